"""The child's side of the events channel: one event, one JSON line, one ``os.write``.

Apart from ``main`` so that every part of the child (the trial, the environment
check, the fork server) writes events without importing the entry that
dispatches to it. Stdlib only at import (see ``main``): the protocol's models
are imported on the first event.
"""

from __future__ import annotations

import os


class Events:
    """Append-only JSON-lines channel to the parent: one event, one line, one ``os.write``."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.set_inheritable(self._fd, False)  # explicit: a process the model starts must not inherit it

    def emit(self, event) -> None:
        from isoprobe.protocol.messages import event_line

        self.write(event_line(event))

    def write(self, line: bytes) -> None:
        os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)
