"""A command's interpreter, started ahead of its trial: wait for the batch, then let the interpreter go on.

The trial's process waiting for its request (``isoprobe.child.command_trial.warm``) starts the command exactly as the
trial would (``python [FLAGS] SCRIPT ARG...`` or ``-m MODULE``: the same interpreter, flags, environment, working
directory, cap and session), but with the batch's placeholder still in its arguments, no batch variable, and
``ISOPROBE_WARM_FD`` naming a pipe. The shim's ``sitecustomize`` calls ``wait_here`` at the end of the interpreter's
start (after any ``sitecustomize`` of the environment's, before the script is read), only in that process:

1. ``warm-ready`` in the trial's folder; then it blocks on the pipe until the trial is due;
2. the trial's process writes the variables to set (``ISOPROBE_BATCH_SIZE``) and the arguments with the batch in
   them; they replace the placeholders in ``sys.argv``, and the interpreter goes on as it would have: it reads,
   compiles and runs the script itself (``__main__``, tracebacks, exit status: nothing here is on the stack).
   EOF at once means the runner is not needed: the process exits before the script runs.

Nothing of the script's runs ahead, not even its imports (issue 55). Importing the script's installed top-level
imports ahead (issue 49) changed what scripts see: one that sets ``OMP_NUM_THREADS`` before ``import torch`` ran
every trial with torch's threads already set (160 where its own edge is 123), one that puts a vendored fork first
on ``sys.path`` got the installed package (149 where the fork's edge is 82), a module that reads the batch from the
environment at import read none, and a script that re-executes itself wrote two hellos. What runs here is what
every process of the command runs anyway, cold or not: the interpreter's own start and the shim's finder; the
script's first line is still the first thing of the script's to run, with the batch already in the environment.
No priority is changed here either: the process waits blocked, and runs at the trial's priority when it runs.

Standard library only, and only modules the interpreter has loaded at start: it lives in the process being
measured.
"""

import os
import sys
import time

#: The variable naming the pipe the trial comes on; only the process started ahead has it (removed at once).
#: ``protocol.wiring.WARM_FD_ENV`` written again (and ``SHIM_DIR_ENV``, ``WARM_READY_FILE`` below): this file loads
#: nothing, so that the script's ``sys.modules`` is a cold start's (tests/unit/test_shim_names.py ties them).
FD_ENV = "ISOPROBE_WARM_FD"


def wait_here():
    """Say ready, wait for the trial, set its batch; return to the interpreter's start (see the docstring)."""
    fd = int(os.environ.pop(FD_ENV))
    _ready()
    message = _read_all(fd)
    os.close(fd)
    if not message:
        os._exit(0)  # the trial went another way: this interpreter is not needed, and runs nothing of the script
    words = [os.fsdecode(word) for word in message.split(b"\0")]
    count = int(words[0])
    for assignment in words[1 : 1 + count]:
        name, _, value = assignment.partition("=")
        os.environ[name] = value
    arguments = words[1 + count :]
    if len(arguments) != len(sys.argv) - 1:
        sys.stderr.write(
            f"isoprobe: the trial's {len(arguments)} arguments do not replace the command's {len(sys.argv) - 1}\n"
        )
        os._exit(2)
    sys.argv[1:] = arguments
    sys.modules.pop(__name__, None)  # as a cold start: no module of isoprobe's in the script's sys.modules


def _ready():
    folder = os.environ.get("ISOPROBE_SHIM_DIR")
    if not folder:
        return
    temporary = os.path.join(folder, ".warm-ready")
    with open(temporary, "w") as handle:
        handle.write(f"READY {time.time():.6f}\n")
    os.replace(temporary, os.path.join(folder, "warm-ready"))


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
