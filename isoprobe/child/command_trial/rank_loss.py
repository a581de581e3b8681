"""Which rank of a gang was lost, when its peers' errors are only the echo of its loss.

Under torchrun, a rank killed by a signal (SIGKILL from the kernel's OOM killer or from outside, a segfault in
native code) writes no exception: it is gone. Its peers then fail inside a collective with the transport's words
("Connection reset by peer" from gloo, NCCL's "remote process exited"), and the first exception the supervisor
read was rank 0's: the trial blamed rank 0 for "the script's error" and never named rank 1 (issue 47). Two
things say who was lost:

- the supervisor's own view: a rank that said hello is gone, with no exception line, while a peer failed with a
  transport error (``peer_loss``);
- torchrun's failure report on its stderr (``torch.distributed.elastic.multiprocessing.errors``'s template:
  ``rank : 1 (local_rank: 1)`` / ``exitcode : -9 (pid: 1234) SIGKILL``), which names the signal
  (``launcher_exits``).

A rank lost to a signal is a crash, not the script's error: retried in a fresh process, and a failure only if it
comes back (``search.history.not_reproduced``). Pure: text in, findings out.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

#: What a rank's transport says when its peer is gone (lower case): gloo's socket errors, NCCL's, the TCP store's.
PEER_LOSS_WORDS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "remote process exited",
    "remote peer",
    "connection refused",
    "ncclremoteerror",
    "communicator was aborted",
    "socket closed",
    "recvbytes",
    "sendbytes",
    "unexpected eof",
    "end of file",
)

_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>-?\d+)\s*\(local_rank:\s*(?P<local>-?\d+)\)\s*\n\s*exitcode\s*:\s*"
    r"(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
)


@dataclass(frozen=True)
class RankExit:
    """One rank's ending, as the launcher reported it."""

    rank: int
    exitcode: int
    pid: int

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


def peer_loss(message: str) -> bool:
    """The exception's words are a transport's, whose peer is gone (not the script's own error)."""
    lowered = message.lower()
    return any(words in lowered for words in PEER_LOSS_WORDS)


def launcher_exits(stderr: str) -> list[RankExit]:
    """Every rank ending torchrun's failure report lists on ``stderr``, in the order printed."""
    return [RankExit(int(m["rank"]), int(m["code"]), int(m["pid"])) for m in _FAILURE.finditer(stderr)]


def killed_rank(stderr: str, pid: int | None = None, rank: int | None = None) -> RankExit | None:
    """The launcher's report of a rank killed by a signal: the one with ``pid`` or ``rank`` if given, else the
    report's root cause (its first observed failure) if a signal ended it. A rank the launcher stopped itself
    after another failed (SIGTERM) is listed too, but is never the root cause."""
    if pid is None and rank is None:
        at = stderr.rfind("Root Cause")
        root = launcher_exits(stderr[at:]) if at >= 0 else []
        return root[0] if root and root[0].exitcode < 0 else None
    for ending in launcher_exits(stderr):
        if ending.exitcode < 0 and (
            (pid is not None and ending.pid == pid) or (rank is not None and ending.rank == rank)
        ):
            return ending
    return None


def lost_message(lost_name: str, steps: int, how: str, peer_name: str | None, peer_message: str | None) -> str:
    """What the user reads: the lost rank first, how it ended, and that its peer's error followed from it."""
    text = (
        f"{lost_name} of the command {how} after {steps} optimizer step(s), with no error of its own: a rank "
        "killed by a signal (the kernel's OOM killer: see dmesg; a kill from outside; a crash in native code)"
    )
    if peer_name is not None and peer_message is not None:
        text += f"; {peer_name}'s error followed from the loss of its peer: {peer_message[:300]}"
    return text
