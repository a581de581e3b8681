"""Which fork server forks a request, and when this probe stops forking: the local executor's fork servers.

One server at a time, for the conditions it was started under (all but the
CPU cap, which each fork sets for itself), or for conditions that only add
modules to its preload, which it is told to import (``added_imports``: the
model's imports, known once the environment check has run). The server is isoprobe's own
machinery, so its failures are never a request's: a server that cannot start
or whose forks would hang (``child.server.forks_safely``), and a fork that
cannot set itself up, make this probe spawn under those conditions from then
on (``unforkable``); a server *lost* while it served (killed, wedged:
``fork_server_channel.ServerChannel.lost``) is stopped with its whole tree and replaced
by a fresh one, up to ``SERVER_LOSSES`` times. Re-running what a lost server
was running is the executor's (``executors.rounds``, for a single trial and a
parallel slot alike; ``GangExecutor`` for a gang).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from isoprobe.executors import Conditions
from isoprobe.executors.child_process import StartedChild, await_warm, modules_file, stop_child
from isoprobe.executors.fork_server_channel import ServerChannel
from isoprobe.executors.processes import import_timeout, signals_deferred
from isoprobe.protocol.messages import ForkOrder

#: How many fork servers under the same conditions may be lost (killed, wedged) in one probe before its
#: requests are spawned instead: one loss can be an accident (a server killed by hand, or by an OOM killer
#: that picked it), a second says that forking is not safe here. So a request is run at most this many
#: times more than once, and its last attempt is spawned, where no server can lose it.
SERVER_LOSSES = 2


@dataclass
class _Server:
    """A fork server (a child started as any other, ``child.server``) and the parent's end of its channel."""

    started: StartedChild
    channel: ServerChannel
    key: Conditions  # the conditions it serves, but for the cap, which each fork sets for itself
    extending: bool = False  # an ImportOrder was sent: its answer comes before the next fork


class ForkServers:
    """The fork server of a ``LocalExecutor``; ``spawn(conditions, fd)`` starts one serving on ``fd``."""

    def __init__(
        self,
        backends: frozenset[str],
        spawn: Callable[[Conditions, int], StartedChild],
        next_files: Callable[[], tuple[Path, Path, Path]],
    ):
        self.backends = backends  # the backends whose children are forked
        self._spawn = spawn
        self._next_files = next_files
        self._server: _Server | None = None
        self._unforkable: set[Conditions] = set()  # server keys that spawn for the rest of the probe
        self._losses: dict[Conditions, int] = {}  # server keys: how many of their servers were lost

    def forks(self, conditions: Conditions) -> bool:
        """Whether requests under ``conditions`` are forked: their backend's, and forking was not given up."""
        return conditions.backend in self.backends and replace(conditions, memory_limit=None) not in self._unforkable

    def server_for(self, conditions: Conditions) -> _Server:
        """The fork server for ``conditions`` (all but the cap), started now if there is none; one at a time.

        A server whose preload the new one only lengthens (the model's imports, known once the environment
        check, itself forked from this server, has run) is told to import the rest (``ImportOrder``) rather
        than replaced: a new server would import torch again while the first trial waited for it.
        """
        key = replace(conditions, memory_limit=None)
        self.drop_lost()
        if self._server is not None and self._server.key != key:
            more = added_imports(self._server.key, key)
            if more and self._server.channel.extend(str(modules_file(self._next_files()[0], more))):
                self._server.key, self._server.extending = key, True
            else:
                self.stop()
        if self._server is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                started = self._spawn(key, theirs.fileno())
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            self._server = _Server(started, ServerChannel(ours), key)
        return self._server

    def fork(self, request_path: Path, conditions: Conditions, timeout: float) -> StartedChild | None:
        """The request's child, forked from the fork server; None if no server can (then one is spawned)."""
        while self.forks(conditions):
            with signals_deferred():
                server = self.server_for(conditions)
            if not await_warm(server.started, import_timeout(timeout)) or not self._extended(server, timeout):
                # Died, hung importing, or found that its forks would hang: this probe spawns from now on under
                # these conditions; a spawned child meets the same import, if that was the trouble, and reports
                # it as the trial's.
                self._give_up(server)
                return None
            with signals_deferred():
                stem, events_path, stderr_path = self._next_files()
                order = ForkOrder(
                    request=str(request_path),
                    events=str(events_path),
                    stdout=str(stem.with_suffix(".stdout")),
                    stderr=str(stderr_path),
                    memory_limit=conditions.memory_limit,
                )
                lifeline_read, lifeline_write = os.pipe()
                try:
                    process = server.channel.fork(order, lifeline_read)
                finally:
                    os.close(lifeline_read)
                if process is not None:
                    return StartedChild(
                        process, lifeline_write, events_path, stderr_path, conditions, warm=True, forked=True
                    )
                os.close(lifeline_write)
                self.drop_lost()  # it did not take the order: a fresh one, or none (then spawned)
        return None

    @staticmethod
    def _extended(server: _Server, timeout: float) -> bool:
        """Wait for the answer to an ``ImportOrder`` sent to ``server``, if one is pending: whether it can fork."""
        if not server.extending:
            return True
        reply = server.channel.extended(import_timeout(timeout))
        server.extending = False
        return reply is not None and reply.safe

    def unfit(self, child: StartedChild) -> None:
        """A fork that ended, or stayed silent, before its first report: stop it; its request did not fail.

        Either the server was lost meanwhile (counted: ``drop_lost``), or the
        fork could not set itself up (no room for its files, say): then this
        probe spawns under these conditions, and a spawned child meets the cause
        and reports it as the spawned path does.
        """
        stop_child(child)
        if self._server is not None and not self._server.channel.lost:
            self._give_up(self._server)
        self.drop_lost()

    def drop_lost(self) -> None:
        """Stop the server if it was lost, and count it: after ``SERVER_LOSSES`` of them its conditions spawn."""
        server = self._server
        if server is None or not server.channel.lost:
            return
        self._losses[server.key] = self._losses.get(server.key, 0) + 1
        if self._losses[server.key] >= SERVER_LOSSES:
            self._unforkable.add(server.key)
        self.stop()

    def _give_up(self, server: _Server) -> None:
        self._unforkable.add(server.key)
        self.stop()

    def stop(self) -> None:
        """Stop the server, if any: it reads EOF and exits; its keeper's lifeline ends its tree regardless."""
        server, self._server = self._server, None
        if server is not None:
            server.channel.close()
            stop_child(server.started)


def added_imports(started: Conditions, wanted: Conditions) -> tuple[str, ...]:
    """The modules a process started under ``started`` must import to be one started under ``wanted``: what
    ``wanted``'s preload adds after ``started``'s, when that is all that differs (else none: it cannot become one)."""
    same = replace(started, preload=()) == replace(wanted, preload=())
    if not same or wanted.preload[: len(started.preload)] != started.preload:
        return ()
    return wanted.preload[len(started.preload) :]
