"""The one loader of isoprobe's standalone layer: the standard-library-only modules that run where isoprobe cannot
be imported by name.

Three places run isoprobe's code without its package. The keeper and a Slurm rank's wrapper run isolated
(``python -I -S``: no isoprobe on the path, no site-packages), and must start in milliseconds. The command trial's
shim runs inside the user's process, where importing ``isoprobe.x`` would run the package's ``__init__`` files
(pydantic, megabytes on the very heap it measures) and put isoprobe's names in the script's ``sys.modules``. Such
code loads the modules it needs from their files, through ``load`` here, and nowhere else:

- run as a script: ``python -I -S standalone.py system/keeper ARGS`` loads ``isoprobe/system/keeper.py`` and calls
  its ``main([its file, *ARGS])`` (``command`` writes that argv). The modules it runs reach their siblings through
  ``sys.modules[LOADER_NAME].load`` where ``__package__`` is empty (they were loaded by path), by name where not;
- loaded by path itself (the shim's one bootstrap, ``_isoprobe_shim._own``), under ``LOADER_NAME``;
- imported by name (the parent, the child, tests): ``load`` then imports by name, so that one module is one module.

A module loaded by path gets the private name ``_isoprobe_<package>_<module>`` and is loaded once. Everything in
``LAYER`` imports the standard library only, loads isoprobe's modules only through here
(``tests/unit/test_standalone_layer.py``), and its ``load`` calls are imports to the layering test.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

#: The name this loader has in ``sys.modules`` where it was run or loaded by its file.
LOADER_NAME = "_isoprobe_standalone"
#: ``isoprobe/``: where the layer's files are found.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The standalone layer: the modules that are run or loaded by their file (paths under ``isoprobe/``, no ``.py``).
LAYER = (
    "system/standalone",
    "system/keeper",
    "system/primitives",
    "system/proc_memory",
    "system/data_cap",
    "protocol/wiring",
    "child/srun_rank",
    "child/native_reads",
    "child/cuda_readings",
    "child/shim/_isoprobe_cuda",
)


def _by_path() -> bool:
    """Whether this copy runs without isoprobe's package: as the script, or loaded from its file."""
    return __name__ in ("__main__", LOADER_NAME)


def load(relative: str) -> ModuleType:
    """``isoprobe/RELATIVE.py`` (``"system/primitives"``): imported by name where this loader was, else loaded
    from its file once, under a private name that cannot meet the user's modules."""
    if not _by_path():
        import importlib

        return importlib.import_module("isoprobe." + relative.replace("/", "."))
    name = "_isoprobe_" + relative.replace("/", "_")
    loaded = sys.modules.get(name)
    if loaded is None:
        import importlib.util

        path = os.path.join(ROOT, *relative.split("/")) + ".py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"isoprobe: cannot load {path}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
    return loaded


def command(relative: str, *arguments: str) -> list[str]:
    """The argv that runs ``isoprobe/RELATIVE.py``'s ``main`` isolated (no ``PYTHON*`` variables, no site-packages,
    no isoprobe on the path)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), relative, *arguments]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in LAYER:
        os.write(2, f"usage: standalone.py MODULE ARGS... (MODULE one of {', '.join(LAYER)})\n".encode())
        os._exit(2)
    sys.modules[LOADER_NAME] = sys.modules[__name__]
    module = load(argv[1])
    module.main([os.path.join(ROOT, argv[1]) + ".py", *argv[2:]])


if __name__ == "__main__":
    main(sys.argv)
