"""An independent check of isoprobe's edge over many steps: a plain training loop in fresh processes.

    python benchmarks/harness/steady_harness.py specs/gru-lm.yaml --strategy fsdp --batch 58 60 --steps 30
    python benchmarks/harness/steady_harness.py specs/gru-lm.yaml --strategy none --batch 60 --steps 30 --json
    srun python benchmarks/harness/steady_harness.py --slurm-task SPEC --batch 60 --memory-budget 1GiB --folder SHARED

Why it exists: a trial proves a batch with a few steps, and a real job runs
thousands. This runs the spec's model as a plain loop (zero_grad, forward, loss,
backward, optimizer step; the output held through backward as ``outputs = model(x)``
holds it) for N steps in fresh processes under the same cap as isoprobe's CPU
trials: ``RLIMIT_DATA`` set before exec, ``MALLOC_MMAP_THRESHOLD_=131072``, no CUDA.
A gang is ``--world-size`` processes with torch.distributed over gloo, meeting in a
FileStore, each at ``OMP_NUM_THREADS=1`` (as torchrun starts them); ddp is
``DistributedDataParallel``, zero1 the same with ``ZeroRedundancyOptimizer`` over
the spec's optimizer, fsdp FSDP2's ``fully_shard`` on each block of the model's
sequential stages (or lists of blocks) and then on the root.

It deliberately does not import isoprobe: the loop, the cap and the peak reading
are written again here, so that a bug in isoprobe's trial cannot hide in both.
It reads only the spec's fields it needs (model.factory/kwargs or a torchvision
model.name, input, target, optimizer, training.output_lifetime, memory_budget).

Per step, each rank reports the peak of its data segment in the cap's units
(VmPeak - (VmSize - VmData), at most the cap: what RLIMIT_DATA counts), VmData
now, and glibc's ``mallinfo2`` (arena bytes, mmapped bytes, free bytes kept in
the arenas). A batch "survives" N steps when every rank finishes them; otherwise
the first step a rank ran out of memory at is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MALLOC_MMAP_THRESHOLD = "131072"
_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS:
        raise SystemExit(f"cannot read a memory size from {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


# --------------------------------------------------------------------------- the rank (a fresh process)


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmPeak", "VmSize", "VmData", "VmHWM", "VmRSS"):
                values[name] = int(rest.split()[0]) * 1024
    return values


def _mallinfo() -> dict[str, int]:
    """glibc's mallinfo2: arena (sbrk'd heap + other arenas), hblkhd (mmapped blocks), fordblks (free kept)."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {"arena": info.arena, "mmapped": info.hblkhd, "free_kept": info.fordblks}


def _peak(cap: int | None) -> dict[str, int]:
    status = _status()
    peak = status["VmPeak"] - (status["VmSize"] - status["VmData"])
    if cap is not None:
        peak = min(peak, cap)
    return {"peak": peak, "data": status["VmData"], "hwm": status["VmHWM"], **_mallinfo()}


def _load_factory(spec: dict, spec_dir: Path):
    import importlib.util

    model = spec["model"]
    if "factory" in model:
        path, _, function = model["factory"].rpartition(":")
        file = (spec_dir / path).resolve()
        sys.path.insert(0, str(file.parent))
        module_spec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return getattr(module, function)(**(model.get("kwargs") or {}))
    import torchvision

    # The spec's model.torchvision (model.name is its older spelling).
    return torchvision.models.get_model(model.get("torchvision") or model["name"], **(model.get("kwargs") or {}))


def _blocks(model) -> list:
    """The children of the model's sequential stages and block lists: what FSDP2 shards one by one."""
    import torch

    found = []

    def visit(module):
        for child in module.children():
            if isinstance(child, (torch.nn.Sequential, torch.nn.ModuleList)) and len(child) >= 2:
                found.extend(c for c in child if any(p.requires_grad for p in c.parameters()))
                continue
            visit(child)

    visit(model)
    return found


def _optimizer(spec: dict, parameters, strategy: str):
    import torch

    options = dict((spec.get("optimizer") or {}).get("kwargs") or {})
    name = (spec.get("optimizer") or {}).get("name", "adam")
    classes = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    if name == "sgd":
        options.setdefault("lr", 0.01)
        options.setdefault("momentum", 0.9)
    if strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(parameters, optimizer_class=classes[name], **options)
    return classes[name](parameters, **options)


def run_rank(config: dict) -> int:
    """One process of the loop; writes one JSON line per step to its report file. Exit 0 after all steps."""
    report = open(config["report"], "a", buffering=1)

    def say(**record):
        report.write(json.dumps({"rank": config["rank"], **record}) + "\n")

    import torch
    import torch.nn.functional as F

    spec, strategy, cap = config["spec"], config["strategy"], config["cap"]
    say(event="imported", **_peak(cap))
    torch.manual_seed(0)
    if strategy != "none":
        import torch.distributed as dist

        store = dist.FileStore(config["store"], config["world_size"])
        dist.init_process_group("gloo", store=store, rank=config["rank"], world_size=config["world_size"])
    model = _load_factory(spec, Path(config["spec_dir"]))
    if strategy in ("ddp", "zero1"):
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in _blocks(model):
            fully_shard(block)
        fully_shard(model)
    model.train()
    optimizer = _optimizer(spec, model.parameters(), strategy)
    shape = (config["batch"], *spec["input"]["shape"])
    language = (spec.get("target") or {}).get("task") == "language_modeling"
    if spec["input"].get("dtype") == "int64":
        inputs = torch.randint(0, spec["input"]["high"], shape)
    else:
        inputs = torch.randn(shape)
    targets = None
    held = None
    through_backward = (spec.get("training") or {}).get("output_lifetime", "through_backward") == "through_backward"
    say(event="built", **_peak(cap))
    for index in range(1, config["steps"] + 1):
        started = time.perf_counter()
        try:
            optimizer.zero_grad(set_to_none=True)
            output = model(inputs)
            if language:
                logits = output[:, :-1, :].float()
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs[:, 1:].reshape(-1))
            else:
                if targets is None:
                    targets = torch.randint(0, spec["target"]["classes"], (config["batch"],))
                loss = F.cross_entropy(output, targets)
            held = output if through_backward else None  # a plain loop's `outputs` lives to the next forward
            del output
            loss.backward()
            optimizer.step()
        except RuntimeError as exc:
            if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
                say(event="oom", step=index, message=str(exc)[:200])
                report.close()
                os._exit(3)  # a peer waits in a collective: the parent ends the gang
            raise
        say(event="step", step=index, seconds=round(time.perf_counter() - started, 3), **_peak(cap))
    del held
    report.close()
    os._exit(0)  # a process group's teardown can hang when a peer is already gone


# --------------------------------------------------------------------------- the parent


def run_batch(spec_path: Path, spec: dict, strategy: str, batch: int, steps: int, cap: int, world_size: int,
              threads: str | None, timeout: float, extra_env: dict[str, str] | None = None) -> dict:
    """Run ``batch`` for ``steps`` steps in fresh rank processes; the per-step peaks (max over ranks), the
    step a rank ran out of memory at (None: survived), and the seconds."""
    ranks = 1 if strategy == "none" else world_size
    with tempfile.TemporaryDirectory(prefix="steady-") as folder:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MALLOC_MMAP_THRESHOLD, CUDA_VISIBLE_DEVICES="",
                   PYTHONUNBUFFERED="1", **(extra_env or {}))
        if (extra_env or {}).get("MALLOC_MMAP_THRESHOLD_") == "":
            del env["MALLOC_MMAP_THRESHOLD_"]  # glibc's own dynamic threshold, as a job started without it has
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        elif ranks > 1:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun starts more than one process on a node

        def limit():
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

        processes, reports = [], []
        started = time.monotonic()
        for rank in range(ranks):
            report = Path(folder) / f"rank{rank}.jsonl"
            report.touch()
            reports.append(report)
            config = {"rank": rank, "world_size": ranks, "store": str(Path(folder) / "store"), "spec": spec,
                      "spec_dir": str(spec_path.parent), "strategy": strategy, "batch": batch, "steps": steps,
                      "cap": cap, "report": str(report)}
            processes.append(subprocess.Popen(
                [sys.executable, __file__, "--rank-config", json.dumps(config)], env=env, preexec_fn=limit,
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(Path(folder) / f"rank{rank}.err", "w")))
        failed = None
        try:
            while time.monotonic() - started < timeout:
                codes = [p.poll() for p in processes]
                if any(code not in (None, 0) for code in codes):
                    failed = next(i for i, c in enumerate(codes) if c not in (None, 0))
                    break
                if all(code == 0 for code in codes):
                    break
                time.sleep(0.1)
            else:
                failed = "timeout"
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        seconds = time.monotonic() - started
        records = [json.loads(line) for report in reports for line in report.read_text().splitlines() if line]
        errors = {r: (Path(folder) / f"rank{r}.err").read_text()[-1500:] for r in range(ranks)}
    per_step: dict[int, dict] = {}
    for record in records:
        if record["event"] == "step":
            kept = per_step.setdefault(record["step"], {"peak": 0, "data": 0, "ranks": 0})
            kept["peak"] = max(kept["peak"], record["peak"])
            kept["data"] = max(kept["data"], record["data"])
            kept["ranks"] += 1
    oom = [r for r in records if r["event"] == "oom"]
    oom_step = min((r["step"] for r in oom), default=None)
    if failed is not None and oom_step is None:
        raise RuntimeError(f"batch {batch}: rank {failed} failed without running out of memory: {errors}")
    complete = [s for s in sorted(per_step) if per_step[s]["ranks"] == ranks]
    return {"batch": batch, "strategy": strategy, "steps": steps, "survived": oom_step is None,
            "oom_step": oom_step, "peaks": [per_step[s]["peak"] for s in complete],
            "data": [per_step[s]["data"] for s in complete], "records": records, "seconds": round(seconds, 1)}


def load_spec(path: Path) -> dict:
    import yaml

    with open(path) as file:
        return yaml.safe_load(file)


def run_slurm_task(spec_path: Path, strategy: str, batch: int, steps: int, cap: int, folder: Path) -> int:
    """One rank of a gang that Slurm started (``srun python steady_harness.py --slurm-task ...``, one task a rank,
    on any node): its rank and world from SLURM_PROCID and SLURM_NTASKS, the ranks meeting in a FileStore in
    ``folder`` (on a filesystem every node sees), each rank a fresh process under the cap as ``run_batch`` starts
    it. Exit 0: this rank ran every step; 3: it ran out of memory (its report says at which step)."""
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    config = {"rank": rank, "world_size": world, "store": str(folder / "store"), "spec": load_spec(spec_path),
              "spec_dir": str(spec_path.parent), "strategy": strategy, "batch": batch, "steps": steps, "cap": cap,
              "report": str(folder / f"rank{rank}.jsonl")}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MALLOC_MMAP_THRESHOLD, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    done = subprocess.run([sys.executable, __file__, "--rank-config", json.dumps(config)], env=env, preexec_fn=limit)
    records = [json.loads(line) for line in Path(config["report"]).read_text().splitlines() if line]
    steps_run = sum(1 for record in records if record["event"] == "step")
    oom = next((record["step"] for record in records if record["event"] == "oom"), None)
    print(f"rank {rank} on {os.uname().nodename}: batch {batch}, {steps_run} of {steps} steps"
          + (f", out of memory at step {oom}" if oom else ""), flush=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-config"]:
        return run_rank(json.loads(argv[1]))
    if argv[:1] == ["--slurm-task"]:
        task = argparse.ArgumentParser(prog="steady_harness.py --slurm-task")
        task.add_argument("spec", type=Path)
        task.add_argument("--strategy", choices=("ddp", "zero1", "fsdp"), default="ddp")
        task.add_argument("--batch", type=int, required=True)
        task.add_argument("--steps", type=int, default=30)
        task.add_argument("--memory-budget", required=True, help="per rank")
        task.add_argument("--folder", type=Path, required=True, help="for the ranks' store and reports; shared")
        given = task.parse_args(argv[1:])
        return run_slurm_task(given.spec, given.strategy, given.batch, given.steps, parse_bytes(given.memory_budget),
                              given.folder)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path)
    parser.add_argument("--strategy", choices=("none", "ddp", "zero1", "fsdp"), default="none")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch", type=int, nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--memory-budget", help="per process; default: the spec's memory_budget")
    parser.add_argument("--threads", help="OMP_NUM_THREADS (default: inherited for one process, 1 for ranks)")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE for every rank (e.g. MALLOC_ARENA_MAX=1; MALLOC_MMAP_THRESHOLD_= unsets it)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per batch, with every rank's records")
    options = parser.parse_args(argv)
    spec = load_spec(options.spec)
    cap = parse_bytes(options.memory_budget or spec["memory_budget"])
    extra = dict(item.split("=", 1) for item in options.env)
    for batch in options.batch:
        result = run_batch(options.spec, spec, options.strategy, batch, options.steps, cap, options.world_size,
                           options.threads, options.timeout, extra)
        if options.json:
            print(json.dumps(result), flush=True)
            continue
        mib = [round(p / 2**20) for p in result["peaks"]]
        verdict = "survived" if result["survived"] else f"out of memory at step {result['oom_step']}"
        print(f"{options.strategy} batch {batch}: {verdict} ({len(mib)} steps, {result['seconds']} s); "
              f"peak MiB per step: {mib}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
