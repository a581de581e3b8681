"""The env and taskprolog dialects: what a shell or Slurm executes must give back exactly the values."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isoprobe.report.shell import fallback_variables, render

SHELLS = [shell for shell in ("bash", "dash") if shutil.which(shell)]


def _evaluated(lines: str, shell: str, names: list[str]) -> tuple[list[str], str]:
    """Run ``eval "$lines"`` in ``shell`` and read the variables back (NUL-separated: values may hold newlines)."""
    script = 'eval "$ISOPROBE_LINES"; ' + "; ".join(f'printf "%s\\0" "${name}"' for name in names)
    done = subprocess.run([shell, "-c", script], env={"ISOPROBE_LINES": lines, "PATH": "/usr/bin:/bin"},
                          capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split("\0")[:-1], done.stderr.decode()


@pytest.mark.skipif(not SHELLS, reason="neither bash nor dash is installed")
@settings(max_examples=25, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40))
def test_any_value_survives_eval_in_every_shell(value):
    lines = render([("ISOPROBE_X", value), ("ISOPROBE_Y", "17")], ["it's a $(warning) `x`; rm -rf /"], "env")
    for shell in SHELLS:
        values, stderr = _evaluated(lines, shell, ["ISOPROBE_X", "ISOPROBE_Y"])
        assert values == [value, "17"]
        assert "it's a $(warning) `x`; rm -rf /" in stderr  # the warning is echoed, not executed


def test_env_lines_are_exports_and_warnings_go_to_stderr():
    lines = render([("ISOPROBE_BATCH_SIZE", "17")], ["line one\nline two"], "env").splitlines()
    assert lines == ["echo 'isoprobe: line one line two' >&2", "export ISOPROBE_BATCH_SIZE=17"]


def test_taskprolog_values_are_bare_and_unsafe_ones_left_out():
    # Slurm takes the rest of an export line verbatim: quotes would become part of the value.
    lines = render([("ISOPROBE_A", "17"), ("ISOPROBE_B", "edge_found"), ("ISOPROBE_C", "a b'c")],
                   ["no probed answer"], "taskprolog").splitlines()
    assert lines == ["print isoprobe: no probed answer", "export ISOPROBE_A=17", "export ISOPROBE_B=edge_found"]


def test_fallback_names_the_batch_and_says_it_is_a_fallback():
    variables = dict(fallback_variables(6, "start_does_not_fit"))
    assert variables["ISOPROBE_BATCH_SIZE"] == "6"
    assert variables["ISOPROBE_FALLBACK"] == "1"
    assert variables["ISOPROBE_ANSWERED"] == "0"
    assert "ISOPROBE_MAX_BATCH_SIZE" not in variables  # nothing was proven


def test_unknown_dialect_is_refused():
    with pytest.raises(ValueError):
        render([], [], "fish")


def test_an_answer_exports_the_environment_its_trials_ran_in_and_no_answer_exports_none():
    """issue 46: every CPU trial runs with glibc's mmap threshold fixed; a job without it fragments its heap and 4
    of 5 held-out scripts ran out at their maxima. The answer carries it, under its own name."""
    from isoprobe.report.result import Result
    from isoprobe.report.shell import render, result_variables

    saved = Result.model_validate_json((Path(__file__).resolve().parents[2] / "docs" / "results"
                                        / "resnet50-cpu.json").read_text())
    answered = saved.model_copy(update={"job_environment": {"MALLOC_MMAP_THRESHOLD_": "131072"}})
    lines = render(result_variables(answered), [], "env").splitlines()
    assert "export MALLOC_MMAP_THRESHOLD_=131072" in lines
    assert "export MALLOC_MMAP_THRESHOLD_=131072" in render(result_variables(answered), [], "taskprolog").splitlines()
    unanswered = answered.model_copy(update={"answered": False})
    assert not [name for name, _ in result_variables(unanswered) if not name.startswith("ISOPROBE_")]


def test_a_cpu_trial_and_the_answer_name_the_same_memory_environment():
    from isoprobe.executors.processes import child_environment, memory_environment

    env = child_environment({}, backend="cpu", allocator=None, events_path=Path("/tmp/e"))
    assert memory_environment("cpu").items() <= env.items() and memory_environment("cuda") == {}
