"""Collect measured plan samples for the cost model (same as ``disco collect``).

Example::

  python scripts/tools/collect_profiles.py --models mlp,transformer_lm --preset tiny --devices 4 \\
      --random 150 --rounds 3 --out /work/data/profiles_tiny
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from disco.cli.collect import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
