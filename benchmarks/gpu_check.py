"""The GPU check: isoprobe's CUDA answers against a card that really has only the budget free.

Run it first when a session is lent a GPU, in one device call (the GPU machine reaches no registry; the packages
its image lacks travel as wheels, ../shared/gpu/README.md):

    bash ../shared/gpu/stage.sh                       # here, once
    bash .gpu/setup.sh && PYTHONUNBUFFERED=1 timeout 560 python3 benchmarks/gpu_check.py   # the call, carry .gpu

    python benchmarks/gpu_check.py [--quick] [--output docs/gpu.md] [--raw-dir DIR]

The run holds itself to 510 s (``--quick`` 360); each part has its own limit and is skipped, with the reason, when
too little time is left (``gpu_check_parts/judge.py``'s PLAN). In order: the device's facts and isoprobe's import;
(a) ResNet50 fp32 Adam 224² under 8 GiB; (e) the same under ``expandable_segments:True``; (b) a command trial under
8 GiB; (f) the default path, no budget, the whole card; (c) a 2-rank DDP gang (two GPUs only); the GPU test tier
with what is left. Each of (a), (e), (b), (c) runs ``isoprobe run --no-cache --format json`` for the maximum M and
judges it against the yardstick (``judge.judge_edge``): the plain loop (``gpu_check_parts/plain_loop.py``, nothing
of isoprobe) in a fresh process with no fraction set, while the ballast (``gpu_check_parts/ballast.py``) holds all
but the budget of the card; (f)'s yardstick is the plain loop on the whole card. The fraction-capped loop, the same
recipe isoprobe uses, is run after as a second reading, labelled so and never judged.

After every part the page (``--output``, and ``$OUT/gpu.md`` where ``$OUT`` is a folder) and the raw results (every
result JSON and plain line, archived as ``$OUT/gpu_check.tar.gz``) are written, so a call stopped at its limit still
returns what it measured. Exit: 0 nothing failed; 1 a check failed (the page names it); 2 stopped by a signal (SIGTERM from the call's
``timeout``: the running part's processes ended, the page and the archive written); 5 no CUDA GPU here (nothing
measured, nothing written; ``NO_GPU_EXIT``). Its processes go through one seam, ``gpu_check_parts.runner.Runner``,
which tests/unit/test_gpu_check_runs.py replaces with a fake card.
"""

from __future__ import annotations

import argparse
import hashlib
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_parts import judge  # noqa: E402
from gpu_check_parts.judge import GiB, Verdict  # noqa: E402
from gpu_check_parts.page import Part, Report, render  # noqa: E402
from gpu_check_parts.runner import Runner, archive  # noqa: E402

NO_GPU_EXIT = 5
#: Stopped by a signal before its end (the page and the archive say how far it got).
STOPPED_EXIT = 2
PARTS_DIR = Path(__file__).resolve().parent / "gpu_check_parts"
PLAIN_LOOP = PARTS_DIR / "plain_loop.py"
BALLAST = PARTS_DIR / "ballast.py"
#: The archive of the raw folder under $OUT (the device call brings few files back).
ARCHIVE_NAME = "gpu_check.tar.gz"


def gpu_present(runner: Runner, environ=os.environ) -> bool:
    """A CUDA GPU torch can use here? Asked in a child (this script never creates a context, nor imports isoprobe:
    it must say "no GPU" even where isoprobe's dependencies are missing)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return False
    ran = runner.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], 120,
                     env={k: v for k, v in environ.items() if k == "CUDA_VISIBLE_DEVICES"})
    return ran.returncode == 0 and ran.stdout.strip().endswith("True")


@dataclass(frozen=True)
class Workload:
    """One training setup: isoprobe's spec and the plain loop's flags describe the same training. ``budget_bytes``
    None: the whole card; ``alloc_conf``: PYTORCH_CUDA_ALLOC_CONF for isoprobe (``allocator``) and the loop alike."""

    model: str = "resnet50"
    precision: str = "fp32"
    budget_bytes: int | None = 8 * GiB
    ranks: int = 1
    image_size: int = 224
    classes: int = 1000
    alloc_conf: str | None = None

    def spec(self) -> dict:
        spec: dict = {"model": {"torchvision": self.model, "kwargs": {"num_classes": self.classes}},
                      "input": {"shape": [3, self.image_size, self.image_size]}, "target": {"classes": self.classes},
                      "optimizer": {"name": "adam", "kwargs": {"lr": 0.001}}, "training": {"precision": self.precision},
                      "device": "cuda", "recommendation": {"soak_steps": 0}}
        if self.budget_bytes is not None:
            spec["memory_budget"] = self.budget_bytes
        if self.alloc_conf:
            spec["allocator"] = self.alloc_conf
        if self.ranks > 1:
            spec["distributed"] = {"strategy": "ddp", "world_size": self.ranks, "launcher": "local"}
        return spec

    def plain_args(self, batch: int | str, steps: int, budget: bool = False) -> list[str]:
        """The plain loop's command; ``budget``: cap it with a fraction (the second reading), else no fraction."""
        return [sys.executable, str(PLAIN_LOOP), "--batch-size", str(batch), "--steps", str(steps),
                "--model", self.model, "--image-size", str(self.image_size), "--classes", str(self.classes),
                "--optimizer", "adam", "--precision", self.precision, "--ranks", str(self.ranks),
                *(["--budget", str(self.budget_bytes)] if budget and self.budget_bytes else [])]

    def env(self) -> dict[str, str]:
        return {"PYTORCH_CUDA_ALLOC_CONF": self.alloc_conf} if self.alloc_conf else {}

    def label(self) -> str:
        budget = f"{self.budget_bytes / GiB:g}gib" if self.budget_bytes else "card"
        return f"{self.model}-{self.image_size}-{budget}-r{self.ranks}" + ("-expandable" if self.alloc_conf else "")


RESNET_8 = Workload()
RESNET_8_EXPANDABLE = Workload(alloc_conf="expandable_segments:True")
#: The default path: no budget. ResNet50 fp32 Adam at 448² (about four times 224²'s activations a sample) puts the
#: whole card's edge in the hundreds on an 80-141 GiB card, where a step takes about a second: a minute or two.
WHOLE_CARD = Workload(budget_bytes=None, image_size=448)


@dataclass
class Context:
    """What the parts share: the clock and the deadline, the runner, the raw folder, and the yardstick's runs."""

    quick: bool
    deadline: float
    runner: Runner = field(default_factory=Runner)
    clock: Callable[[], float] = time.monotonic
    raw_dir: Path | None = None
    gpus: int = 0
    tier_k: str | None = None  # the tier's -k expression (--tier-k)
    #: (Workload, yardstick) -> batch -> [(fits, JSON line)]; yardstick "ballast"/"card" (judged) or "fraction".
    plain: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)

    def left(self, end: float) -> float:
        return end - self.clock()

    def save(self, name: str, data) -> None:
        if self.raw_dir is not None:
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            (self.raw_dir / name).write_text(data if isinstance(data, str) else json.dumps(data, indent=1))

    def runs(self, workload: Workload, yardstick: str) -> dict[int, list]:
        return self.plain.setdefault((workload, yardstick), {})

    def run_plain(self, workload: Workload, batch: int, limit_s: float, yardstick: str) -> bool | None:
        """One plain loop run at ``batch``; ``yardstick`` "fraction" caps it with a fraction, else none is set (the
        ballast, if any, is already held)."""
        steps = judge.PLAIN_STEPS[self.quick]
        ran = self.runner.run(workload.plain_args(batch, steps, budget=yardstick == "fraction"), limit_s,
                              env=workload.env(), grace_s=5)
        fits, line = judge.plain_outcome(ran.returncode, ran.stdout)
        if ran.returncode is None:
            line = {**line, "outcome": f"stopped at its {limit_s:.0f} s limit"}
        elif fits is None:
            line = {**line, "error_tail": ran.stderr.strip()[-600:]}
        line["wall_seconds"] = round(ran.seconds, 1)
        runs = self.runs(workload, yardstick).setdefault(batch, [])
        runs.append((fits, line))
        print(f"gpu_check:   {yardstick} loop batch {batch} ({workload.label()}): {line.get('outcome')} in "
              f"{ran.seconds:.1f} s", flush=True)
        self.save(f"plain-{workload.label()}-{yardstick}-b{batch}-{len(runs)}.json", line)
        return fits


@contextlib.contextmanager
def ballast(ctx: Context, workload: Workload):
    """The card (each rank's) left with only the budget free while the block runs: yields None when held, else why
    not. Without a budget: nothing held, None."""
    if workload.budget_bytes is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        for device in range(workload.ranks):
            ready = stack.enter_context(ctx.runner.hold(
                [sys.executable, str(BALLAST), "--leave", str(workload.budget_bytes), "--device", str(device)],
                judge.BALLAST_READY_S))
            ctx.save(f"ballast-{workload.label()}-gpu{device}.json", ready)
            if not ready.get("ready"):
                yield f"the ballast could not hold GPU {device}: {ready.get('error')}"
                return
            print(f"gpu_check:   ballast on GPU {device}: {ready.get('free_bytes', 0) / GiB:.3f} GiB left free "
                  f"({ready.get('held_bytes', 0) / GiB:.2f} GiB held)", flush=True)
        yield None


def isoprobe_json(ctx: Context, spec: dict, limit_s: float, command: list[str] | None = None) -> tuple:
    """``isoprobe run`` on a spec without the cache: (result or None, seconds, stderr, exit status or None)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.json"  # YAML is a superset of JSON
        path.write_text(json.dumps(spec))
        argv = [sys.executable, "-m", "isoprobe", "run", str(path), "--no-cache", "--format", "json"]
        ran = ctx.runner.run(argv + (["--", *command] if command else []), limit_s)
    try:
        return json.loads(ran.stdout), ran.seconds, ran.stderr, ran.returncode
    except json.JSONDecodeError:
        return None, ran.seconds, ran.stderr, ran.returncode


def leftover_processes(ctx: Context) -> list[str]:
    ran = ctx.runner.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], 20)
    apps = ran.stdout.strip() if ran.returncode == 0 else ""
    return [f"- note: processes on the GPU before this part: {apps}"] if apps else []


# --------------------------------------------------------------------------- the parts


def part_facts(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    code = textwrap.dedent("""
        import json, sys, torch, torchvision
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        found = {"name": p.name, "total": total, "free": free, "capability": f"{p.major}.{p.minor}",
                 "torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(), "count": torch.cuda.device_count(),
                 "python": sys.version.split()[0]}
        try:
            import pydantic, isoprobe.cli.main
            found["isoprobe_import"] = f"ok (pydantic {pydantic.VERSION})"
        except Exception as exc:
            found["isoprobe_import"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(found))
    """)
    ran = ctx.runner.run([sys.executable, "-c", code], limit_s)
    try:
        facts = json.loads(ran.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        facts = {"error": (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]}
    ctx.save("facts.json", facts)
    smi = ctx.runner.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 20)
    listing = ctx.runner.run(["nvidia-smi", "-L"], 20).stdout.strip()
    ctx.gpus = judge.visible_gpu_count(listing, os.environ.get("CUDA_VISIBLE_DEVICES")) or int(facts.get("count") or 0)
    commit = ctx.runner.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], 20).stdout.strip()
    # The device's copy of the checkout carried a stale .git on the second call (it said b9a33db, the first
    # call's, for a tree two commits on): the source's own digest says what ran; ``source_digest`` here, on a
    # checkout of the commit, gives the same figure.
    commit = f"{commit or '?'}, source sha256 {source_digest(ROOT)}"
    report.facts = [
        f"- device: {facts.get('name')} ({(facts.get('total') or 0) / GiB:.2f} GiB reported, "
        f"{(facts.get('free') or 0) / GiB:.2f} GiB free at the start, compute capability {facts.get('capability')}), "
        f"driver {smi.stdout.strip() or '?'}",
        f"- visible GPUs: {ctx.gpus} (`nvidia-smi -L`: {'; '.join(listing.splitlines()) or '-'})",
        f"- torch {facts.get('torch')}, torchvision {facts.get('torchvision')}, CUDA {facts.get('cuda')}, cuDNN "
        f"{facts.get('cudnn')}, python {facts.get('python')}, isoprobe commit {commit or '?'}",
        f"- isoprobe's import here: {facts.get('isoprobe_import', '-')}",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}" + (", --quick" if ctx.quick else "")]
    if "error" in facts:
        report.facts.append(f"- reading the device failed: {facts['error']}")
        part.judge("device facts", Verdict(Verdict.FAIL, f"torch could not read the device: {facts['error']}"))
    elif not str(facts.get("isoprobe_import", "")).startswith("ok"):
        part.judge("isoprobe's import", Verdict(Verdict.FAIL, f"isoprobe does not import here ("
                                                             f"{facts.get('isoprobe_import')}): was .gpu/setup.sh run?"))
    part.lines += report.facts


def edge_check(part: Part, ctx: Context, name: str, workload: Workload, limit_s: float,
               command: list[str] | None = None, spec: dict | None = None, recipe: str | None = None) -> dict | None:
    """isoprobe's answer for ``workload`` (its own trials, or ``command`` as a command trial) judged against the
    yardstick (``judge.next_plain_batch``, ``judge.judge_edge``), then the second reading with time left."""
    part_end = ctx.clock() + limit_s
    plain_limit = judge.PLAIN_LIMIT_S[ctx.quick]
    yardstick = "ballast" if workload.budget_bytes is not None else "card"
    part.lines += leftover_processes(ctx)
    spec = spec if spec is not None else workload.spec()
    result, seconds, err, returncode = isoprobe_json(ctx, spec, max(30.0, limit_s - judge.YARDSTICK_S), command)
    ctx.save(f"isoprobe-{part.key}.json", result if result is not None else {"stderr": err[-4000:]})
    m = (result or {}).get("max_batch_size")
    f = (result or {}).get("first_failing_batch_size")
    part.lines.append(f"- isoprobe{' (command trial)' if command else ''}: max {m}, first failing {f}, recommended "
                      f"{(result or {}).get('recommended_batch_size')}, stop reason "
                      f"{(result or {}).get('stop_reason')}, exit {returncode}"
                      f"{'' if returncode is not None else ' (stopped at its limit)'}, "
                      f"{len((result or {}).get('trials') or [])} trials in {seconds:.0f} s")
    if result is None or m is None:
        tail = [line for line in err.strip().splitlines() if line.strip()][-12:]
        part.lines += ["", "isoprobe's stderr, last lines:", "", "```text", *tail, "```", ""]
    if result is not None and result.get("message"):
        part.lines.append(f"- isoprobe says: {result['message']}")
    part.lines += judge.trial_lines(result)
    runs = ctx.runs(workload, yardstick)

    def verdicts() -> dict:
        return {batch: [fits for fits, _ in lines] for batch, lines in runs.items()}

    not_held = None
    if judge.next_plain_batch(m, f, verdicts()) is not None and ctx.left(part_end) >= 15:
        with ballast(ctx, workload) as not_held:
            while not not_held:
                batch = judge.next_plain_batch(m, f, verdicts())
                if batch is None or ctx.left(part_end) < 15:
                    break
                ctx.run_plain(workload, batch, min(plain_limit, ctx.left(part_end)), yardstick)
    verdict = judge.judge_edge(m, f, verdicts())
    if not_held:
        verdict = Verdict(Verdict.NOT_JUDGED, not_held)
    elif verdict.status == Verdict.NOT_JUDGED and m is not None and ctx.left(part_end) < 15:
        verdict = Verdict(Verdict.NOT_JUDGED, verdict.reason + " (the part's time ran out)")
    part.judge(name, verdict)
    if recipe:
        part.lines.append(f"- what the in-process doubling recipe reaches (the articles; never judged): {recipe}")
    if m is None:
        return result
    if workload.budget_bytes is not None:  # the second reading: the fraction recipe, labelled, never judged
        for batch in (m, m + 1):
            if ctx.left(part_end) >= plain_limit / 2 and not ctx.runs(workload, "fraction").get(batch):
                ctx.run_plain(workload, batch, min(plain_limit, ctx.left(part_end)), "fraction")
    labelled = [(f"{'ballast' if kind == 'ballast' else 'whole card' if kind == 'card' else 'fraction (second reading)'}"
                 f" loop run {number}", batch, line)
                for kind in (yardstick, "fraction") for batch, lines in sorted(ctx.runs(workload, kind).items())
                for number, (_, line) in enumerate(lines, 1)]
    part.lines += ["", "The margin's readings of isoprobe's deciding trial:", "", *judge.margin_lines(result), "",
                   *judge.readings_table(result, labelled, [m, m + 1, m + 2]), ""]
    part.lines += [f"- run without a memory verdict at {batch}: {line.get('outcome')} {line.get('error', '')} "
                   f"{line.get('error_tail', '')[-300:]}" for _, batch, line in labelled
                   if line.get("outcome") not in ("fits", "out_of_memory")]
    return result


def part_resnet50_8gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    ctx.results["resnet50_8gib"] = edge_check(part, ctx, "ResNet50 under 8 GiB", RESNET_8, limit_s,
                                              recipe=judge.RECIPE[("resnet50", 8)])


def part_expandable_8gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    result = edge_check(part, ctx, "ResNet50 under 8 GiB, expandable segments", RESNET_8_EXPANDABLE, limit_s)
    m, own = (result or {}).get("max_batch_size"), (ctx.results.get("resnet50_8gib") or {}).get("max_batch_size")
    if m is not None and own is not None:
        part.lines.append(f"- against (a)'s maximum {own} without the setting (not judged): {m - own:+d}")


def part_command_8gib(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    own = (ctx.results.get("resnet50_8gib") or {}).get("max_batch_size")
    spec = {"device": "cuda", "memory_budget": RESNET_8.budget_bytes, "recommendation": {"soak_steps": 0},
            "search": {"start_batch_size": own or 64, "trial_timeout": 120}}
    command = RESNET_8.plain_args("{batch_size}", 100000)
    part.lines.append(f"- the command: `{' '.join(Path(a).name if '/' in a else a for a in command)}` (no --budget: "
                      f"the shim applies the spec's {(RESNET_8.budget_bytes or 0) / GiB:g} GiB), starting at "
                      f"isoprobe's own maximum from (a), {own if own is not None else 'none: 64'}")
    result = edge_check(part, ctx, "command trial under 8 GiB", RESNET_8, limit_s, command=command, spec=spec)
    m = (result or {}).get("max_batch_size")
    if m is not None and own is not None:
        part.lines.append(f"- the command's maximum {m} against isoprobe's own trials' {own} (same workload, not "
                          f"judged): {'the same' if m == own else f'{m - own:+d}'}")


def part_whole_card(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    edge_check(part, ctx, "the whole card, no budget", WHOLE_CARD, limit_s)


def part_ddp(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    if ctx.gpus < 2:
        part.judge("2-rank DDP gang", Verdict(Verdict.SKIPPED, f"{ctx.gpus} GPU(s) visible: isoprobe runs each rank of a "
                                                               "gang on its own GPU (rank r on visible GPU r), so a "
                                                               "2-rank gang needs two; not faked on one"))
        return
    edge_check(part, ctx, "2-rank DDP gang under 8 GiB a rank", Workload(ranks=2), limit_s)


def source_digest(root: Path) -> str:
    """The first 12 hex digits of a SHA-256 over isoprobe/'s Python files (path and content, in path order)."""
    digest = hashlib.sha256()
    for path in sorted((root / "isoprobe").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def part_tier(part: Part, ctx: Context, report: Report, limit_s: float) -> None:
    chosen = ["-k", ctx.tier_k] if ctx.tier_k else []
    ran = ctx.runner.run([sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-n", "0", "-v", "-p",
                          "no:cacheprovider", "--durations=15", *chosen], limit_s, grace_s=10,
                         env={"ISOPROBE_PRINT_FAILURES_NOW": "1"})  # tests/conftest.py: each failure as it happens
    ctx.save("tier.txt", ran.stdout + "\n--- stderr\n" + ran.stderr)
    verdict, lines = judge.tier_summary(ran.stdout, ran.returncode, ran.seconds, limit_s)
    part.judge("GPU test tier", verdict)
    part.lines += lines


PARTS = {"facts": part_facts, "resnet50_8gib": part_resnet50_8gib, "expandable_8gib": part_expandable_8gib,
         "command_8gib": part_command_8gib, "whole_card": part_whole_card, "ddp": part_ddp, "tier": part_tier}


# --------------------------------------------------------------------------- the run


def publish(report: Report, output: Path, out_dir: Path | None, raw_dir: Path | None) -> None:
    """The page to ``output`` and, where the call has an ``$OUT`` folder, the page and the raw folder's archive there."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(report))
    if out_dir is None:
        return
    if output.resolve() != (out_dir / "gpu.md").resolve():
        shutil.copy(output, out_dir / "gpu.md")
    if raw_dir is not None and raw_dir.is_dir():
        archive(raw_dir, out_dir / ARCHIVE_NAME)


def main(argv: list[str] | None = None, runner: Runner | None = None, clock: Callable[[], float] = time.monotonic,
         environ=os.environ) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "gpu.md")
    parser.add_argument("--quick", action="store_true", help="shorter limits and fewer steps; (f), (c) left out")
    parser.add_argument("--skip-tier", action="store_true", help="leave out the GPU test tier")
    parser.add_argument("--only", default=None, metavar="KEY[,KEY]",
                        help="run only these parts (the device's facts always): " + ", ".join(k for k in PARTS
                                                                                            if k != "facts")
                             + "; for a second call with less device time left")
    parser.add_argument("--deadline", type=float, default=None, metavar="S",
                        help="hold the whole check to S seconds (default 510, --quick 360)")
    parser.add_argument("--tier-k", default=None, metavar="EXPR", help="the GPU test tier's tests matching EXPR")
    parser.add_argument("--raw-dir", type=Path, default=None,
                        help="write every result JSON and plain line here (default: a fresh folder, archived to "
                             f"$OUT/{ARCHIVE_NAME} where $OUT is a folder)")
    args = parser.parse_args(argv)
    only = None if args.only is None else {key.strip() for key in args.only.split(",") if key.strip()}
    if only is not None and not only <= set(PARTS):
        parser.error(f"--only: no such part {', '.join(sorted(only - set(PARTS)))} (parts: {', '.join(PARTS)})")
    args.only = only
    runner = runner or Runner()
    started = clock()  # the device call's clock: asking torch for a GPU counts too
    out_dir = Path(environ["OUT"]) if environ.get("OUT") and Path(environ["OUT"]).is_dir() else None
    if not gpu_present(runner, environ):
        print(f"gpu_check: no CUDA GPU visible here (CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')!r}); "
              f"nothing measured, {args.output} not written (exit {NO_GPU_EXIT})", file=sys.stderr)
        return NO_GPU_EXIT
    raw_dir = args.raw_dir or (Path(tempfile.mkdtemp(prefix="gpu-check-")) / "gpu_check" if out_dir else None)
    try:
        return _check(args, runner, clock, started, out_dir, raw_dir)
    finally:  # the fresh folder's files are in $OUT's archive by now: the folder itself goes
        if args.raw_dir is None and raw_dir is not None:
            shutil.rmtree(raw_dir.parent, ignore_errors=True)


def _check(args: argparse.Namespace, runner: Runner, clock: Callable[[], float], started: float,
           out_dir: Path | None, raw_dir: Path | None) -> int:
    """Every part, the page and the archive published after each; the exit code."""
    deadline = judge.DEADLINE_S[args.quick] if args.deadline is None else args.deadline
    ctx = Context(quick=args.quick, deadline=started + deadline, runner=runner, clock=clock,
                  raw_dir=raw_dir, tier_k=args.tier_k)
    report = Report(quick=args.quick)
    previous = signal.signal(signal.SIGTERM, _stop)  # the call's `timeout`: the part's processes end, the page stays
    try:
        _run_parts(ctx, report, args, started, out_dir)
    except Stopped as stop:
        if report.parts:
            report.parts[-1].judge(report.parts[-1].key, Verdict(Verdict.NOT_JUDGED, f"stopped by {stop}"))
        report.seconds = clock() - started
        publish(report, args.output, out_dir, raw_dir)
        print(f"\ngpu_check: stopped by {stop} after {report.seconds:.0f} s; {args.output} written (exit "
              f"{STOPPED_EXIT})", file=sys.stderr)
        return STOPPED_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)
    report.finished = True
    report.seconds = clock() - started
    publish(report, args.output, out_dir, raw_dir)
    print(f"\ngpu_check: {args.output} written in {report.seconds:.0f} s; "
          + ("nothing failed" if not report.failed else f"{len(report.failed)} failed: {', '.join(report.failed)}"))
    return 1 if report.failed else 0


class Stopped(BaseException):
    """The check was signalled (SIGTERM: the device call's ``timeout``). Not an ``Exception``: a part's own error
    handling must not take it for a broken measurement."""


def _stop(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def _run_parts(ctx: Context, report: Report, args: argparse.Namespace, started: float, out_dir: Path | None) -> None:
    """Every part of the PLAN in order, each within its limit; the page published after each."""
    clock = ctx.clock
    for plan in judge.PLAN:
        left = ctx.deadline - clock()
        limit = judge.part_limit(plan, args.quick, left)
        part = Part(plan.key, plan.title, limit)
        report.parts.append(part)
        print(f"\ngpu_check: {plan.title} (limit {'-' if limit is None else f'{limit:.0f} s'}, "
              f"{left:.0f} s of the run left)", flush=True)
        if plan.key == "tier" and args.skip_tier:
            part.judge("GPU test tier", Verdict(Verdict.SKIPPED, "--skip-tier"))
        elif args.only is not None and plan.key != "facts" and plan.key not in args.only:
            part.judge(plan.key, Verdict(Verdict.SKIPPED, f"not asked for (--only {','.join(sorted(args.only))})"))
        elif limit is None:
            why = "left out under --quick" if args.quick and plan.quick_s <= 0 and plan.key != "tier" else \
                f"{left:.0f} s of the run left, it needs {plan.min_s} s"
            part.judge(plan.key, Verdict(Verdict.SKIPPED, why))
        else:
            begun = clock()
            try:
                PARTS[plan.key](part, ctx, report, limit)
            except Exception as exc:  # a broken measurement is reported, not a lost run
                part.judge(plan.key, Verdict(Verdict.FAIL, f"the check itself raised {type(exc).__name__}: {exc} "
                                                           "(a bug in gpu_check.py, not necessarily isoprobe's)"))
                part.lines += ["```text", *traceback.format_exc().strip().splitlines()[-8:], "```"]
            part.seconds = clock() - begun
        print("\n".join([str(v) for _, v in part.verdicts] + part.lines), flush=True)
        report.seconds = clock() - started
        publish(report, args.output, out_dir, ctx.raw_dir)


if __name__ == "__main__":
    sys.exit(main())
