"""What a waiting child imports ahead of its request: the names, their import, a list of more (standard library only).

A spawned child (``child.main``) and the fork server (``child.server``) import the modules of
``protocol.PRELOAD_ENV`` before anything of isoprobe's own, and later, when the parent sends a file
naming more (``IMPORT_LINE``, ``ImportOrder``: the model's imports, known once the environment check has
run), those too. Standard library only: it runs before torch (see ``child.main``).
"""

from __future__ import annotations

import os

from isoprobe.protocol.wiring import PRELOAD_ENV


def preload_names() -> list[str]:
    """The modules ``PRELOAD_ENV`` names (comma-separated), in order."""
    return [m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m]


def import_modules(modules: list[str]) -> list[str]:
    """Import ``modules`` in order, up to the first that fails: those imported.

    An import that fails is not this child's verdict: the modules after it are skipped, and the trial
    meets the same failure in its own import, where it is classified as the trial's.
    """
    imported = []
    for module in modules:
        try:
            __import__(module)
        except Exception:
            break
        imported.append(module)
    return imported


def read_modules(path: str) -> list[str]:
    """The modules a file names, one a line (``IMPORT_LINE``, ``ImportOrder``); none if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError:
        return []
