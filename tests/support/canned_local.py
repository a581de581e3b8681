"""The real local executor (and the gang over it) with canned children: for the tests of how runs are recorded.

``CannedLocal`` is ``LocalExecutor`` with only ``launch`` replaced: each launch
answers its request from a ``scripted`` script at once, as a child that has
already ended (its events and stderr written to files, its keeper's exit
status the run's). Everything after the launch is the executor's own code:
``run``, the rounds, the gang's supervisor, ``stop`` and ``collect`` over those
files. So a signal can be made to land at a chosen point between a child's end
and its trial being recorded (``hooks``), and a fork server's loss can be
played (``lose``), with no process and no torch. Not a test module; the unit
tests import it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from isoprobe.executors import ChildRun, Conditions
from isoprobe.executors.child_process import StartedChild
from isoprobe.executors.local import Launch, LocalExecutor
from isoprobe.executors.scripted import Script, ScriptedExecutor, inspected
from isoprobe.protocol.messages import InspectRequest, event_line


class EndedProcess:
    """A keeper that has already exited, as ``subprocess.Popen`` shows one; ``on_seen`` runs when its end is first
    looked at (``poll`` or ``wait``), as if something happened right then."""

    stdin = None

    def __init__(self, returncode: int, on_seen: Callable[[], None] | None = None):
        self.pid = 4242
        self.returncode = returncode
        self._on_seen = on_seen

    def _seen(self) -> int:
        hook, self._on_seen = self._on_seen, None
        if hook is not None:
            hook()
        return self.returncode

    def poll(self) -> int:
        return self._seen()

    def wait(self, timeout: float | None = None) -> int:
        return self._seen()


class CannedLocal(LocalExecutor):
    """``LocalExecutor`` whose launches are children that ended as ``script`` says.

    ``lose(name, attempt)``: why the fork server lost that launch's end (None:
    it did not); ``attempt`` counts the launches of that name's request from 1.
    ``on_seen(name)``: called when a launch's end is first looked at.
    ``launched``: every launch's name, in order; ``dropped``: how many times a lost server was dropped.
    """

    def __init__(self, script: Script, workdir: Path, *, lose: Callable[[str, int], str | None] | None = None,
                 on_seen: Callable[[str], None] | None = None):
        super().__init__(workdir)
        self.scripted = ScriptedExecutor(script)
        self.lose = lose
        self.on_seen = on_seen
        self.launched: list[str] = []
        self.dropped = 0
        self.servers.drop_lost = self._drop_lost

    def _drop_lost(self) -> None:
        self.dropped += 1

    def launch(self, request, conditions: Conditions, *, timeout: float, name: str) -> Launch:
        self.launched.append(name)
        if isinstance(request, InspectRequest):
            run = inspected()
        else:
            run = self.scripted.run(request, conditions, timeout=timeout, name=name)
        events_path, stderr_path = self.workdir / f"{name}.events.jsonl", self.workdir / f"{name}.stderr"
        events_path.write_bytes(b"".join(event_line(event) for event in run.events))
        stderr_path.write_text(run.stderr_tail)
        stem = name.split("-again")[0]
        attempt = sum(1 for launched in self.launched if launched.split("-again")[0] == stem)
        lost = self.lose(name, attempt) if self.lose is not None and not isinstance(request, InspectRequest) else None
        hook = (lambda: self.on_seen(name)) if self.on_seen is not None else None
        process = EndedProcess(-9 if lost else run.returncode, hook)
        now = time.monotonic()
        launch = Launch(began=now, child=StartedChild(process, -1, events_path, stderr_path, conditions, warm=False),
                        delivered=now)
        launch.lost = lost
        return launch

    def collect(self, launch: Launch) -> ChildRun:
        return replace(LocalExecutor.collect(launch), lost=launch.lost)
