"""Files in a shared cache folder are opened without trusting what lies there (isoprobe.system.files).

No processes: a FIFO, a symbolic link to /dev/zero or to a victim's file, a
folder and a huge sparse file are made in tmp_path, and each read or lock must
refuse or replace them at once. Where the old code would hang on a FIFO, the
call runs in a thread with a deadline; where it would read /dev/zero until
memory runs out, the process's data segment is capped around the call, so the
old code fails with MemoryError instead of taking the machine's memory.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading

import pytest

from isoprobe.cache.store import ENTRY_LIMIT, ResultCache
from isoprobe.system.files import KeyLock, UntrustedFile, read_bounded, sha256_of


def finishes(call, seconds: float = 10.0):
    """``call()``'s return value (or exception), failing the test if it has not finished within ``seconds``."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def unblock(fifo) -> None:
    """Open the FIFO's other end once, so that a reader blocked on it (the old code) can end."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def data_capped(extra: int = 256 * 1024**2):
    """This process may allocate about ``extra`` more bytes of data segment while inside (RLIMIT_DATA)."""
    with open("/proc/self/status") as status:
        data = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (data + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def test_an_entry_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    store = ResultCache(tmp_path)
    os.mkfifo(store.entry("k"))
    try:
        with pytest.raises(UntrustedFile, match="a FIFO, not a regular file"):
            finishes(lambda: store.read("k"))
    finally:
        unblock(store.entry("k"))


def test_an_entry_that_links_to_dev_zero_is_refused_without_reading_it(tmp_path):
    store = ResultCache(tmp_path)
    store.entry("k").symlink_to("/dev/zero")
    with data_capped(), pytest.raises(UntrustedFile, match="symbolic link"):
        finishes(lambda: store.read("k"))


def test_a_link_is_refused_even_to_a_good_entry(tmp_path):
    store = ResultCache(tmp_path)
    store.write("good", '{"a": 1}')
    store.entry("k").symlink_to(store.entry("good"))
    with pytest.raises(UntrustedFile, match="symbolic link"):
        store.read("k")


def test_an_entry_that_is_a_folder_or_too_large_is_refused(tmp_path):
    store = ResultCache(tmp_path)
    store.entry("folder").mkdir()
    with pytest.raises(UntrustedFile, match="a folder, not a regular file"):
        store.read("folder")
    with open(store.entry("huge"), "wb") as huge:
        huge.truncate(ENTRY_LIMIT + 1)  # sparse: costs no disk
    with data_capped(), pytest.raises(UntrustedFile, match=f"larger than {ENTRY_LIMIT} bytes"):
        store.read("huge")


def test_a_bounded_read_returns_a_whole_regular_file_up_to_its_limit(tmp_path):
    file = tmp_path / "f"
    assert read_bounded(file, 4) is None  # nothing there is not a refusal
    file.write_bytes(b"1234")
    assert read_bounded(file, 4) == b"1234"
    with pytest.raises(UntrustedFile, match="larger than 3 bytes"):
        read_bounded(file, 3)


def test_hashing_refuses_what_is_not_a_regular_file(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    try:
        with data_capped(), pytest.raises(UntrustedFile):
            finishes(lambda: sha256_of(tmp_path / "zero"))
        with pytest.raises(UntrustedFile, match="FIFO"):
            finishes(lambda: sha256_of(tmp_path / "fifo"))
    finally:
        unblock(tmp_path / "fifo")
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256_of(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_of(tmp_path / "missing") is None


def test_the_lock_excludes_a_second_holder_until_released(tmp_path):
    first, second = KeyLock(tmp_path / "k.lock"), KeyLock(tmp_path / "k.lock")
    assert first.try_acquire()
    assert not second.try_acquire()  # flock: another open file description, even in this process
    first.release()
    assert second.try_acquire()
    second.release()
    with first:
        assert not second.try_acquire()
    assert second.try_acquire()
    second.release()


def test_a_lock_that_links_to_another_file_is_replaced_and_the_file_left_whole(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("somebody's work")
    lock_path = tmp_path / "k.lock"
    lock_path.symlink_to(victim)
    lock = KeyLock(lock_path)
    assert finishes(lock.try_acquire)
    lock.release()
    assert victim.read_text() == "somebody's work"  # the old lock opened it with O_TRUNC
    assert lock_path.is_file() and not lock_path.is_symlink()
    assert lock.notes == [f"removed {lock_path}: it was a symbolic link, not a regular lock file"]


def test_a_lock_that_is_a_fifo_is_replaced_by_a_regular_file(tmp_path):
    lock_path = tmp_path / "k.lock"
    os.mkfifo(lock_path)
    lock = KeyLock(lock_path)
    try:
        assert finishes(lock.try_acquire)
    finally:
        lock.release()
        unblock(lock_path)
    assert lock_path.is_file()
    assert lock.notes == [f"removed {lock_path}: it was a FIFO, not a regular lock file"]


def test_a_lock_that_is_a_folder_is_an_error_with_a_reason(tmp_path):
    (tmp_path / "k.lock").mkdir()
    with pytest.raises(UntrustedFile, match="is a folder"):
        KeyLock(tmp_path / "k.lock").try_acquire()
