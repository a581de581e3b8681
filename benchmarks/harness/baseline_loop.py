"""The in-process baseline isoprobe is compared with: one process, double until OOM, bisect to the edge.

Not used by isoprobe. ``compare_baseline.py`` starts it as
``python benchmarks/harness/baseline_loop.py REQUEST.json`` in one child process under
the same memory cap a trial gets (on the CPU backend: the same RLIMIT_DATA and
malloc setting), and reads one JSON line from its stdout.

What it does is what Lightning's ``scale_batch_size(mode="binsearch")`` and the
classic recipe do: build the model once; for each candidate batch, a fresh
optimizer, synthetic inputs and targets, the spec's number of training steps
(forward, loss, backward, optimizer step); on an out-of-memory exception, drop
the references, ``gc.collect()`` and empty the CUDA cache, and go on. Start at
the spec's start batch, double until the first OOM (or the spec's cap), then
bisect until the largest fitting and smallest failing batch are adjacent. No
retries, no confirmation run: what it finds is whatever one in-process run saw.
The training step is isoprobe's own (``isoprobe.child``), so both do the same
work per trial.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from isoprobe.child.core.training import Step, build_optimizer  # noqa: E402
from isoprobe.child.core.workload import build_model  # noqa: E402
from isoprobe.report.outcomes import Outcome, classify_exception, maybe_allocation_failure  # noqa: E402
from isoprobe.spec.model import Spec  # noqa: E402
from isoprobe.spec.search_section import MAX_BATCH_SIZE  # noqa: E402


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocator's OOM, or a library error that usually means one (as Lightning's is_oom_error counts it)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    return classify_exception(names, str(exc)) is Outcome.OUT_OF_MEMORY or maybe_allocation_failure(str(exc))


def main(request_path: str) -> None:
    started = time.monotonic()
    request = json.loads(Path(request_path).read_text())
    spec, device_name = Spec.model_validate(request["spec"]), request["device"]
    import torch

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        budget = request.get("memory_budget_bytes")
        if budget:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    python_path = request.get("python_path", [])
    # One model for every trial, as Lightning's loop keeps it (training options applied once).
    step = Step(spec, build_model(spec, python_path), device, python_path)
    ready = time.monotonic()
    trials: list[dict] = []

    def fits(batch: int) -> bool:
        began = time.monotonic()
        prepared = None
        try:
            prepared = step.batch(batch)
            for _ in range(spec.search.steps):
                step.run(prepared)
            if cuda:
                torch.cuda.synchronize(device)
            ok = True
        except Exception as exc:  # noqa: BLE001 - the baseline's whole point: catch the OOM in-process
            if not is_out_of_memory(exc):
                raise
            ok = False
        finally:
            prepared = None
            if step.optimizer is not None:  # the next trial starts with a fresh optimizer, no state yet
                step.optimizer = None
                step.optimizer = build_optimizer(spec, step.model.parameters())
            step.model.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        trials.append({"batch_size": batch, "fits": ok, "seconds": round(time.monotonic() - began, 3)})
        return ok

    highest = min(c for c in (spec.search.cap, MAX_BATCH_SIZE) if c is not None)
    low, high = None, None
    batch = spec.search.start_batch_size
    while high is None and (low is None or low < highest):
        if fits(batch):
            low, batch = batch, min(2 * batch, highest)
        else:
            high = batch
            if low is None:
                break
    while low is not None and high is not None and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    print(json.dumps({
        "max_batch_size": low,
        "first_failing_batch_size": high,
        "trials": trials,
        "setup_seconds": round(ready - started, 3),
        "seconds": round(time.monotonic() - started, 3),
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
