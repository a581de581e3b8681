"""The allocator comparison's orchestration, over a fake trial runner (no processes, no GPU).

Each setting has its own true edge; the fake runner answers like a device whose
peak is ``base + per_sample * batch`` and whose usable memory depends on the
allocator (fragmentation). The comparison must find every edge exactly, tag each
trial with its setting, and start the later settings from what it knows.
"""

from __future__ import annotations

from isoprobe.outcomes import Outcome
from isoprobe.probe import Found, Target, TrialRunner, compare_allocators
from isoprobe.result import DeviceInfo, StopReason, Trial
from isoprobe.spec import Spec

GiB = 1024**3
PER_SAMPLE = 100 * 1024**2
BASE = 2 * GiB
EDGES = {"default": 60, "expandable_segments:True": 66, "max_split_size_mb:128": 58}


class FakeRunner(TrialRunner):
    def __init__(self, spec, target):
        super().__init__(spec, target, launcher=None, python_path=[], reporter=_Quiet())

    def run(self, batch_size: int, purpose: str = "search") -> Trial:
        edge = EDGES[self.allocator_label]
        fits = batch_size <= edge
        trial = Trial(
            index=len(self.trials) + 1, batch_size=batch_size, purpose=purpose,
            outcome=Outcome.FITS if fits else Outcome.OUT_OF_MEMORY, seconds=1.0,
            budget_peak_bytes=BASE + PER_SAMPLE * batch_size if fits else None,
            peak_bytes=BASE + PER_SAMPLE * batch_size if fits else None,
            base_bytes=BASE if fits else None, allocator=self.allocator_label,
        )
        self.trials.append(trial)
        return trial


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


def _first_found(runner: FakeRunner, spec: Spec, target: Target) -> Found:
    from isoprobe.probe import _edge_search

    runner.allocator_label = spec.allocators[0]
    return _edge_search(spec, target, runner, start=None)


def test_every_setting_gets_its_exact_edge_and_the_best_is_named():
    spec, target = _spec(), _target("cuda")
    runner = FakeRunner(spec, target)
    first = _first_found(runner, spec, target)
    relaunched = []
    comparison = compare_allocators(spec, target, runner, first, lambda s: relaunched.append(s) or None)
    assert comparison.applies
    assert relaunched == list(EDGES)[1:]  # a fresh launcher (environment) per further setting
    found = {o.setting: (o.max_batch_size, o.first_failing_batch_size) for o in comparison.outcomes}
    assert found == {s: (e, e + 1) for s, e in EDGES.items()}
    assert comparison.best == "expandable_segments:True"
    assert all(t.allocator in EDGES for t in runner.trials)
    assert sum(o.trials for o in comparison.outcomes) == len(runner.trials)


def test_later_settings_start_from_the_known_edge_and_need_few_trials():
    spec, target = _spec(), _target("cuda")
    runner = FakeRunner(spec, target)
    first = _first_found(runner, spec, target)
    comparison = compare_allocators(spec, target, runner, first, lambda s: None)
    later = [t for t in runner.trials if t.allocator == "expandable_segments:True"]
    assert later[0].batch_size == EDGES["default"]  # started where the first setting's edge was
    by_setting = {o.setting: o.trials for o in comparison.outcomes}
    assert by_setting["expandable_segments:True"] <= by_setting["default"] + 2


def test_a_setting_whose_edge_is_below_the_start_is_searched_again_from_the_spec_start():
    spec, target = _spec(), _target("cuda")
    runner = FakeRunner(spec, target)
    first = _first_found(runner, spec, target)
    comparison = compare_allocators(spec, target, runner, first, lambda s: None)
    lower = next(o for o in comparison.outcomes if o.setting == "max_split_size_mb:128")
    assert (lower.max_batch_size, lower.first_failing_batch_size) == (58, 59)
    assert lower.stop_reason == StopReason.EDGE_FOUND.value


def test_on_the_cpu_backend_nothing_runs_and_the_result_says_why():
    spec, target = _spec(), _target("cpu")
    runner = FakeRunner(spec, target)
    comparison = compare_allocators(spec, target, runner, Found(StopReason.EDGE_FOUND, 10, 11), lambda s: None)
    assert not comparison.applies and comparison.outcomes == [] and comparison.best is None
    assert "CPU" in comparison.note and runner.trials == []
