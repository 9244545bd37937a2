"""``python -m fleetenv``: the same as the ``fleetenv`` command.

Handy where the console script is not on ``PATH`` (a venv not activated, a notebook
kernel's interpreter) and for being sure which interpreter runs the command.
"""

from __future__ import annotations

import sys

from fleetenv.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
