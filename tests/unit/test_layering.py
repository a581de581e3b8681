"""The layering of docs/architecture.md, enforced: no import against a layer, torch only in the child, no circles.

Every module's imports are read with ``ast`` (nothing is executed), those inside
functions and under ``TYPE_CHECKING`` included: a lazy import is still a
dependency. The allowed arrows are read from the page's table, so the page is
the one place they are written.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import isoprobe

PACKAGE = Path(isoprobe.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
TORCH = {"torch", "torchvision"}
#: Training frameworks: imported by the trial (child/) and by the callback that runs in the user's own trainer.
FRAMEWORKS = {"lightning": {"child", "lightning"}, "pytorch_lightning": {"child", "lightning"},
              "transformers": {"child"}, "accelerate": {"child"}, "timm": {"child"}}
#: What search/ may import besides its layers: no processes, files, clocks or signals.
PURE_STDLIB = {"__future__", "collections", "dataclasses", "math", "statistics", "typing"}


def rules_from_architecture(text: str) -> dict[str, set[str]]:
    """``package -> packages it may import``, from the table after the ``layering-table`` marker."""
    rules: dict[str, set[str]] = {}
    table = text.split("<!-- layering-table", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        allowed = cells[2]
        rules[cells[0].strip("`")] = set() if allowed == "nothing" else {a.strip() for a in allowed.split(",")}
    return rules


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


#: The standalone layer's loader calls (``system.standalone.load``, the shim's ``_own`` in front of it): a module
#: loaded by its file, ``load("system/primitives")``, is an import of ``isoprobe.system.primitives`` here.
LOADER_CALLS = {"load", "_own"}


def loaded_by_path(node: ast.AST) -> str | None:
    """``isoprobe.system.primitives`` for a call ``load("system/primitives")`` / ``x.load(...)`` / ``_own(...)``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    first = node.args[0]
    if name in LOADER_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str) and "/" in first.value:
        return "isoprobe." + first.value.replace("/", ".")
    return None


def imports_in(text: str, package: str) -> set[str]:
    """The absolute module names a module of ``package`` imports (``from isoprobe.x import y`` is
    ``isoprobe.x.y`` when y is a module, else ``isoprobe.x``), the standalone loader's calls included."""
    tree = ast.parse(text)
    found = set()
    for node in ast.walk(tree):
        if (by_path := loaded_by_path(node)) is not None:
            found.add(by_path)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("isoprobe."):
        return False
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def layer_of(module: str) -> str | None:
    """``isoprobe.search.steps`` -> ``search``; ``isoprobe.api`` -> ``api``; the root package -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in sorted(PACKAGE.rglob("*.py"))}


def violations(modules: dict[str, set[str]], rules: dict[str, set[str]]) -> list[str]:
    """Every import against ``rules``, torch outside the child, and search/ beyond the pure standard library."""
    found = []
    for module, imported in sorted(modules.items()):
        layer = layer_of(module)
        for name in sorted(imported):
            top = name.partition(".")[0]
            if top in TORCH and layer != "child":
                found.append(f"{module} imports {name}: only child/ imports torch")
            elif top in FRAMEWORKS and layer not in FRAMEWORKS[top]:
                found.append(f"{module} imports {name}: only {' and '.join(sorted(FRAMEWORKS[top]))} import {top}")
            elif top == "isoprobe":
                target = layer_of(name)
                if layer is None or target is None or target == layer:
                    continue
                if layer not in rules:
                    found.append(f"{module}: the layer {layer!r} is not in docs/architecture.md's table")
                elif target not in rules[layer]:
                    found.append(f"{module} imports {name}: {layer} may import only {sorted(rules[layer]) or 'nothing'}")
            elif layer == "search" and top not in PURE_STDLIB:
                found.append(f"{module} imports {name}: search/ is pure (standard library: {sorted(PURE_STDLIB)})")
    return found


def cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(modules[root] & modules.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(modules[child] & modules.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


RULES = rules_from_architecture(ARCHITECTURE.read_text(encoding="utf-8"))


def test_the_table_names_every_package_and_top_level_module():
    layers = {layer_of(module) for module in graph()} - {None}
    assert layers == set(RULES), f"in the tree but not the table: {layers - set(RULES)}; " \
                                 f"in the table but not the tree: {set(RULES) - layers}"


def test_no_import_goes_against_the_layers():
    assert violations(graph(), RULES) == []


def test_no_module_imports_itself_through_others():
    assert cycles(graph()) == []


def test_the_top_level_is_a_dozen_layers():
    """About a dozen packages, and the modules a user imports by name (api, huggingface, lightning, errors)."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 17, entries


# --------------------------------------------------------------------------- the checker itself can fail


def test_an_arrow_against_the_table_is_named():
    modules = {"isoprobe.child.core.trial": {"isoprobe.executors.local", "isoprobe.protocol.messages", "torch"},
               "isoprobe.search.steps": {"os", "math", "isoprobe.report.outcomes"},
               "isoprobe.cache.store": {"torch"},
               "isoprobe.pipeline.answer": {"lightning.pytorch"}}
    found = violations(modules, RULES)
    assert any("child.core.trial imports isoprobe.executors.local" in line for line in found), found
    assert any("search.steps imports os: search/ is pure" in line for line in found), found
    assert any("cache.store imports torch" in line for line in found), found
    assert any("pipeline.answer imports lightning.pytorch: only child and lightning" in line for line in found), found
    assert len(found) == 4, found


def test_a_package_missing_from_the_table_is_named():
    assert violations({"isoprobe.newthing.x": {"isoprobe.spec.model"}}, RULES) == [
        "isoprobe.newthing.x: the layer 'newthing' is not in docs/architecture.md's table"]


def test_a_circle_is_found():
    modules = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(modules) == [["a", "b", "c"]]


@pytest.mark.parametrize("line, expected", [
    ("from isoprobe.child.core import distributed", "isoprobe.child.core.distributed"),
    ("from isoprobe.report.result import Result", "isoprobe.report.result"),
    ("from isoprobe import steady", "isoprobe"),  # no such module at the top any more
    ("from . import events", "isoprobe.child.events"),
    ("from ..report import outcomes", "isoprobe.report.outcomes"),
    ("import torch.nn as nn", "torch.nn"),
])
def test_imports_resolve_to_modules(line, expected):
    assert imports_in(line + "\n", "isoprobe.child") == {expected}


def test_a_module_loaded_by_its_file_is_an_import():
    """The standalone layer's loads count: a keeper that loaded ``executors/local`` by path would be named."""
    text = 'primitives = sys.modules["_isoprobe_standalone"].load("system/primitives")\nw = _own("protocol/wiring")\n'
    assert imports_in(text, "isoprobe.system") == {"isoprobe.system.primitives", "isoprobe.protocol.wiring"}
    found = violations({"isoprobe.system.keeper": imports_in('x = load("executors/local")\n', "isoprobe.system")}, RULES)
    assert found == ["isoprobe.system.keeper imports isoprobe.executors.local: system may import only ['errors']"]


def test_the_rules_are_read_from_the_page():
    assert RULES["child"] == {"errors", "spec", "report", "protocol", "system"}
    assert RULES["errors"] == set()
    assert re.search(r"\| `search` \| parent, pure \|", ARCHITECTURE.read_text(encoding="utf-8"))
