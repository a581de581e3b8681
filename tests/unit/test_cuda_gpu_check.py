"""The GPU check's no-GPU path (issue 19, part 4): it says so, writes nothing and exits with its own code."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_the_check_says_so_writes_nothing_and_exits_5(tmp_path):
    output = tmp_path / "gpu.md"
    run = subprocess.run([sys.executable, str(SCRIPT), "--output", str(output)], capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert run.returncode == _module().NO_GPU_EXIT == 5
    assert "no CUDA GPU visible" in run.stderr and "nothing measured" in run.stderr
    assert not output.exists()


def test_the_no_gpu_exit_code_is_none_of_isoprobes_own():
    from isoprobe.errors import ExitCode

    assert _module().NO_GPU_EXIT not in {int(code) for code in ExitCode}
    assert _module().gpu_present({"CUDA_VISIBLE_DEVICES": ""}) is False


def test_a_failed_check_is_recorded_and_named():
    report = _module().Report()
    assert report.check("a", True) == "pass" and report.check("b", False) == "FAIL"
    assert report.failed == ["b"]
