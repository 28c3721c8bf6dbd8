import sys

from stlsgd.cli import main

sys.exit(main())
