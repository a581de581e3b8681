"""Where isoprobe's words go, and what happens when a destination cannot take them.

- **stdout** carries the answer (JSON, a table, or shell lines a job evaluates).
  A write that fails is reported, never hidden: :func:`emit` raises
  ``OutputFailed`` (exit 74; a closed pipe stays ``BrokenPipeError``, exit 141),
  and :func:`detach_stdout` points the descriptor at /dev/null so that the
  interpreter's final flush cannot fail a second time with a traceback of its own.
- **stderr** is for people: :func:`tell` never raises. If stderr itself is a full
  disk, there is nobody to tell, and the run goes on to its answer.
- **--log FILE** is a copy of what people would read, for hooks whose stderr
  nobody sees: :class:`Log`. A log that stops accepting writes (a full disk,
  ``/dev/full``) is said once on stderr and then left alone; it never costs the
  answer, which is what the job is waiting for.

Nothing here imports more than the standard library's os and sys: the CLI's
start-up time is part of its interface.
"""

from __future__ import annotations

import os
import sys


def emit(text: str, what: str = "the result to stdout") -> None:
    """Write ``text`` and a newline to stdout, now (flushed); ``OutputFailed``, naming ``what``, if that fails.

    All of it or an error: written to the descriptor until every byte is out. ``print`` is not that under
    ``PYTHONUNBUFFERED=1`` (containers set it): its text layer then writes to the file once, and a write to a
    full pipe that a signal interrupts part-way returns short; the rest was dropped without a word (measured:
    a 300 kB document cut at 64 KiB by one SIGTERM whose handler returned).
    """
    try:
        _write_all(text + "\n")
    except BrokenPipeError:
        raise  # the reader went away: exit 141, as for any well-behaved writer in a pipe
    except OSError as exc:
        from isoprobe.errors import OutputFailed

        raise OutputFailed(what, exc.strerror or str(exc)) from None


def _write_all(text: str) -> None:
    stream = sys.stdout
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO): it takes everything at once
        stream.write(text)
        stream.flush()
        return
    stream.flush()  # whatever was printed before goes first
    data = memoryview(text.encode(stream.encoding or "utf-8", stream.errors or "strict"))
    while data:
        data = data[os.write(descriptor, data) :]  # a short write (a signal, a full pipe): the rest, again


def detach_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered there is dropped at exit, quietly."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO): nothing will flush to it
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


def tell(line: str) -> None:
    """One line for people on stderr. Never raises: if stderr cannot be written, there is nobody to tell."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def open_for_appending(path: str | os.PathLike) -> int:
    """A descriptor that appends to ``path`` (created if missing), opened without blocking.

    For ``--log FILE``. A log may be a pipe or a terminal (``--log /dev/stderr``,
    ``--log >(logger)``), so unlike reading, any kind of file is accepted; but a
    FIFO with no reader would block ``open`` for ever, so it is opened with
    ``O_NONBLOCK`` (no reader: ``ENXIO``, an ``OSError``) and then switched back
    to blocking writes, so that a slow reader slows the log instead of losing it.
    """
    import fcntl

    descriptor = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644
    )
    flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
    fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return descriptor


class Log:
    """``--log FILE``: a copy of everything people would read (progress, errors, the result JSON).

    ``Log(None)`` is no log: ``say`` only tells stderr. Opening may raise
    ``OSError`` (the caller decides: a usage error, or in hook mode a warning);
    writing never does.
    """

    def __init__(self, path: str | None):
        self.path = path
        self._descriptor = open_for_appending(path) if path else None

    def write(self, text: str) -> None:
        """Append ``text`` (one newline at its end) to the log, if there is one and it still takes writes."""
        if self._descriptor is None:
            return
        data = (text.rstrip("\n") + "\n").encode("utf-8", errors="replace")
        try:
            while data:
                data = data[os.write(self._descriptor, data) :]
        except OSError as exc:
            self.close()
            tell(
                f"isoprobe: --log {self.path}: cannot write ({exc.strerror or exc}); the log stops here, "
                "the run goes on"
            )

    def say(self, line: str) -> None:
        """A line for people: stderr, and the log."""
        tell(line)
        self.write(line)

    def close(self) -> None:
        if self._descriptor is not None:
            descriptor, self._descriptor = self._descriptor, None
            try:
                os.close(descriptor)
            except OSError:
                pass
