"""The training scripts of tests/commands/ and benchmarks/harness/command_truth.py stay independent of isoprobe.

The command source (issue 36) is tested on real training scripts "written as their community writes
them": if one of them imported isoprobe, it would prove nothing about probing a command as it is,
and the independent truth (benchmarks/harness/command_truth.py) would not be independent. These tests scan
their sources for any import of isoprobe, and run each script's ``--help`` (a script that cannot
even parse its flags would make every later integration test fail for the wrong reason), checking
that the help names the batch flag and the max-steps flag the tests substitute.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "tests" / "commands"

#: script -> (argv before --help, the batch flag and the max-steps flag its help must name)
SCRIPTS = {
    "plain_loop.py": ([], ["--batch-size", "--max-steps"]),
    "ddp_train.py": ([], ["--batch-size", "--max-steps"]),
    "lightning_cli.py": (["fit"], ["--data.batch_size", "--trainer.max_steps"]),
    "hf_trainer_script.py": ([], ["--per_device_train_batch_size", "--max_steps"]),
    "accelerate_script.py": ([], ["--batch-size", "--max-steps", "--cpu"]),
    "raises_before_step.py": ([], ["--batch-size", "--max-steps"]),
    "exits_early.py": ([], ["--batch-size", "--max-steps"]),
    "never_steps.py": ([], ["--batch-size", "--max-steps"]),
    "leaves_daemon.py": ([], ["--batch-size", "--max-steps"]),
    "not_its_batch.py": ([], ["--mode", "--batch-size", "--max-steps"]),
    "sanity_check_first.py": ([], ["--batch-size", "--max-steps", "--sanity"]),
    "forges_steps.py": ([], ["--batch-size", "--forge", "--max-steps"]),
    "killed_rank.py": ([], ["--batch-size", "--kill-with", "--at-step", "--max-steps"]),
}


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


def test_every_script_in_the_folder_is_listed():
    assert sorted(p.name for p in COMMANDS.glob("*.py")) == sorted(SCRIPTS)


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.py")) + [ROOT / "benchmarks" / "harness" / "command_truth.py"],
                         ids=lambda p: p.name)
def test_imports_nothing_of_isoprobe(path):
    source = path.read_text()
    assert isoprobe_imports(source) == [], f"{path.name} imports isoprobe"
    assert ast.get_docstring(ast.parse(source)), f"{path.name} has no module docstring"


@pytest.mark.integration  # each imports torch (and Lightning or transformers) in a fresh process: ~5 s
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_works_and_names_the_flags(name):
    before, flags = SCRIPTS[name]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(COMMANDS / name), *before, "--help"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in flags:
        assert flag in proc.stdout, f"{name} --help does not name {flag}"
