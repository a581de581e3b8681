"""issue 20 on a real GPU: what only a GPU can show (skipped without one).

Defect 1 (allocator parsing) is in test_cuda.py; here: the warm-up takes the libraries' memory before
the model (and the budget leaves room for it), fp16's optimizer state is in the peak (3), the evaluation
pass is timed on finished work (5), and the inspect child holds a context on the trials' GPU only (9).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MiB = 1024**2


def _python(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (its own CUDA context); it prints one JSON line last."""
    import os

    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed"])
def test_the_warm_up_takes_the_libraries_memory_before_the_model(precision):
    """After setup, a real matmul and convolution forward and backward add (almost) nothing outside the allocator."""
    found = _python(f"""
        import json, torch
        from isoprobe.child.core import cuda
        device = torch.device("cuda:0")
        cuda.setup(torch, device, {precision!r}, None)
        def outside():
            free, total = torch.cuda.mem_get_info(device)
            return cuda.outside_allocator_bytes(free, total, torch.cuda.memory_reserved(device))
        before = outside()
        dtype = torch.float16 if {precision!r} == "fp16-mixed" else torch.float32
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is torch.float16):
            a = torch.randn(2048, 2048, device=device, requires_grad=True)
            x = torch.randn(16, 64, 56, 56, device=device, requires_grad=True)
            conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
            ((a @ a).float().sum() + conv(x).float().sum()).backward()
        torch.cuda.synchronize()
        print(json.dumps({{"before": before, "after": outside()}}))
    """)
    assert found["before"] > 100 * MiB  # the context and the libraries are there, outside the allocator
    assert found["after"] - found["before"] < 64 * MiB, found


def test_under_a_budget_allocator_and_outside_memory_stay_within_it():
    found = _python("""
        import json, torch
        from isoprobe.child.core import cuda
        device = torch.device("cuda:0")
        budget = 2 * 1024**3
        cuda.setup(torch, device, "fp32", budget)
        blocks = []
        try:
            while True:
                blocks.append(torch.empty(64 * 1024**2, dtype=torch.uint8, device=device))
        except torch.OutOfMemoryError:
            pass
        free, total = torch.cuda.mem_get_info(device)
        print(json.dumps({"used": total - free, "budget": budget}))
    """)
    assert found["used"] <= found["budget"] and found["used"] > found["budget"] - 256 * MiB, found


def _trial(tmp_path, spec: dict, batch: int, steps: int | None = None) -> dict:
    from isoprobe.executors import Conditions
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    tmp_path.mkdir(parents=True, exist_ok=True)
    request = TrialRequest(spec=Spec.model_validate(spec), batch_size=batch, device="cuda:0",
                           memory_budget_bytes=None, python_path=[], steps=steps,
                           eval_batch_size=batch if spec.get("training", {}).get("eval_pass") else None)
    run = run_once(request, Conditions(backend="cuda", allocator=None), timeout=600, workdir=tmp_path)
    end = classify_exit(run)
    assert end.outcome.value == "fits", run.stderr_tail
    return end.result.model_dump()


def _resnet(**training) -> dict:
    return {"model": {"torchvision": "resnet18", "kwargs": {"num_classes": 100}}, "input": {"shape": [3, 128, 128]},
            "target": {"classes": 100}, "optimizer": {"name": "adam"}, "search": {"steps": 3}, "device": "cuda",
            "training": training}


def test_fp16_mixed_adam_state_is_in_every_fit(tmp_path):
    """Whatever the scaler skipped, a 'fits' holds Adam's two moments: twice the parameters' bytes."""
    result = _trial(tmp_path, _resnet(precision="fp16-mixed"), 32)
    sizes = result["sizes"]
    assert sizes["optimizer_state_bytes"] >= 2 * sizes["parameter_bytes"]
    assert result["applied"]["grad_scaler"] is True


def test_the_evaluation_pass_is_timed_on_finished_work(tmp_path):
    """A forward pass of resnet50 at batch 128 takes real milliseconds; timing launches would report a few."""
    spec = {**_resnet(eval_pass=True), "model": {"torchvision": "resnet50"}, "input": {"shape": [3, 224, 224]},
            "target": {"classes": 1000}}
    result = _trial(tmp_path, spec, 128)
    later = sorted(result["step_seconds"][1:])
    # A training step is about three forward passes; launch-only timing is well under a tenth of one.
    assert result["eval_seconds"] > 0.15 * later[len(later) // 2], result


def test_the_inspect_child_holds_a_context_on_the_trials_gpu_only(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to tell the target from the others")
    pytest.importorskip("pynvml")
    spec = {**_resnet(), "device": "cuda:1"}
    found = _python(f"""
        import json, os, pynvml
        from isoprobe.child.environment_check import run_inspect
        from isoprobe.protocol.messages import InspectRequest
        from isoprobe.spec.model import Spec
        class Events:
            def emit(self, event):
                self.last = event
        events = Events()
        run_inspect(InspectRequest(spec=Spec.model_validate(json.loads(os.environ['SPEC_JSON']))), events)
        pynvml.nvmlInit()
        holding = [i for i in range(pynvml.nvmlDeviceGetCount())
                   if os.getpid() in {{p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
                       pynvml.nvmlDeviceGetHandleByIndex(i))}}]
        devices = events.last.facts.cuda_devices
        print(json.dumps({{"holding": holding, "free": [d.free_memory_bytes for d in devices]}}))
    """, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "SPEC_JSON": json.dumps(spec)})
    assert found["holding"] == [1], found
    assert found["free"][0] is None and found["free"][1] > 0


def test_a_neighbours_memory_is_not_read_as_the_trials_own():
    """Issue 57: a second process holds 3 GiB of the card; the trial's memory outside its allocator is its own (NVML's
    figure for its pid), not the neighbour's. Where NVML lists no figure for this pid, the card-wide one stands: said."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, torch
        held = torch.empty(3 * 1024**3, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        found = _python("""
            import json, torch
            from isoprobe.child import cuda_readings
            from isoprobe.child.core import cuda
            device = torch.device("cuda:0")
            cuda.setup(torch, device, "fp32", 8 * 1024**3)
            reading = cuda_readings.card_reading(torch.cuda, device)
            print(json.dumps({"own": cuda_readings.own_process_bytes(torch.cuda, device),
                              "outside": reading["outside"]}))
        """)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    if found["own"] is None:
        pytest.skip(f"NVML gives no figure for this pid here: the card-wide figure stands ({found})")
    assert found["outside"] < 2 * 1024**3, found
