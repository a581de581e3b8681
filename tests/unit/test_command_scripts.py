"""The training scripts of tests/commands/ and benchmarks/harness/command_truth.py stay independent of isoprobe.

The command source (issue 36) is tested on real training scripts "written as their community writes
them": if one of them imported isoprobe, it would prove nothing about probing a command as it is,
and the independent truth (benchmarks/harness/command_truth.py) would not be independent. These tests scan
their sources for any import of isoprobe. That each script's ``--help`` works and names the flags the
tests substitute is tests/integration/test_command_scripts_help.py (each a fresh process importing torch).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "tests" / "commands"


def isoprobe_imports(source: str) -> list[str]:
    """Every way the source names isoprobe as a module: import statements and import_module/__import__ calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "isoprobe"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "isoprobe":
            found.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and arg.split(".")[0] == "isoprobe":
                found.append(arg)
    return found


def test_the_scan_sees_every_form_of_import():
    """The scanner itself: each form is caught, a mere mention in text is not an import."""
    for src in ("import isoprobe", "import isoprobe.spec as s", "from isoprobe.cli import main",
                "import importlib\nimportlib.import_module('isoprobe.child')", "__import__('isoprobe')"):
        assert isoprobe_imports(src), src
    assert not isoprobe_imports('"""Nothing of isoprobe is imported."""\nimport torch')


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.py")) + [ROOT / "benchmarks" / "harness" / "command_truth.py"],
                         ids=lambda p: p.name)
def test_imports_nothing_of_isoprobe(path):
    source = path.read_text()
    assert isoprobe_imports(source) == [], f"{path.name} imports isoprobe"
    assert ast.get_docstring(ast.parse(source)), f"{path.name} has no module docstring"
