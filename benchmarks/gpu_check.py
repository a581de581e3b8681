"""The GPU check: every CUDA figure isoprobe claims, measured in one command on a machine with a GPU.

    python benchmarks/gpu_check.py [--output docs/gpu.md] [--skip-tier]

From a fresh checkout (``pip install -e '.[test]'`` done), it runs, each through isoprobe's real CLI
or its child code, never a canned number:

1. the GPU test tier (``pytest tests/gpu -m gpu --durations=0``);
2. the classic articles' figures under budget emulation: ResNet50, fp32, Adam, 224x224: the maximum
   lies in [8, 16) under 8 GiB and in [16, 32) under 11 GiB; MobileNetV3-large, fp16 mixed, under
   16 GiB against the article's 515 (within 25 %);
3. an allocator comparison (default vs expandable_segments:True) on a step whose shapes vary;
4. the probe's wall time and trial count for ResNet50 on the whole card;
5. trial start: cold spawn, warm spare, fork server (median seconds outside the steps);
6. issue 20's experiments: (a) allocator parsing, (b) the first matmul and convolution on a nearly full
   card through isoprobe's classifier, (c) fp16 GradScaler and Adam's state per step, (d) a 16 GiB budget
   against a card with 16 GiB left free by a holder process, (e) an evaluation trial's timings and the
   compute processes while a warm spare waits.

It writes ``--output`` (docs/gpu.md) with the device, the versions and every figure. Exit codes: 0 every
check passed; 1 a check failed (the file says which); 5 no CUDA GPU here (nothing measured, nothing
written; ``NO_GPU_EXIT``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_GPU_EXIT = 5
GiB = 1024**3
MiB = 1024**2


@dataclass
class Report:
    """Every figure, in the order measured; ``failed`` names the checks that did not pass."""

    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, title: str, lines: list[str]) -> None:
        self.sections.append((title, lines))
        print(f"\n## {title}\n" + "\n".join(lines), flush=True)

    def check(self, name: str, passed: bool) -> str:
        if not passed:
            self.failed.append(name)
        return "pass" if passed else "FAIL"


def gpu_present(environ=os.environ) -> bool:
    """A CUDA GPU torch can use here? Asked in a child (this script never creates a context itself)."""
    if environ.get("CUDA_VISIBLE_DEVICES") is not None and not environ["CUDA_VISIBLE_DEVICES"].strip():
        return False
    sys.path.insert(0, str(ROOT))
    from isoprobe.cache.store import driver_lists_a_gpu

    if not driver_lists_a_gpu():
        return False
    found = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, env=dict(environ))
    return found.stdout.strip().endswith("True")


def python(code: str, env: dict | None = None, timeout: int = 900) -> dict:
    """Run ``code`` in a fresh interpreter (its own CUDA context); its last stdout line is JSON."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def isoprobe_run(spec: dict, *args: str, env: dict | None = None) -> tuple[dict | None, float, str]:
    """``isoprobe run`` on a spec, without the cache: (result or None, wall seconds, stderr tail)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.json"  # YAML is a superset of JSON
        path.write_text(json.dumps(spec))
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(path), "--no-cache", "--format", "json",
                              *args], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        seconds = time.monotonic() - started
    try:
        return json.loads(run.stdout), seconds, run.stderr[-2000:]
    except json.JSONDecodeError:
        return None, seconds, run.stderr[-2000:]


def vision_spec(model: str, precision: str = "fp32", **extra) -> dict:
    return {"model": {"torchvision": model}, "input": {"shape": [3, 224, 224]}, "target": {"classes": 1000},
            "optimizer": {"name": "adam"}, "training": {"precision": precision}, "device": "cuda:0", **extra}


def device_facts() -> list[str]:
    facts = python("""
        import json, subprocess, torch
        p = torch.cuda.get_device_properties(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        print(json.dumps({"name": p.name, "total": p.total_memory, "capability": f"{p.major}.{p.minor}",
                          "torch": torch.__version__, "cuda": torch.version.cuda, "driver": smi,
                          "cudnn": torch.backends.cudnn.version()}))
    """)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return [f"- device: {facts.get('name')} ({facts.get('total', 0) / GiB:.2f} GiB reported, compute capability "
            f"{facts.get('capability')}), driver {facts.get('driver')}",
            f"- torch {facts.get('torch')}, CUDA {facts.get('cuda')}, cuDNN {facts.get('cudnn')}, python "
            f"{sys.version.split()[0]}, isoprobe commit {commit.stdout.strip() or '?'}",
            f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]


def gpu_tier(report: Report) -> None:
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-n", "0", "-q",
                          "-p", "no:cacheprovider", "--durations=0"], capture_output=True, text=True, cwd=ROOT)
    tail = run.stdout.strip().splitlines()
    durations = [line for line in tail if line[:1].isdigit() and "s " in line][:25]
    summary = tail[-1] if tail else run.stderr[-500:]
    verdict = report.check("GPU test tier", run.returncode == 0)
    report.add("GPU test tier (experiment e: --durations=0)",
               [f"`pytest tests/gpu -m gpu`: {summary} ({verdict})", "", "```", *durations, "```"])


def reference_figures(report: Report) -> dict | None:
    """The articles' figures; returns the whole-card-free 8 GiB ResNet50 result for the timing section."""
    lines = ["| setup | budget | measured max | expected | verdict |", "|---|---|---|---|---|"]
    cases = [("ResNet50 fp32 Adam 224²", vision_spec("resnet50"), "8GiB", (8, 16)),
             ("ResNet50 fp32 Adam 224²", vision_spec("resnet50"), "11GiB", (16, 32)),
             ("MobileNetV3-large fp16-mixed Adam 224²", vision_spec("mobilenet_v3_large", "fp16-mixed"), "16GiB",
              (round(515 * 0.75), round(515 * 1.25) + 1))]
    for name, spec, budget, (low, high) in cases:
        result, seconds, stderr = isoprobe_run(spec, "--memory-budget", budget)
        measured = result.get("max_batch_size") if result else None
        passed = measured is not None and low <= measured < high
        expected = f"[{low}, {high})" if "MobileNet" not in name else f"515 ± 25 % [{low}, {high})"
        lines.append(f"| {name} | {budget} | {measured if measured is not None else 'none: ' + stderr[-200:]} "
                     f"| {expected} | {report.check(f'{name} under {budget}', passed)} |")
    report.add("Reference figures under budget emulation", lines)


FRAGMENTING_STEP = '''
import itertools

import torch

SIZES = (96, 224, 128, 192, 160)
_calls = itertools.count()


def train_step(model, optimizer, batch, device):
    """Each step a different resolution: the blocks the allocator cached never fit the next step's tensors."""
    inputs, targets = batch
    size = SIZES[next(_calls) % len(SIZES)]
    inputs = torch.nn.functional.interpolate(inputs, size=(size, size))
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
'''


def allocator_comparison(report: Report) -> None:
    with tempfile.TemporaryDirectory() as folder:
        step_file = Path(folder) / "fragmenting_step.py"
        step_file.write_text(FRAGMENTING_STEP)
        spec = vision_spec("resnet50", allocators=["default", "expandable_segments:True"],
                           memory_budget="8GiB", search={"steps": 6})
        spec["model"]["step"] = f"{step_file}:train_step"
        result, seconds, stderr = isoprobe_run(spec)
    comparison = (result or {}).get("allocator_comparison") or {}
    lines = [f"ResNet50 with a step whose resolution varies (96..224) under 8 GiB, {seconds:.0f} s:", "",
             "```", json.dumps(comparison, indent=1)[:3000] or stderr[-500:], "```"]
    report.check("allocator comparison ran", bool(comparison))
    report.add("Allocator comparison on a fragmenting workload", lines)


def whole_card_probe(report: Report) -> None:
    result, seconds, stderr = isoprobe_run(vision_spec("resnet50"))
    if result is None:
        report.check("ResNet50 whole-card probe", False)
        report.add("ResNet50 on the whole card", [f"no result: {stderr[-500:]}"])
        return
    trials = result.get("trials", [])
    report.check("ResNet50 whole-card probe answered", result.get("max_batch_size") is not None)
    report.add("ResNet50 on the whole card", [
        f"max {result.get('max_batch_size')}, first failing {result.get('first_failing_batch_size')}, "
        f"recommended {result.get('recommended_batch_size')}; {len(trials)} trials in {seconds:.1f} s wall"])


def start_times(report: Report) -> None:
    """Median seconds of a trial outside its steps (process start, imports left, build), per way of starting."""
    ways = {"cold spawn": {"warm_start": False, "fork_server": False},
            "warm spare": {"warm_start": True, "fork_server": False},
            "fork server": {"fork_server": True}}
    lines = ["| start | trials | median seconds outside the steps | wall |", "|---|---|---|---|"]
    for way, search in ways.items():
        spec = {"model": {"torchvision": "resnet18", "kwargs": {"num_classes": 100}},
                "input": {"shape": [3, 128, 128]}, "target": {"classes": 100}, "device": "cuda:0",
                "memory_budget": "4GiB", "search": {"steps": 3, **search}}
        result, seconds, stderr = isoprobe_run(spec)
        overheads = [t["seconds"] - sum(t["step_seconds"]) for t in (result or {}).get("trials", [])
                     if t.get("step_seconds")]
        median = f"{statistics.median(overheads):.2f}" if overheads else f"none ({stderr[-150:]})"
        lines.append(f"| {way} | {len(overheads)} | {median} | {seconds:.1f} s |")
    report.add("Trial start: cold, warm, fork server (resnet18, 128², 4 GiB budget)", lines)


def experiment_a(report: Report) -> None:
    lines = []
    expected = {"no_such_key:1": False, "expandable_segments:True": True, "expandable_segments:true": False}
    for setting, accepted in expected.items():
        found = python("""
            import json, torch
            try:
                torch.cuda.init(); torch.empty(1, device="cuda")
                print(json.dumps({"ok": True}))
            except Exception as exc:
                print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
        """, env={"PYTORCH_CUDA_ALLOC_CONF": setting})
        verdict = report.check(f"(a) {setting}", found.get("ok") is accepted)
        lines.append(f"- `{setting}`: {'accepted' if found.get('ok') else found.get('error')} ({verdict})")
    report.add("(a) Allocator parsing at CUDA's initialisation", lines)


def experiment_b(report: Report) -> None:
    lines = []
    for left in (8, 48, 200):
        for op in ("matmul", "conv"):
            found = python(f"""
                import json, torch
                from isoprobe.report.outcomes import card_was_full, classify_exception, maybe_allocation_failure
                torch.cuda.init()
                free, total = torch.cuda.mem_get_info()
                hold = torch.empty(max(0, free - {left} * 1024**2), dtype=torch.uint8, device="cuda")
                try:
                    if {op!r} == "matmul":
                        a = torch.randn(256, 256, device="cuda"); (a @ a).sum().item()
                    else:
                        x = torch.randn(4, 3, 64, 64, device="cuda", requires_grad=True)
                        w = torch.randn(16, 3, 3, 3, device="cuda", requires_grad=True)
                        torch.nn.functional.conv2d(x, w).sum().backward(); torch.cuda.synchronize()
                    print(json.dumps({{"outcome": "ran"}}))
                except Exception as exc:
                    names = [c.__name__ for c in type(exc).__mro__]
                    free_now, _ = torch.cuda.mem_get_info()
                    print(json.dumps({{"outcome": classify_exception(names, str(exc)).value,
                                      "ambiguous": maybe_allocation_failure(str(exc)),
                                      "card_full": card_was_full(free_now, total),
                                      "error": f"{{type(exc).__name__}}: {{str(exc).splitlines()[0][:160]}}"}}))
            """)
            unclassified = found.get("outcome") == "error" and not found.get("ambiguous")
            verdict = report.check(f"(b) {op} with {left} MiB left", not unclassified)
            lines.append(f"- {op}, {left} MiB left: {json.dumps(found)} ({verdict})")
    report.add("(b) First matmul and convolution on a nearly full card, through isoprobe's classifier", lines)


def experiment_c(report: Report) -> None:
    found = python("""
        import json, torch, torchvision
        model = torchvision.models.resnet18(num_classes=100).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        x = torch.randn(64, 3, 224, 224, device="cuda"); y = torch.randint(0, 100, (64,), device="cuda")
        steps = []
        for step in range(3):
            torch.cuda.reset_peak_memory_stats()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
            steps.append({"scale": scaler.get_scale(), "state": len(optimizer.state),
                          "reserved_peak_mib": round(torch.cuda.max_memory_reserved() / 2**20)})
        print(json.dumps(steps))
    """)
    report.add("(c) resnet18, fp16 autocast, Adam, 3 steps: scale, optimizer state, reserved peak",
               ["```", json.dumps(found, indent=1), "```"])


def experiment_d(report: Report) -> None:
    spec = vision_spec("resnet50", search={"steps": 3})
    budgeted, seconds_budget, err_b = isoprobe_run(spec, "--memory-budget", "16GiB")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, torch
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        hold = torch.empty(free - 16 * 1024**3, dtype=torch.uint8, device="cuda")
        print(torch.cuda.mem_get_info()[0], flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        left = int(holder.stdout.readline().strip() or 0)
        held, seconds_held, err_h = isoprobe_run(spec)
    finally:
        holder.stdin.close()
        holder.wait(timeout=120)
    a = (budgeted or {}).get("max_batch_size")
    b = (held or {}).get("max_batch_size")
    close = a is not None and b is not None and abs(a - b) <= max(1, round(0.03 * b))
    report.add("(d) A 16 GiB budget against a card with 16 GiB left free", [
        f"- `--memory-budget 16GiB` on the whole card: max {a} ({seconds_budget:.0f} s)",
        f"- no budget, a holder process leaving {left / GiB:.2f} GiB free: max {b} ({seconds_held:.0f} s)",
        f"- within 3 %: {report.check('(d) budget emulation matches a real 16 GiB', close)}"])


def experiment_e(report: Report) -> None:
    spec = {"model": {"torchvision": "resnet50"}, "input": {"shape": [3, 224, 224]}, "target": {"classes": 1000},
            "device": "cuda:0", "training": {"eval_pass": True}, "search": {"start_batch_size": 64,
                                                                             "max_batch_size": 64}}
    result, _, stderr = isoprobe_run(spec)
    trial = next((t for t in (result or {}).get("trials", []) if t.get("eval_seconds")), None)
    found = python("""
        import json, subprocess, time
        from pathlib import Path
        from isoprobe.executors import Conditions
        from isoprobe.executors.local import LocalExecutor
        from isoprobe.protocol.messages import Started, Warm, last_of, read_events
        import tempfile
        with tempfile.TemporaryDirectory() as folder, LocalExecutor(Path(folder), warm=True) as executor:
            executor.prestart(Conditions(backend="cuda", allocator=None, preload=("torch", "torch._dynamo")))
            spare = executor._spare
            deadline = time.monotonic() + 120
            while last_of(read_events(spare.events_path), Warm) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            pid = last_of(read_events(spare.events_path), Started).pid
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                  capture_output=True, text=True).stdout.split()
        print(json.dumps({"spare_pid": pid, "compute_pids": apps}))
    """)
    spare_clean = "spare_pid" in found and str(found["spare_pid"]) not in found.get("compute_pids", [])
    report.add("(e) Evaluation timings, and the GPU's compute processes while a warm spare waits", [
        f"- resnet50 batch 64 with eval_pass: steps {trial['step_seconds'] if trial else stderr[-200:]} s, "
        f"evaluation {trial['eval_seconds'] if trial else '-'} s",
        f"- nvidia-smi --query-compute-apps=pid while the spare waits: {found} "
        f"({report.check('(e) the waiting spare holds no context', spare_clean)})"])


def write(report: Report, facts: list[str], output: Path) -> None:
    verdict = "every check passed" if not report.failed else f"FAILED: {', '.join(report.failed)}"
    parts = ["# isoprobe on a GPU", "", "Written by `python benchmarks/gpu_check.py`; every figure below was "
             "measured by that run, through isoprobe's CLI or its child code.", "", *facts, f"- verdict: {verdict}"]
    for title, lines in report.sections:
        parts += ["", f"## {title}", "", *lines]
    output.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "gpu.md")
    parser.add_argument("--skip-tier", action="store_true", help="leave out the GPU test tier (it runs minutes)")
    args = parser.parse_args(argv)
    if not gpu_present():
        print(f"gpu_check: no CUDA GPU visible here (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r});"
              f" nothing measured, {args.output} not written (exit {NO_GPU_EXIT})", file=sys.stderr)
        return NO_GPU_EXIT
    report = Report()
    facts = device_facts()
    print("\n".join(facts), flush=True)
    steps = [experiment_a, experiment_b, experiment_c, reference_figures, whole_card_probe, start_times,
             allocator_comparison, experiment_d, experiment_e]
    if not args.skip_tier:
        steps.insert(0, gpu_tier)
    for step in steps:
        try:
            step(report)
        except Exception as exc:  # one broken measurement is a failed check, not a lost report
            report.check(step.__name__, False)
            report.add(step.__name__, [f"raised {type(exc).__name__}: {exc}"])
    write(report, facts, args.output)
    print(f"\ngpu_check: {args.output} written; " + ("every check passed" if not report.failed else
                                                      f"{len(report.failed)} failed: {', '.join(report.failed)}"))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
