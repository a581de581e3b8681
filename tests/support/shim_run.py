"""Run a snippet of Python under the command shim, as a command trial's process runs, and read the lines it wrote.

The shim's tests (the forwards a step trained on, the cycle's evaluation forwards and saves, where a process is in
its step) each ran the same dance: the shim's folder on PYTHONPATH, the trial's folder in the environment, the gate
open, the script run, its one lines file parsed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from isoprobe.protocol.command import SHIM_FOLDER, parse_lines
from isoprobe.protocol.wiring import GATE_FILE, SHIM_DIR_ENV


def shim_lines(folder: Path, script: str, *kinds: type) -> list:
    """The lines of ``kinds`` that ``script`` (run with ``python -c`` under the shim, in ``folder``) wrote, in order;
    the run must succeed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHIM_DIR_ENV)}
    env.update(PYTHONPATH=str(SHIM_FOLDER), **{SHIM_DIR_ENV: str(folder)})
    (folder / GATE_FILE).write_text("100")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=folder, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    [file] = folder.glob("p*.jsonl")
    return [line for line in parse_lines(file.read_bytes()) if isinstance(line, kinds)]
