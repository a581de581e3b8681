"""The names the shim shares with isoprobe are isoprobe's (issue 58 item 5): the shim is standard-library-only code
loaded into the user's process, so it cannot import ``isoprobe.protocol`` by name. ``_isoprobe_shim`` reads them
from ``protocol/wiring.py``, the one module of the wire's constants, through the standalone loader. The two files
that run before anything may be loaded (``sitecustomize``, at every interpreter's start, and ``_isoprobe_warm``,
which must leave the script's ``sys.modules`` as a cold start would: their start-up is measured) write the few
names they need again, and this test ties each copy to wiring's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from isoprobe.protocol import wiring
from isoprobe.protocol.command import SHIM_FOLDER

#: The names a shim file writes again -> wiring's constant, for the two files that cannot load wiring.
COPIES = {
    "sitecustomize.py": {"ISOPROBE_SHIM_DIR": "SHIM_DIR_ENV", "ISOPROBE_WARM_FD": "WARM_FD_ENV"},
    "_isoprobe_warm.py": {"ISOPROBE_SHIM_DIR": "SHIM_DIR_ENV", "ISOPROBE_WARM_FD": "WARM_FD_ENV",
                          "warm-ready": "WARM_READY_FILE"},
}


def _strings(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _wire_values() -> dict[str, str]:
    return {value: name for name, value in vars(wiring).items() if name.isupper() and isinstance(value, str)}


@pytest.mark.parametrize("path", sorted(SHIM_FOLDER.glob("*.py")), ids=lambda p: p.name)
def test_every_wire_name_in_the_shim_is_wirings_and_only_the_files_that_cannot_load_it_copy_one(path):
    names = {s for s in _strings(path) if s.startswith("ISOPROBE_") and s.upper() == s and " " not in s}
    copied = {value for value in _strings(path) if value in _wire_values() and (value in names or "-" in value)}
    assert names <= set(_wire_values()), f"{path.name} uses names wiring does not define: {names - set(_wire_values())}"
    assert copied == set(COPIES.get(path.name, {})), f"{path.name} copies {sorted(copied)}"


@pytest.mark.parametrize("filename, value, name", [(f, v, n) for f, copies in sorted(COPIES.items())
                                                   for v, n in sorted(copies.items())])
def test_each_copy_is_wirings_value(filename, value, name):
    assert getattr(wiring, name) == value
    assert value in _strings(SHIM_FOLDER / filename)


def test_the_shim_reads_its_names_and_the_gate_from_wiring():
    """``_isoprobe_shim``'s names are wiring's objects, loaded through the standalone loader: no literal of its own."""
    text = (SHIM_FOLDER / "_isoprobe_shim.py").read_text()
    assert '_own("protocol/wiring")' in text and "_wiring.GATE_FILE" in text
    assert wiring.GATE_FILE not in _strings(SHIM_FOLDER / "_isoprobe_shim.py")


def test_the_native_readers_system_folders_are_the_caches_and_var():
    """child/native_reads.py is loaded into the user's process by path (standard library only), so it writes the
    cache's system folders again: this ties the copy to ``cache.arguments.SYSTEM_ROOTS``."""
    from isoprobe.cache.arguments import SYSTEM_ROOTS
    from isoprobe.child import native_reads

    assert native_reads._SYSTEM == (*SYSTEM_ROOTS, "/var/")
