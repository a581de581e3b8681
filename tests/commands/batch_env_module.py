"""The training configuration of tests/commands/batch_at_import.py, read once, at import: held-out test material
(issue 55).

``BATCH_SIZE`` is ``$ISOPROBE_BATCH_SIZE`` as the environment holds it when this module is imported (a job script
exports it, ``--format env``), else the configuration's default, 16. A process that imported this module before its
batch was in the environment keeps 16 for ever. Nothing of isoprobe is imported.
"""

import os

#: The configuration's own batch, used where the environment names none.
DEFAULT_BATCH_SIZE = 16
#: Read here, at import, never again.
FROM_ENVIRONMENT = os.environ.get("ISOPROBE_BATCH_SIZE")
BATCH_SIZE = int(FROM_ENVIRONMENT) if FROM_ENVIRONMENT else DEFAULT_BATCH_SIZE
ROWS = 64
WIDTH = 4096
HIDDEN = 64
CLASSES = 10
