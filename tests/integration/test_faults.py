"""Faults a trial can meet, end to end: what isoprobe reports, the exit code, and no leftover process.

Every scenario probes tests/faults.py:faulty, which fits below ``at`` and misbehaves
at or above it. Unless a scenario says otherwise: start 7, cap 8, fault at 8,
one retry, one confirmation. Scenarios start where the fault is when the shape
of the search around it is not the point, since every trial costs an
``import torch`` (~3 s here). The autouse ``no_leftover_processes`` fixture
(conftest.py) fails any scenario that leaves a process alive.
"""

from __future__ import annotations

import pytest

from conftest import FAULTS, run_cli

pytestmark = pytest.mark.integration


def fault_spec(fault: str, *, at: int = 8, edge: int | None = None, start: int = 7, cap: int | None = 8,
               timeout: float = 60, state_dir: str | None = None, probability: float = 1.0, **search) -> dict:
    kwargs = {"fault": fault, "at": at, "edge": edge, "probability": probability, "state_dir": state_dir}
    return {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": kwargs},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": start, "max_batch_size": cap, "steps": 2, "trial_timeout": timeout,
                   **search},
        "device": "cpu",
        "memory_budget": "2GiB",
        "recommendation": {"headroom": 0.0},
    }


def probe(write_spec, spec: dict):
    run = run_cli("run", str(write_spec(spec)))
    return run, run.json


def at_batch(result: dict, batch: int) -> list[dict]:
    return [t for t in result["trials"] if t["batch_size"] == batch]


def test_a_crash_is_retried_then_counts_as_failing_and_the_answer_stays_below_it(write_spec):
    run, result = probe(write_spec, fault_spec("segfault"))
    assert run.returncode == 0, run.stderr
    assert result["max_batch_size"] == 7
    assert result["first_failing_batch_size"] == 8
    assert result["first_failing_outcome"] == "crashed"
    crashed = at_batch(result, 8)
    assert [t["purpose"] for t in crashed] == ["search", "retry"]
    assert all(t["outcome"] == "crashed" and t["signal"] == "SIGSEGV" for t in crashed)
    assert "Segmentation fault" in crashed[0]["stderr_tail"]  # faulthandler's stack, kept as evidence
    assert [t["outcome"] for t in at_batch(result, 7)] == ["fits", "fits"]  # the answer was confirmed


@pytest.mark.parametrize(
    ("fault", "signal", "evidence"),
    [
        ("abort", "SIGABRT", "Aborted"),
        ("sigkill", "SIGKILL", None),
        ("half_result", "SIGKILL", None),
        ("exit0", None, None),
    ],
)
def test_a_persistent_crash_is_crashed_never_out_of_memory(write_spec, fault, signal, evidence):
    run, result = probe(write_spec, fault_spec(fault, start=8))
    assert run.returncode == 4, run.stderr  # nothing fits: no answer
    assert result["stop_reason"] == "crashed"
    assert [(t["purpose"], t["outcome"], t["signal"]) for t in result["trials"]] == [
        ("search", "crashed", signal), ("retry", "crashed", signal)
    ]
    if evidence:
        assert evidence in result["trials"][0]["stderr_tail"]
    assert result["max_batch_size"] is None


def test_a_hang_is_killed_at_the_timeout(write_spec):
    run, result = probe(write_spec, fault_spec("hang", start=8, timeout=12, retries=0))
    assert run.returncode == 4, run.stderr
    assert result["stop_reason"] == "timed_out"
    [trial] = result["trials"]
    assert trial["outcome"] == "timed_out" and 12 <= trial["seconds"] < 12 + 5


def test_a_hanging_grandchild_holding_the_pipes_times_out_twice_and_dies_with_its_group(write_spec):
    run, result = probe(write_spec, fault_spec("grandchild_hang", timeout=12))
    assert run.returncode == 0, run.stderr
    assert result["max_batch_size"] == 7
    assert result["first_failing_outcome"] == "timed_out"
    assert [t["outcome"] for t in at_batch(result, 8)] == ["timed_out", "timed_out"]


def test_a_bug_in_the_model_stops_at_once_with_exit_4(write_spec):
    run, result = probe(write_spec, fault_spec("raise"))
    assert run.returncode == 4, run.stderr
    assert result["stop_reason"] == "error"
    assert [(t["batch_size"], t["outcome"]) for t in result["trials"]] == [(7, "fits"), (8, "error")]
    assert "deliberate non-memory bug" in result["trials"][-1]["error"]["traceback_tail"]


@pytest.mark.parametrize("fault", ["garbage", "grandchild"])
def test_noise_and_stray_grandchildren_do_not_change_a_fit(write_spec, fault):
    run, result = probe(write_spec, fault_spec(fault, start=8, confirmations=0))
    assert run.returncode == 0, run.stderr
    assert result["max_batch_size"] == 8 and result["limited_by"] == "max_batch_size"
    assert [t["outcome"] for t in result["trials"]] == ["fits"]


def test_a_transient_crash_marks_the_batch_flaky_and_it_is_never_the_answer(write_spec, tmp_path):
    run, result = probe(write_spec, fault_spec("nth:1:segfault", state_dir=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert [t["outcome"] for t in at_batch(result, 8)] == ["crashed", "fits"]
    assert result["max_batch_size"] == 7
    assert result["flaky_batch_sizes"] == [8] and result["edge_flaky"] is True


def test_a_failed_confirmation_moves_the_answer_down(write_spec, tmp_path):
    # 8 fits on its first run, then runs out of memory when it is confirmed.
    run, result = probe(write_spec, fault_spec("nth:2:flaky_oom", state_dir=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert [(t["purpose"], t["outcome"]) for t in at_batch(result, 8)] == [
        ("search", "fits"), ("confirmation", "out_of_memory")
    ]
    assert result["max_batch_size"] == 7
    assert all(t["outcome"] == "fits" for t in at_batch(result, 7))
    assert result["edge_flaky"] is True and 8 in result["flaky_batch_sizes"]


def test_a_randomly_flaky_edge_never_yields_an_answer_above_the_true_maximum(write_spec):
    # Out of memory above 12 always, and at 9..12 half of the time: the true maximum is 12 at best.
    run, result = probe(
        write_spec, fault_spec("flaky_oom", at=9, edge=12, start=8, cap=None, probability=0.5)
    )
    assert run.returncode == 0, run.stderr
    maximum = result["max_batch_size"]
    assert maximum is not None and maximum <= 12
    assert all(t["outcome"] == "fits" for t in at_batch(result, maximum))
    assert len(at_batch(result, maximum)) >= 2  # confirmed
