"""A process started before the environment check takes on the model's imports; it is not thrown away.

The probe starts the trials' process (the fork server, or a warm spare) while the environment check runs,
under the conditions it can know then; the check then reports the installed modules the model's code
imported (``Facts.model_imports``), which every trial's process preloads. Those conditions differ only by
what they add to the preload, and before issue 35 that difference stopped the process and started a new
one, which imported torch and the model library again while the first trial waited, silently: 8.6 s
measured on the Hugging Face path (tests/support/hf_trainers.py's GPT-2, 31 model imports), up to 21 s on a
loaded machine. Here, with no process and no torch: one server or spare is started, it is told to import
what the check added (``ImportOrder``, ``IMPORT_LINE``), and only conditions that change anything else
(the allocator, the cap of a spare) still start a new one. Real processes: tests/integration/test_fork_server.py.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from isoprobe.child.preload import read_modules
from isoprobe.executors import Conditions
from isoprobe.executors.child_process import StartedChild
from isoprobe.executors.fork_server_choice import ForkServers, added_imports
from isoprobe.executors.local import LocalExecutor
from isoprobe.protocol.messages import (IMPORT_LINE, SERVER_ORDER, Extended, ForkOrder, Forked, ImportOrder, Warm,
                                       event_line)

BEFORE = Conditions(backend="cpu", memory_limit=2**30, preload=("torch", "torch._dynamo", "transformers"))
AFTER = replace(BEFORE, preload=(*BEFORE.preload, "psutil", "tqdm.contrib"))


class Waiting:
    """A started child's keeper that waits until stopped (its lifeline closed), as ``subprocess.Popen`` shows one."""

    def __init__(self, lifeline_read: int):
        self.pid = 4343
        self.returncode = None
        self._lifeline = lifeline_read
        read, write = os.pipe()
        self._stdin_read = read
        self.stdin = os.fdopen(write, "wb")

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        os.close(self._lifeline)  # the keeper saw its lifeline close and ended
        self.returncode = 0
        return 0

    def lines(self) -> list[str]:
        """What the parent wrote on the child's stdin so far."""
        os.set_blocking(self._stdin_read, False)
        try:
            return os.read(self._stdin_read, 65536).decode().splitlines()
        except BlockingIOError:
            return []


def _started(conditions: Conditions, tmp_path: Path, count: int) -> StartedChild:
    lifeline_read, lifeline_write = os.pipe()
    events = tmp_path / f"child{count:03d}.events.jsonl"
    # The child has imported (``warm``): await_warm returns at once, as for a server that finished its preload.
    events.write_bytes(event_line(Warm(modules=[], seconds=0.0, cuda_initialized=False, idle_priority=False)))
    return StartedChild(Waiting(lifeline_read), lifeline_write, events, tmp_path / "err", conditions, warm=True)


class PlayedServer:
    """The server's end of one channel, answering in a thread: ``Extended`` to an import, ``Forked`` to a fork."""

    safe = True  # what it answers to an import: whether its forks are still safe

    def __init__(self, fd: int):
        self.socket = socket.socket(fileno=os.dup(fd))
        self.orders: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.socket, 65536, 1)
            except OSError:
                return
            if not data:
                return
            for fd in fds:
                os.close(fd)
            order = SERVER_ORDER.validate_json(data)
            self.orders.append(order)
            reply = (Extended(imported=len(read_modules(order.modules_file)), safe=self.safe) if isinstance(order, ImportOrder)
                     else Forked(pid=os.getpid()))
            self.socket.send(reply.model_dump_json().encode())


@pytest.fixture
def servers(tmp_path):
    """ForkServers whose ``spawn`` plays a server (no process): ``spawned`` lists each one started."""
    spawned: list[PlayedServer] = []

    def spawn(conditions: Conditions, fd: int) -> StartedChild:
        spawned.append(PlayedServer(fd))
        return _started(conditions, tmp_path, len(spawned))

    count = iter(range(100, 1000))

    def next_files():
        stem = tmp_path / f"child{next(count)}"
        return stem, stem.with_suffix(".events.jsonl"), stem.with_suffix(".stderr")

    made = ForkServers(frozenset({"cpu"}), spawn, next_files)
    yield made, spawned
    made.stop()


def test_the_server_started_before_the_check_imports_the_models_modules_instead_of_being_replaced(servers, tmp_path):
    made, spawned = servers
    made.server_for(BEFORE)  # the probe's guess, while the environment check runs
    made.server_for(AFTER)  # the check's model imports: the same server, told to import them
    child = made.fork(tmp_path / "trial.request.json", AFTER, timeout=60)
    assert child is not None and child.forked
    assert len(spawned) == 1, "a second server was started: it imports torch again while the first trial waits"
    import_order, fork_order = spawned[0].orders
    assert isinstance(import_order, ImportOrder) and read_modules(import_order.modules_file) == ["psutil", "tqdm.contrib"]
    assert isinstance(fork_order, ForkOrder) and fork_order.memory_limit == AFTER.memory_limit
    child.process.close()
    os.close(child.lifeline_write)


def test_conditions_that_change_more_than_the_preload_still_get_a_server_of_their_own(servers, tmp_path):
    made, spawned = servers
    made.server_for(BEFORE)
    made.server_for(replace(AFTER, allocator="expandable_segments:True"))  # set in its environment at exec
    assert len(spawned) == 2 and not any(isinstance(o, ImportOrder) for s in spawned for o in s.orders)


def test_a_server_that_cannot_fork_after_the_models_imports_makes_the_probe_spawn(servers, tmp_path, monkeypatch):
    made, spawned = servers
    made.server_for(BEFORE)
    monkeypatch.setattr(PlayedServer, "safe", False)  # CUDA initialised, or the canary fork hung, after them
    made.server_for(AFTER)
    assert made.fork(tmp_path / "trial.request.json", AFTER, timeout=60) is None  # spawned instead
    assert not made.forks(AFTER) and len(spawned) == 1


@pytest.mark.parametrize(("started", "wanted", "added"), [
    (BEFORE, AFTER, ("psutil", "tqdm.contrib")),
    (BEFORE, BEFORE, ()),
    (AFTER, BEFORE, ()),  # fewer modules: a process cannot un-import
    (BEFORE, replace(AFTER, memory_limit=2**31), ()),  # a spawned child's cap is set at exec
    (BEFORE, replace(AFTER, preload=("torch", "psutil")), ()),  # not an extension of the same order
])
def test_added_imports_is_only_a_longer_preload_in_the_same_order(started, wanted, added):
    assert added_imports(started, wanted) == added


def test_a_warm_spare_started_before_the_check_imports_the_models_modules_instead_of_being_replaced(tmp_path,
                                                                                                   monkeypatch):
    spawned: list[StartedChild] = []

    def spawn(self, conditions, *, spare, serve=None):
        spawned.append(_started(conditions, tmp_path, len(spawned) + 1))
        return spawned[-1]

    monkeypatch.setattr(LocalExecutor, "_spawn", spawn)
    with LocalExecutor(tmp_path, warm=True) as executor:
        executor.prestart(BEFORE)
        executor.prestart(AFTER)
        assert len(spawned) == 1, "the spare was stopped and another started: it imports torch again"
        spare = spawned[0]
        (line,) = spare.process.lines()
        assert line.startswith(IMPORT_LINE) and read_modules(line[len(IMPORT_LINE):]) == ["psutil", "tqdm.contrib"]
        assert spare.conditions == AFTER and spare.warm_reports == 2  # delivered only after its second 'warm'
        assert executor._take_spare(AFTER) is spare
        executor.prestart(replace(AFTER, memory_limit=2**31))  # another cap: set at exec, a new spare
        assert len(spawned) == 2


def test_the_wait_that_remains_is_said_and_names_the_modules():
    """What the first trial still waits for (the model's imports, in the process started for it) is one line on
    stderr (``pipeline.run_probe``), not a silence; nothing is said when the model imported nothing more."""
    from isoprobe.pipeline.environment import model_imports_note, trial_conditions
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate({"model": {"hf_trainer": "train.py:build_trainer"}, "device": "cpu"})
    assert model_imports_note(spec, trial_conditions(spec, "cpu", 2**30)) is None
    note = model_imports_note(spec, trial_conditions(spec, "cpu", 2**30, model_imports=(
        "psutil", "tqdm.contrib", "tqdm.contrib.logging", "safetensors", "transformers.models.gpt2")))
    assert note.startswith("the model's code imports 4 installed module(s) beyond torch and the model library "
                           "(psutil, tqdm.contrib, tqdm.contrib.logging and 1 more)")  # transformers' own: preloaded
    assert "the first trial waits for that" in note
