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
               plain_runs: dict[int, list[bool | None]]) -> Verdict:
    """isoprobe's maximum M against the yardstick's runs (batch -> [True: trained every step, False: out of memory,
    None: no memory verdict (an error, a timeout)]); the yardstick is the plain loop on a card that has only the
    budget free (the ballast, issue 57), or the whole card where there is no budget.

    M must train in every run (one run out of memory: FAIL, isoprobe's answer would crash the job). M+1, or M+2 at
    the most, must run out: M+1 out of memory is exact (PASS); M+1 trains and M+2 runs out is one short (accepted,
    said); M+2 trains too is a FAIL (isoprobe more than two short: wasted card). A run without a memory verdict
    decides nothing (NOT_JUDGED)."""
    if isoprobe_max is None:
        return Verdict(Verdict.FAIL, "isoprobe gave no maximum to check")
    m = isoprobe_max
    at = plain_runs.get(m, [])
    if _count(at, False):
        return Verdict(Verdict.FAIL, f"isoprobe's maximum {m} ran out of memory in the yardstick "
                                     f"({_count(at, False)} of {len(at)} runs)")
    if not _count(at, True):
        return Verdict(Verdict.NOT_JUDGED, f"no yardstick run at the maximum {m} finished with a memory verdict "
                                           f"({len(at)} tried)")
    called = ("isoprobe called it out of memory" if isoprobe_first_failing == m + 1 else
              f"isoprobe's first failing batch {isoprobe_first_failing}" if isoprobe_first_failing is not None
              else "isoprobe reported no failing batch")
    above = plain_runs.get(m + 1, [])
    fits, ooms = _count(above, True), _count(above, False)
    if ooms:
        marginal = f" (marginal: it also trained {fits} time(s))" if fits else ""
        return Verdict(Verdict.PASS, f"exact: {m} trained ({_count(at, True)} of {len(at)} runs), {m + 1} ran out "
                                     f"of memory{marginal}; {called}")
    if not fits:
        return Verdict(Verdict.NOT_JUDGED, f"{m} trained, but no run at {m + 1} finished with a memory verdict "
                                           f"({len(above)} tried)")
    two = plain_runs.get(m + 2, [])
    if _count(two, False):
        return Verdict(Verdict.ONE_SHORT, f"{m} and {m + 1} trained, {m + 2} ran out of memory; {called}: one short")
    if _count(two, True):
        return Verdict(Verdict.FAIL, f"isoprobe is more than two short: {m + 1} and {m + 2} trained in the "
                                     f"yardstick; {called}")
    return Verdict(Verdict.NOT_JUDGED, f"{m} and {m + 1} trained, but no run at {m + 2} finished with a memory "
                                       f"verdict ({len(two)} tried)")


def next_plain_batch(isoprobe_max: int | None, isoprobe_first_failing: int | None,
                     plain_runs: dict[int, list[bool | None]]) -> int | None:
    """The batch the yardstick should run next to judge the edge (``judge_edge``), or None when it is judged:
    the maximum, then the batch above it, then (only when that trained) the one above that; each once."""
    if isoprobe_max is None:
        return None
    m = isoprobe_max
    for batch in (m, m + 1, m + 2):
        runs = plain_runs.get(batch, [])
        if not runs:
            return batch
        if _count(runs, False) or not _count(runs, True):
            return None
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


def readings_table(result: dict | None, plain_runs: list[tuple[str, int, dict]], batches: list[int]) -> list[str]:
    """isoprobe's trial and the plain loop's runs (``(label, batch, line)``: the yardstick's, then any second reading)
    side by side at each batch (MiB): the same workload, read the same ways. The plain loop's outside column is at its
    end, with its growth after the warm-up."""
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
        for label, at, line in plain_runs:
            if at != batch:
                continue
            growth = line.get("outside_growth_bytes")
            outside = n(line.get("outside_end_bytes")) + (f" (+{n(growth)})" if growth else "")
            rows.append(f"| {batch} | {label} | {line.get('outcome', 'no verdict')} | "
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


#: The run's whole time: the device call is at most 10 minutes, its command ``bash .gpu/setup.sh && timeout 560 python3
#: benchmarks/gpu_check.py``; the set-up takes about half a minute, so the check holds itself to 510 s (``timeout``
#: stops it at 560 all the same, and the page and the archive are written after every part).
DEADLINE_S = {False: 510, True: 360}
#: Seconds kept back at the end for writing the report.
RESERVE_S = 10
#: The plain loop's runs: steps, and seconds each may take (a fresh process: imports, CUDA, the model, steps).
PLAIN_STEPS = {False: 12, True: 8}
PLAIN_LIMIT_S = {False: 45, True: 35}
#: Seconds of a part kept for its yardstick after isoprobe's run (the ballast and three plain runs take about 45 s on
#: an H200; a slower yardstick leaves the part not judged, said so, rather than isoprobe cut short).
YARDSTICK_S = 45
#: Seconds the ballast may take to hold the card (a fresh process: torch, CUDA, a few large allocations).
BALLAST_READY_S = 60

#: The parts, in the order that teaches most first (issue 57): the budget against a card that really has that much
#: free, the same under expandable segments, a command trial, the default path (no budget, the whole card), a gang
#: (two GPUs only), then the GPU test tier with what time is left (``full_s`` 0: whatever remains).
PLAN = (
    PartPlan("facts", "Device and versions", 30, 30, 5),
    PartPlan("resnet50_8gib", "(a) ResNet50 fp32 Adam 224² under 8 GiB: isoprobe against the ballast loop", 150,
             120, 80),
    PartPlan("expandable_8gib", "(e) The same under `allocator: expandable_segments:True`", 115, 100, 70),
    PartPlan("command_8gib", "(b) A command trial under 8 GiB: `isoprobe run -- python plain_loop.py` against the "
                             "ballast loop", 115, 100, 70),
    PartPlan("whole_card", "(f) The default path: no budget, the whole card (ResNet50 fp32 Adam 448²)", 110, 0, 80),
    PartPlan("ddp", "(c) A 2-rank DDP gang under 8 GiB a rank", 120, 0, 100),
    PartPlan("tier", "GPU test tier", 0, 0, 30),
)


def part_limit(plan: PartPlan, quick: bool, left_s: float) -> float | None:
    """Seconds a part may take with ``left_s`` of the run left, or None to skip it (left out under --quick, or
    too little time left). Never past the run's end less RESERVE_S. The tier (``full_s`` 0) takes what is left."""
    usable = left_s - RESERVE_S
    if plan.key == "tier":
        return float(usable) if usable >= plan.min_s else None
    budget = plan.quick_s if quick else plan.full_s
    if budget <= 0 or usable < min(plan.min_s, budget):
        return None
    return float(min(budget, usable))
