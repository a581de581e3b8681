"""The document of a stop that has no ``Result`` of the probe's own: every stop of ``isoprobe run`` prints one.

The probe returns a ``Result`` for every end it reaches (an answer, nothing fits, a failed trial, a signal
mid-probe). What ends the command before or outside it did not: a bad spec (exit 2), a ``ProbeError`` raised out
of the probe (exit 4: the environment check failed, no space left for a trial's files, Slurm lost a node's step
daemon), a signal before the first trial (130/143), a bug in isoprobe (exit 1). Each left one line on stderr and
nothing on stdout, so a hook or a pipeline that parses stdout had nothing to parse (issue 56). ``stop_result``
makes that stop a ``Result`` of the one model, in every format the command prints: ``answered`` false, the
stop reason, the message, and the trials the probe had run where there were any. Pure: the caller says what
happened; nothing here runs anything.
"""

from __future__ import annotations

import platform

from isoprobe import __version__
from isoprobe.report.outcomes import StopReason
from isoprobe.report.result import Result


def stop_result(
    reason: StopReason, message: str, *, spec_path: str, spec=None, trials=(), seconds: float = 0.0, suggestions=()
) -> Result:
    """A ``Result`` for a stop without an answer: ``spec`` None where it was not valid (bad_spec), ``trials`` the
    ones run before the stop (a ``ProbeError``'s), ``seconds`` the command's time so far."""
    return Result(
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        spec_path=spec_path,
        spec=spec,
        allocator=None,
        answered=False,
        stop_reason=reason,
        message=message,
        suggestions=list(suggestions),
        trials=list(trials),
        total_seconds=round(seconds, 3),
    )
