"""Models that make a trial look better than it was, in real child processes: the verdict still holds.

Each scenario runs a model of tests/support/hostile.py through the real CLI (or one
real child, where that is all it takes). What stays here needs a process:
shared memory the CPU cap does not count, a verdict line forged from inside
the child, a real ValueError's classification, a factory that really hangs in
the environment check. The rules themselves are unit tests over literal runs
(tests/unit/test_plausibility.py, test_outcomes_*.py,
test_units_outcomes_recommend.py). The autouse ``no_leftover_processes``
fixture (conftest.py) fails any scenario that leaves a process alive.
"""

from __future__ import annotations

import time

from conftest import SUPPORT, run_cli


HOSTILE = SUPPORT / "hostile.py"
MiB, GiB = 1024**2, 1024**3
BUDGET = int(1.5 * GiB)


def hostile_spec(factory: str, *, start: int = 2, cap: int | None = 2, trial_timeout: float = 120,
                 budget: str = "2GiB", **kwargs) -> dict:
    """The tiniest CPU spec around a model of tests/support/hostile.py: no retry, no confirmation."""
    return {
        "model": {"factory": f"{HOSTILE}:{factory}", **({"kwargs": kwargs} if kwargs else {})},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": start, "max_batch_size": cap, "steps": 2, "trial_timeout": trial_timeout,
                   "retries": 0, "confirmations": 0},
        "device": "cpu",
        "memory_budget": budget,
        "recommendation": {"headroom": 0.0, "soak_steps": 0},
    }


def private_trial(batch: int, workdir):
    """memory_hog(shared=False) at ``batch`` in one fresh child under the same cap, judged as the probe judges."""
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.environment import trial_conditions
    from isoprobe.pipeline.plausibility import Asked
    from isoprobe.pipeline.trial_record import trial_from_run
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate(hostile_spec("memory_hog", budget="1.5GiB", per_sample_mib=48, shared=False))
    request = TrialRequest(spec=spec, batch_size=batch, device="cpu", memory_budget_bytes=BUDGET,
                           python_path=[str(SUPPORT)])
    run = run_once(request, trial_conditions(spec, "cpu", BUDGET), timeout=120, workdir=workdir)
    return trial_from_run(run, 1, batch, "search", Asked(steps=2, backend="cpu", budget_bytes=BUDGET))


def test_shared_memory_past_the_cap_never_fits_and_the_answer_stays_within_the_private_edge(write_spec, tmp_path):
    # 48 MiB per sample in an anonymous MAP_SHARED mapping: RLIMIT_DATA never refuses it, so before the
    # fix every batch up to the cap "fit", far past where the same memory, private, runs out.
    spec = hostile_spec("memory_hog", start=8, cap=16, budget="1.5GiB", per_sample_mib=48, shared=True)
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 0, run.stderr
    result = run.json
    assert result["stop_reason"] == "edge_found"
    answer = result["max_batch_size"]
    over = [t for t in result["trials"] if t["outcome"] == "out_of_memory"]
    assert over, result["trials"]
    for trial in over:  # no allocation failed: the measurement is the evidence, with its numbers
        assert trial["error"] is None and "above the 1.50 GiB (1610612736 B) budget" in trial["reclassified"]
        assert trial["budget_peak_bytes"] > BUDGET
    for trial in result["trials"]:
        if trial["outcome"] == "fits":
            assert trial["budget_peak_bytes"] <= BUDGET and trial["peak_bytes"] <= BUDGET
    # The same memory, private, still fits at the answer: the answer is not above the private edge.
    assert private_trial(answer, tmp_path).outcome.value == "fits"


def test_a_verdict_forged_from_inside_the_child_is_crashed_with_the_reason(write_spec):
    # A well-formed forgery: step events for both steps, matching step times, a 'fits' with a peak of 1000 B,
    # written to the events file the model found (its variable, else /proc/self/fd), then exit 0.
    run = run_cli("run", str(write_spec(hostile_spec("forger", steps=2, peak_bytes=1000, well_formed=True))))
    assert run.returncode == 4, run.stderr
    result = run.json
    assert result["stop_reason"] == "crashed" and result["max_batch_size"] is None
    [trial] = result["trials"]
    assert trial["outcome"] == "crashed" and trial["exit_code"] == 0
    assert trial["peak_bytes"] is None  # the forged numbers are not reported as measurements
    assert trial["reclassified"].startswith("implausible 'fits' (not counted): ")
    assert "budget peak 1000 B is below the" in trial["reclassified"]
    assert "1000 B" not in run.stderr.split("isoprobe: trial")[1].splitlines()[0]  # nor shown as its peak


def test_a_value_error_that_says_out_of_memory_is_an_error_not_an_edge(write_spec):
    run = run_cli("run", str(write_spec(hostile_spec("value_error_oom", cap=8))))
    assert run.returncode == 4, run.stderr
    result = run.json
    assert result["stop_reason"] == "error" and result["max_batch_size"] is None
    [trial] = result["trials"]  # an error stops the search at once
    assert trial["outcome"] == "error" and trial["error"]["type"] == "ValueError"
    assert "out of memory" in trial["error"]["message"]


def test_a_factory_that_hangs_is_stopped_after_its_imports_and_trial_timeout_and_the_phase_is_named(write_spec):
    # The environment check builds the model on the meta device: a factory that hangs hangs there first.
    started = time.monotonic()
    # trial_timeout 5 s (10 until 2026-11-26): it runs from the end of the imports, which the check names.
    run = run_cli("run", str(write_spec(hostile_spec("slow_to_build", trial_timeout=5))), timeout=300)
    took = time.monotonic() - started
    assert run.returncode == 4, run.stderr
    assert 5 <= took < 5 + 45, took  # the imports (seconds) plus trial_timeout; before the fix: 300 s
    assert "the environment check (a child process) was stopped after search.trial_timeout (5 s). It had " \
           "imported torch, torch._dynamo; after that it looks at the GPUs, builds the model " \
           f"(factory: {HOSTILE}:slow_to_build) on the meta device" in run.stderr
    assert "raise search.trial_timeout" in run.stderr
    [error] = [line for line in run.stderr.splitlines() if "the environment check (a child process)" in line]
    assert "importing torch" not in error  # what the old message blamed, whatever the phase
