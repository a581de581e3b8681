"""Distributed probing without processes: the spec section, the gang's size, the fan-out, and gang verdicts.

A gang's runs come from a scripted executor (``scripted.gang``), so the probe's
rules for gangs (every rank fits or the first failing rank decides; the peak
the search follows is the highest rank's) run for real with no torch.
"""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from isoprobe.errors import SpecError
from isoprobe.executors.gang import is_gang, rank_requests
from isoprobe.executors.scripted import ScriptedExecutor, crashed, fits, gang, out_of_memory
from isoprobe.report.outcomes import Outcome
from isoprobe.search.plan import accumulation_plan
from isoprobe.pipeline.trial_record import trial_from_run
from isoprobe.protocol.messages import TrialRequest
from isoprobe.executors.ranks import resolve_threads_per_rank, resolve_world_size, with_world_size
from isoprobe.spec.model import Spec

from scripted_probe import GiB, MiB, hog_spec, probe

RAM = 24 * GiB


def _spec(**distributed) -> Spec:
    raw = hog_spec()
    raw["distributed"] = distributed
    return Spec.model_validate(raw)


# --------------------------------------------------------------------------- the spec section


@pytest.mark.parametrize("section, field", [
    ({"strategy": "fsdp", "bucket_cap_mb": 25}, "bucket_cap_mb"),
    ({"strategy": "ddp", "reshard_after_forward": False}, "reshard_after_forward"),
    ({"strategy": "none", "world_size": 4}, "world_size"),
    ({"strategy": "zero1", "fsdp_wrap": "model"}, "fsdp_wrap"),
    ({"strategy": "none", "threads_per_rank": 2}, "threads_per_rank"),
])
def test_an_option_of_another_strategy_is_refused_by_name(section, field):
    with pytest.raises(Exception) as raised:
        _spec(**section)
    assert field in str(raised.value)


def test_a_distributed_strategy_needs_training_mode():
    raw = hog_spec()
    raw["distributed"] = {"strategy": "ddp", "world_size": 2}
    raw["training"] = {"mode": "inference"}
    with pytest.raises(Exception, match="distributed.strategy"):
        Spec.model_validate(raw)


# --------------------------------------------------------------------------- the gang's size


@pytest.mark.parametrize("environ, gpus, expected", [
    ({}, 0, (2, "cpu default")),
    ({}, 4, (4, "visible GPUs")),
    ({"WORLD_SIZE": "8"}, 8, (8, "WORLD_SIZE")),
    ({"WORLD_SIZE": "16"}, 8, (8, "WORLD_SIZE")),  # a two-node job on a node of 8: capped, with a note
    ({"SLURM_NTASKS": "1", "SLURM_GPUS_ON_NODE": "4"}, 4, (4, "SLURM_GPUS_ON_NODE x SLURM_JOB_NUM_NODES")),
    ({"SLURM_NTASKS": "4"}, 4, (4, "SLURM_NTASKS")),
    ({"WORLD_SIZE": "3"}, 0, (3, "WORLD_SIZE")),
])
def test_the_gang_size_comes_from_the_job_capped_to_this_node(environ, gpus, expected):
    resolved = resolve_world_size(_spec(strategy="ddp"), environ, gpus, ram_bytes=RAM, cpu_budget=3 * GiB)
    assert (resolved.size, resolved.source) == expected
    assert (resolved.note is not None) == (environ.get("WORLD_SIZE") == "16")


def test_a_stated_world_size_is_kept_and_a_cpu_gang_is_capped_by_memory():
    stated = resolve_world_size(_spec(strategy="fsdp", world_size=3), {"WORLD_SIZE": "8"}, 8, ram_bytes=RAM,
                                cpu_budget=3 * GiB)
    assert (stated.size, stated.source) == (3, "spec")
    capped = resolve_world_size(_spec(strategy="ddp"), {"WORLD_SIZE": "64"}, 0, ram_bytes=RAM, cpu_budget=4 * GiB)
    assert capped.size == int(RAM * 0.8) // (4 * GiB) and "memory" in capped.note


def test_the_resolved_size_is_in_the_spec_and_so_in_the_cache_key():
    from isoprobe.cache.store import cache_key, key_material

    spec = _spec(strategy="zero1")
    two = with_world_size(spec, resolve_world_size(spec, {}, 0, ram_bytes=RAM, cpu_budget=GiB))
    four = with_world_size(spec, resolve_world_size(spec, {"WORLD_SIZE": "4"}, 0, ram_bytes=RAM, cpu_budget=GiB))
    assert (two.distributed.world_size, four.distributed.world_size) == (2, 4)
    keys = {cache_key(key_material(s, "spec.yaml", {}, None)) for s in (spec, two, four)}
    assert len(keys) == 3


@pytest.mark.parametrize("section, environ, expected", [
    ({"strategy": "ddp", "world_size": 2}, {}, 1),                           # torchrun: 1 when it starts several
    ({"strategy": "ddp", "world_size": 2}, {"OMP_NUM_THREADS": "4"}, 4),     # ... unless the variable is set
    ({"strategy": "ddp", "world_size": 2}, {"OMP_NUM_THREADS": "3,2"}, 3),   # nested levels: the outer one
    ({"strategy": "ddp", "world_size": 2}, {"OMP_NUM_THREADS": "many"}, None),  # left to the ranks as found
    ({"strategy": "fsdp", "world_size": 1}, {}, None),                       # one process: torch's default
    ({"strategy": "zero1", "world_size": 2, "threads_per_rank": 6}, {"OMP_NUM_THREADS": "4"}, 6),  # the spec's
    ({"strategy": "none"}, {"OMP_NUM_THREADS": "4"}, None),                  # not a gang: nothing to decide
])
def test_each_rank_gets_the_threads_torchrun_would_give_it(section, environ, expected):
    spec = _spec(**section)
    assert resolve_threads_per_rank(spec, environ, spec.distributed.world_size or 1) == expected


def test_the_threads_per_rank_are_in_the_key_and_every_rank_starts_with_them():
    """A rank's host memory depends on its threads (measured: a DDP rank of stateful-hog fits 49 with one, 43
    with two), so the number is in the cache key, in every trial's conditions (the child's OMP_NUM_THREADS at
    exec, ``processes.child_environment``) and in the result."""
    from isoprobe.cache.store import cache_key, key_material
    from isoprobe.executors.processes import child_environment

    spec = _spec(strategy="ddp", world_size=2)
    world = resolve_world_size(spec, {}, 0, ram_bytes=RAM, cpu_budget=GiB)
    one = with_world_size(spec, world, resolve_threads_per_rank(spec, {}, world.size))
    four = with_world_size(spec, world, resolve_threads_per_rank(spec, {"OMP_NUM_THREADS": "4"}, world.size))
    assert (one.distributed.threads_per_rank, four.distributed.threads_per_rank) == (1, 4)
    stated = _spec(strategy="ddp", world_size=2, threads_per_rank=6)
    assert with_world_size(stated, world).distributed.threads_per_rank == 6  # a stated count is never dropped
    assert cache_key(key_material(one, "spec.yaml", {}, None)) != cache_key(key_material(four, "spec.yaml", {}, None))

    executor = ScriptedExecutor(lambda call: gang(fits(GiB), fits(GiB)) if call.batch_size <= 8
                                else gang(out_of_memory(), fits(GiB), failed_rank=0, stop_seconds=0.01))
    result = probe(one, executor).result
    assert result.distributed.threads_per_rank == 1
    assert executor.calls and {call.conditions.threads for call in executor.calls} == {1}
    assert {conditions.threads for conditions in executor.prestarts} == {1}
    env = child_environment({"OMP_NUM_THREADS": "8"}, backend="cpu", allocator=None, events_path="e",
                            threads=executor.calls[0].conditions.threads)
    assert env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in child_environment({}, backend="cpu", allocator=None, events_path="e")


def test_the_plan_counts_the_gangs_ranks_unless_the_job_says_more():
    raw = hog_spec()
    raw["distributed"] = {"strategy": "ddp", "world_size": 2}
    raw["plan"] = {"target_global_batch": 64}
    spec = Spec.model_validate(raw)
    plan = accumulation_plan(spec, 16, {})
    assert (plan.world_size, plan.world_size_source, plan.global_batch_size) == (2, "distributed.world_size", 64)
    assert accumulation_plan(spec, 16, {"WORLD_SIZE": "8"}).world_size == 8


# --------------------------------------------------------------------------- the fan-out


def test_each_rank_gets_its_own_request_and_gpu_and_the_gang_one_store():
    spec = with_world_size(_spec(strategy="ddp"), resolve_world_size(_spec(strategy="ddp"), {}, 3, ram_bytes=RAM,
                                                                     cpu_budget=GiB))
    request = TrialRequest(spec=spec, batch_size=8, device="cuda:0")
    assert is_gang(request)
    ranks = rank_requests(request, "/w/trial.store")
    assert [r.device for r in ranks] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [(r.rank.rank, r.rank.world_size, r.rank.backend) for r in ranks] == [(i, 3, "nccl") for i in range(3)]
    assert {r.rank.store_path for r in ranks} == {"/w/trial.store"}
    assert not any(is_gang(r) for r in ranks)  # a rank's request is never fanned out again
    cpu = rank_requests(request.model_copy(update={"device": "cpu"}), "/w/s")
    assert {(r.device, r.rank.backend) for r in cpu} == {("cpu", "gloo")}
    assert not is_gang(TrialRequest(spec=_spec(), batch_size=8, device="cpu"))


# --------------------------------------------------------------------------- a gang's verdict


def test_the_first_failing_rank_decides_and_the_ranks_it_took_down_are_marked():
    run = gang(crashed(signal.SIGKILL, stderr_tail=""), out_of_memory(), failed_rank=1, stop_seconds=0.05)
    trial = trial_from_run(run, 1, 8, "search")
    assert trial.outcome is Outcome.OUT_OF_MEMORY and trial.failed_rank == 1
    assert [(r.rank, r.outcome, r.stopped_by_gang) for r in trial.ranks] == [
        (0, Outcome.CRASHED, True), (1, Outcome.OUT_OF_MEMORY, False)]
    assert trial.gang_stop_seconds == 0.05


def test_a_gang_fits_only_if_every_rank_fits_and_reports_its_highest_rank():
    both = trial_from_run(gang(fits(900 * MiB), fits(1000 * MiB)), 1, 8, "search")
    assert both.outcome is Outcome.FITS and both.budget_peak_bytes == 1000 * MiB and both.failed_rank is None
    assert [r.budget_peak_bytes for r in both.ranks] == [900 * MiB, 1000 * MiB]
    # A rank that fits and then dies (no failure the supervisor saw first) still sinks the gang.
    one_died = gang(fits(900 * MiB), replace(fits(900 * MiB), returncode=-signal.SIGSEGV))
    assert trial_from_run(one_died, 1, 8, "search").outcome is Outcome.CRASHED


def test_a_probe_of_gangs_finds_the_per_rank_edge_and_says_it_is_per_rank():
    # Rank 1 holds 60 MiB more than rank 0 (say, uneven ZeRO-1 shards): the edge is rank 1's (23 leaves it 20 MiB,
    # clear of a gang's spread of 16 MiB).
    budget = 1536 * MiB

    def script(call):
        runs = []
        for extra in (0, 60 * MiB):
            peak = 720 * MiB + extra + 32 * MiB * call.batch_size
            runs.append(fits(peak, base_bytes=720 * MiB + extra) if peak <= budget else out_of_memory())
        failed = next((rank for rank, run in enumerate(runs) if run.returncode == 0 and run.events[-1].outcome
                       is not Outcome.FITS), None)
        return gang(*runs, failed_rank=failed, stop_seconds=0.02 if failed is not None else None)

    raw = hog_spec()
    raw["distributed"] = {"strategy": "zero1", "world_size": 2}
    result = probe(raw, ScriptedExecutor(script)).result
    assert (result.max_batch_size, result.first_failing_batch_size) == (23, 24)
    assert result.distributed.strategy == "zero1" and result.distributed.world_size == 2
    assert result.distributed.per_rank and result.distributed.backend == "gloo"
    failing = [t for t in result.trials if t.batch_size == 24][0]
    assert failing.failed_rank == 1 and failing.ranks[0].outcome is Outcome.FITS


def test_a_gang_that_needs_more_gpus_than_the_node_has_is_a_spec_error():
    from isoprobe.pipeline.environment import resolve_target
    from isoprobe.protocol.messages import CudaDevice, Facts

    spec = _spec(strategy="ddp", world_size=4).model_copy(update={"device": "cuda"})
    facts = Facts(torch_version="x", cuda_available=True,
                  cuda_devices=[CudaDevice(name="GPU", total_memory_bytes=80 * GiB)] * 2)
    with pytest.raises(SpecError) as raised:
        resolve_target(spec, facts, None)
    assert "distributed.world_size" in str(raised.value) and "2 visible" in str(raised.value)


def test_a_hook_learns_the_batch_is_per_rank_and_for_which_strategy():
    from isoprobe.report.shell import result_variables

    def script(call):
        return gang(fits(900 * MiB), fits(900 * MiB)) if call.batch_size <= 20 else gang(
            fits(900 * MiB), out_of_memory(), failed_rank=1, stop_seconds=0.01)

    raw = hog_spec(max_batch_size=40)
    raw["distributed"] = {"strategy": "fsdp", "world_size": 2}
    variables = dict(result_variables(probe(raw, ScriptedExecutor(script)).result))
    assert (variables["ISOPROBE_STRATEGY"], variables["ISOPROBE_PROBED_RANKS"]) == ("fsdp", "2")
    assert variables["ISOPROBE_MAX_BATCH_SIZE"] == "20"
    single = dict(result_variables(probe(hog_spec(), ScriptedExecutor(lambda call: fits(900 * MiB))).result))
    assert "ISOPROBE_STRATEGY" not in single


class _HungRank:
    """A rank still running at the gang's deadline, with the events it wrote so far (a Launch, as _supervise sees it)."""

    def __init__(self, tmp_path, rank: int, steps_done: int):
        import time as clock

        from isoprobe.protocol.messages import RequestReceived, Started, StepDone, event_line

        self.events_path = tmp_path / f"rank{rank}.events"
        events = [Started(pid=rank + 100), RequestReceived(path="r.json")] + [StepDone(step=n, seconds=0.1)
                                                                 for n in range(1, steps_done + 1)]
        self.events_path.write_bytes(b"".join(event_line(e) for e in events))
        self.delivered = clock.monotonic() - 60
        self.timed_out = self.verdict_at_timeout = False
        self.child = None

    def poll(self):
        return None


@pytest.mark.parametrize(("steps", "blamed"), [((1, 0), 1), ((0, 2), 0), ((1, 1), None), ((0, 1, 1), 0)])
def test_a_gang_that_times_out_names_the_rank_that_fell_behind_or_none(tmp_path, monkeypatch, steps, blamed):
    """Rank 1 hung in step 2 while rank 0 waited in its all-reduce: rank 0 was named, as the first that timed out."""
    from isoprobe.executors import gang as gang_module

    launches = [_HungRank(tmp_path, rank, done) for rank, done in enumerate(steps)]
    monkeypatch.setattr(gang_module, "wait_for_end", lambda child, timeout: (True, False))
    monkeypatch.setattr(gang_module.LocalExecutor, "stop", staticmethod(lambda launch: None))
    assert gang_module._supervise(launches, 1.0, conclude=lambda failed: failed) == blamed
