"""docs/gpu.md: what the GPU check does, then what its run measured (``render``), written after every part.

Pure: no process, no torch, no isoprobe; tests/unit/test_cuda_gpu_check.py renders fake reports, and the committed
page is ``render(None)`` until a GPU run replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_check_parts.judge import Verdict


@dataclass
class Part:
    """One part of the run: its limit, the seconds it took, its verdicts and the lines of its section."""

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
    """The whole run: the device's facts, the parts so far, whether it reached its end."""

    facts: list[str] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    quick: bool = False
    seconds: float | None = None
    finished: bool = False

    @property
    def failed(self) -> list[str]:
        return [name for part in self.parts for name, verdict in part.verdicts if verdict.failed]


#: The exact device call (docs/gpu.md and benchmarks/README.md say it too).
CALL = ("bash ../shared/gpu/stage.sh   # here, once: the wheels the GPU machine lacks, into .gpu/ (ignored)\n"
        "# the device call, carrying .gpu:\n"
        "bash .gpu/setup.sh && PYTHONUNBUFFERED=1 timeout 560 python3 benchmarks/gpu_check.py")

ABOUT = f"""\
`benchmarks/gpu_check.py` checks isoprobe's CUDA answers on a real card against a yardstick that shares nothing
with isoprobe, in one device call of at most 10 minutes. The GPU machine reaches no package registry, so the
packages its image lacks travel with the call as wheels:

```bash
{CALL}
```

The check holds itself to 510 s (`--quick`: 360); each part has its own limit and is skipped, with the reason,
when too little time is left. The page (`$OUT/gpu.md`) and every raw result (`$OUT/gpu_check.tar.gz`) are
written after every part, so a call stopped at its limit still returns what it measured. Exit 0: nothing
failed; 1: a check failed (named below); 5: no CUDA GPU here (nothing measured, nothing written).

**The yardstick is a card that really has only the budget free.** isoprobe emulates a budget with an
allocator fraction (the memory outside the allocator taken off first), so the yardstick must not use that
recipe. `gpu_check_parts/ballast.py` takes (free - budget) of the card with plain allocations and holds it;
`gpu_check_parts/plain_loop.py`, which imports nothing of isoprobe, then trains in a fresh process with no
fraction set, on a card whose free memory is the budget: its context, libraries, cache and fragmentation all
come out of it, as on a card that small. It trains torchvision's model (`weights=None`) for 12 steps
(`--quick`: 8): `zero_grad`, `outputs = model(x)`, `cross_entropy`, `backward`, `optimizer.step()`. Exit 0: it
fits; 3: out of memory. The fraction-capped loop (the same recipe as isoprobe's) is kept only as a second
reading, labelled so, never judged. Without a budget the yardstick is the plain loop on the whole card.

**The judgement.** isoprobe's maximum M (`isoprobe run --no-cache --format json`) must train in the
yardstick: M running out of memory is a FAIL. M+1 should run out (exact); M+1 training and M+2 running out
is **one short**, accepted and said; M+2 training too is a FAIL. The classic articles' in-process figures
(ResNet50 [8, 16) under 8 GiB) are printed beside, never judged.

**The parts**, in order: the device's facts; (a) ResNet50 fp32 Adam 224² under 8 GiB, isoprobe's own trials;
(e) the same with `allocator: expandable_segments:True` (the yardstick's loop under the same setting); (b) a
command trial under 8 GiB, `isoprobe run -- python plain_loop.py --batch-size {{batch_size}}` (the shim applies
the budget; the script sets none); (f) the default path, no budget, the whole card, ResNet50 at 448²; (c) a
2-rank DDP gang, only with two visible GPUs (isoprobe puts rank r on GPU r); then the GPU test tier
(`pytest tests/gpu -m gpu`) with the time left. Each judged part prints the margin's readings of isoprobe's
deciding trial (peaks, retries, outside the allocator, the free memory against the spread) and isoprobe's
and the plain loop's readings side by side at M, M+1 and M+2."""

NOT_YET_RUN = """\
## Not yet run on a GPU

No GPU has been lent to this work yet: every figure isoprobe has was measured on the CPU backend, and
nothing on this page is a CUDA measurement. The first session with a GPU makes the call above first; it
replaces this section with the device, the versions, each part's time and verdict, and the readings. The
orchestration runs end to end on a fake card (`tests/unit/test_gpu_check_runs.py`: set-up, deadline, page,
archive, exit codes), the judging on recorded readings (`tests/unit/test_cuda_gpu_check.py`), the ballast's
arithmetic and the plain loop on the CPU, and `bash ../shared/gpu/rehearse.sh` installs the wheels into an
image-like venv, so that run needs no edits."""


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
