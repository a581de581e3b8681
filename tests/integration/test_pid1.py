"""isoprobe as PID 1 (a container's entrypoint): signals forwarded, orphans reaped, exit status passed on.

Each test runs in a fresh PID namespace (``unshare --pid --fork --mount-proc``,
root only), where the process started is PID 1, as in ``docker run``. From out
here that process is the child of ``unshare``; signals go to it by its host PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, faulty_spec, wait_for as _wait_for


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]

#: The entry point as the brief wires it: ``main_as_pid1(cli.main)``, arguments from sys.argv.
ENTRY = (
    "import sys; from isoprobe.system.pid1 import main_as_pid1; from isoprobe.cli.main import main; "
    "sys.exit(main_as_pid1(main))"
)


@pytest.fixture(scope="module", autouse=True)
def pid_namespaces():
    if sys.platform != "linux":
        pytest.skip("PID namespaces are Linux only")
    try:
        probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("unshare (util-linux) is not installed")
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here (needs root or user namespaces): {probe.stderr.strip()}")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return state, int(ppid)


def _tree(root: int) -> dict[int, str]:
    """``root`` and all its descendants, zombies included: {pid: state}."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            table[int(entry)] = found
    tree, frontier = {}, [root]
    while frontier:
        current = frontier.pop()
        if current in table:
            tree[current] = table[current][0]
        frontier += [pid for pid, (_, ppid) in table.items() if ppid == current]
    return tree


@pytest.fixture
def start():
    """``start(argv, env)`` runs ``argv`` as PID 1 of a new PID namespace: the Popen of ``unshare``, PID 1's host PID.

    The host PID is None for a program that was over before it was seen.

    ``unshare`` leads a process group of its own (so a signal to "the group" is
    Ctrl-C on a terminal, and reaches nothing of pytest's). A namespace still
    running when the test ends (it failed) is killed whole: SIGKILL to its PID 1.
    """
    started: list[tuple[subprocess.Popen, int | None]] = []

    def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int | None]:
        outer = subprocess.Popen(
            [*UNSHARE, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        started.append((outer, None))

        def pid1() -> list[int] | None:
            children = [pid for pid in _tree(outer.pid) if (_stat(pid) or ("", 0))[1] == outer.pid]
            return children or (None if outer.poll() is None else [None])

        found = _wait_for(pid1, 30)
        assert found, "PID 1 of the namespace did not start"
        if found[0] is None:  # a short program: already over (its output and status tell the rest)
            return outer, None
        started[-1] = (outer, found[0])
        try:
            with open(f"/proc/{found[0]}/status") as status:
                nspid = next(line for line in status if line.startswith("NSpid:")).split()
        except OSError:  # ended meanwhile
            return outer, None
        assert nspid[-1] == "1", nspid
        return outer, found[0]

    yield run
    for outer, pid1 in started:
        if outer.poll() is None:
            try:
                os.kill(pid1 or outer.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            outer.kill()
        outer.wait(timeout=30)  # not communicate(): a test's reader thread may still hold a pipe


def _program(tmp_path: Path, body: str) -> Path:
    """A script whose ``main(argv)`` (in ``body``) runs through ``main_as_pid1``."""
    path = tmp_path / "program.py"
    path.write_text(
        "import json, os, signal, sys, time\n"
        "from isoprobe.system.pid1 import main_as_pid1\n\n"
        + textwrap.dedent(body)
        + "\nsys.exit(main_as_pid1(main))\n"
    )
    return path


# ---- (a) the real isoprobe, SIGTERM mid-probe -------------------------------------------------


def _leaking_spec(tmp_path: Path) -> Path:
    # Every trial leaves a grandchild (`sleep 1000`) in its process group and fits. The local executor
    # kills the group after the trial; by then the sleep is an orphan of PID 1, which must reap it.
    # `edge` is far away: the probe has dozens of trials to go when the SIGTERM comes.
    path = tmp_path / "leaking.yaml"
    path.write_text(json.dumps(faulty_spec("grandchild", at=2, edge=1000000, trial_timeout=120)))
    return path


def _sleepers(tree: dict[int, str]) -> set[int]:
    found = set()
    for pid in tree:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"1000"]:
                found.add(pid)
        except OSError:
            pass
    return found


def test_sigterm_to_pid_1_mid_probe_gives_one_json_document_exit_143_and_no_zombie(tmp_path, start):
    outer, pid1 = start(
        [sys.executable, "-c", ENTRY, "run", str(_leaking_spec(tmp_path))],
        env={"ISOPROBE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert pid1, "isoprobe ended at once"
    stdout_lines: list[str] = []
    stderr_lines: list[str] = []
    readers = [threading.Thread(target=lambda: stdout_lines.extend(outer.stdout), daemon=True),
               threading.Thread(target=lambda: stderr_lines.extend(outer.stderr), daemon=True)]
    for reader in readers:
        reader.start()

    # Watch the namespace until some trials' leaked sleeps have been killed: each one is then an
    # orphan of PID 1, and must be gone from /proc (reaped), not left a zombie.
    seen: set[int] = set()
    seen_tree: set[int] = set()

    def some_sleepers_killed() -> bool:
        tree = _tree(pid1)
        seen_tree.update(tree)
        seen.update(_sleepers(tree))
        ended = [pid for pid in seen if tree.get(pid, "Z") == "Z"]  # a zombie, or gone (reaped)
        return sum(1 for line in stderr_lines if line.startswith("isoprobe: trial ")) >= 3 and len(ended) >= 2

    assert _wait_for(some_sleepers_killed, 60), f"no trial's grandchild came and went: {''.join(stderr_lines)[-3000:]}"
    assert outer.poll() is None, "the probe ended before the SIGTERM"
    # The orphans' zombies are PID 1's to reap (isoprobe's own children are its Popen's). One may
    # exist for an instant between an exit and its reaping; one that lasts is a leak.
    def orphaned_zombies() -> set[int]:
        return {pid for pid, state in _tree(pid1).items() if state == "Z" and (_stat(pid) or ("", 0))[1] == pid1}

    first = orphaned_zombies()
    time.sleep(1.0)
    lasting = first & orphaned_zombies()
    assert not lasting, f"zombies left unreaped by PID 1: {lasting}"

    sent = time.monotonic()
    os.kill(pid1, signal.SIGTERM)
    outer.wait(timeout=30)
    took = time.monotonic() - sent
    for reader in readers:
        reader.join(timeout=5)
    stdout, stderr = "".join(stdout_lines), "".join(stderr_lines)
    assert outer.returncode == 143, stderr[-3000:]
    result = json.loads(stdout)  # exactly one JSON document: anything more fails to parse
    assert result["stop_reason"] == "terminated"
    assert result["answered"] is False
    assert len(result["trials"]) >= 3
    assert took < 10, f"took {took:.1f} s to stop"
    left = [pid for pid in seen_tree if _stat(pid) is not None]
    assert not left, f"left behind: {left}"


# ---- (b) orphans are reaped ------------------------------------------------------------------

ORPHANS = """
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None  # gone: reaped


def parent(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def main(argv):
    # Five times: a child forks a grandchild and exits at once, so the grandchild (alive for
    # half a second more) is an orphan, re-parented to PID 1.
    orphans, parents = [], []
    for _ in range(5):
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(0.5)
                os._exit(0)
            os.write(write, str(grandchild).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(middle, 0)
        orphans.append(int(os.read(read, 32)))
        os.close(read)
        parents.append(parent(orphans[-1]))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(state(pid) not in (None, "Z") for pid in orphans):
        time.sleep(0.02)
    time.sleep(0.5)  # all have ended; PID 1 has had time to reap them
    zombies = sorted(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and state(int(pid)) == "Z")
    print(json.dumps({"me": os.getpid(), "orphans": orphans, "parents": parents, "zombies": zombies}))
    return 0
"""


@pytest.mark.parametrize("init", [True, False], ids=["as-init", "control-without-init"])
def test_orphans_reparented_to_pid_1_are_reaped(tmp_path, start, init):
    env = {} if init else {"ISOPROBE_NO_INIT": "1"}
    outer, _ = start([sys.executable, str(_program(tmp_path, ORPHANS))], env=env)
    stdout, stderr = outer.communicate(timeout=30)
    assert outer.returncode == 0, stderr
    report = json.loads(stdout)
    assert len(report["orphans"]) == 5, report
    assert report["parents"] == [1] * 5, report  # they were orphans of PID 1 indeed
    if init:
        assert report["me"] == 2  # main runs in PID 1's child
        assert report["zombies"] == [], report
    else:
        # The same program with main itself as PID 1 (no init in front): every orphan stays a zombie.
        # This shows the check above can fail.
        assert report["me"] == 1
        assert report["zombies"] == sorted(report["orphans"]), report


# ---- (c) exit status passed through; signals forwarded, each exactly once ---------------------


@pytest.mark.parametrize(("body", "code"), [
    ("def main(argv):\n    return 3\n", 3),
    ("def main(argv):\n    return 0\n", 0),
    ("def main(argv):\n    raise RuntimeError('deliberate')\n", 1),
    ("def main(argv):\n    os.kill(os.getpid(), signal.SIGKILL)\n", 128 + 9),
    ("def main(argv):\n    sys.exit(2)\n", 2),
], ids=["returns-3", "returns-0", "raises", "killed-by-sigkill", "sys-exit-2"])
def test_the_exit_status_of_main_is_pid_1s(tmp_path, start, body, code):
    outer, _ = start([sys.executable, str(_program(tmp_path, body))])
    _, stderr = outer.communicate(timeout=30)
    assert outer.returncode == code, stderr


def test_arguments_reach_main(tmp_path, start):
    program = _program(tmp_path, "def main(argv):\n    print(json.dumps([argv, sys.argv[1:], os.getpid()]))\n    return 0\n")
    outer, _ = start([sys.executable, str(program), "run", "a spec.yaml", "--format", "json"])
    stdout, stderr = outer.communicate(timeout=30)
    assert outer.returncode == 0, stderr
    assert json.loads(stdout) == [None, ["run", "a spec.yaml", "--format", "json"], 2]


FORWARDED = ["SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT"]

COUNTING = """
FORWARDED = [getattr(signal, name) for name in %r]


def main(argv):
    got = []
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: got.append(signal.Signals(signum).name))
    print("ready", flush=True)
    deadline = time.monotonic() + 10
    while len(got) < len(FORWARDED) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # a duplicate would land now
    print(json.dumps({"got": got, "pgid": os.getpgrp(), "sid": os.getsid(0)}), flush=True)
    return 0
""" % FORWARDED


def test_each_signal_reaches_main_once_even_when_sent_to_the_whole_group(tmp_path, start):
    outer, pid1 = start([sys.executable, str(_program(tmp_path, COUNTING))])
    assert pid1, "the program ended at once"
    assert outer.stdout.readline() == "ready\n"
    for name in FORWARDED[:-1]:
        os.kill(pid1, getattr(signal, name))  # as `docker kill --signal` / `docker stop` do
        time.sleep(0.05)
    # Ctrl-C on a terminal goes to its whole foreground process group: here unshare's and PID 1's.
    # isoprobe must get it once (forwarded by PID 1), not a second time directly.
    os.killpg(outer.pid, signal.SIGINT)
    stdout, stderr = outer.communicate(timeout=30)
    assert outer.returncode == 0, stderr
    report = json.loads(stdout)
    assert sorted(report["got"]) == sorted(FORWARDED), report
    assert report["pgid"] == report["sid"] == 2, report  # main leads a session of its own
