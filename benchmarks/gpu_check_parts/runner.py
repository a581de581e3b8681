"""The GPU check's processes: every run in a session of its own, stopped at its limit, and the ballast held beside.

The one seam between benchmarks/gpu_check.py and the machine: ``Runner.run`` (a command to its end or its limit) and
``Runner.hold`` (a process that holds something until released: the ballast). tests/unit/test_gpu_check_runs.py
replaces it with a fake card, so the orchestration (the deadline, the page and the archive under ``$OUT``, the exit
codes) runs end to end without a GPU.

Children inherit the interpreter's packages: the checkout is put in front of ``PYTHONPATH``, never in place of it
(the GPU machine's wheels may be installed where only ``PYTHONPATH`` finds them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ran:
    """A finished (or stopped) run: ``returncode`` None means it was stopped at its limit."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def child_environment(extra: dict[str, str] | None = None, environ=None) -> dict[str, str]:
    """This process's environment, the checkout first on ``PYTHONPATH`` (kept, not replaced), then ``extra``."""
    env = dict(os.environ if environ is None else environ)
    kept = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([kept] if kept else [])])
    env.update(extra or {})
    return env


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class Runner:
    """Real processes (see the module's docstring)."""

    def run(self, argv: list[str], limit_s: float, env: dict[str, str] | None = None, grace_s: float = 20) -> Ran:
        """``argv`` in a session of its own for at most ``limit_s``; at the limit SIGTERM to its group (isoprobe prints
        its trials so far), then after ``grace_s`` SIGKILL. Whatever of its session is left is killed either way."""
        started = time.monotonic()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, start_new_session=True, text=True,
                                       env=child_environment(env))
            try:
                returncode: int | None = process.wait(timeout=max(1.0, limit_s))
            except subprocess.TimeoutExpired:
                returncode = None
                _signal_group(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=grace_s)
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            except BaseException:  # the check itself stopped (its call's timeout): nothing of this run outlives it
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
                raise
            _signal_group(process.pid, signal.SIGKILL)
            out.seek(0)
            err.seek(0)
            return Ran(returncode, out.read(), err.read(), time.monotonic() - started)

    @contextlib.contextmanager
    def hold(self, argv: list[str], ready_s: float, env: dict[str, str] | None = None) -> Iterator[dict]:
        """Start ``argv``, wait up to ``ready_s`` for its first stdout line (JSON), yield it, and on leaving close its
        stdin, SIGTERM its group and reap it (SIGKILL after 10 s). A process that says nothing in time yields
        ``{"ready": False, "error": ...}``."""
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   cwd=ROOT, start_new_session=True, text=True, env=child_environment(env))
        try:
            yield _first_line(process, ready_s)
        finally:
            with contextlib.suppress(OSError):
                process.stdin.close()
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            _signal_group(process.pid, signal.SIGKILL)


def _first_line(process: subprocess.Popen, ready_s: float) -> dict:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=ready_s):
            return {"ready": False, "error": f"no ready line within {ready_s:.0f} s"}
    text = process.stdout.readline()
    try:
        line = json.loads(text)
    except json.JSONDecodeError:
        tail = (process.stderr.read() if process.poll() is not None else "").strip().splitlines()[-3:]
        return {"ready": False, "error": f"not a ready line: {text.strip()[:200]!r} {' '.join(tail)[:300]}"}
    return line if isinstance(line, dict) else {"ready": False, "error": f"not a JSON object: {text[:200]!r}"}


def archive(folder: Path, into: Path) -> Path:
    """``folder`` as one gzipped tar ``into`` (the device call brings few files back): written beside, then moved, so
    a call stopped mid-write still leaves the previous archive whole."""
    partial = into.with_name(into.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    partial.replace(into)
    return into
