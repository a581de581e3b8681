"""The parent's side of the fork server (``isoprobe.child.server``): start it, order forks, learn how they ended.

The server is started like any child (under a keeper whose lifeline the
parent holds, from ``LocalExecutor._spawn``), with one end of a SOCK_SEQPACKET
socket pair as its channel. Each order carries the trial's own lifeline as
SCM_RIGHTS; the reply names the forked keeper's PID, and a later reply its wait
status. ``ForkedProcess`` shows that keeper through the subset of
``subprocess.Popen`` the executor uses (``poll``, ``wait``, ``returncode``), so
a forked trial is waited for, timed out and stopped exactly as a spawned one.

If the server is gone (killed, crashed), its keeper has already killed every
trial under it; a trial whose end the server can no longer report is taken as
killed by SIGKILL, which the probe classifies as crashed (never as fitting).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time

from pydantic import ValidationError

from isoprobe.protocol import SERVER_REPLY, Ended, ForkOrder, Forked

#: What a trial's end is taken to be when the server that forked it can no longer say.
LOST_STATUS = int(signal.SIGKILL)  # a raw wait status: killed by SIGKILL
#: How long the server may take to answer an order with the forked PID (a fork: milliseconds).
FORK_REPLY_SECONDS = 30.0


class ForkedProcess:
    """A forked trial's keeper, as the executor sees a spawned one: ``poll``, ``wait``, ``returncode``."""

    stdin = None  # the request travels in the order, not on a pipe

    def __init__(self, server: "ServerChannel", pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect(self, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.server.collect(self, timeout=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked trial {self.pid}", timeout)
        return self.returncode


class ServerChannel:
    """The parent's end of one fork server's channel."""

    def __init__(self, channel: socket.socket):
        self.channel = channel
        self.lost = False
        self._ended: dict[int, int] = {}  # wait statuses that arrived while another reply was awaited

    def fork(self, order: ForkOrder, lifeline_read: int) -> ForkedProcess | None:
        """Order one fork; the forked keeper's process, or None if the server did not take the order."""
        try:
            socket.send_fds(self.channel, [order.model_dump_json().encode()], [lifeline_read])
        except OSError:
            self.lost = True
            return None
        deadline = time.monotonic() + FORK_REPLY_SECONDS
        while True:
            reply = self._reply(max(0.0, deadline - time.monotonic()))
            if isinstance(reply, Ended):  # another trial of the gang ended meanwhile: kept for its collect
                self._ended[reply.pid] = reply.status
                continue
            if not isinstance(reply, Forked):
                self.lost = True
                return None
            return ForkedProcess(self, reply.pid)

    def collect(self, process: ForkedProcess, timeout: float | None) -> None:
        """Wait up to ``timeout`` (None: for ever) for ``process``'s end; sets its ``returncode`` when known.

        Replies for other trials (the other ranks of a gang) that come first are kept for their own collect.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while process.pid not in self._ended:
            reply = self._reply(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if isinstance(reply, Ended):
                self._ended[reply.pid] = reply.status
            elif isinstance(reply, Forked):  # no order is waiting for one: the server is confused
                self.lost = True
            if reply is None or isinstance(reply, Forked):
                break
        if process.pid in self._ended:
            process.returncode = _returncode(self._ended.pop(process.pid))
        elif self.lost:
            process.returncode = _returncode(LOST_STATUS)

    def _reply(self, timeout: float | None) -> Forked | Ended | None:
        """The next reply; None at the timeout, or once the server is gone (``lost`` is then set)."""
        if self.lost:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.channel], [], [], left)
            if not readable:
                return None
            try:
                data = self.channel.recv(4096)
            except OSError:
                data = b""
            if not data:
                self.lost = True
                return None
            try:
                return SERVER_REPLY.validate_json(data)
            except ValidationError:
                self.lost = True
                return None

    def close(self) -> None:
        self.channel.close()


def _returncode(status: int) -> int:
    """A raw wait status as ``Popen.returncode`` gives it: the exit code, or minus the signal."""
    return os.waitstatus_to_exitcode(status)
