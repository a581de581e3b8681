"""SIGINT/SIGTERM in the command: the first stops the work, a later one never cuts the cleanup or the document.

Issue 34: two SIGTERMs 0.2 s apart after trial 1 of ``isoprobe run`` gave exit
143, "terminated before the first trial" and no JSON: the second signal was
raised again inside the first one's cleanup (and, with ``PYTHONUNBUFFERED=1``,
inside the write of the document, which a short write then cut). The handler
(``system.stops``) is checked here in this process; the write, in a small
Python process of its own (no torch). The real probe under 2 and 3 signals is
``tests/integration/test_repeated_signals.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from isoprobe.errors import Terminated
from isoprobe.system import stops as stops_module
from isoprobe.system.stops import Stops, settle


@pytest.fixture
def handlers():
    """The SIGINT/SIGTERM handlers are put back after the test (a Stops replaces them)."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    stops_module._installed = None


def test_the_first_signal_raises_and_every_later_one_is_only_noted(handlers):
    stops = Stops().install()
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs at the next bytecode; never reached
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # inside the first one's cleanup
        os.kill(os.getpid(), signum)
    assert stops.reason == "terminated"


def test_a_signal_while_held_is_noted_and_raised_when_the_next_probe_arms(handlers):
    """A frontier between two points (held): the signal waits, then stops the frontier before the next probe."""
    stops = Stops().install()
    stops.hold()
    os.kill(os.getpid(), signal.SIGINT)
    assert stops.reason == "interrupted"
    with pytest.raises(KeyboardInterrupt):
        stops.arm()


def test_the_probe_settles_the_installed_stops_and_nothing_else(handlers):
    """``run_probe`` holds the command's Stops once its trials are over; under the Python API (no Stops) nothing."""
    settle()  # none installed: a no-op
    stops = Stops().install()
    settle()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stops.reason == "terminated" and not stops.armed


def test_done_ignores_both_signals_until_the_process_ends(handlers):
    """After the document: the interpreter's shutdown would put back the default action (killed, not 143)."""
    stops = Stops().install()
    stops.done()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert stops_module.installed() is None


def test_an_ignored_sigint_stays_ignored(handlers):
    """A background job (``cmd &``) starts with SIGINT ignored: isoprobe keeps ignoring it, as before."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Stops().install()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


WRITER = """
import signal, sys
from isoprobe.report.streams import emit
signal.signal(signal.SIGTERM, lambda *_: None)  # a signal noted, not raised: as Stops does while held
document = "".join(f"{i:09d}\\n" for i in range(30000))  # 300 kB: far more than a pipe holds
print("writing", file=sys.stderr, flush=True)
emit(document)
"""


def test_a_signal_during_a_long_write_to_a_slow_pipe_loses_no_byte():
    """Under PYTHONUNBUFFERED=1 (containers set it), print's write to a full pipe that a signal interrupts
    returned short and the rest was dropped: 64 KiB of 300 kB arrived. ``emit`` now writes until all is out."""
    child = subprocess.Popen([sys.executable, "-c", WRITER], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert child.stderr.readline() == b"writing\n"
    time.sleep(0.5)  # the pipe is full and the child blocked in its write (nobody reads stdout yet)
    child.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert len(out) == 300001 and out.endswith(b"000029999\n\n")
