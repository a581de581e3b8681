"""Reading a file a user named, without ever hanging or filling memory: regular files only, bounded.

isoprobe runs unattended (Slurm hooks, container entrypoints), so a path that
names something other than a file must not stop it: ``/dev/zero`` never ends,
``/dev/urandom`` is endless binary, a FIFO (named pipe) blocks on open until a
writer comes and on read until it closes, a socket cannot be opened at all.
Every file isoprobe reads because a user named it (the spec, a factory file,
a saved result) goes through :func:`read_regular_file`:

- the path is ``stat``-ed first, and anything but a regular file is refused
  without being opened (opening some devices has effects of its own);
- it is then opened with ``O_NONBLOCK`` (a FIFO swapped in after the check
  cannot block the open) and checked again on the open descriptor (``fstat``),
  which is what is actually read;
- at most ``limit + 1`` bytes are read, so a file that grows while it is read,
  or a huge one, costs no more memory than the limit.

What is wrong becomes a :class:`Refused` with a sentence for people and a fix;
a missing file or a permission problem stays the ``OSError`` it is.
"""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Refused(OSError):
    """The path names something isoprobe will not read: not a regular file, or larger than the limit.

    An ``OSError`` so that code that already handles unreadable files handles it
    too. ``reason`` is the words to show ("is a FIFO (named pipe), not a spec
    file"); ``kind`` is what the path is ('a directory'), or None when the file
    is only too large; the caller, who knows what the file was for, adds the fix.
    """

    def __init__(self, reason: str, kind: str | None):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


#: The fix for a refused path that is not a directory: what to do instead of a pipe or a device.
NOT_A_PIPE = "a pipe or a device is refused (it may never end); write the content to a file and give its path"


def kind_of(mode: int) -> str | None:
    """What a ``st_mode`` is, in words ('a FIFO (named pipe)'), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def _refuse_unless_regular(mode: int, what: str) -> None:
    kind = kind_of(mode)
    if kind is not None:
        raise Refused(f"is {kind}, not {what}", kind)


def read_regular_file(path: str | os.PathLike, limit: int, *, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    ``what`` names the file in a refusal ('a spec file': "is a FIFO (named pipe),
    not a spec file"). Raises ``Refused`` for a directory, a device, a FIFO, a
    socket or a file over ``limit`` bytes, and the ``OSError`` of the system
    otherwise (FileNotFoundError, PermissionError).
    """
    _refuse_unless_regular(os.stat(path).st_mode, what)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_unless_regular(os.fstat(descriptor).st_mode, what)  # what is read, not what was looked at
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    if size > limit:
        raise Refused(f"larger than {limit} bytes: not {what}", None)
    return b"".join(chunks)
