"""The parent's end of the fork server's channel, against a server played by the test (no processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

from isoprobe.child.server import resident_file_ranges
from isoprobe.executors.fork_server_channel import ServerChannel
from isoprobe.protocol.messages import SERVER_ORDER, SERVER_REPLY, Ended, Extended, ForkOrder, Forked, ImportOrder


@pytest.fixture
def ends():
    parent, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield ServerChannel(parent), server
    parent.close()
    server.close()


ORDER = ForkOrder(request="/r.json", events="/e.jsonl", stdout="/o", stderr="/e", memory_limit=123)


def _take_order(server: socket.socket) -> tuple[ForkOrder, list[int]]:
    data, fds, _, _ = socket.recv_fds(server, 65536, 1)
    return ForkOrder.model_validate_json(data), fds


def test_an_order_carries_the_lifeline_and_the_reply_names_the_process(ends):
    channel, server = ends
    read, write = os.pipe()
    server.send(Forked(pid=4242).model_dump_json().encode())  # SEQPACKET: replies queue as whole messages
    process = channel.fork(ORDER, read)
    order, fds = _take_order(server)
    assert order == ORDER and len(fds) == 1
    os.close(write)
    assert os.read(fds[0], 1) == b""  # the same pipe: its write end closed, the server's copy reads EOF
    for fd in (read, *fds):
        os.close(fd)
    assert process is not None and process.pid == 4242 and process.poll() is None


@pytest.mark.parametrize(("status", "code"), [(0, 0), (3 << 8, 3), (signal.SIGKILL, -signal.SIGKILL),
                                              (signal.SIGSEGV, -signal.SIGSEGV)])
def test_the_end_is_the_raw_wait_status_as_popen_reports_it(ends, status, code):
    channel, server = ends
    server.send(Forked(pid=7).model_dump_json().encode())
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.05)
    server.send(Ended(pid=7, status=status).model_dump_json().encode())
    assert process.wait(timeout=5) == code and process.returncode == code
    os.close(read)
    os.close(write)


@pytest.mark.parametrize("end", ["eof", "garbage"])
def test_a_server_that_is_gone_or_talks_nonsense_leaves_a_killed_trial_never_a_clean_exit(ends, end):
    channel, server = ends
    server.send(Forked(pid=9).model_dump_json().encode())
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    if end == "eof":
        server.close()
    else:
        server.send(b'{"reply": "ended", "pid": 9, "status": "zero"}')
    assert process.wait(timeout=5) == -signal.SIGKILL
    assert channel.lost
    assert channel.fork(ORDER, read) is None  # and no further order goes to it
    os.close(read)
    os.close(write)


def test_an_order_the_server_does_not_answer_is_refused_not_waited_for_ever(ends, monkeypatch):
    import isoprobe.executors.fork_server_channel as fork_server_channel

    monkeypatch.setattr(fork_server_channel, "FORK_REPLY_SECONDS", 0.05)
    channel, _ = ends
    read, write = os.pipe()
    assert channel.fork(ORDER, read) is None and channel.lost
    os.close(read)
    os.close(write)


def test_the_replies_are_typed_and_strict():
    assert isinstance(SERVER_REPLY.validate_json(b'{"reply": "forked", "pid": 1}'), Forked)
    with pytest.raises(ValueError):
        SERVER_REPLY.validate_json(b'{"reply": "forked", "pid": 1, "extra": 2}')


def test_resident_file_ranges_are_page_aligned_runs_inside_file_mappings():
    flat = iter(resident_file_ranges())
    runs = list(zip(flat, flat))
    assert runs, "this interpreter has resident library pages"
    page = os.sysconf("SC_PAGE_SIZE")
    assert all(address % page == 0 and length > 0 and length % page == 0 for address, length in runs)


def test_overlapping_trials_each_get_their_own_end_whatever_order_the_replies_come_in(ends):
    """A gang's ranks run at once: an Ended for one rank may arrive while another's Forked or Ended is awaited."""
    channel, server = ends
    lifelines = [os.pipe() for _ in range(2)]
    server.send(Forked(pid=101).model_dump_json().encode())
    first = channel.fork(ORDER, lifelines[0][0])
    server.send(Ended(pid=101, status=9).model_dump_json().encode())  # rank 0 killed before rank 1's fork reply
    server.send(Forked(pid=102).model_dump_json().encode())
    second = channel.fork(ORDER, lifelines[1][0])
    assert (first.pid, second.pid) == (101, 102)
    server.send(Ended(pid=102, status=0).model_dump_json().encode())
    assert second.wait(timeout=1) == 0
    assert first.poll() == -signal.SIGKILL  # its status was kept for it while the second fork was awaited
    assert not channel.lost
    for read, write in lifelines:
        os.close(read)
        os.close(write)


def test_a_server_that_does_not_report_a_trial_that_ended_is_lost_within_the_margin(ends, monkeypatch):
    """A stopped (SIGSTOP) or wedged server never sends ``Ended``: the keeper's own end is seen, and the wait ends."""
    import isoprobe.executors.fork_server_channel as fork_server_channel

    monkeypatch.setattr(fork_server_channel, "ENDED_REPLY_SECONDS", 0.3, raising=False)
    channel, server = ends
    keeper = subprocess.Popen(["sleep", "0.2"])  # plays the forked keeper: a real process that ends on its own
    server.send(Forked(pid=keeper.pid).model_dump_json().encode())
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    assert process.poll() is None  # running: no verdict yet, and the server is not suspected
    try:
        assert process.wait(timeout=30) == -signal.SIGKILL  # never a clean exit: the end is unknown
    finally:
        keeper.wait()
        for fd in (read, write):
            os.close(fd)
    assert process.lost is not None and "did not report the end" in process.lost
    assert channel.lost == process.lost and channel.fork(ORDER, read) is None


def test_a_reply_that_comes_in_the_margin_is_the_trials_end_not_a_loss(ends, monkeypatch):
    import isoprobe.executors.fork_server_channel as fork_server_channel

    monkeypatch.setattr(fork_server_channel, "ENDED_REPLY_SECONDS", 30)
    channel, server = ends
    keeper = subprocess.Popen(["true"])
    keeper.wait()  # ended (and reaped here, as the server reaps its keepers): its Ended comes a little later
    server.send(Forked(pid=keeper.pid).model_dump_json().encode())
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    server.send(Ended(pid=keeper.pid, status=0).model_dump_json().encode())
    assert process.wait(timeout=5) == 0 and process.lost is None and not channel.lost
    os.close(read)
    os.close(write)


def test_waiting_for_a_forked_trial_has_no_for_ever(ends):
    channel, server = ends
    server.send(Forked(pid=os.getpid()).model_dump_json().encode())  # a process that will not end meanwhile
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    with pytest.raises(TypeError):
        process.wait()  # every caller names its bound
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    os.close(read)
    os.close(write)


def test_an_import_order_is_answered_before_the_next_fork_and_an_end_meanwhile_is_kept(ends):
    """The model's imports, after the environment check (``ImportOrder``): a trial's end that arrives before the
    answer is kept for its collect, as during a fork order."""
    channel, server = ends
    server.send(Forked(pid=31).model_dump_json().encode())
    read, write = os.pipe()
    process = channel.fork(ORDER, read)
    for fd in _take_order(server)[1]:
        os.close(fd)
    assert channel.extend("/scratch/child004.imports")
    assert SERVER_ORDER.validate_json(server.recv(65536)) == ImportOrder(modules_file="/scratch/child004.imports")
    server.send(Ended(pid=31, status=0).model_dump_json().encode())
    server.send(Extended(imported=1, safe=True).model_dump_json().encode())
    assert channel.extended(timeout=5) == Extended(imported=1, safe=True)
    assert process.poll() == 0 and not channel.lost
    os.close(read)
    os.close(write)


@pytest.mark.parametrize("end", ["silent", "eof", "forked"])
def test_a_server_that_does_not_answer_an_import_order_is_lost_not_waited_for_ever(ends, end):
    channel, server = ends
    assert channel.extend("/scratch/child004.imports")
    if end == "eof":
        server.close()
    elif end == "forked":
        server.send(Forked(pid=5).model_dump_json().encode())  # an answer to an order nobody gave
    assert channel.extended(timeout=0.05) is None and channel.lost
    assert not channel.extend("/scratch/child004.imports")  # and no further order goes to it


def test_the_server_tells_an_import_order_from_a_fork_order():
    assert SERVER_ORDER.validate_json(ORDER.model_dump_json()) == ORDER
    assert isinstance(SERVER_ORDER.validate_json(b'{"order": "import", "modules_file": "/m"}'), ImportOrder)
    with pytest.raises(ValueError):
        SERVER_ORDER.validate_json(b'{"order": "import", "modules_file": "/m", "request": "/r.json"}')
