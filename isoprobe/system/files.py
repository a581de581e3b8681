"""Files in a cache folder that others can write, opened without trusting what lies there.

A cluster's cache folder is shared, so anything can sit under an entry's or a
lock's name: a FIFO (an ordinary open waits forever for a writer, so every job
hangs), a symbolic link to /dev/zero (an ordinary read never ends and eats the
node's memory) or to somebody's own file (an ordinary lock open truncates it).
So every file here is opened with ``O_NOFOLLOW`` (a link is refused, never
followed) and ``O_NONBLOCK`` (a FIFO opens at once instead of waiting), and is
checked with ``fstat`` to be a regular file before a byte is read; a read
stops one byte past its bound. What is refused raises ``UntrustedFile``, whose
text says why, for people.

Stdlib only: the trial child imports this too, to hash the sources it ran.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import time
from pathlib import Path

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
#: O_NOFOLLOW on a symbolic link fails with ELOOP on Linux (EMLINK on the BSDs).
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)


class UntrustedFile(OSError):
    """A path that exists but is not a regular file within its bound; ``str()`` is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_regular(path: Path | str) -> int | None:
    """A descriptor on ``path`` if it is a regular file, None if nothing is there; UntrustedFile otherwise."""
    try:
        descriptor = os.open(path, _READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise UntrustedFile("it is a symbolic link") from None
        raise
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UntrustedFile(f"it is {_kind(mode)}, not a regular file")
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def read_bounded(path: Path | str, limit: int) -> bytes | None:
    """The whole regular file at ``path`` (None if there is none), refused past ``limit`` bytes."""
    descriptor = _open_regular(path)
    if descriptor is None:
        return None
    try:
        if os.fstat(descriptor).st_size > limit:
            raise UntrustedFile(f"it is larger than {limit} bytes")
        chunks, left = [], limit + 1  # one byte past the bound tells a file that grew since fstat
        while left > 0 and (chunk := os.read(descriptor, min(left, _CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UntrustedFile(f"it is larger than {limit} bytes")
    return data


def sha256_of(path: Path | str) -> str | None:
    """SHA-256 of the regular file at ``path`` (read in chunks), None if there is none; UntrustedFile otherwise."""
    descriptor = _open_regular(path)
    if descriptor is None:
        return None
    digest = hashlib.sha256()
    try:
        while chunk := os.read(descriptor, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(descriptor)
    return digest.hexdigest()


class KeyLock:
    """An exclusive ``flock`` on one regular lock file; the kernel releases it if its holder dies.

    Opening the lock file is where a trap would bite, so a symbolic link, a
    FIFO or any other non-regular file under the lock's name is removed (with a
    note in ``notes``) and a regular file is made in its place; what cannot be
    removed (a folder, another user's file in a sticky folder) is an
    ``UntrustedFile``. Two runs that both remove the same trap may each lock
    their own new file, and then both probe: the cost is a probe, never an answer.
    """

    POLL_SECONDS = 0.05

    def __init__(self, path: Path):
        self.path = path
        self.notes: list[str] = []
        self._descriptor: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; False when another process does."""
        for _ in range(5):
            descriptor = self._open()
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                return False
            except BaseException:
                os.close(descriptor)
                raise
            if self._still_named(descriptor):
                self._descriptor = descriptor
                return True
            os.close(descriptor)  # the name was replaced meanwhile: a lock on an orphan excludes nobody
        raise UntrustedFile(f"the lock file {self.path} keeps being replaced")

    def acquire(self) -> None:
        """Wait for the lock (as long as its holder probes; a holder that dies releases it)."""
        while not self.try_acquire():
            time.sleep(self.POLL_SECONDS)

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing the last descriptor releases the flock
            self._descriptor = None

    def __enter__(self) -> KeyLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _still_named(self, descriptor: int) -> bool:
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(descriptor)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def _open(self) -> int:
        for _ in range(3):
            try:
                descriptor = os.open(
                    self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o664
                )
            except PermissionError:
                # Another user's lock file without group write: a read-only descriptor takes a local flock.
                descriptor = os.open(self.path, _READ)
            except OSError as exc:
                if exc.errno in _LINK_ERRNOS:
                    self._remove_trap("a symbolic link")
                    continue
                if exc.errno == errno.EISDIR:
                    raise UntrustedFile(f"the lock file {self.path} is a folder") from None
                raise
            info = os.fstat(descriptor)
            if stat.S_ISREG(info.st_mode):
                if info.st_uid == os.geteuid() and info.st_mode & 0o060 != 0o060:
                    try:  # the job owners' group must be able to lock it too (a shared, setgid folder)
                        os.fchmod(descriptor, 0o664)
                    except OSError:
                        pass
                return descriptor
            os.close(descriptor)
            self._remove_trap(_kind(info.st_mode))
        raise UntrustedFile(f"the lock file {self.path} keeps being replaced by something that is not a regular file")

    def _remove_trap(self, kind: str) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # another run removed it first
        except OSError as exc:
            raise UntrustedFile(
                f"the lock file {self.path} is {kind}, not a regular file, and cannot be removed "
                f"({exc.strerror or exc})"
            ) from None
        self.notes.append(f"removed {self.path}: it was {kind}, not a regular lock file")
