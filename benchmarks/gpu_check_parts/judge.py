"""What benchmarks/gpu_check.py computes and judges, as pure functions (tests/unit/test_cuda_gpu_check.py runs
them on recorded and fake readings, so the first run on a GPU needs no edits).

Nothing here starts a process or imports torch or isoprobe: the inputs are isoprobe's result JSON (read with
``.get``, since fields are added over time), the plain loop's JSON lines and exit statuses, ``nvidia-smi -L``'s
text and pytest's output; the outputs are verdicts and the lines of docs/gpu.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MiB = 1024**2
GiB = 1024**3

#: The plain loop's exit statuses (benchmarks/gpu_check_parts/plain_loop.py).
PLAIN_FITS, PLAIN_OUT_OF_MEMORY = 0, 3

#: What the classic articles' in-process doubling recipe reached (other cards, one process, double until
#: out of memory): printed beside isoprobe's answer, never judged. isoprobe's own ResNet50 slope (about
#: 83 MiB a sample on the CPU backend) puts the true edge near 80 under 8 GiB and 115 under 11 GiB.
RECIPE = {
    ("resnet50", 8): "[8, 16): the recipe doubles 8 -> 16 and stops at 8",
    ("resnet50", 11): "[16, 32): the recipe doubles 16 -> 32 and stops at 16",
    ("mobilenet_v3_large", 16): "515 (the article's fp16-mixed figure)",
}


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """One judgement: ``status`` is one of STATUSES; only FAIL fails the check."""

    status: str
    reason: str

    PASS = "pass"
    ONE_SHORT = "one short"
    FAIL = "FAIL"
    NOT_JUDGED = "not judged"
    SKIPPED = "skipped"

    @property
    def failed(self) -> bool:
        return self.status == Verdict.FAIL

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


STATUSES = (Verdict.PASS, Verdict.ONE_SHORT, Verdict.FAIL, Verdict.NOT_JUDGED, Verdict.SKIPPED)


def _count(runs: list, value) -> int:
    return sum(1 for run in runs if run is value)


def judge_edge(isoprobe_max: int | None, isoprobe_first_failing: int | None,
               plain_runs: dict[int, list[bool | None]], runs_needed: int = 2) -> Verdict:
    """isoprobe's maximum M against the plain loop's runs (batch -> [True: trained every step, False: out of
    memory, None: no memory verdict (an error, a timeout)]).

    M must train in every plain run (else FAIL). M+1 should run out: if it does in any run, the edge is exact.
    If M+1 trained in every run: where isoprobe called M+1 out of memory (``isoprobe_first_failing == M+1``) and
    ``runs_needed`` runs all trained, that is a FAIL; otherwise (fewer runs, or isoprobe held M+1 back as
    marginal, inside the spread) isoprobe was one short, which is acceptable and said.
    """
    if isoprobe_max is None:
        return Verdict(Verdict.FAIL, "isoprobe gave no maximum to check")
    m = isoprobe_max
    at = plain_runs.get(m, [])
    if _count(at, False):
        return Verdict(Verdict.FAIL, f"isoprobe's maximum {m} ran out of memory in the plain loop "
                                     f"({_count(at, False)} of {len(at)} runs)")
    if not _count(at, True):
        return Verdict(Verdict.NOT_JUDGED, f"no plain run at the maximum {m} finished with a memory verdict "
                                           f"({len(at)} tried)")
    above = plain_runs.get(m + 1, [])
    fits, ooms = _count(above, True), _count(above, False)
    called = ("isoprobe called it out of memory" if isoprobe_first_failing == m + 1 else
              f"isoprobe held it back as marginal (first failing {isoprobe_first_failing})"
              if isoprobe_first_failing is not None else "isoprobe reported no failing batch")
    if ooms and fits:
        return Verdict(Verdict.PASS, f"{m} trained ({_count(at, True)} of {len(at)}); {m + 1} is marginal in the "
                                     f"plain loop too (trained {fits}, ran out {ooms}); {called}")
    if ooms:
        return Verdict(Verdict.PASS, f"exact: {m} trained ({_count(at, True)} of {len(at)} runs), {m + 1} ran out "
                                     f"of memory ({ooms} of {len(above)})")
    if not fits:
        return Verdict(Verdict.NOT_JUDGED, f"{m} trained in the plain loop, but no run at {m + 1} finished with a "
                                           f"memory verdict ({len(above)} tried)")
    if isoprobe_first_failing == m + 1 and fits >= runs_needed:
        return Verdict(Verdict.FAIL, f"{called}, but the plain loop trained {m + 1} in {fits} of {len(above)} runs "
                                     f"under the same budget")
    if isoprobe_first_failing == m + 1:
        return Verdict(Verdict.ONE_SHORT, f"{m + 1} trained in the plain loop's only finished run ({fits} of "
                                          f"{len(above)}); {called}: one short, unconfirmed")
    return Verdict(Verdict.ONE_SHORT, f"{m + 1} trained in the plain loop ({fits} of {len(above)} runs); {called}: "
                                      "one short")


def next_plain_batch(isoprobe_max: int | None, isoprobe_first_failing: int | None,
                     plain_runs: dict[int, list[bool | None]], runs_needed: int = 2) -> int | None:
    """The batch the plain loop should run next to judge the edge (``judge_edge``), or None when it is judged.

    The maximum once; the batch above it once; that batch again (up to ``runs_needed`` runs) only while every
    run of it trained and isoprobe called it out of memory, the one case a second run decides."""
    if isoprobe_max is None:
        return None
    m = isoprobe_max
    at = plain_runs.get(m, [])
    if not at:
        return m
    if _count(at, False) or not _count(at, True):
        return None
    above = plain_runs.get(m + 1, [])
    if not above:
        return m + 1
    if _count(above, False):
        return None
    if isoprobe_first_failing == m + 1 and _count(above, True) < runs_needed and len(above) < runs_needed:
        return m + 1
    return None


def plain_outcome(returncode: int | None, stdout: str) -> tuple[bool | None, dict]:
    """The plain loop's verdict from its exit status (None: killed at its limit) and its last JSON line."""
    line: dict = {}
    for text in reversed((stdout or "").strip().splitlines()):
        if text.startswith("{"):
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            break
    if returncode == PLAIN_FITS and line.get("outcome") == "fits":
        return True, line
    if returncode == PLAIN_OUT_OF_MEMORY:
        return False, line
    return None, line


# --------------------------------------------------------------------------- reading isoprobe's result


def _get(mapping, *path, default=None):
    for key in path:
        if not isinstance(mapping, dict):
            return default
        mapping = mapping.get(key)
    return default if mapping is None else mapping


def deciding_trial(result: dict | None) -> dict | None:
    """The trial that decided the maximum: the last fitting training trial at max_batch_size that ran the steady
    rule, else the last fitting one there; None without a maximum."""
    m = _get(result, "max_batch_size")
    if m is None:
        return None
    fitting = [t for t in result.get("trials") or [] if t.get("batch_size") == m and t.get("outcome") == "fits"
               and t.get("training_batch_size") is None]
    steady = [t for t in fitting if t.get("steady_rule")]
    return (steady or fitting or [None])[-1]


def retries_of(trial: dict | None):
    """The allocator's free-and-retry count a trial read (``alloc_retries``; ``num_alloc_retries`` in other
    versions), or None where the result has neither."""
    if not trial:
        return None
    for key in ("alloc_retries", "num_alloc_retries"):
        if trial.get(key) is not None:
            return trial[key]
    return None


def mib(value) -> str:
    return "-" if value is None else f"{value / MiB:.1f} MiB"


def margin_lines(result: dict | None) -> list[str]:
    """The margin's readings for the deciding trial (issue 45 items 1, 4, 7): its peaks, the allocator's retries,
    the memory outside the allocator, and its free memory against the spread from ``edge_margin``."""
    trial = deciding_trial(result)
    if trial is None:
        return [f"- no deciding trial: no maximum (stop reason {_get(result, 'stop_reason', default='-')})"]
    capacity = _get(result, "edge_margin", "capacity_bytes") or _get(result, "device", "capacity_bytes")
    budget = _get(result, "device", "memory_budget_bytes")
    total = _get(result, "device", "total_memory_bytes")
    sizes = trial.get("sizes") or {}
    outside = sizes.get("cuda_context_bytes")
    reserved, allocated, budget_peak = trial.get("peak_bytes"), trial.get("peak_allocated_bytes"), \
        trial.get("budget_peak_bytes")
    retries = retries_of(trial)
    steps = len(trial.get("step_seconds") or [])
    lines = [f"- deciding trial: #{trial.get('index')}, batch {trial.get('batch_size')}, purpose "
             f"{trial.get('purpose')}, {steps} steps{' (steady rule)' if trial.get('steady_rule') else ''}",
             f"- capacity {mib(capacity)} (budget {mib(budget)} of a card reporting {mib(total)})",
             f"- reserved peak (max_memory_reserved, peak_bytes): {mib(reserved)}",
             f"- allocated peak (max_memory_allocated, peak_allocated_bytes): {mib(allocated)}",
             f"- peak in the budget's units (budget_peak_bytes): "
             f"{mib(budget_peak) if budget_peak is not None else 'not in this result'}",
             f"- memory outside the allocator (sizes.cuda_context_bytes): {mib(outside)}",
             f"- reserved but not allocated at the peak (sizes.reserved_unallocated_bytes): "
             f"{mib(sizes.get('reserved_unallocated_bytes'))}"]
    if retries is None:
        lines.append("- allocator retries: not in this result (no alloc_retries / num_alloc_retries field)")
    else:
        lines.append(f"- allocator retries (num_alloc_retries): {retries}"
                     + (": the allocator freed its cache and retried at the cap, so the reserved peak measures the "
                        "cap, not the batch" if retries else ": none, the reserved peak is the batch's own"))
    margin = _get(result, "edge_margin")
    if margin:
        free, spread = margin.get("max_free_bytes"), margin.get("spread_bytes")
        clears = ("-" if free is None or spread is None else
                  f"clears it by {mib(free - spread)}" if free > spread else f"does NOT clear it ({mib(free - spread)})")
        lines.append(f"- free at the steady peak (edge_margin.max_free_bytes) {mib(free)} vs the spread "
                     f"{mib(spread)} (floor {mib(margin.get('floor_bytes'))}, observed "
                     f"{mib(margin.get('observed_bytes'))}): {clears}")
        for batch in margin.get("marginal") or []:
            lines.append(f"- marginal: batch {batch.get('batch_size')} fit {batch.get('fitted')} of "
                         f"{batch.get('runs')} runs with {mib(batch.get('free_bytes'))} free (inside the spread)")
    else:
        lines.append("- edge_margin: none in this result (the spread rule did not apply)")
    if capacity is not None:
        ways = []
        if budget_peak is not None:
            ways.append(f"capacity - budget_peak_bytes = {mib(capacity - budget_peak)}")
        if reserved is not None:
            ways.append(f"capacity - reserved peak = {mib(capacity - reserved)}")
            if outside is not None:
                ways.append(f"capacity - reserved peak - outside = {mib(capacity - reserved - outside)}")
        if ways:
            lines.append("- free memory reckoned each way: " + "; ".join(ways))
    return lines


def _latest_trial(result: dict | None, batch: int) -> dict | None:
    found = [t for t in (result or {}).get("trials") or [] if t.get("batch_size") == batch
             and t.get("training_batch_size") is None]
    return found[-1] if found else None


def readings_table(result: dict | None, plain_lines: dict[int, list[dict]], batches: list[int]) -> list[str]:
    """isoprobe's trial and the plain loop's runs side by side at each batch (MiB): the same workload, read the
    same ways. The plain loop's outside column is at its end, with its growth after the warm-up."""
    rows = ["| batch | run | outcome | reserved peak | allocated peak | peak in budget units | outside the "
            "allocator | retries |", "|---|---|---|---|---|---|---|---|"]

    def n(value):
        return "-" if value is None else f"{value / MiB:.1f}"

    for batch in batches:
        trial = _latest_trial(result, batch)
        if trial is not None:
            rows.append(f"| {batch} | isoprobe trial #{trial.get('index')} | {trial.get('outcome')} | "
                        f"{n(trial.get('peak_bytes'))} | {n(trial.get('peak_allocated_bytes'))} | "
                        f"{n(trial.get('budget_peak_bytes'))} | {n((trial.get('sizes') or {}).get('cuda_context_bytes'))}"
                        f" | {retries_of(trial) if retries_of(trial) is not None else '-'} |")
        for number, line in enumerate(plain_lines.get(batch, []), 1):
            growth = line.get("outside_growth_bytes")
            outside = n(line.get("outside_end_bytes")) + (f" (+{n(growth)})" if growth else "")
            rows.append(f"| {batch} | plain run {number} | {line.get('outcome', 'no verdict')} | "
                        f"{n(line.get('reserved_peak_bytes'))} | {n(line.get('allocated_peak_bytes'))} | "
                        f"{n(line.get('budget_peak_bytes'))} | {outside} | {line.get('num_alloc_retries', '-')} |")
    return rows


def trial_lines(result: dict | None) -> list[str]:
    """One line per isoprobe trial: what the search ran."""
    lines = []
    for t in (result or {}).get("trials") or []:
        error = _get(t, "error", "type")
        lines.append(f"- trial {t.get('index')}: batch {t.get('batch_size')} {t.get('purpose')} {t.get('outcome')}"
                     f"{f' ({error})' if error else ''}, {len(t.get('step_seconds') or [])} steps, reserved peak "
                     f"{mib(t.get('peak_bytes'))}, budget units {mib(t.get('budget_peak_bytes'))}, "
                     f"{t.get('seconds', 0):.1f} s")
    return lines


# --------------------------------------------------------------------------- the machine and the tier


def visible_gpu_count(smi_list: str, cuda_visible: str | None) -> int:
    """GPUs this process may use: ``nvidia-smi -L``'s GPU lines, narrowed by CUDA_VISIBLE_DEVICES when set."""
    gpus = sum(1 for line in (smi_list or "").splitlines() if line.startswith("GPU "))
    if cuda_visible is None:
        return gpus
    entries = [entry.strip() for entry in cuda_visible.split(",") if entry.strip()]
    if not gpus:
        return 0
    if all(entry.isdigit() for entry in entries):
        return len([entry for entry in entries if int(entry) < gpus])
    return len(entries)


_TEST_LINE = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


def tier_summary(stdout: str, returncode: int | None, seconds: float, limit_s: float) -> tuple[Verdict, list[str]]:
    """The GPU test tier from ``pytest -v``'s output; ``returncode`` None: stopped at its limit."""
    results: dict[str, str] = {}
    for line in (stdout or "").splitlines():
        found = _TEST_LINE.match(line.strip())
        if found:
            results[found.group(1)] = found.group(2)
    counts: dict[str, int] = {}
    for outcome in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    tally = ", ".join(f"{count} {outcome.lower()}" for outcome, count in sorted(counts.items())) or "no test finished"
    bad = [name for name, outcome in results.items() if outcome in ("FAILED", "ERROR")]
    if bad:
        verdict = Verdict(Verdict.FAIL, f"{len(bad)} failed ({tally})")
    elif returncode is None:
        verdict = Verdict(Verdict.NOT_JUDGED, f"stopped at its {limit_s:.0f} s limit: {tally} by then; the rest not "
                                              "reached")
    elif returncode == 0:
        verdict = Verdict(Verdict.PASS, tally)
    elif returncode == 5:
        verdict = Verdict(Verdict.NOT_JUDGED, "pytest collected no test")
    else:
        verdict = Verdict(Verdict.FAIL, f"pytest exited {returncode} ({tally})")
    lines = [f"- `pytest tests/gpu -m gpu` in {seconds:.0f} s (limit {limit_s:.0f} s): {verdict}"]
    lines += [f"- {outcome}: `{name}`" for name, outcome in results.items() if outcome in ("FAILED", "ERROR")]
    durations = [line.strip() for line in (stdout or "").splitlines() if re.match(r"^\d+\.\d+s (call|setup)", line)]
    if durations:
        lines += ["", "```text", *durations[:15], "```"]
    return verdict, lines


# --------------------------------------------------------------------------- time


@dataclass(frozen=True)
class PartPlan:
    """A part of the check and the seconds it may take: ``full_s`` normally, ``quick_s`` under --quick (0: left
    out). ``min_s``: started only with at least this much of the run's time left (optional parts ask their whole
    budget)."""

    key: str
    title: str
    full_s: int
    quick_s: int
    min_s: int


#: The run's whole time: one device call of at most 10 minutes, so 9 minutes with the start and the copy back.
DEADLINE_S = {False: 540, True: 360}
#: Seconds kept back at the end for writing the report.
RESERVE_S = 10
#: The plain loop's runs: steps, and seconds each may take (a fresh process: imports, CUDA, the model, steps).
PLAIN_STEPS = {False: 20, True: 10}
PLAIN_LIMIT_S = {False: 45, True: 35}

PLAN = (
    PartPlan("facts", "Device and versions", 45, 45, 5),
    PartPlan("tier", "GPU test tier", 120, 60, 30),
    PartPlan("resnet50_8gib", "(a) ResNet50 fp32 Adam 224² under 8 GiB: isoprobe against the plain loop", 200, 140,
             80),
    PartPlan("margin", "(d) The margin's readings: the deciding trial of (a)", 0, 0, 0),
    PartPlan("command_8gib", "(b) A command trial under 8 GiB: `isoprobe run -- python plain_loop.py` against the "
                             "plain loop", 140, 100, 70),
    PartPlan("ddp", "(c) A 2-rank DDP gang under 8 GiB a rank", 150, 120, 100),
    PartPlan("resnet50_11gib", "(a') ResNet50 fp32 Adam 224² under 11 GiB", 170, 0, 170),
    PartPlan("mobilenet_16gib", "MobileNetV3-large fp16-mixed Adam 224² under 16 GiB", 150, 0, 150),
)


def part_limit(plan: PartPlan, quick: bool, left_s: float) -> float | None:
    """Seconds a part may take with ``left_s`` of the run left, or None to skip it (left out under --quick, or
    too little time left). Never past the run's end less RESERVE_S."""
    budget = plan.quick_s if quick else plan.full_s
    if plan.key == "margin":
        return 0.0
    usable = left_s - RESERVE_S
    if budget <= 0 or usable < min(plan.min_s, budget):
        return None
    return float(min(budget, usable))


# --------------------------------------------------------------------------- the report


@dataclass
class Part:
    key: str
    title: str
    limit_s: float | None = None
    seconds: float | None = None
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def judge(self, name: str, verdict: Verdict) -> Verdict:
        self.verdicts.append((name, verdict))
        return verdict


@dataclass
class Report:
    facts: list[str] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    quick: bool = False
    seconds: float | None = None
    finished: bool = False

    @property
    def failed(self) -> list[str]:
        return [name for part in self.parts for name, verdict in part.verdicts if verdict.failed]


ABOUT = """\
`python benchmarks/gpu_check.py [--quick] [--output docs/gpu.md]` checks isoprobe's CUDA answers on a real
card against an independent truth, in one device call of at most 10 minutes (the whole run is held to
9 minutes on an H100; `--quick` to 6). Each part has its own time limit and is skipped, with the
reason, when too little time is left. Exit 0: nothing failed; 1: a check failed (named below); 5: no CUDA
GPU here (nothing measured, nothing written).

**The truth is a plain loop, not the articles' figures.** `benchmarks/gpu_check_parts/plain_loop.py`
imports nothing of isoprobe. In a fresh process on the same card it takes the budget as a user's job
would get it, "the process may use this many bytes on the card, context included": it initialises
CUDA, runs a small matmul and convolution forward and backward, reads the memory it holds outside
torch's allocator and sets `per_process_memory_fraction = (budget - outside) / total`. Then it trains
torchvision's model (`weights=None`) for 20 steps (`--quick`: 10) at one batch: `zero_grad`,
`outputs = model(x)`, `cross_entropy`, `backward`, `optimizer.step()`. Exit 0: it fits; 3: out of memory.

**The judgement.** isoprobe's maximum M (`isoprobe run --no-cache --format json`) must train in the plain
loop: M running out of memory is a FAIL. M+1 should run out. If M+1 trains, isoprobe was **one short**,
which is accepted and printed; but where isoprobe called M+1 out of memory (`first_failing_batch_size`)
and the plain loop trains it in 2 runs of 2, that is a FAIL. The classic articles' ResNet50 figures ([8, 16)
under 8 GiB, [16, 32) under 11 GiB; MobileNetV3 515) are what an in-process doubling recipe reached, not
the edge (isoprobe's ResNet50 slope of about 83 MiB a sample puts it near 80 and 115): they are printed
beside, never judged.

**The parts**, in order:

1. the GPU test tier, `pytest tests/gpu -m gpu`, stopped at its limit (120 s; `--quick` 60 s);
2. (a) ResNet50 fp32 Adam 224² under 8 GiB: isoprobe's own trials against the plain loop (200 s; 140 s);
3. (d) the margin's readings of (a)'s deciding trial: reserved and allocated peaks, the allocator's
   retries, the memory outside the allocator (`sizes.cuda_context_bytes`), the peak in the budget's units,
   and the free memory against the spread (`edge_margin`), with isoprobe's and the plain loop's readings
   side by side at M and M+1;
4. (b) a command trial under 8 GiB, `isoprobe run -- python plain_loop.py --batch-size {batch_size}`
   (the shim applies the budget; the script sets none), judged against the same plain loop (140 s; 100 s);
5. (c) a 2-rank DDP gang under 8 GiB a rank, judged against the plain loop as a gang of two: only with two
   visible GPUs, since isoprobe puts rank r on GPU r (one GPU per rank); with one, skipped and said so
   (150 s; 120 s);
6. with time left (not under `--quick`): (a') ResNet50 under 11 GiB, and MobileNetV3-large fp16-mixed under
   16 GiB, each judged the same way."""

NOT_YET_RUN = """\
## Not yet run on a GPU

No GPU has been lent to this work yet: every figure isoprobe has was measured on the CPU backend, and
nothing on this page is a CUDA measurement. The first session with a GPU runs
`python benchmarks/gpu_check.py` first; it replaces this section with the device, the versions, each
part's time and verdict, and the readings. The parts that compute and judge (`judge_edge`,
`next_plain_batch`, `margin_lines`, `readings_table`, `tier_summary`, `part_limit`, `render`) are tested
on fake readings in `tests/unit/test_cuda_gpu_check.py`, and the plain loop's argument parsing and loop
on the CPU, so that run needs no edits."""


def render(report: Report | None) -> str:
    """docs/gpu.md: what the check does, then the run's figures (None: the page before any GPU run)."""
    parts = ["# isoprobe on a GPU", "", ABOUT, ""]
    if report is None:
        return "\n".join(parts + [NOT_YET_RUN]) + "\n"
    verdict = ("every check passed or was one short" if not report.failed else f"FAILED: {', '.join(report.failed)}")
    took = f"{report.seconds:.0f} s" if report.seconds is not None else "-"
    unfinished = "" if report.finished else " (stopped before its end: the parts after the last one below did not run)"
    parts += ["## The run", "", "Written by `python benchmarks/gpu_check.py" + (" --quick" if report.quick else "")
              + "`; every figure below was measured by that run.", "", *report.facts,
              f"- whole run: {took}{unfinished}", f"- verdict: {verdict}", "",
              "| part | limit | took | verdicts |", "|---|---|---|---|"]
    for part in report.parts:
        verdicts = "; ".join(f"{name}: {v.status}" for name, v in part.verdicts) or "-"
        limit = "-" if part.limit_s is None else f"{part.limit_s:.0f} s"
        seconds = "-" if part.seconds is None else f"{part.seconds:.0f} s"
        parts.append(f"| {part.title} | {limit} | {seconds} | {verdicts} |")
    for part in report.parts:
        parts += ["", f"## {part.title}", ""]
        parts += [f"- **{name}**: {verdict}" for name, verdict in part.verdicts]
        if part.verdicts and part.lines:
            parts.append("")
        parts += part.lines
    return "\n".join(parts) + "\n"
