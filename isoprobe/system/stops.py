"""SIGINT and SIGTERM for a command that prints what it did so far: the first one stops the work, the rest wait.

``isoprobe run`` and ``isoprobe frontier`` turn SIGINT into ``KeyboardInterrupt``
and SIGTERM into ``Terminated`` where it lands, so that the probe stops the
trial that is running and returns the trials that had ended (``pipeline``).
That is right for the *first* signal only. A second one, raised while the first
is being handled (the running child stopped, the executor closed, the document
written to a slow pipe), would end that cleanup half-way and lose every trial
already finished: two SIGTERMs 0.2 s apart gave exit 143, "terminated before the
first trial" and no JSON (issue 34). So ``Stops`` raises the first signal and
only notes every later one, whatever their number and spacing.

Once there is nothing left to stop, the work is *held*: a signal is noted, not
raised, so the document that holds the finished trials is not cut either.
``run_probe`` holds when its trials are over (``settle``: its executor is being
closed, the result assembled and cached), the command holds while it prints, and
a frontier holds between points and *arms* again before the next point's probe:
``arm`` raises a signal noted meanwhile right there, before any new trial, so
the frontier stops with the points answered so far. ``done`` ignores both
signals for the few milliseconds between the printed document and the process's
end (the interpreter's own shutdown would otherwise put back the default action:
killed by the signal, not exit 143).

Only the command line installs a ``Stops``. Without one (the Python API,
``probe()``), ``settle`` does nothing and Ctrl-C raises wherever it lands, as
Python's own handler does.
"""

from __future__ import annotations

import signal

from isoprobe.errors import Terminated

_installed: Stops | None = None


class Stops:
    """The process's SIGINT/SIGTERM handler while a command runs (``install``); see the module's docstring."""

    def __init__(self) -> None:
        self.first: int | None = None  # the signal that stopped the work (SIGINT or SIGTERM); later ones are not kept
        self.armed = True

    def install(self) -> Stops:
        """Handle SIGTERM, and SIGINT unless it is ignored (a background job's ``&`` keeps ignoring Ctrl-C)."""
        global _installed
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)
        _installed = self
        return self

    def _on_signal(self, signum: int, frame) -> None:
        if self.first is not None:
            return  # the first one is being handled: raised here, this one would cut its cleanup short
        self.first = signum
        if self.armed:
            raise stopped_by(signum)

    def hold(self) -> None:
        """From now on a signal is noted, not raised (nothing is running that it must stop)."""
        self.armed = False

    def arm(self) -> None:
        """From now on the first signal raises; one noted while held raises at once, here."""
        self.armed = True
        if self.first is not None:
            raise stopped_by(self.first)

    def done(self) -> None:
        """The command has printed its document: ignore both signals until the process ends."""
        global _installed
        self.armed = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, signal.SIG_IGN)
        if _installed is self:
            _installed = None

    @property
    def reason(self) -> str | None:
        """'interrupted' (SIGINT), 'terminated' (SIGTERM), or None: no signal came."""
        if self.first is None:
            return None
        return "interrupted" if self.first == signal.SIGINT else "terminated"


def stopped_by(signum: int) -> BaseException:
    """The exception a signal becomes: KeyboardInterrupt for SIGINT, ``Terminated`` for SIGTERM."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def settle() -> None:
    """The probe's trials are over: hold the command's ``Stops`` (none installed, as under ``probe()``: nothing)."""
    if (stops := installed()) is not None:
        stops.hold()


def installed() -> Stops | None:
    """The ``Stops`` a command installed and that still handles SIGTERM, if any."""
    if _installed is None or signal.getsignal(signal.SIGTERM) != _installed._on_signal:
        return None
    return _installed
