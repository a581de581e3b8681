"""Running as PID 1 (a container's entrypoint, ``unshare --pid``): a tiny init in front of isoprobe.

Why. The first process of a PID namespace has two jobs that an ordinary program
does not do, and isoprobe does neither on its own:

- **Signals.** The kernel never applies a *default* disposition to PID 1: a
  ``docker stop`` (SIGTERM), SIGHUP or SIGUSR1 aimed at a PID 1 without a
  handler for it does nothing at all. isoprobe handles SIGTERM and SIGINT only
  once ``run`` has started; before that, and for the other signals, it would
  be unkillable short of SIGKILL.
- **Orphans.** Every process whose parent dies is re-parented to PID 1, and only
  PID 1 can reap it. What a trial leaves (compile workers, data-loader workers,
  whatever a user's model spawns and leaks) is re-parented to the trial's keeper,
  a subreaper that kills and reaps it (``system.keeper``); but a keeper whose
  isoprobe died, and anything isoprobe's own process leaves, comes here.
  Unreaped, each stays a zombie, holding a PID, until the container ends.

Why not a SIGCHLD handler in isoprobe itself. The local executor waits for its own
children through ``subprocess.Popen`` (``waitpid`` on their PIDs). A
``waitpid(-1)`` anywhere else in the same process would steal those exit
statuses: Popen would then see "no such child", report exit status 0, and a
crashed trial would be misread. So this follows tini's pattern instead: PID 1
forks, the real isoprobe runs in the child (PID 2) exactly as it runs anywhere
else, and PID 1 only forwards signals and reaps, with every signal blocked and
taken synchronously by ``sigtimedwait`` (no handler runs at an arbitrary point,
and nothing is lost between two checks: a blocked signal stays pending).

The child is put in a session (and process group) of its own, so that a signal
sent to PID 1's group (Ctrl-C on the container's terminal reaches the terminal's
foreground group, which is PID 1's) reaches isoprobe exactly once: forwarded
by PID 1. In PID 1's group it would get a second copy directly, and isoprobe
turns SIGINT and SIGTERM into a result document plus exit 130/143: once each.
Its trials' keepers are in sessions of their own already, and isoprobe stops them itself.

When isoprobe exits, PID 1 exits with the same status (128 + N if it was killed
by signal N). Whatever is still running in the namespace is then killed by the
kernel, as it is for any namespace whose init ends.

Outside PID 1 (the usual case, or ``docker run --init``, where tini is PID 1)
and with ``ISOPROBE_NO_INIT=1`` nothing of this happens: ``main`` just runs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence

#: Signals PID 1 passes on to isoprobe (to its PID only: isoprobe stops its own trials).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

#: Set to 1 to run isoprobe itself as PID 1, without the init in front (for debugging).
NO_INIT_ENV = "ISOPROBE_NO_INIT"

#: How long PID 1 waits for a signal before it looks for processes to reap anyway (a backstop only:
#: SIGCHLD wakes it as soon as any child ends).
_POLL_SECONDS = 1.0

Main = Callable[[Sequence[str] | None], int]


def wanted() -> bool:
    """True when this process is PID 1 and should act as init (and can: sigtimedwait is POSIX, not macOS)."""
    return os.getpid() == 1 and os.environ.get(NO_INIT_ENV) != "1" and hasattr(signal, "sigtimedwait")


def main_as_pid1(main: Main, argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)``; as PID 1, run it in a child and be its init (see the module's docstring).

    Returns ``main``'s exit status, or, as PID 1, that of the child that ran it
    (128 + N if signal N killed it). In the child, this function never returns:
    ``main``'s status leaves the child as ``SystemExit``, with the usual
    interpreter shutdown (buffers flushed, ``atexit``).
    """
    if not wanted():
        return main(argv)
    waited = set(FORWARDED) | {signal.SIGCHLD}
    # Blocked before the fork: a signal that comes while the child starts waits, pending, for the loop.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise
    if child == 0:
        os.setsid()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise SystemExit(main(argv))
    return _supervise(child, waited)


def _supervise(child: int, waited: set[signal.Signals]) -> int:
    """PID 1's loop: forward signals to ``child``, reap every process, return ``child``'s exit status."""
    while True:
        try:
            info = signal.sigtimedwait(waited, _POLL_SECONDS)
        except InterruptedError:  # retried by Python itself (PEP 475); kept for safety
            info = None
        if info is not None and info.si_signo in FORWARDED:
            try:
                os.kill(child, info.si_signo)
            except ProcessLookupError:  # already gone: the reaping below picks up its status
                pass
        status = _reap_all(child)
        if status is not None:
            return status


def _reap_all(child: int) -> int | None:
    """Reap every process that has ended; the exit status of ``child`` if it was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except InterruptedError:
            continue
        except ChildProcessError:  # ECHILD: no child at all is left
            return found
        if pid == 0:  # children left, none ended
            return found
        if pid == child:
            found = exit_status(status)


def exit_status(wait_status: int) -> int:
    """A ``waitpid`` status as a shell reports it: the exit code, or 128 + N for death by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code
