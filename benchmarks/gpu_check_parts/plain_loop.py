"""The independent truth of benchmarks/gpu_check.py: does batch N train under a memory budget in a plain loop?

    python benchmarks/gpu_check_parts/plain_loop.py --batch-size 80 --budget 8589934592 [--steps 20]
        [--model resnet50] [--image-size 224] [--classes 1000] [--optimizer adam] [--precision fp32]
        [--ranks 1] [--device cuda]

Imports nothing of isoprobe, on purpose: it is what isoprobe's answer is checked against. One fresh
process (a gang of ``--ranks`` spawned processes for DDP, one GPU each), as a user's training job is:

1. The budget, the way the user's job would get it: "the process may use ``--budget`` bytes on the card,
   context included". CUDA is initialised, a small matmul and a convolution run forward and backward (the
   libraries' handles and kernels load), then the memory the process holds outside torch's allocator is read
   (NVML's figure for this pid less the reserved bytes; ``total - free - reserved`` without NVML) and the allocator is capped at
   ``per_process_memory_fraction = (budget - outside) / total``. No budget: the whole card.
2. The model from torchvision (``weights=None``), synthetic inputs and targets made once, and ``--steps``
   steps of the plainest loop: ``zero_grad``, ``outputs = model(x)``, ``loss = cross_entropy(outputs, y)``,
   ``loss.backward()``, ``optimizer.step()`` (fp16-mixed: autocast and a GradScaler). ``outputs`` lives until
   the next forward rebinds it, as in every ``for x, y in loader:`` loop.

Without ``--budget`` it sets no fraction at all. That is the yardstick (benchmarks/gpu_check.py): run while
``ballast.py`` holds all but the budget of the card, the card itself is the limit, context and libraries
included, with nothing of isoprobe's recipe in it; ``--budget`` (the fraction recipe above) is only a second
reading. It is also how ``isoprobe run -- python plain_loop.py ...`` runs it as a command, where isoprobe's
shim applies the budget (the steps are then isoprobe's to stop: give ``--steps`` large).

The last stdout line is one JSON object: the outcome, the steps done and the readings (reserved and
allocated peaks, ``num_alloc_retries``, the memory outside the allocator after the warm-up and at the end,
and the peak in the budget's units: allocated peak plus the free space inside used segments, plus what lies
outside). Exit status: 0 every step trained; 3 out of memory (``torch.OutOfMemoryError``, or an allocation
failure a library reports: "out of memory", ``*_ALLOC_FAILED``); 4 any other error; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

FITS, OUT_OF_MEMORY, ERROR = 0, 3, 4
_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
_ALLOCATION_WORDS = ("out of memory", "alloc_failed", "cudaerrormemoryallocation")


def byte_count(text: str) -> int:
    """'8GiB', '8 GiB', '16GB' or bytes; GiB and MiB are powers of 1024, GB and MB of 1000."""
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number):]
    if unit not in _UNITS or not number:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write 8GiB, 8GB or bytes)")
    return int(float(number) * _UNITS[unit])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a torchvision model for N steps at one batch under a "
                                                 "memory budget; exit 0 if it fits, 3 on out of memory.")
    parser.add_argument("--batch-size", type=int, required=True, help="samples per step (per rank)")
    parser.add_argument("--budget", type=byte_count, default=None,
                        help="bytes the process may use on its GPU, context included (e.g. 8GiB); none: the card")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--model", default="resnet50", help="a torchvision classification model name")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam")
    parser.add_argument("--precision", choices=("fp32", "fp16-mixed", "bf16-mixed"), default="fp32")
    parser.add_argument("--ranks", type=int, default=1, help="above 1: a DDP gang, rank r on GPU r")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: for tests of this script only (no budget applies)")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.steps < 1 or args.ranks < 1:
        parser.error("--batch-size, --steps and --ranks must be at least 1")
    return args


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: torch's own type, or a library's wording (cuBLAS, cuDNN, NCCL)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "OutOfMemoryError" in names:
        return True
    return any(word in str(exc).lower() for word in _ALLOCATION_WORDS)


def _autocast_dtype(torch, precision: str):
    return {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)


def _autocast(torch, device_type: str, precision: str):
    dtype = _autocast_dtype(torch, precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


def _own_bytes(device) -> int | None:
    """What this process holds on its GPU by NVML's count for its pid, or None where NVML cannot say. Under the
    ballast the card-wide ``total - free`` would count the ballast's memory as this process's."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
    except Exception:
        return None
    return None


def _outside(torch, device) -> int:
    """Memory this process holds outside torch's allocator: NVML's per-process figure less the reserved bytes, or
    (no NVML) the card-wide ``total - free - reserved``, which then counts other processes too."""
    reserved = torch.cuda.memory_reserved(device)
    own = _own_bytes(device)
    if own is not None:
        return max(0, own - reserved)
    free, total = torch.cuda.mem_get_info(device)
    return max(0, total - free - reserved)


def apply_budget(torch, device, budget: int | None, precision: str) -> dict:
    """Initialise CUDA, warm the libraries up, cap the allocator so that it plus the outside memory is the budget."""
    torch.cuda.init()
    torch.cuda.set_device(device)
    a = torch.randn(64, 64, device=device, requires_grad=True)
    x = torch.randn(2, 3, 16, 16, device=device, requires_grad=True)
    w = torch.randn(8, 3, 3, 3, device=device, requires_grad=True)
    with _autocast(torch, "cuda", precision):
        total = (a @ a).float().sum() + torch.nn.functional.conv2d(x, w, padding=1).float().sum()
    total.backward()
    torch.cuda.synchronize(device)
    del a, x, w, total
    free, card = torch.cuda.mem_get_info(device)
    outside = _outside(torch, device)
    fraction = None
    if budget:
        fraction = min(1.0, max(0, budget - outside) / card)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"total_bytes": card, "free_after_warm_up_bytes": free, "outside_after_warm_up_bytes": outside,
            "fraction": fraction}


def readings(torch, device, budget: int | None, setup: dict) -> dict:
    """The process's memory as torch and the driver see it now (peaks since the start)."""
    if device.type != "cuda":
        return {}
    stats = dict(torch.cuda.memory_stats(device))
    reserved_peak = torch.cuda.max_memory_reserved(device)
    allocated_peak = torch.cuda.max_memory_allocated(device)
    split_peak = stats.get("inactive_split_bytes.all.peak")
    need = reserved_peak if split_peak is None else min(reserved_peak, allocated_peak + split_peak)
    outside = _outside(torch, device)
    found = {"reserved_peak_bytes": reserved_peak, "allocated_peak_bytes": allocated_peak,
             "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
             "num_ooms": int(stats.get("num_ooms", 0)),
             "outside_end_bytes": outside, "budget_peak_bytes": need + outside, **setup}
    found["outside_growth_bytes"] = outside - setup.get("outside_after_warm_up_bytes", outside)
    if budget:
        found["over_budget_bytes"] = max(0, need + outside - budget)
    return found


def train(args, rank: int = 0, world: int = 1, store: str | None = None) -> dict:
    """One process's run; returns its JSON line (``outcome``: fits, out_of_memory or error)."""
    import torch
    import torch.nn.functional as F
    import torchvision

    started = time.monotonic()
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    line: dict = {"batch_size": args.batch_size, "rank": rank, "steps_asked": args.steps, "steps_done": 0,
                  "budget_bytes": args.budget, "torch": torch.__version__}
    setup: dict = {}
    step_seconds: list[float] = []
    try:
        if cuda:
            setup = apply_budget(torch, device, args.budget, args.precision)
        if world > 1:
            torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}",
                                                 rank=rank, world_size=world)
        model = torchvision.models.get_model(args.model, weights=None, num_classes=args.classes).to(device)
        model.train()
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
        if args.optimizer == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            optimizer = getattr(torch.optim, {"adam": "Adam", "adamw": "AdamW"}[args.optimizer])(
                model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16-mixed" else None
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        y = torch.randint(0, args.classes, (args.batch_size,), device=device)
        for _ in range(args.steps):
            begun = time.monotonic()
            optimizer.zero_grad(set_to_none=True)
            with _autocast(torch, device.type, args.precision):
                outputs = model(x)
                loss = F.cross_entropy(outputs, y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            if cuda:
                torch.cuda.synchronize(device)
            step_seconds.append(round(time.monotonic() - begun, 4))
            line["steps_done"] += 1
        line["outcome"] = "fits"
    except Exception as exc:  # the verdict: out of memory, or an error that is no memory verdict
        line["outcome"] = "out_of_memory" if is_out_of_memory(exc) else "error"
        line["error"] = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}" \
            if str(exc).strip() else type(exc).__name__
        if line["outcome"] == "error":
            traceback.print_exc()
    try:
        line.update(readings(torch, device, args.budget, setup))
    except Exception as exc:  # readings are evidence, never the verdict
        line["readings_error"] = f"{type(exc).__name__}: {exc}"[:200]
    line["step_seconds"] = step_seconds
    line["seconds"] = round(time.monotonic() - started, 2)
    return line


def _rank(rank: int, args, world: int, store: str, folder: str) -> None:
    line = train(args, rank, world, store)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump(line, handle)
    code = {"fits": FITS, "out_of_memory": OUT_OF_MEMORY}.get(line["outcome"], ERROR)
    if code:
        sys.stdout.flush()
        os._exit(code)  # the gang's other ranks may be blocked in a collective: spawn's join ends them


def gang(args) -> dict:
    """``--ranks`` processes, spawned as a fresh job's ranks; the gang fits only if every rank fits."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        context = mp.start_processes(_rank, args=(args, args.ranks, store, folder), nprocs=args.ranks, join=False,
                                     start_method="spawn")
        failure = None
        try:
            while not context.join():
                pass
        except Exception as exc:  # ProcessExitedException / ProcessRaisedException: the others were ended
            failure = exc
        lines = []
        for rank in range(args.ranks):
            path = os.path.join(folder, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as handle:
                    lines.append(json.load(handle))
    outcomes = [line["outcome"] for line in lines]
    if "out_of_memory" in outcomes or (failure is not None and getattr(failure, "exit_code", None) == OUT_OF_MEMORY):
        outcome = "out_of_memory"
    elif failure is None and len(lines) == args.ranks and all(o == "fits" for o in outcomes):
        outcome = "fits"
    else:
        outcome = "error"
    worst = max(lines, key=lambda line: line.get("budget_peak_bytes") or 0, default={})
    return {**worst, "outcome": outcome, "ranks": lines,
            **({"gang_failure": f"{type(failure).__name__}: {failure}"[:300]} if failure else {})}


def main(argv=None) -> int:
    args = parse_args(argv)
    line = gang(args) if args.ranks > 1 else train(args)
    print(json.dumps(line), flush=True)
    return {"fits": FITS, "out_of_memory": OUT_OF_MEMORY}.get(line["outcome"], ERROR)


if __name__ == "__main__":
    sys.exit(main())
