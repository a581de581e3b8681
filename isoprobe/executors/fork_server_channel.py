"""The parent's side of the fork server (``isoprobe.child.server``): start it, order forks, learn how they ended.

The server is started like any child (under a keeper whose lifeline the
parent holds, from ``LocalExecutor._spawn``), with one end of a SOCK_SEQPACKET
socket pair as its channel. Each order carries the trial's own lifeline as
SCM_RIGHTS; the reply names the forked keeper's PID, and a later reply its wait
status. ``ForkedProcess`` shows that keeper through the subset of
``subprocess.Popen`` the executor uses (``poll``, ``wait``, ``returncode``), so
a forked trial is waited for, timed out and stopped exactly as a spawned one.

The server is isoprobe's machinery, not the trial: when it fails, the trial's
end is unknown, and that must never become the batch's outcome. So a trial
whose end the server can no longer report is *lost* (``ForkedProcess.lost``
says why), which the executor re-runs (``LocalExecutor``), never classifies:

- the server is gone (killed, crashed: its keeper has then killed every trial
  under it) or talks nonsense: the channel reads EOF or garbage;
- the server is wedged (stopped, hung): the forked keeper's own end is seen
  directly, through a pidfd (it is the server's child, not ours, so it cannot
  be waited for), and the server's ``Ended`` for it must follow within
  ``ENDED_REPLY_SECONDS``; an order's ``Forked`` within ``FORK_REPLY_SECONDS``.

Every wait here has a deadline: a stopped server cannot hold the probe.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from pydantic import ValidationError

from isoprobe.protocol.messages import SERVER_REPLY, Ended, Extended, Forked, ForkOrder, ImportOrder
from isoprobe.system.primitives import alive

#: The return code a lost trial is given, so that whatever reads only the code sees a kill, never a clean exit.
LOST_STATUS = int(signal.SIGKILL)  # a raw wait status: killed by SIGKILL
#: How long the server may take to answer an order with the forked PID (a fork: milliseconds).
FORK_REPLY_SECONDS = 30.0
#: How long the server may take to report a keeper's end once the keeper has ended. It looks every 20 ms
#: (``child.server._REAP_SECONDS``); this much longer only on a machine that did not run it for seconds.
ENDED_REPLY_SECONDS = 10.0


class ForkedProcess:
    """A forked trial's keeper, as the executor sees a spawned one: ``poll``, ``wait``, ``returncode``.

    ``lost``: why its end is unknown (the server failed); ``returncode`` is then ``-SIGKILL``.
    """

    stdin = None  # the request travels in the order, not on a pipe

    def __init__(self, server: ServerChannel, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.lost: str | None = None
        self.exited_at: float | None = None  # when the keeper was seen to end, before the server reported it
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):  # already ended and reaped (its Ended is on the way), or no pidfd
            self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect(self, timeout=0)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """The end, within ``timeout`` seconds (there is no waiting for ever: the server may be wedged)."""
        if self.returncode is None:
            self.server.collect(self, timeout=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked trial {self.pid}", timeout)
        return self.returncode

    def exited(self) -> bool:
        """Whether the keeper has ended (a zombie of the server counts), seen directly, not through the server."""
        if self.pidfd is None:
            return not alive(self.pid)
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class ServerChannel:
    """The parent's end of one fork server's channel; ``lost`` says why the server can no longer be trusted."""

    def __init__(self, channel: socket.socket):
        self.channel = channel
        self.lost: str | None = None
        self._ended: dict[int, int] = {}  # wait statuses that arrived while another reply was awaited

    def fork(self, order: ForkOrder, lifeline_read: int) -> ForkedProcess | None:
        """Order one fork; the forked keeper's process, or None if the server did not take the order (lost)."""
        if self.lost:
            return None
        try:
            socket.send_fds(self.channel, [order.model_dump_json().encode()], [lifeline_read])
        except OSError as error:
            self._lose(f"the fork server's channel failed ({error.strerror or error})")
            return None
        reply = self._answer(time.monotonic() + FORK_REPLY_SECONDS)
        if not isinstance(reply, Forked):
            self._lose(f"the fork server did not answer an order within {FORK_REPLY_SECONDS:g} s (stopped or wedged)")
            return None
        return ForkedProcess(self, reply.pid)

    def _answer(self, deadline: float) -> Forked | Extended | None:
        """The next reply that answers an order, by ``deadline``; a trial's end that comes first (another rank
        of a gang, or a trial that ended before the order) is kept for its collect."""
        while True:
            reply = self._reply(deadline - time.monotonic())
            if not isinstance(reply, Ended):
                return reply
            self._ended[reply.pid] = reply.status

    def extend(self, modules_file: str) -> bool:
        """Order the server to import the modules ``modules_file`` names too (``ImportOrder``); False if it did not
        take the order (lost). Its answer is ``extended``'s to wait for, before the next fork."""
        if self.lost:
            return False
        try:
            self.channel.send(ImportOrder(modules_file=modules_file).model_dump_json().encode())
        except OSError as error:
            self._lose(f"the fork server's channel failed ({error.strerror or error})")
            return False
        return True

    def extended(self, timeout: float) -> Extended | None:
        """The server's answer to ``extend`` within ``timeout`` seconds (the imports' bound); None, and the server
        lost, if it ended, wedged or answered something else meanwhile."""
        reply = self._answer(time.monotonic() + timeout)
        if isinstance(reply, Extended):
            return reply
        if reply is None and not self.lost:
            self._lose(
                f"the fork server did not finish importing the model's modules within {timeout:g} s (stopped or wedged)"
            )
        elif reply is not None:
            self._lose("the fork server replied to an order nobody gave")
        return None

    def collect(self, process: ForkedProcess, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for ``process``'s end; sets its ``returncode`` (and ``lost``) when known.

        Replies for other trials (the other ranks of a gang) that come first are
        kept for their own collect. A keeper that has ended without the server
        reporting it within ``ENDED_REPLY_SECONDS`` loses the server.
        """
        deadline = time.monotonic() + timeout
        while process.pid not in self._ended and not self.lost:
            now = time.monotonic()
            if process.exited_at is None and process.exited():
                process.exited_at = now
            if process.exited_at is not None and now - process.exited_at >= ENDED_REPLY_SECONDS:
                self._lose(
                    f"the fork server did not report the end of trial process {process.pid} within "
                    f"{ENDED_REPLY_SECONDS:g} s of it (stopped or wedged)"
                )
                break
            until = deadline if process.exited_at is None else min(deadline, process.exited_at + ENDED_REPLY_SECONDS)
            watch = [] if process.exited_at is not None or process.pidfd is None else [process.pidfd]
            reply = self._reply(until - now, also=watch)
            if isinstance(reply, Ended):
                self._ended[reply.pid] = reply.status
            elif isinstance(reply, (Forked, Extended)):  # no order is waiting for one: the server is confused
                self._lose("the fork server replied to an order nobody gave")
            elif reply is None and time.monotonic() >= deadline:
                break
        if process.pid in self._ended:
            process.returncode = _returncode(self._ended.pop(process.pid))
        elif self.lost:
            process.lost = self.lost
            process.returncode = _returncode(LOST_STATUS)
        if process.returncode is not None:
            process.close()

    def _reply(self, timeout: float, also: Sequence[int] = ()) -> Forked | Ended | Extended | None:
        """The next reply; None at the timeout, when one of ``also`` becomes readable, or once the server is lost."""
        if self.lost:
            return None
        watched: list[socket.socket | int] = [self.channel, *also]
        readable, _, _ = select.select(watched, [], [], max(0.0, timeout))
        if self.channel not in readable:
            return None
        try:
            data = self.channel.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._lose("the fork server is gone (its channel closed: killed or crashed)")
            return None
        try:
            return SERVER_REPLY.validate_json(data)
        except ValidationError:
            self._lose("the fork server sent a reply that is not one")
            return None

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason

    def close(self) -> None:
        self.channel.close()


def _returncode(status: int) -> int:
    """A raw wait status as ``Popen.returncode`` gives it: the exit code, or minus the signal."""
    return os.waitstatus_to_exitcode(status)
