"""``python -m sbxlimit``: the command line (see ``sbxlimit --help``)."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
