"""Distributed trials on GPUs with nccl: a gang of two ranks, one GPU each. Skipped with fewer than two GPUs.

Written before any machine with two GPUs was available to the project: run it
whenever one is (``python -m pytest tests/gpu -m gpu``). It checks what only
real GPUs show: the backend is nccl, each rank's peak is on its own GPU and
within the per-GPU budget, and one rank running out of memory ends the gang
at once, as on the CPU.
"""

from __future__ import annotations

import pytest

from conftest import FAULTS, cuda_resnet_spec, run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA GPUs")

GiB = 1024**3


def _resnet(strategy: str) -> dict:
    """The GPU tier's resnet18 (conftest.cuda_resnet_spec) as a gang of two ranks, one GPU each."""
    return {**cuda_resnet_spec("2GiB"), "recommendation": {"soak_steps": 0},
            "distributed": {"strategy": strategy, "world_size": 2}}


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_a_nccl_gang_finds_an_exact_per_rank_edge_within_the_per_gpu_budget(write_spec, strategy):
    run = run_cli("run", str(write_spec(_resnet(strategy))), "--format", "json")
    assert run.returncode == 0, run.stderr
    result = run.json
    assert result["distributed"]["backend"] == "nccl" and result["distributed"]["world_size"] == 2
    assert result["first_failing_batch_size"] == result["max_batch_size"] + 1
    for trial in result["trials"]:
        if trial["outcome"] == "fits":
            assert len(trial["ranks"]) == 2
            for rank in trial["ranks"]:
                assert rank["budget_peak_bytes"] <= 2 * GiB


def test_one_rank_out_of_memory_on_a_gpu_ends_the_gang_at_once(write_spec):
    spec = {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": "raise_cuda_oom", "at": 4, "ranks": [1]}},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "steps": 2, "max_batch_size": 4, "trial_timeout": 120},
        "device": "cuda",
        "recommendation": {"soak_steps": 0},
        "distributed": {"strategy": "ddp", "world_size": 2},
    }
    run = run_cli("run", str(write_spec(spec)), "--format", "json")
    assert run.returncode == 0, run.stderr
    failing = [t for t in run.json["trials"] if t["batch_size"] == 4]
    assert failing and all(t["outcome"] == "out_of_memory" and t["failed_rank"] == 1 for t in failing)
    assert all(t["gang_stop_seconds"] < 5 and t["seconds"] < 60 for t in failing)
