"""A CPU answer is kept per intra-op thread count (isoprobe.cache.threads).

The parent's reading of torch's rule (measured with torch 2.14, 2 cores: unset
reads 2, OMP_NUM_THREADS=3 reads 2, MKL_NUM_THREADS wins over OMP_NUM_THREADS,
MKL_DYNAMIC=FALSE lifts the cap, ``taskset -c 0`` reads 1); an entry filled
at one thread count is not served at another; and an answer whose trials ran
another count than the key holds is not stored.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_orchestration_cache import Recording, Untouchable, ask

from isoprobe.cache import threads as cache_threads
from isoprobe.cache.store import cache_key, key_material
from isoprobe.cache.threads import asked_threads, predicted_threads, trial_threads
from isoprobe.protocol.messages import TrialResult
from isoprobe.spec.model import Spec
from scripted_probe import SPEC_PATH, hog_spec


@pytest.mark.parametrize(("variables", "usable_cores", "cores", "expected"), [
    ({}, 2, 2, 2),                                                # torch's default: the usable cores
    ({}, 1, 2, 1),                                                # taskset -c 0
    ({"OMP_NUM_THREADS": "1"}, 2, 2, 1),
    ({"OMP_NUM_THREADS": "3"}, 2, 2, 2),                          # capped at the machine's cores
    ({"OMP_NUM_THREADS": "2"}, 1, 2, 2),                          # ... not at the affinity
    ({"OMP_NUM_THREADS": "3", "MKL_DYNAMIC": "FALSE"}, 2, 2, 3),  # unless MKL_DYNAMIC is false
    ({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}, 2, 2, 2),  # MKL's variable wins
    ({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "abc"}, 2, 2, 1),
    ({"OMP_NUM_THREADS": "2,1"}, 4, 4, 2),                        # nested levels: the first
    ({"OMP_NUM_THREADS": "0"}, 2, 2, 2),                          # not a count: ignored
    ({"OMP_NUM_THREADS": "+1"}, 2, 2, 1),
])
def test_the_predicted_count_follows_torchs_rule(variables, usable_cores, cores, expected):
    assert predicted_threads(variables, usable_cores, cores) == expected


def test_a_thread_variable_is_read_as_torch_reads_it():
    assert [asked_threads(v) for v in ("4", " 4", "4abc", "4,2", "-1", "0", "", None, "x4")] == \
        [4, 4, 4, 4, None, None, None, None, None]


def _key(environ: dict, device: str = "cpu", gpus=None) -> str:
    spec = Spec.model_validate({**hog_spec(), "device": device})
    return cache_key(key_material(spec, SPEC_PATH, environ, gpus))


def test_a_cpu_key_holds_the_threads_and_a_cuda_key_does_not(monkeypatch):
    monkeypatch.setattr(cache_threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(cache_threads, "physical_cores", len)
    assert _key({"OMP_NUM_THREADS": "1"}) != _key({})
    assert _key({"MKL_NUM_THREADS": "1"}) != _key({})
    assert _key({"OMP_NUM_THREADS": "1"}) == _key({"OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "7"})
    monkeypatch.setattr(cache_threads, "usable_cpus", lambda: [0])  # the same variables on fewer CPUs
    one_cpu = _key({})
    monkeypatch.setattr(cache_threads, "usable_cpus", lambda: [0, 1])
    assert one_cpu != _key({})
    a100 = [{"nvml_index": 0, "uuid": "GPU-a", "name": "A100", "total_memory_bytes": 80 << 30,
             "driver_version": "550"}]
    assert _key({"OMP_NUM_THREADS": "1"}, "cuda", a100) == _key({}, "cuda", a100)


def test_a_gangs_threads_per_rank_is_the_ranks_omp_num_threads():
    assert trial_threads({"OMP_NUM_THREADS": "4"}, threads_per_rank=1)["variables"]["OMP_NUM_THREADS"] == "1"
    assert trial_threads({"OMP_NUM_THREADS": "4"})["variables"]["OMP_NUM_THREADS"] == "4"


def test_an_entry_filled_at_one_thread_count_is_not_served_at_another(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    stored, _ = ask(spec, cache, Recording(), environ={"OMP_NUM_THREADS": "1"})
    assert stored.cache.hit is False and stored.answered
    assert ask(spec, cache, Untouchable(), environ={"OMP_NUM_THREADS": "1"})[0].cache.hit is True

    again, lines = ask(spec, cache, (executor := Recording()), environ={})  # torch's default count
    assert executor.calls and again.cache.hit is False and again.cache.key != stored.cache.key
    assert "answer from the cache" not in lines


class Threads(Recording):
    """Scripted trials that report running ``count`` intra-op threads, as real ones do."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def run(self, request, conditions, *, timeout, name):
        run = super().run(request, conditions, timeout=timeout, name=name)
        return replace(run, events=[e.model_copy(update={"threads": self.count}) if isinstance(e, TrialResult)
                                    else e for e in run.events])


def test_an_answer_whose_trials_ran_another_count_than_the_key_is_not_stored(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    result, lines = ask(spec, cache, Threads(2), environ={"OMP_NUM_THREADS": "1"})
    assert "the trials ran 2 intra-op thread(s), but the cache key holds 1" in lines
    assert "so the answer is not cached" in lines
    assert result.answered and result.cache is None and not list(cache.glob("*.json"))

    stored, lines = ask(spec, cache, Threads(1), environ={"OMP_NUM_THREADS": "1"})
    assert stored.cache.hit is False and "answer cached in" in lines
