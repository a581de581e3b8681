"""The standalone layer (issue 58 item 5): the standard-library-only modules that run where isoprobe cannot be
imported by name (the keeper and a Slurm rank's wrapper, isolated; the shim, in the user's process) are one named
set, ``system.standalone.LAYER``, loaded by one loader, ``system.standalone.load``.

What holds it together: every module in the layer imports the standard library and the layer only; every module
loaded by its file anywhere in isoprobe is in the layer; nothing but the loader (and the shim's one bootstrap of the
loader itself) loads isoprobe's code by path; and the loader does what it says, by path and by name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import isoprobe
from isoprobe.system import standalone
from test_layering import imports_of, loaded_by_path, module_name

PACKAGE = Path(isoprobe.__file__).resolve().parent
LAYER = {"isoprobe." + relative.replace("/", ".") for relative in standalone.LAYER}
#: Calls of importlib's by-path loading allowed outside the loader, each with its reason.
OTHER_BY_PATH = {
    # The shim's one bootstrap: it loads the loader itself, once, then everything through it.
    "isoprobe.child.shim._isoprobe_shim",
    # A hidden sitecustomize of the user's environment (Debian's, a cluster's), run as site.py would have.
    "isoprobe.child.shim.sitecustomize",
    # The user's own model file named in the spec (``model: path/to/file.py:Class``): not isoprobe's code.
    "isoprobe.child.core.references",
}


#: What a layer module may import beyond the standard library, where the process it runs in has it, with the reason.
OPTIONAL = {
    # NVML's bindings in the user's environment (torch.cuda reads them too), for this process's own memory on the
    # card; without them the card-wide reading stands (``child.cuda_readings.outside_bytes``).
    "pynvml": {"isoprobe.child.cuda_readings"},
}


def _path(module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    return PACKAGE / relative.with_suffix(".py")


@pytest.mark.parametrize("module", sorted(LAYER))
def test_each_module_of_the_layer_imports_the_standard_library_and_the_layer_only(module):
    found = {name for name in imports_of(_path(module)) if name != "__future__"}
    outside = {name for name in found if name.partition(".")[0] not in sys.stdlib_module_names and name not in LAYER
               and module not in OPTIONAL.get(name, ())}
    assert not outside, f"{module} imports {sorted(outside)}: the standalone layer is standard library only"


def test_every_module_loaded_by_its_file_is_in_the_layer_and_every_layer_module_is_used():
    loaded = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        loaded |= {name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if (name := loaded_by_path(node)) is not None}
    entries = {"isoprobe.system.keeper", "isoprobe.child.srun_rank"}  # run by the loader's main (``command``)
    assert loaded <= LAYER, f"loaded by path but not in standalone.LAYER: {sorted(loaded - LAYER)}"
    assert LAYER - {"isoprobe.system.standalone"} == loaded | entries, sorted(LAYER - loaded - entries)


def test_nothing_but_the_loader_loads_isoprobes_code_by_path():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "spec_from_file_location" in path.read_text(encoding="utf-8"):
            found.add(module_name(path))
    assert found == OTHER_BY_PATH | {"isoprobe.system.standalone"}, found


def test_the_layers_entries_run_isolated_and_refuse_a_module_outside_it():
    """``python -I -S standalone.py MODULE``: no isoprobe, no site-packages on the path, and only the layer's
    modules (a typo or another module is a usage error, never an import of something else)."""
    usage = subprocess.run([sys.executable, "-I", "-S", standalone.__file__, "executors/local"],
                           capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage: standalone.py MODULE" in usage.stderr
    rank = subprocess.run(standalone.command("child/srun_rank"), capture_output=True, text=True, timeout=30)
    assert rank.returncode == 2 and "usage: standalone.py child/srun_rank" in rank.stderr, rank.stderr


def test_loaded_by_path_a_module_is_private_and_loaded_once_and_by_name_it_is_the_packages(tmp_path):
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_isoprobe_standalone', {standalone.__file__!r})\n"
        "loader = importlib.util.module_from_spec(spec); sys.modules['_isoprobe_standalone'] = loader\n"
        "spec.loader.exec_module(loader)\n"
        "first, again = loader.load('system/primitives'), loader.load('system/primitives')\n"
        "print(first is again, first.__name__, any(name.startswith('isoprobe') for name in sys.modules))\n"
    )
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=30)
    assert ran.stdout.split() == ["True", "_isoprobe_system_primitives", "False"], ran.stderr
    from isoprobe.system import primitives

    assert standalone.load("system/primitives") is primitives
