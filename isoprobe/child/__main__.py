"""``python -m isoprobe.child REQUEST.json`` (cold) or ``python -m isoprobe.child --wait`` (warm)."""

import sys

from isoprobe.child.main import exit_now, main

if __name__ == "__main__":
    exit_now(main(sys.argv))
