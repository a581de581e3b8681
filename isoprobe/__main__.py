"""``python -m isoprobe`` is the same as the ``isoprobe`` command."""

from isoprobe.cli import main

raise SystemExit(main())
