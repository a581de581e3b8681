"""``python -m isoprobe.child REQUEST.json`` (cold) or ``python -m isoprobe.child --wait`` (warm)."""

import sys

from isoprobe.child.main import main
from isoprobe.child.request import exit_now

if __name__ == "__main__":
    exit_now(main(sys.argv))
