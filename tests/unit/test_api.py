"""The Python API (``isoprobe.probe``, ``isoprobe.load_spec``): its public surface, its errors, and its path
through the cache, with scripted children (``isoprobe.pipeline.pipeline.local_executor`` is the seam, as for the
CLI's in-process runs). The real children, and torch never imported in the caller, are
tests/integration/test_api_probe.py's.
"""

from __future__ import annotations

import errno
import inspect
import subprocess
import sys

import pytest

import isoprobe
from conftest import REPO
from isoprobe.errors import ProbeError, SpecError
from isoprobe.executors.scripted import ScriptedExecutor, linear
from isoprobe.report.result import Result
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, MODELS, hog_spec

PUBLIC = ["__version__", "probe", "load_spec", "Spec", "Result", "StopReason", "IsoprobeError", "SpecError",
          "ProbeError", "Problem"]


@pytest.fixture
def scripted(monkeypatch):
    """Every probe's children scripted: the memory_hog device (batch 25 fits under 1.5 GiB, 26 does not)."""
    executors: list[ScriptedExecutor] = []

    def make(spec):
        executors.append(ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
        return executors[-1]

    monkeypatch.setattr("isoprobe.pipeline.pipeline.local_executor", make)
    return executors


# --------------------------------------------------------------------------- the public surface


def test_the_public_surface_is_pinned():
    assert isoprobe.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(isoprobe, name) is not None, name
    from isoprobe.api import probe
    from isoprobe.errors import IsoprobeError, Problem
    from isoprobe.spec.model import Spec
    from isoprobe.spec.load import load_spec

    assert isoprobe.load_spec is load_spec and isoprobe.Spec is Spec and isoprobe.Result is Result
    assert isoprobe.SpecError is SpecError and isoprobe.ProbeError is ProbeError
    assert isoprobe.IsoprobeError is IsoprobeError and isoprobe.Problem is Problem
    assert issubclass(SpecError, IsoprobeError) and issubclass(ProbeError, IsoprobeError)
    assert isoprobe.probe is probe
    assert list(inspect.signature(isoprobe.probe).parameters) == [
        "spec", "device", "memory_budget", "max_batch_size", "overrides", "cache", "refresh", "quiet", "progress"]


def test_import_isoprobe_loads_nothing_else():
    """``import isoprobe`` stays fast: the names are imported on first use (no pydantic, YAML or submodule)."""
    code = "import sys, isoprobe\nprint(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('isoprobe', 'pydantic', 'yaml', 'torch')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['isoprobe']"


def test_probe_stays_the_function_when_the_orchestration_is_imported():
    """The orchestration is ``isoprobe.pipeline`` (it was ``isoprobe.probe``, which shadowed the function)."""
    code = ("from isoprobe import probe\n"
            "import isoprobe.pipeline.answer, isoprobe.pipeline.pipeline\n"
            "import isoprobe\n"
            "from isoprobe import probe as again\n"
            "assert again is probe is isoprobe.probe and callable(probe), isoprobe.probe\n"
            "assert isoprobe.pipeline.answer is __import__('sys').modules['isoprobe.pipeline.answer']\n"
            "from isoprobe.pipeline.pipeline import run_probe\n"
            "assert isoprobe.pipeline.run_probe is run_probe\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        isoprobe.pipeline.nothing_here


# --------------------------------------------------------------------------- load_spec


def test_load_spec_resolves_a_dicts_relative_paths_against_the_current_directory(monkeypatch):
    spec = hog_spec()
    spec["model"]["factory"] = "models.py:memory_hog"
    monkeypatch.chdir(MODELS.parent)
    assert isoprobe.load_spec(spec).model.factory == f"{MODELS}:memory_hog"
    assert spec["model"]["factory"] == "models.py:memory_hog"  # the caller's dict is left as it was


def test_a_bad_dict_spec_raises_spec_error_with_every_problem(scripted):
    spec = hog_spec(max_batch_size=0, stepz=3)
    spec["device"] = "gpu"
    with pytest.raises(SpecError) as info:
        isoprobe.probe(spec)
    fields = {problem.field for problem in info.value.problems}
    assert fields == {"search.max_batch_size", "search.stepz", "device"}
    assert info.value.source.endswith("<dict spec>")
    assert not scripted  # nothing started


def test_override_problems_name_the_argument_they_came_from(scripted):
    with pytest.raises(SpecError) as info:
        isoprobe.probe(hog_spec(), max_batch_size=0, overrides={"training.precision": "fp8", "serch.steps": 2})
    assert {problem.field for problem in info.value.problems} == {
        "search.max_batch_size (from probe(max_batch_size=0))",
        "training.precision (from overrides['training.precision'])",
        "serch (from overrides['serch.steps'])",
    }


# --------------------------------------------------------------------------- probe: the CLI's path


def test_probe_returns_the_typed_result_and_stores_it_in_the_cache(scripted, capsys):
    first = isoprobe.probe(hog_spec())
    assert isinstance(first, Result)
    assert first.answered and first.max_batch_size == HOG_MAX and not first.cache.hit
    assert first.spec_path.endswith("<dict spec>")
    assert "isoprobe: trial " in capsys.readouterr().err  # progress on stderr, as the CLI's
    again = isoprobe.probe(hog_spec())
    assert again.cache.hit and again.max_batch_size == HOG_MAX
    assert len(scripted) == 1  # the hit started nothing
    isoprobe.probe(hog_spec(), refresh=True, quiet=True)
    uncached = isoprobe.probe(hog_spec(), cache=False, quiet=True)
    assert len(scripted) == 3 and uncached.cache is None


def test_overrides_reach_the_probe_and_the_cache_key(scripted):
    base = isoprobe.probe(hog_spec(), quiet=True)
    capped = isoprobe.probe(hog_spec(), overrides={"search.max_batch_size": 8}, quiet=True)
    assert not capped.cache.hit and capped.cache.key != base.cache.key  # another setup, another key
    assert capped.max_batch_size == 8 and max(scripted[-1].batches) == 8
    assert capped.spec.search.max_batch_size == 8
    named = isoprobe.probe(hog_spec(), max_batch_size=8, overrides={"search.max_batch_size": 4}, quiet=True)
    assert named.cache.hit and named.max_batch_size == 8  # the named argument won: the same setup as before


def test_a_memory_budget_argument_is_reported_as_an_override(scripted):
    result = isoprobe.probe(hog_spec(), memory_budget="1GiB", cache=False, quiet=True)
    assert result.device.memory_budget_bytes == 1 << 30 and result.device.budget_source == "command line"
    assert result.max_batch_size == (1024 - 720) // 32
    plain = isoprobe.probe(hog_spec(), cache=False, quiet=True)
    assert plain.device.budget_source == "spec"


def test_progress_goes_where_the_caller_says(scripted, capsys):
    lines: list[str] = []
    isoprobe.probe(hog_spec(), progress=lines.append, cache=False)
    isoprobe.probe(hog_spec(), quiet=True, cache=False)
    assert any(line.startswith("isoprobe: trial ") for line in lines)
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="not both"):
        isoprobe.probe(hog_spec(), quiet=True, progress=print)


def test_the_system_refusing_a_trial_is_a_probe_error(monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/isoprobe-x/trial-1.request.json")

    monkeypatch.setattr("isoprobe.pipeline.answer.answer", full)
    with pytest.raises(ProbeError, match="No space left on device.*TMPDIR"):
        isoprobe.probe(hog_spec(), quiet=True)


def test_ctrl_c_during_the_probe_raises_keyboard_interrupt_after_the_children_stopped(monkeypatch):
    executors = []

    def interrupted(call):
        raise KeyboardInterrupt

    def make(spec):
        executors.append(ScriptedExecutor(interrupted))
        return executors[-1]

    monkeypatch.setattr("isoprobe.pipeline.pipeline.local_executor", make)
    with pytest.raises(KeyboardInterrupt):
        isoprobe.probe(hog_spec(), quiet=True)
    assert executors[0].closed and executors[0].calls
