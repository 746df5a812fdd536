"""Train the GNN cost model (same as ``disco train-gnn``).

    PYTHONPATH=. python scripts/train_gnn.py --data /work/data/profiles_tiny --lomo
"""

import sys

from gnn.cli import main

if __name__ == "__main__":
    sys.exit(main())
