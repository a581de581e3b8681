"""``python -m isoprobe`` is the same as the ``isoprobe`` command."""

from isoprobe.cli.main import entry

raise SystemExit(entry())
