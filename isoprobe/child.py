"""The trial, inside its own process: real training steps at one batch size.

Run as ``python -m isoprobe.child REQUEST.json`` by ``supervisor.py`` and by
nothing else. It is the only part of isoprobe that imports torch. It reports
through a dedicated events file (path in ``$ISOPROBE_EVENTS``), one complete
JSON line per event written with a single ``write``, because the user's model
may print anything on stdout and a half-written line must be detectable.

Events, in order: ``started``, ``imported``, ``model_built``, ``step`` (one per
completed step), then exactly one ``result``. A process that ends without a
``result`` event is classified by the parent (crashed, timed out). The child
classifies its own exceptions: out of memory versus any other error.

Started as ``python -m isoprobe.child --wait`` it is a *warm* child: it
imports torch and the model library first, then reads the request's path from
stdin (see ``supervisor.Launcher``).

Two modes: ``trial`` runs the training steps; ``inspect`` (once per probe, before
any trial) reports versions and the device, and checks that the model can be
built, on the meta device so that it costs no memory.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

from isoprobe.outcomes import Outcome, classify_exception
from isoprobe.training import Step, build_optimizer, enable_checkpointing
from isoprobe.workload import build_model, import_callable, make_batch, primary_output, task_of

_TRACEBACK_LINES = 25
_MESSAGE_CHARS = 2000


class Events:
    """Append-only JSON-lines channel to the parent."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n"
        os.write(self._fd, line.encode())


# --------------------------------------------------------------------------- memory readings


def _proc_status_bytes(*keys: str) -> dict[str, int | None]:
    """VmHWM, VmRSS, VmData... from /proc/self/status, in bytes (None where absent)."""
    values: dict[str, int | None] = {key: None for key in keys}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in values:
                    values[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def _cpu_memory() -> dict[str, int | None]:
    readings = _proc_status_bytes("VmHWM", "VmRSS", "VmData", "VmPeak", "VmSize")
    peak_data = None
    if None not in (readings["VmPeak"], readings["VmSize"], readings["VmData"]):
        peak_data = readings["VmPeak"] - (readings["VmSize"] - readings["VmData"])
    return {"peak_rss": readings["VmHWM"], "rss": readings["VmRSS"], "data": readings["VmData"], "peak_data": peak_data}


def _cpu_readings() -> dict[str, int | None]:
    """A CPU trial's peaks: resident (what people know) and the data segment (what the budget caps).

    RLIMIT_DATA caps the data segment, which runs a near-constant ~200 MiB above
    the resident set (mapped but untouched pages), so the resident peak is not in
    the budget's units. Linux keeps no high-water mark of the data segment, but
    it keeps one of the whole address space (VmPeak); the part of the address
    space that is not data (code, read-only mappings, the stack) is settled once
    the imports are done, so VmPeak minus that part estimates the data peak.
    Measured on ResNet50 under 3 GiB: the estimate puts batch 21 at 2.97 GiB and
    predicts 22 above 3 GiB, where the edge is. ``base_bytes`` is the data
    segment after the steps, with the batch's activations freed.
    """
    memory = _cpu_memory()
    return {"peak_bytes": memory["peak_rss"], "budget_peak_bytes": memory["peak_data"], "base_bytes": memory["data"]}


# --------------------------------------------------------------------------- modes


def _import_model_library(spec: dict):
    """The model source's library (torchvision, timm or transformers), or None for a factory."""
    model = spec["model"]
    for source, module in (("torchvision", "torchvision"), ("timm", "timm"), ("huggingface", "transformers")):
        if model.get(source):
            return __import__(module)
    return None


def _setup_cuda(torch, request: dict) -> dict:
    """Select the GPU, touch the allocator (a bad allocator setting fails here), apply the budget."""
    device = torch.device(request["device"])
    torch.cuda.set_device(device)
    torch.empty(1, device=device)
    total = torch.cuda.get_device_properties(device).total_memory
    budget = request.get("memory_budget_bytes")
    if budget:
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    return {"total_memory_bytes": total}


def run_trial(request: dict, events: Events) -> None:
    progress: dict = {"phase": "started", "step_seconds": []}
    report: dict = {}
    failure: tuple[Outcome, dict] | None = None
    try:
        report = _train(request, events, progress)
    except Exception as exc:  # classified, never guessed: see outcomes.classify_exception
        failure = _describe_failure(exc)
    if failure is None:
        events.emit("result", outcome=Outcome.FITS.value, **progress, **report)
        return
    # The model, optimizer and batch lived in _train's frame, kept alive by the traceback
    # until the except block ended: collect them before writing, so that reporting an
    # out-of-memory does not itself run out of memory.
    gc.collect()
    outcome, error = failure
    if outcome is Outcome.ERROR:
        sys.stderr.write(error["traceback_tail"])
    if not request["device"].startswith("cuda"):
        report["peak_bytes"] = _cpu_memory()["peak_rss"]
    events.emit("result", outcome=outcome.value, error=error, **progress, **report)


def _train(request: dict, events: Events, progress: dict) -> dict:
    """Build, then run the spec's training steps; return the peak readings. Raises on failure."""
    spec = request["spec"]
    report: dict = {}
    import torch

    _import_model_library(spec)  # here, so that its cost lands in the 'imported' phase
    progress["phase"] = "imported"
    events.emit("imported", memory=_cpu_memory())
    device = torch.device(request["device"])
    cuda = device.type == "cuda"
    if cuda:
        report.update(_setup_cuda(torch, request))
    python_path = request.get("python_path", [])
    step = Step(spec, build_model(spec, python_path), device, python_path)
    progress["phase"] = "model_built"
    events.emit("model_built", memory=_cpu_memory())
    if cuda:
        # Peaks from here on; the model's weights are allocated already and still count.
        torch.cuda.reset_peak_memory_stats(device)
    batch = step.batch(request["batch_size"])
    for index in range(1, spec["search"]["steps"] + 1):
        started = time.perf_counter()
        step.run(batch)
        if cuda:
            torch.cuda.synchronize(device)
        progress["step_seconds"].append(time.perf_counter() - started)
        progress["phase"] = f"step {index}"
        events.emit("step", step=index, seconds=progress["step_seconds"][-1])
    if (spec.get("training") or {}).get("eval_pass"):
        progress["phase"] = "eval"
        seconds = step.evaluate(batch)
        if cuda:
            torch.cuda.synchronize(device)
        report["eval_seconds"] = seconds
        events.emit("eval", seconds=seconds)
    report["applied"] = step.applied
    sizes = dict(step.sizes or {})
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        sizes["cuda_context_bytes"] = max(0, (total - free) - torch.cuda.memory_reserved(device))
        sizes["reserved_unallocated_bytes"] = torch.cuda.max_memory_reserved(device) - torch.cuda.max_memory_allocated(device)
    if sizes:
        report["sizes"] = sizes
    if (spec.get("training") or {}).get("compile") and len(progress["step_seconds"]) >= 2:
        # The first step compiles (forward and backward graphs); the later ones show what a step costs.
        later = sorted(progress["step_seconds"][1:])
        report["compile_seconds"] = max(0.0, progress["step_seconds"][0] - later[len(later) // 2])
    if cuda:
        report["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        report["peak_bytes"] = report["budget_peak_bytes"] = torch.cuda.max_memory_reserved(device)
        # Weights, gradients and optimizer state, with the batch's activations freed. In allocated
        # bytes, a little below the reserved line's intercept: a conservative anchor for the search.
        report["base_bytes"] = torch.cuda.memory_allocated(device)
    else:
        report.update(_cpu_readings())
    progress["phase"] = "done"
    return report


def _describe_failure(exc: BaseException) -> tuple[Outcome, dict]:
    names = [cls.__name__ for cls in type(exc).__mro__]
    message = str(exc)
    outcome = classify_exception(names, message)
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines)[-8000:].splitlines()[-_TRACEBACK_LINES:]
    qualified = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return outcome, {"type": qualified, "message": message[:_MESSAGE_CHARS], "traceback_tail": "\n".join(tail) + "\n"}


def _installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def run_inspect(request: dict, events: Events) -> None:
    """Versions, devices, and whether the model and optimizer can be built at all."""
    before = _cpu_memory()
    import torch

    spec = request["spec"]
    facts: dict = {"torch_version": torch.__version__, "memory_before_import": before}
    library = _import_model_library(spec)  # imported as a trial will: its memory belongs in the baseline
    if library is not None and library.__name__ != "torchvision":
        facts[f"{library.__name__}_version"] = library.__version__
    if spec["model"].get("torchvision"):
        facts["torchvision_version"] = library.__version__
    else:
        facts["torchvision_version"] = _installed_version("torchvision")  # no import: ~2.5 s saved
    facts["memory_after_import"] = _cpu_memory()
    facts["cuda_available"] = torch.cuda.is_available()
    facts["cuda_devices"] = []
    if facts["cuda_available"]:
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            free, _ = torch.cuda.mem_get_info(index)  # this child's own context is already taken out
            facts["cuda_devices"].append(
                {"name": properties.name, "total_memory_bytes": properties.total_memory, "free_memory_bytes": free}
            )
        facts["cuda_version"] = torch.version.cuda
    problems = []
    if facts["cuda_available"] and spec.get("allocator"):
        # The allocator reads its setting at the first CUDA allocation and rejects unknown keys only
        # then: touch it here, so a typo is a spec error before any trial, not a failed trial.
        try:
            torch.empty(1, device="cuda")
        except Exception as exc:
            problems.append(_problem("allocator", exc))
    problems += _check_buildable(torch, spec, request.get("python_path", []), facts)
    events.emit("result", outcome="inspected", facts=facts, problems=problems)


def _problem(stage: str, exc: BaseException) -> dict:
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc)[:_MESSAGE_CHARS]}


def _check_buildable(torch, spec: dict, python_path: list[str], facts: dict) -> list[dict]:
    """Can the model, optimizer and training options be set up, and does the output fit the target?

    On the meta device first: shapes without memory. A model the meta device cannot
    build is built for real on the CPU, once: if that raises too, the factory itself
    is broken (a spec error); if not, only the meta device was the problem.
    """
    for stage in ("batch", "loss"):
        if spec["model"].get(stage):
            try:
                import_callable(spec["model"][stage], python_path)
            except Exception as exc:
                return [_problem(stage, exc)]
    try:
        with torch.device("meta"):
            model = build_model(spec, python_path)
    except (ImportError, AttributeError, TypeError, ValueError, KeyError) as exc:
        return [_problem("model", exc)]
    except Exception as exc:
        facts["meta_build_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        try:
            build_model(spec, python_path)
        except Exception as real_exc:
            return [_problem("model", real_exc)]
        return []
    device = _trial_device(torch, spec)
    problems = _check_precision(torch, spec, device)
    if (spec.get("training") or {}).get("mode", "train") == "train":
        try:
            # One real parameter on the trial's device: fused/foreach and unknown kwargs fail here, not in a trial.
            build_optimizer(spec, [torch.nn.Parameter(torch.zeros(4, device=device))])
        except Exception as exc:
            problems.append(_problem("optimizer", exc))
    facts["parameter_count"] = sum(p.numel() for p in model.parameters())
    facts["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if not spec["model"].get("batch"):
        problems += _check_output_shape(torch, spec, model, facts)
    if (spec.get("training") or {}).get("gradient_checkpointing"):
        try:
            facts["checkpointing"] = enable_checkpointing(model)
        except Exception as exc:
            problems.append(_problem("checkpointing", exc))
    return problems


def _trial_device(torch, spec: dict):
    wanted = spec.get("device", "auto")
    if wanted == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda:0" if wanted in ("auto", "cuda") else wanted)


def _check_precision(torch, spec: dict, device) -> list[dict]:
    """Can this device run the spec's precision? A tiny real op under the same autocast, and the scaler."""
    precision = (spec.get("training") or {}).get("precision", "fp32")
    if precision == "fp32":
        return []
    dtype = torch.float16 if precision == "fp16-mixed" else torch.bfloat16
    try:
        if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name(device)
            raise RuntimeError(f"{name} does not support bfloat16 (it needs compute capability 8.0, Ampere, or newer)")
        a = torch.ones(4, 4, device=device)
        if precision == "bf16-true":
            (a.to(dtype) @ a.to(dtype)).sum()
        else:
            with torch.autocast(device.type, dtype=dtype):
                (a @ a).sum()
        if precision == "fp16-mixed":
            torch.amp.GradScaler(device.type)
    except Exception as exc:
        return [{"stage": "precision", "type": type(exc).__name__,
                 "message": f"{precision} on {device.type}: {str(exc)[:_MESSAGE_CHARS]}"}]
    return []


def _check_output_shape(torch, spec: dict, model, facts: dict) -> list[dict]:
    """One forward pass on meta tensors (no memory, no compute): does the output match the target?"""
    task = task_of(spec)
    if task == "detection" or (spec["model"].get("huggingface") and task == "language_modeling"):
        return []  # these models compute their own losses from the batch
    try:
        batch = make_batch(spec, 2, torch.device("meta"), [])
        model.train()
        output = primary_output(model(batch.inputs))
    except RuntimeError as exc:
        message = str(exc)
        if any(word in message for word in ("shape", "size", "dimension", "mat1 and mat2", "channels")):
            return [{"stage": "input", "type": type(exc).__name__, "message": message[:_MESSAGE_CHARS]}]
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {message[:500]}"
        return []
    except Exception as exc:  # an op without a meta kernel, say: the trials will tell
        facts["meta_forward_warning"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        return []
    target = spec.get("target")
    if target is None or spec["model"].get("loss"):
        return []  # the user's loss decides what the output must be
    shape = list(output.shape)
    if task == "language_modeling":
        if len(shape) != 3:
            return [{"stage": "target", "type": "ShapeMismatch",
                     "message": f"language_modeling needs logits (batch, sequence, vocabulary); the model "
                                f"returned shape {shape}"}]
        return []
    if task == "segmentation" and len(shape) != 4:
        return [{"stage": "target", "type": "ShapeMismatch",
                 "message": f"segmentation needs outputs (batch, classes, height, width); the model returned {shape}"}]
    if target.get("classes") is not None:
        if len(shape) < 2 or shape[1] != target["classes"]:
            return [{"stage": "target", "type": "ShapeMismatch",
                     "message": f"the model's output has shape {shape} (per sample {shape[1:]}), "
                                f"so its class dimension is {shape[1] if len(shape) > 1 else 'missing'}, "
                                f"not target.classes = {target['classes']}"}]
    elif shape[1:] != list(target["shape"]):
        return [{"stage": "target", "type": "ShapeMismatch",
                 "message": f"the model's output per sample has shape {shape[1:]}, not target.shape = "
                            f"{list(target['shape'])}"}]
    return []


def watch_parent(fd: int) -> None:
    """Kill this process group when the parent dies: the lifeline pipe reads EOF only then.

    A daemon thread, blocked in ``os.read`` (which releases the GIL), so it runs
    whatever the trial is doing; killing the *group* takes any grandchild (a
    DataLoader worker, a stray ``sleep``) with it.
    """
    import signal
    import threading

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="isoprobe-lifeline", daemon=True).start()


def wait_for_request(events: Events) -> str | None:
    """Warm start: import what the trial will need, then block until the parent sends the request's path.

    Importing torch does not initialise CUDA, and nothing here touches a device:
    the ``warm`` event records ``cuda_initialized`` so that a test (and a
    suspicious user) can see it stayed that way. EOF on stdin means the parent
    no longer needs this child: it exits quietly.
    """
    started = time.perf_counter()
    modules = [m for m in os.environ.pop("ISOPROBE_PRELOAD", "").split(",") if m]
    niced = _lower_priority()
    for module in modules:
        __import__(module)
    torch = sys.modules.get("torch")
    cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
    if niced is not None:
        # Back to normal before waiting: blocked, the child needs no CPU, and a spare that is
        # stopped instead of used must not die at idle priority (its exit could wait for minutes
        # behind a busy machine, and the parent with it).
        _restore_priority(niced)
    events.emit("warm", modules=modules, seconds=time.perf_counter() - started, cuda_initialized=cuda_initialized,
                idle_priority=niced is not None)
    line = sys.stdin.readline().strip()
    return line or None


def _restore_priority(value: int) -> None:
    """Give every thread of this process the normal policy and its nice value back, not only this one.

    Scheduling policy and nice value are per thread on Linux, and the imports
    start threads of their own (measured: one, which OpenMP then uses as a
    compute worker). Left idle-class, that one thread would stall every step.
    """
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, int(task), value)
        except (OSError, ValueError):
            pass


def _lower_priority() -> int | None:
    """Run the imports under SCHED_IDLE, only where the policy can be switched back; the old nice value, or None.

    The import competes with the running trial for the CPU. A nice value of +10
    was not enough: the trial's OpenMP threads wait for each other at every
    barrier, and one of them sharing a core with the import made the steps of a
    small CNN 1.8 times slower (measured). SCHED_IDLE runs only on a core
    nothing else wants. Switching back needs root or a permissive RLIMIT_NICE;
    without either the child keeps its priority, because a trial at a lower
    priority would run slower on a shared machine.
    """
    import resource

    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    # RLIMIT_NICE = r lets a thread go down to nice 20 - r, and back from SCHED_IDLE at nice >= 20 - r.
    allowed = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20 - current
    if not allowed or not hasattr(os, "SCHED_IDLE"):
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return None
    return current


def main(argv: list[str]) -> int:
    lifeline = os.environ.pop("ISOPROBE_LIFELINE_FD", None)
    if lifeline is not None:
        watch_parent(int(lifeline))
    events = Events(os.environ["ISOPROBE_EVENTS"])
    events.emit("started", pid=os.getpid())
    request_path = argv[1]
    if request_path == "--wait":
        request_path = wait_for_request(events)
        if request_path is None:
            return 0
        events.emit("request", path=request_path)
    with open(request_path) as handle:
        request = json.load(handle)
    if request["mode"] == "inspect":
        run_inspect(request, events)
    else:
        run_trial(request, events)
    sys.stdout.flush()
    return 0


def exit_now(status: int) -> None:
    """Leave without the interpreter's teardown: the verdict is written, and tearing down torch costs ~1 s.

    Nothing is lost: events go out with unbuffered ``os.write``, and the standard
    streams are flushed here. (A crash during a slow teardown would also turn a
    written 'fits' into 'crashed', which is correct but wasteful.)
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


if __name__ == "__main__":
    exit_now(main(sys.argv))
