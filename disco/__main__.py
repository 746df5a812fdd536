import sys

from disco.cli import main

sys.exit(main())
