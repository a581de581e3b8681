"""isoprobe's own modules are compiled from source in every child, whether or not bytecode caches exist.

Why: what isoprobe's own modules leave in a CPU trial's process depends on how
they are loaded, and the cap's credit (``child.core.memory``) is only as exact as
that is repeatable. Measured 2026-11-26 on this project's machine (small-cnn at
batch 152, one thread, data peak less the credit, against a plain process that
imports only torch: 1338.80 to 1338.96 MB in 3 runs): compiled from source, the
trial peaked at 1338.53 to 1338.92 MB (5 runs); loaded from ``__pycache__``
(a regular ``pip install``, or any second run where bytecode could be
written) at 1340.14 to 1340.32 MB (6 runs), 1.4 MiB above, one sample of
small-cnn at its edge. The import's own growth is what the credit measures, and
with bytecode it is smaller than what the modules end up costing (their
objects fill free room that the preload's imports left, room the user's first
steps would otherwise have used); compiling from source leaves room of its own
behind, which the trial's later allocations take, and the two balance to within
the runs' own spread. So the child always compiles, and a trial carries the same
memory in a development checkout, in CI and in a user's installed copy.

The cost is time, once per process: a spawned child compiles the ~40 modules it
imports after torch (measured ~0.3 s); a fork server compiles them once for all
its forks. Only ``isoprobe.*`` is affected: torch, pydantic and the user's modules
load as they always do. Standard library only: installed before anything else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

#: The package whose modules the finder compiles from source.
PACKAGE = "isoprobe"


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A source loader that neither reads nor writes bytecode caches."""

    def get_code(self, fullname: str):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class SourceOnlyFinder(importlib.abc.MetaPathFinder):
    """Finds ``isoprobe.*`` as the path finder does, and hands each source module to ``SourceOnlyLoader``."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = SourceOnlyLoader(spec.loader.name, spec.loader.path)
        return spec


def compile_own_from_source() -> None:
    """Put ``SourceOnlyFinder`` first on ``sys.meta_path`` (once): every ``isoprobe`` module imported from now on
    is compiled from its source."""
    if not any(isinstance(finder, SourceOnlyFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceOnlyFinder())
