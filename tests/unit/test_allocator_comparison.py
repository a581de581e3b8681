"""The allocator comparison's orchestration, over a scripted executor (no processes, no GPU).

Each setting has its own true edge; the script answers like a device whose peak
is ``base + per_sample * batch`` and whose usable memory depends on the
allocator setting the trial's process was started with (fragmentation). The
comparison must find every edge exactly, tag each trial with its setting, start
each setting's processes with that setting, and start the later settings from
what it knows.
"""

from __future__ import annotations

from isoprobe.executors.scripted import Call, ScriptedExecutor, fits, out_of_memory
from isoprobe.pipeline.edge import compare_allocators, edge_search
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.explain import Found
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.device import DeviceInfo
from isoprobe.report.outcomes import StopReason
from isoprobe.spec.model import Spec

GiB = 1024**3
PER_SAMPLE = 100 * 1024**2
BASE = 2 * GiB
EDGES = {"default": 60, "expandable_segments:True": 66, "max_split_size_mb:128": 58}
#: What each setting puts in PYTORCH_CUDA_ALLOC_CONF: 'default' is torch's own (the variable removed: '').
ALLOCATOR = {"default": "", "expandable_segments:True": "expandable_segments:True",
             "max_split_size_mb:128": "max_split_size_mb:128"}
EDGE_BY_ALLOCATOR = {ALLOCATOR[setting]: edge for setting, edge in EDGES.items()}


def device(call: Call):
    """Fits up to the edge of the allocator the trial's process was started with, out of memory above it."""
    edge = EDGE_BY_ALLOCATOR[call.conditions.allocator]
    if call.batch_size <= edge:
        return fits(BASE + PER_SAMPLE * call.batch_size, base_bytes=BASE)
    return out_of_memory("CUDA out of memory. Tried to allocate 100.00 MiB", "torch.OutOfMemoryError")


class _Quiet:
    def note(self, text):
        pass

    def trial(self, trial):
        pass


def _spec(**extra) -> Spec:
    return Spec.model_validate({
        "model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]}, "target": {"classes": 10},
        "allocators": list(EDGES), **extra,
    })


def _target(backend: str) -> Target:
    info = DeviceInfo(backend=backend, requested="cuda", name="fake", total_memory_bytes=16 * GiB,
                      capacity_bytes=16 * GiB)
    return Target(backend=backend, device="cuda:0" if backend == "cuda" else "cpu", info=info)


def _runner(spec: Spec, target: Target) -> tuple[TrialRunner, ScriptedExecutor]:
    executor = ScriptedExecutor(device)
    return TrialRunner(spec, target, executor, python_path=[], reporter=_Quiet()), executor


def _first_found(runner: TrialRunner, spec: Spec, target: Target) -> Found:
    runner.allocator_label = spec.allocators[0]  # as the probe does: the first setting's trials are tagged too
    return edge_search(spec, target, runner, start=None)


def _assert_each_trial_ran_under_its_setting(runner: TrialRunner, executor: ScriptedExecutor) -> None:
    assert len(executor.calls) == len(runner.trials)
    for call, trial in zip(executor.calls, runner.trials):
        assert call.batch_size == trial.batch_size
        assert call.conditions.allocator == ALLOCATOR[trial.allocator], (trial.index, trial.allocator)
        assert call.conditions.backend == "cuda" and call.conditions.memory_limit is None


def test_every_setting_gets_its_exact_edge_and_the_best_is_named():
    spec, target = _spec(), _target("cuda")
    runner, executor = _runner(spec, target)
    first = _first_found(runner, spec, target)
    assert executor.prestarts == []
    comparison = compare_allocators(spec, target, runner, first)
    assert comparison.applies
    # Processes started ahead for each further setting, with that setting (a fresh environment per setting).
    assert [c.allocator for c in executor.prestarts] == [ALLOCATOR[s] for s in list(EDGES)[1:]]
    found = {o.setting: (o.max_batch_size, o.first_failing_batch_size) for o in comparison.outcomes}
    assert found == {s: (e, e + 1) for s, e in EDGES.items()}
    assert comparison.best == "expandable_segments:True"
    assert all(t.allocator in EDGES for t in runner.trials)
    assert sum(o.trials for o in comparison.outcomes) == len(runner.trials)
    _assert_each_trial_ran_under_its_setting(runner, executor)
    assert {c.conditions.allocator for c in executor.calls} == set(ALLOCATOR.values())  # '' for 'default'


def test_later_settings_start_from_the_known_edge_and_need_few_trials():
    spec, target = _spec(), _target("cuda")
    runner, executor = _runner(spec, target)
    first = _first_found(runner, spec, target)
    comparison = compare_allocators(spec, target, runner, first)
    later = [t for t in runner.trials if t.allocator == "expandable_segments:True"]
    assert later[0].batch_size == EDGES["default"]  # started where the first setting's edge was
    by_setting = {o.setting: o.trials for o in comparison.outcomes}
    assert by_setting["expandable_segments:True"] <= by_setting["default"] + 2
    _assert_each_trial_ran_under_its_setting(runner, executor)


def test_a_setting_whose_edge_is_below_the_start_is_searched_again_from_the_spec_start():
    spec, target = _spec(), _target("cuda")
    runner, executor = _runner(spec, target)
    first = _first_found(runner, spec, target)
    comparison = compare_allocators(spec, target, runner, first)
    lower = next(o for o in comparison.outcomes if o.setting == "max_split_size_mb:128")
    assert (lower.max_batch_size, lower.first_failing_batch_size) == (58, 59)
    assert lower.stop_reason == StopReason.EDGE_FOUND.value
    _assert_each_trial_ran_under_its_setting(runner, executor)


def test_on_the_cpu_backend_nothing_runs_and_the_result_says_why():
    spec, target = _spec(), _target("cpu")
    runner, executor = _runner(spec, target)
    comparison = compare_allocators(spec, target, runner, Found(StopReason.EDGE_FOUND, 10, 11))
    assert not comparison.applies and comparison.outcomes == [] and comparison.best is None
    assert "CPU" in comparison.note and runner.trials == []
    assert executor.calls == [] and executor.prestarts == []
