"""The GPU check: isoprobe's CUDA answers against an independent plain loop, on the same card and budget.

    python benchmarks/gpu_check.py [--quick] [--output docs/gpu.md] [--skip-tier] [--raw-dir DIR]

Run it first when a session is lent a GPU: one device call of at most 10 minutes (the run holds itself to
9 minutes, ``--quick`` to 6; each part has its own limit and is skipped, with the reason, when too little
time is left). In order:

1. the GPU test tier (``pytest tests/gpu -m gpu -v``), stopped at its limit;
2. (a) ResNet50 fp32 Adam 224x224 under 8 GiB: ``isoprobe run --no-cache --format json`` gives the maximum M;
   the plain loop (``gpu_check_parts/plain_loop.py``, no isoprobe import, fresh process, the budget taken as
   a user's job would take it) trains M (must fit) and M+1 (should run out; if it trains, isoprobe was one
   short, which is printed; if it trains in 2 of 2 runs where isoprobe called it out of memory: FAIL). The
   articles' figures ([8, 16) under 8 GiB, [16, 32) under 11 GiB, MobileNetV3's 515) are printed beside as
   what the in-process doubling recipe reaches, never judged;
3. (d) the margin's readings of (a)'s deciding trial, and isoprobe's and the plain loop's readings side by side;
4. (b) a command trial under 8 GiB: ``isoprobe run -- python plain_loop.py --batch-size {batch_size}`` (the
   shim applies the budget), judged against the same plain loop;
5. (c) a 2-rank DDP gang under 8 GiB a rank, where two GPUs are visible (isoprobe puts rank r on GPU r);
6. with time left (not under --quick): ResNet50 under 11 GiB, MobileNetV3-large fp16-mixed under 16 GiB.

It writes ``--output`` (docs/gpu.md) after every part, so a run stopped early still leaves what it measured,
and, with ``--raw-dir`` (default ``$OUT/gpu_check`` where ``$OUT`` is a folder), every result JSON and plain
run line; where ``$OUT`` is a folder the page is also copied to ``$OUT/gpu.md``. Exit codes: 0 nothing failed;
1 a check failed (the page names it); 5 no CUDA GPU here (nothing measured, nothing written; ``NO_GPU_EXIT``).
The judging is in ``gpu_check_parts/judge.py`` (pure, tested in tests/unit/test_cuda_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_parts import judge  # noqa: E402
from gpu_check_parts.judge import GiB, Part, Report, Verdict  # noqa: E402

NO_GPU_EXIT = 5
PLAIN_LOOP = Path(__file__).resolve().parent / "gpu_check_parts" / "plain_loop.py"


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


# --------------------------------------------------------------------------- processes


def run_group(argv: list[str], limit_s: float, env: dict | None = None, grace_s: float = 20) -> tuple:
    """Run ``argv`` in a session of its own for at most ``limit_s``: (exit status or None if stopped at the limit,
    stdout, stderr, seconds). At the limit: SIGTERM to its group (isoprobe prints the trials so far), then after
    ``grace_s`` SIGKILL to the group."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, start_new_session=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        try:
            returncode = process.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            returncode = None
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # anything of its session still left (it started the session)
        out.seek(0)
        err.seek(0)
        return returncode, out.read(), err.read(), time.monotonic() - started


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def python_json(code: str, limit_s: float = 60) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    returncode, out, err, _ = run_group([sys.executable, "-c", textwrap.dedent(code)], limit_s)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (err.strip().splitlines() or [f"exit {returncode}"])[-1]}


def shell_text(argv: list[str], limit_s: float = 20) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=limit_s).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({argv[0]}: {exc})"


# --------------------------------------------------------------------------- the context shared by the parts


@dataclass(frozen=True)
class Workload:
    """One plain-loop configuration: isoprobe's spec and the plain loop's flags describe the same training."""

    model: str = "resnet50"
    precision: str = "fp32"
    budget_bytes: int = 8 * GiB
    ranks: int = 1
    image_size: int = 224
    classes: int = 1000

    def spec(self) -> dict:
        spec = {"model": {"torchvision": self.model, "kwargs": {"num_classes": self.classes}},
                "input": {"shape": [3, self.image_size, self.image_size]}, "target": {"classes": self.classes},
                "optimizer": {"name": "adam", "kwargs": {"lr": 0.001}}, "training": {"precision": self.precision},
                "device": "cuda", "memory_budget": self.budget_bytes, "recommendation": {"soak_steps": 0}}
        if self.ranks > 1:
            spec["distributed"] = {"strategy": "ddp", "world_size": self.ranks, "launcher": "local"}
        return spec

    def plain_args(self, batch: int | str, steps: int, budget: bool = True) -> list[str]:
        return [sys.executable, str(PLAIN_LOOP), "--batch-size", str(batch), "--steps", str(steps),
                "--model", self.model, "--image-size", str(self.image_size), "--classes", str(self.classes),
                "--optimizer", "adam", "--precision", self.precision, "--ranks", str(self.ranks),
                *(["--budget", str(self.budget_bytes)] if budget else [])]


@dataclass
class Context:
    quick: bool
    deadline: float
    raw_dir: Path | None = None
    gpus: int = 0
    #: Workload -> batch -> [(fits, JSON line)]: the plain loop's runs, shared by the parts that judge it.
    plain: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)

    def save(self, name: str, data) -> None:
        if self.raw_dir is not None:
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            (self.raw_dir / name).write_text(json.dumps(data, indent=1) if not isinstance(data, str) else data)

    def runs(self, workload: Workload) -> dict[int, list]:
        return self.plain.setdefault(workload, {})

    def run_plain(self, workload: Workload, batch: int, limit_s: float) -> bool | None:
        steps = judge.PLAIN_STEPS[self.quick]
        returncode, out, err, seconds = run_group(workload.plain_args(batch, steps), limit_s, grace_s=5)
        fits, line = judge.plain_outcome(returncode, out)
        if returncode is None:
            line = {**line, "outcome": f"stopped at its {limit_s:.0f} s limit"}
        elif fits is None:
            line = {**line, "error_tail": err.strip()[-600:]}
        line["wall_seconds"] = round(seconds, 1)
        self.runs(workload).setdefault(batch, []).append((fits, line))
        print(f"gpu_check:   plain loop batch {batch} ({workload.model}, {workload.budget_bytes / GiB:g} GiB, "
              f"{workload.ranks} rank(s)): {line.get('outcome')} in {seconds:.1f} s", flush=True)
        self.save(f"plain-{workload.model}-{workload.budget_bytes // GiB}gib-r{workload.ranks}-b{batch}-"
                  f"{len(self.runs(workload)[batch])}.json", line)
        return fits


def isoprobe_json(spec: dict, limit_s: float, command: list[str] | None = None) -> tuple:
    """``isoprobe run`` on a spec without the cache: (result or None, seconds, stderr, exit status or None)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.json"  # YAML is a superset of JSON
        path.write_text(json.dumps(spec))
        argv = [sys.executable, "-m", "isoprobe", "run", str(path), "--no-cache", "--format", "json"]
        returncode, out, err, seconds = run_group(argv + (["--", *command] if command else []), limit_s)
    try:
        return json.loads(out), seconds, err, returncode
    except json.JSONDecodeError:
        return None, seconds, err, returncode


def leftover_processes() -> list[str]:
    apps = shell_text(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"])
    return [f"- note: processes still on the GPU before this part: {apps}"] if apps and "(" not in apps[:1] else []


# --------------------------------------------------------------------------- the parts


def part_facts(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    facts = python_json("""
        import json, torch, torchvision
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        print(json.dumps({"name": p.name, "total": total, "free": free, "capability": f"{p.major}.{p.minor}",
                          "torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version(), "count": torch.cuda.device_count()}))
    """, limit_s)
    driver = shell_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    listing = shell_text(["nvidia-smi", "-L"])
    ctx.gpus = judge.visible_gpu_count(listing, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not ctx.gpus and facts.get("count"):  # no nvidia-smi here: torch's count
        ctx.gpus = int(facts["count"])
    commit = shell_text(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    report.facts = [
        f"- device: {facts.get('name')} ({(facts.get('total') or 0) / GiB:.2f} GiB reported, "
        f"{(facts.get('free') or 0) / GiB:.2f} GiB free at the start, compute capability {facts.get('capability')}), "
        f"driver {driver}",
        f"- visible GPUs: {ctx.gpus} (`nvidia-smi -L`: {'; '.join(listing.splitlines()) or '-'}; "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
        f"- torch {facts.get('torch')}, torchvision {facts.get('torchvision')}, CUDA {facts.get('cuda')}, cuDNN "
        f"{facts.get('cudnn')}, python {sys.version.split()[0]}, isoprobe commit {commit or '?'}",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}" + (", --quick" if ctx.quick else "")]
    if "error" in facts:
        report.facts.append(f"- reading the device failed: {facts['error']}")
    part.lines += report.facts


def part_tier(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    returncode, out, err, seconds = run_group(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-n", "0", "-v", "-p", "no:cacheprovider",
         "--durations=15"], limit_s, grace_s=10)
    ctx.save("tier.txt", out + "\n--- stderr\n" + err)
    verdict, lines = judge.tier_summary(out, returncode, seconds, limit_s)
    part.judge("GPU test tier", verdict)
    part.lines += lines


def edge_check(part: Part, ctx: Context, name: str, workload: Workload, limit_s: float,
               command: list[str] | None = None, spec: dict | None = None, recipe: str | None = None) -> dict | None:
    """isoprobe's answer for ``workload`` (its own trials, or ``command`` as a command trial) judged against the
    plain loop (``judge.next_plain_batch``, ``judge.judge_edge``); returns isoprobe's result."""
    part_end = time.monotonic() + limit_s
    plain_limit = judge.PLAIN_LIMIT_S[ctx.quick]
    part.lines += leftover_processes()
    spec = spec if spec is not None else workload.spec()
    result, seconds, err, returncode = isoprobe_json(spec, max(30.0, limit_s - 2 * plain_limit), command)
    ctx.save(f"isoprobe-{part.key}.json", result if result is not None else {"stderr": err[-4000:]})
    m = (result or {}).get("max_batch_size")
    f = (result or {}).get("first_failing_batch_size")
    stopped = "" if returncode is not None else " (stopped at its limit)"
    part.lines.append(f"- isoprobe{' (command trial)' if command else ''}: max {m}, first failing {f}, recommended "
                      f"{(result or {}).get('recommended_batch_size')}, stop reason "
                      f"{(result or {}).get('stop_reason')}, exit {returncode}{stopped}, "
                      f"{len((result or {}).get('trials') or [])} trials in {seconds:.0f} s")
    if result is None or m is None:
        tail = [line for line in err.strip().splitlines() if line.strip()][-12:]
        part.lines += ["", "isoprobe's stderr, last lines:", "", "```text", *tail, "```", ""]
    if result is not None and result.get("message"):
        part.lines.append(f"- isoprobe says: {result['message']}")
    part.lines += judge.trial_lines(result)
    runs = ctx.runs(workload)
    while True:
        verdicts = {batch: [fits for fits, _ in lines] for batch, lines in runs.items()}
        batch = judge.next_plain_batch(m, f, verdicts)
        left = part_end - time.monotonic()
        if batch is None or left < 15:
            break
        ctx.run_plain(workload, batch, min(plain_limit, left))
    verdicts = {batch: [fits for fits, _ in lines] for batch, lines in runs.items()}
    verdict = judge.judge_edge(m, f, verdicts)
    if verdict.status == Verdict.NOT_JUDGED and m is not None and time.monotonic() >= part_end - 15:
        verdict = Verdict(Verdict.NOT_JUDGED, verdict.reason + " (the part's time ran out)")
    part.judge(name, verdict)
    if recipe:
        part.lines.append(f"- what the in-process doubling recipe reaches (the articles; never judged): {recipe}")
    if m is not None:
        part.lines += ["", *judge.readings_table(result, {b: [line for _, line in runs.get(b, [])]
                                                          for b in (m, m + 1)}, [m, m + 1]), ""]
        errors = [line for b in (m, m + 1) for fits, line in runs.get(b, []) if fits is None]
        part.lines += [f"- plain run without a memory verdict at {line.get('batch_size')}: {line.get('outcome')} "
                       f"{line.get('error', '')} {line.get('error_tail', '')[-300:]}" for line in errors]
    return result


RESNET_8 = Workload()


def part_resnet50_8gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    ctx.results["resnet50_8gib"] = edge_check(part, ctx, "ResNet50 under 8 GiB", RESNET_8, limit_s,
                                              recipe=judge.RECIPE[("resnet50", 8)])


def part_margin(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    result = ctx.results.get("resnet50_8gib")
    part.lines += judge.margin_lines(result)


def part_command_8gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    own = (ctx.results.get("resnet50_8gib") or {}).get("max_batch_size")
    spec = {"device": "cuda", "memory_budget": RESNET_8.budget_bytes, "recommendation": {"soak_steps": 0},
            "search": {"start_batch_size": own or 64, "trial_timeout": 120}}
    command = RESNET_8.plain_args("{batch_size}", 100000, budget=False)
    part.lines.append(f"- the command: `{' '.join(Path(a).name if '/' in a else a for a in command)}` (no --budget: "
                      f"the shim applies the spec's {RESNET_8.budget_bytes / GiB:g} GiB), starting at isoprobe's own "
                      f"maximum from (a), {own if own is not None else 'none: 64'}")
    result = edge_check(part, ctx, "command trial under 8 GiB", RESNET_8, limit_s, command=command, spec=spec)
    m = (result or {}).get("max_batch_size")
    if m is not None and own is not None:
        part.lines.append(f"- the command's maximum {m} against isoprobe's own trials' {own} (same workload, not "
                          f"judged): {'the same' if m == own else f'{m - own:+d}'}")


def part_ddp(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    if ctx.gpus < 2:
        part.judge("2-rank DDP gang", Verdict(Verdict.SKIPPED, f"{ctx.gpus} GPU(s) visible: isoprobe runs each rank of a "
                                                               "gang on its own GPU (rank r on visible GPU r), so a "
                                                               "2-rank gang needs two; not faked on one"))
        return
    edge_check(part, ctx, "2-rank DDP gang under 8 GiB a rank", Workload(ranks=2), limit_s)


def part_resnet50_11gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    edge_check(part, ctx, "ResNet50 under 11 GiB", Workload(budget_bytes=11 * GiB), limit_s,
               recipe=judge.RECIPE[("resnet50", 11)])


def part_mobilenet_16gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    edge_check(part, ctx, "MobileNetV3-large fp16-mixed under 16 GiB",
               Workload(model="mobilenet_v3_large", precision="fp16-mixed", budget_bytes=16 * GiB), limit_s,
               recipe=judge.RECIPE[("mobilenet_v3_large", 16)])


PARTS = {"facts": part_facts, "tier": part_tier, "resnet50_8gib": part_resnet50_8gib, "margin": part_margin,
         "command_8gib": part_command_8gib, "ddp": part_ddp, "resnet50_11gib": part_resnet50_11gib,
         "mobilenet_16gib": part_mobilenet_16gib}


# --------------------------------------------------------------------------- the run


def write(report: Report, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(judge.render(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "gpu.md")
    parser.add_argument("--quick", action="store_true", help="shorter limits and fewer steps; the optional parts "
                                                             "left out (about 6 minutes)")
    parser.add_argument("--skip-tier", action="store_true", help="leave out the GPU test tier")
    out_env = os.environ.get("OUT")
    default_raw = Path(out_env) / "gpu_check" if out_env and Path(out_env).is_dir() else None
    parser.add_argument("--raw-dir", type=Path, default=default_raw,
                        help="also write every result JSON and plain run line here (default: $OUT/gpu_check where "
                             "$OUT is a folder)")
    args = parser.parse_args(argv)
    started = time.monotonic()  # the device call's clock: asking torch for a GPU counts too
    if not gpu_present():
        print(f"gpu_check: no CUDA GPU visible here (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r});"
              f" nothing measured, {args.output} not written (exit {NO_GPU_EXIT})", file=sys.stderr)
        return NO_GPU_EXIT
    ctx = Context(quick=args.quick, deadline=started + judge.DEADLINE_S[args.quick], raw_dir=args.raw_dir)
    report = Report(quick=args.quick)
    for plan in judge.PLAN:
        left = ctx.deadline - time.monotonic()
        limit = judge.part_limit(plan, args.quick, left)
        part = Part(plan.key, plan.title, limit)
        report.parts.append(part)
        print(f"\ngpu_check: {plan.title} (limit {'-' if limit is None else f'{limit:.0f} s'}, "
              f"{left:.0f} s of the run left)", flush=True)
        if plan.key == "tier" and args.skip_tier:
            part.judge("GPU test tier", Verdict(Verdict.SKIPPED, "--skip-tier"))
        elif limit is None:
            why = "left out under --quick" if (plan.quick_s if args.quick else plan.full_s) <= 0 else \
                f"{left:.0f} s of the run left, it needs {plan.min_s} s"
            part.judge(plan.key, Verdict(Verdict.SKIPPED, why))
        else:
            begun = time.monotonic()
            try:
                PARTS[plan.key](part, ctx, report, limit)
            except Exception as exc:  # a broken measurement is reported, not a lost run
                part.judge(plan.key, Verdict(Verdict.FAIL, f"the check itself raised {type(exc).__name__}: {exc} "
                                                           "(a bug in gpu_check.py, not necessarily isoprobe's)"))
                part.lines += ["```text", *traceback.format_exc().strip().splitlines()[-8:], "```"]
            part.seconds = time.monotonic() - begun
        print("\n".join([str(v) for _, v in part.verdicts] + part.lines), flush=True)
        report.seconds = time.monotonic() - started
        write(report, args.output)
    report.finished = True
    report.seconds = time.monotonic() - started
    write(report, args.output)
    if out_env and Path(out_env).is_dir() and Path(out_env).resolve() not in args.output.resolve().parents:
        shutil.copy(args.output, Path(out_env) / "gpu.md")
    print(f"\ngpu_check: {args.output} written in {report.seconds:.0f} s; "
          + ("nothing failed" if not report.failed else f"{len(report.failed)} failed: {', '.join(report.failed)}"))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
