"""The names the shim shares with isoprobe are isoprobe's (issue 58 item 5): the shim is standard-library-only code
loaded into the user's process, so it cannot import ``isoprobe.protocol``; it writes the environment variables'
and files' names again, and this test is what ties each copy to the protocol's one definition.

Every ``ISOPROBE_*`` string in the shim's files must be a name the protocol defines, each named constant must equal
its protocol twin, and the files the shim writes or reads in the trial's folder are the protocol's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from isoprobe.protocol import command, warm_command, wiring
from isoprobe.protocol.command import SHIM_FOLDER

#: The shim's constant -> the protocol's (module, name).
TWINS = {
    ("_isoprobe_shim.py", "DIR_ENV"): (command, "SHIM_DIR_ENV"),
    ("_isoprobe_shim.py", "CUDA_BUDGET_ENV"): (command, "SHIM_CUDA_BUDGET_ENV"),
    ("_isoprobe_shim.py", "CUDA_OUTSIDE_ENV"): (command, "SHIM_CUDA_OUTSIDE_ENV"),
    ("_isoprobe_warm.py", "FD_ENV"): (warm_command, "FD_ENV"),
}


def _strings(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _constant(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} defines no {name}")


def _protocol_names() -> set[str]:
    return {value for module in (command, warm_command, wiring) for value in vars(module).values()
            if isinstance(value, str) and value.startswith("ISOPROBE_")}


@pytest.mark.parametrize("path", sorted(SHIM_FOLDER.glob("*.py")), ids=lambda p: p.name)
def test_every_isoprobe_name_in_the_shim_is_one_the_protocol_defines(path):
    names = {s for s in _strings(path) if s.startswith("ISOPROBE_") and s.upper() == s and " " not in s}
    assert names <= _protocol_names(), f"{path.name} uses names the protocol does not define: {names - _protocol_names()}"


@pytest.mark.parametrize("where, twin", sorted(TWINS.items()), ids=lambda x: getattr(x, "__name__", str(x)))
def test_each_shim_constant_equals_its_protocol_twin(where, twin):
    filename, name = where
    module, twin_name = twin
    assert _constant(SHIM_FOLDER / filename, name) == getattr(module, twin_name)


def test_the_files_the_shim_uses_in_the_trials_folder_are_the_protocols():
    assert command.GATE_FILE in _strings(SHIM_FOLDER / "_isoprobe_shim.py")
    assert warm_command.READY_FILE in _strings(SHIM_FOLDER / "_isoprobe_warm.py")


def test_the_native_readers_system_folders_are_the_caches_and_var():
    """child/native_reads.py is loaded into the user's process by path (standard library only), so it writes the
    cache's system folders again: this ties the copy to ``cache.arguments.SYSTEM_ROOTS``."""
    from isoprobe.cache.arguments import SYSTEM_ROOTS
    from isoprobe.child import native_reads

    assert native_reads._SYSTEM == (*SYSTEM_ROOTS, "/var/")
