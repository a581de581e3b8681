"""The CUDA backend, for real. Skipped without a GPU (CI and dev machines have none)."""

from __future__ import annotations

import json

import pytest

from conftest import cuda_resnet_spec, run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _spec(budget: str) -> dict:
    return cuda_resnet_spec(budget)


def test_cuda_probe_finds_an_edge_under_a_budget(write_spec):
    run = run_cli("run", str(write_spec(_spec("2GiB"))))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["device"]["backend"] == "cuda"
    assert result["stop_reason"] == "edge_found"
    # Exact: the next batch fails, or every batch between fit only inside the spread (a reading at the cap that
    # did not fit again under a cap the spread lower: child.core.cuda.squeeze), listed as marginal.
    between = set(range(result["max_batch_size"] + 1, result["first_failing_batch_size"]))
    marginal = {m["batch_size"] for m in (result["edge_margin"] or {}).get("marginal", [])}
    assert between <= marginal, (between, marginal)
    budget = 2 * 1024**3
    for trial in result["trials"]:
        if trial["outcome"] == "fits":
            assert trial["peak_allocated_bytes"] <= trial["peak_bytes"] <= budget
    failing = [t for t in result["trials"] if t["outcome"] == "out_of_memory"]
    assert failing and all("OutOfMemoryError" in t["error"]["type"] for t in failing)
    # The recommendation is soaked for 20 steps on CUDA, the peak read after each (reserved, so it only rises).
    recommendation = result["recommendation"]
    assert recommendation["soak_steps"] == 20 and recommendation["soaks"][-1]["survived"]
    soak = result["trials"][recommendation["soaks"][-1]["trial"] - 1]
    assert soak["purpose"] == "soak" and soak["batch_size"] == result["recommended_batch_size"]
    # The reserved peak only rises, from the step after the cap was last lowered (kernels that loaded after it:
    # child.core.cuda.refit_cap restarts the peaks, and that trial steps once more).
    peaks = soak["step_peak_bytes"]
    assert len(peaks) >= 20 and peaks[-19:] == sorted(peaks[-19:])
    assert peaks[-1] <= budget and soak["peak_bytes"] <= budget


@pytest.mark.parametrize("setting", ["no_such_key:1", "expandable_segments:true"])
def test_bad_allocator_setting_is_not_an_out_of_memory(write_spec, setting):
    # CUDA's lazy initialisation parses the setting: it must fail inside the checks (exit 2), not as no answer (4).
    spec = _spec("2GiB")
    spec["allocator"] = setting
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 2, run.stderr  # a spec error, found before any trial
    assert "allocator" in run.stderr and setting.split(":")[0] in run.stderr
    assert "isoprobe: trial " not in run.stderr


def test_a_bad_allocators_entry_is_a_spec_error_before_any_trial(write_spec):
    spec = {**_spec("2GiB"), "allocators": ["default", "expandable_segments:True", "max_split_sise_mb:128"]}
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 2, run.stderr
    assert "max_split_sise_mb" in run.stderr and "isoprobe: trial " not in run.stderr


def _compute_pids() -> set[int]:
    """The PIDs holding a context on any GPU, as the driver lists them (NVML; no context of its own)."""
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        pids = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids
    finally:
        pynvml.nvmlShutdown()


def test_a_warm_cuda_child_creates_no_context_before_its_request(tmp_path):
    """Two contexts on one GPU would disturb the running trial: the spare must wait with CUDA untouched.

    Checked where the driver sees it: the waiting spare's PID is not among the GPU's compute
    processes (torch's own ``is_initialized`` flag, which the Warm event reports, would stay False
    for a context some library created behind torch's back). The same check run on the trial
    itself, while it holds its context, shows that the driver lists such PIDs (the negative control).
    """
    import time

    from isoprobe.executors import Conditions
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import Started, TrialRequest, Warm, last_of, read_events
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate(_spec("2GiB"))
    request = TrialRequest(spec=spec, batch_size=16, device="cuda:0", memory_budget_bytes=2 * 1024**3,
                           python_path=[])
    conditions = Conditions(backend="cuda", allocator=None, preload=("torch", "torch._dynamo", "torchvision"))
    with LocalExecutor(tmp_path, warm=True) as executor:
        executor.prestart(conditions)
        spare = executor._spare
        deadline = time.monotonic() + 120
        while last_of(read_events(spare.events_path), Warm) is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until the spare has imported everything and waits for its request
        events = read_events(spare.events_path)
        assert last_of(events, Warm) is not None, events
        spare_pid = last_of(events, Started).pid
        assert spare_pid not in _compute_pids(), "the waiting spare holds a CUDA context"
        run = executor.run(request, conditions, timeout=300, name="warm")
    assert run.warm and last_of(run.events, Warm).cuda_initialized is False
    assert classify_exit(run).outcome.value == "fits"


def test_the_driver_lists_a_process_that_holds_a_context():
    """The negative control of the spare's check: a process with a context is among the compute PIDs."""
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import torch, sys; torch.zeros(1, device='cuda'); "
                               "print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert holder.pid in _compute_pids()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def _one_trial(tmp_path, spec: dict, batch: int) -> dict:
    """One CUDA trial in a fresh child; its ``TrialResult`` as a dict (it must fit)."""
    from isoprobe.executors import Conditions
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    tmp_path.mkdir(parents=True, exist_ok=True)
    request = TrialRequest(spec=Spec.model_validate(spec), batch_size=batch, device="cuda:0",
                           memory_budget_bytes=None, python_path=[])
    run = run_once(request, Conditions(backend="cuda", allocator=None), timeout=300, workdir=tmp_path)
    end = classify_exit(run)
    assert end.outcome.value == "fits", run.stderr_tail
    return end.result.model_dump()


@pytest.mark.parametrize(("precision", "dtype"), [("fp16-mixed", "float16"), ("bf16-mixed", "bfloat16")])
def test_cuda_autocast_runs_in_the_asked_dtype_and_needs_less_than_fp32(tmp_path, precision, dtype):
    if precision.startswith("bf16") and torch.cuda.get_device_capability(0) < (8, 0):  # not is_bf16_supported()
        pytest.skip("this GPU has no bfloat16")
    plain = _one_trial(tmp_path / "fp32", {**_spec("2GiB"), "training": {"precision": "fp32"}}, 64)
    mixed = _one_trial(tmp_path / precision, {**_spec("2GiB"), "training": {"precision": precision}}, 64)
    assert mixed["applied"]["output_dtype"] == dtype
    assert mixed["applied"]["grad_scaler"] is (precision == "fp16-mixed")
    assert mixed["peak_allocated_bytes"] < plain["peak_allocated_bytes"]


def test_cuda_channels_last_and_cudnn_benchmark_take_effect(tmp_path):
    spec = {**_spec("2GiB"), "training": {"channels_last": True, "cudnn_benchmark": True}}
    result = _one_trial(tmp_path, spec, 32)
    assert result["applied"]["channels_last"] and result["applied"]["input_channels_last"]
    assert result["applied"]["cudnn_benchmark"] is True


def test_cuda_gradient_checkpointing_lowers_the_peak(tmp_path):
    plain = _one_trial(tmp_path / "plain", _spec("2GiB"), 64)
    checkpointed = _one_trial(tmp_path / "ckpt", {**_spec("2GiB"), "training": {"gradient_checkpointing": True}}, 64)
    assert checkpointed["applied"]["checkpointing"] == "blocks"
    assert checkpointed["peak_allocated_bytes"] < 0.8 * plain["peak_allocated_bytes"]


def test_nvml_facts_for_the_cache_key_match_what_torch_sees():
    # The parent reads the GPU from NVML (no CUDA context); the trials see it through torch. Same card.
    import os

    from isoprobe.system.hardware import nvml_gpus, visible_devices

    gpus = nvml_gpus(visible_devices(os.environ))
    assert gpus, "NVML sees no GPU although torch does"
    props = torch.cuda.get_device_properties(0)
    assert gpus[0]["name"] == props.name
    # NVML and the runtime may count a few reserved MiB differently; the key needs the model, not the byte.
    assert gpus[0]["total_memory_bytes"] == pytest.approx(props.total_memory, rel=0.05)


def test_a_cached_cuda_answer_is_keyed_by_the_gpu_and_returned_without_trials(write_spec, tmp_path):
    spec = str(write_spec(_spec("2GiB")))
    first = run_cli("run", spec, "--format", "json", cache_dir=tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    second = run_cli("run", spec, "--format", "json", cache_dir=tmp_path / "cache")
    result = json.loads(second.stdout)
    assert result["cache"]["hit"] is True and "isoprobe: trial " not in second.stderr
    assert result["environment"]["gpus"][0]["name"] == result["device"]["name"]
