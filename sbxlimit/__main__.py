"""``python -m sbxlimit``: the command line (see ``sbxlimit --help``)."""

import sys

if sys.platform == "win32":  # the CLI drives the POSIX supervisor
    sys.exit(
        "sbxlimit: the command line is not available on Windows yet; use the Python API "
        "(sbxlimit.run, sbxlimit.doctor()), see docs/windows.md"
    )

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
