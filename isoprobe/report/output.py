"""What people and programs read: progress lines on stderr, the result on stdout.

Every view renders from the ``Result`` model (or, while a probe runs, from the
``Trial`` models it is made of), so the JSON and the text never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from isoprobe.report.outcomes import Outcome
from isoprobe.report.result import Result
from isoprobe.report.trial import Trial
from isoprobe.spec.units import format_bytes


class Reporter:
    """Progress for people, one line per event, on stderr (the CLI passes ``sys.stderr`` writes).

    It keeps the trials it was told of (``trials``): the evidence a ``ProbeError`` raised out of the probe carries
    into the command's document (``api.answer_for``). A probe that starts over (its sources changed) numbers its
    trials from 1 again, and the list starts again with it.
    """

    def __init__(self, write: Callable[[str], None]):
        self._write = write
        self.trials: list[Trial] = []

    def note(self, text: str) -> None:
        self._write(f"isoprobe: {text}")

    def trial(self, trial: Trial) -> None:
        if trial.index == 1:
            self.trials = []
        self.trials.append(trial)
        self._write(trial_line(trial))


_PURPOSE_LABELS = {
    "search": "",
    "retry": "  [retry after a crash or timeout]",
    "confirmation": "  [confirmation of the maximum: {steps} steps, peak {first} -> {last}]",
    "long_run": "  [long run below a maximum that did not hold: {steps} steps, peak {first} -> {last}]",
    "recommendation_check": "  [recommendation check]",
    "soak": "  [soak of the recommendation: {steps} steps, peak {first} -> {last}]",
    "memory_check": "  [memory check: re-run with more memory]",
    "batch_check": "  [batch check: does the command train at the batch it is given?]",
}


#: A search trial that stepped until steady because a fit would make it the maximum (``search.decides``).
_DECIDING = "  [decides the maximum: {steps} steps, peak {first} -> {last}]"


def trial_line(trial: Trial) -> str:
    """``isoprobe: trial  3  batch     16  fits  peak 2.31 GiB  12.4 s``: the peak is the reading the budget counts
    (``budget_peak_bytes``: CPU, the data segment the cap holds; CUDA, the card's use, context included), the one
    the margin is read from. The resident or reserved peak is in the table (``isoprobe show``)."""
    shown = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
    peak = format_bytes(shown) if trial.outcome is Outcome.FITS else "-"
    detail = ""
    if trial.outcome is not Outcome.FITS:
        reason = trial.signal or (trial.error.type if trial.error else None) or trial.phase
        if trial.failed_rank is not None:  # a gang: whose failure it was, and how fast the rest were stopped
            node = trial.ranks[trial.failed_rank].node if trial.ranks and trial.failed_rank < len(trial.ranks) else None
            who = f"rank {trial.failed_rank}" + (f" on {node}" if node else "")
            reason = f"{who}: {reason}" if reason else who
        detail = f" ({reason})" if reason else ""
    peaks = trial.step_budget_peak_bytes or trial.step_peak_bytes
    label = _PURPOSE_LABELS[trial.purpose]
    if trial.purpose in ("search", "retry") and trial.steady_rule is not None and trial.outcome is Outcome.FITS:
        label += _DECIDING  # the batch right below the smallest failure: its fit is the maximum's proof
    purpose = label.format(
        steps=len(trial.step_seconds),
        first=format_bytes(peaks[0] if peaks else None),
        last=format_bytes(peaks[-1] if peaks else None),
    )
    if trial.training_batch_size is not None:
        purpose = f"  [evaluation, after training steps at batch {trial.training_batch_size}]" + purpose
    length = f" x {trial.length}" if trial.length is not None else ""  # search.unit tokens: samples x bucket length
    return (
        f"isoprobe: trial {trial.index:>2}  batch {trial.batch_size:>6}{length}  "
        f"{trial.outcome.value + detail:<30}  peak {peak:>10}  {trial.seconds:6.1f} s{purpose}"
    )


def summary_lines(result: Result) -> list[str]:
    """The closing lines on stderr: the answer in words, and what to try if there is none."""
    lines = [f"isoprobe: {result.message}"]
    if result.recommendation is not None and result.recommended_batch_size is not None:
        measured = result.recommendation.measured_peak_bytes
        of = format_bytes(result.device.capacity_bytes if result.device else None)
        lines.append(
            f"isoprobe: recommended {result.recommended_batch_size}: {result.recommendation.note}"
            + (f"; measured peak {format_bytes(measured)} of {of}" if measured is not None else f"; capacity {of}")
        )
    elif result.recommendation is not None and result.recommendation.soaks:
        lines.append(f"isoprobe: no recommendation: {result.recommendation.note}")
    lines += [f"isoprobe:   try: {s}" for s in result.suggestions]
    probed = f"{len(result.trials)} trials in {result.total_seconds:.1f} s"
    if result.cache is not None and result.cache.hit:
        lines.append(f"isoprobe: answer from the cache, no trial ran now (probed {result.cache.stored_at}: {probed})")
    else:
        lines.append(f"isoprobe: {probed}")
    return lines


def result_json(result: Result) -> str:
    return result.model_dump_json(indent=2)


# --------------------------------------------------------------------------- the table view


def _margin_line(margin) -> str:
    """The spread rule as applied (``Result.edge_margin``): the maximum's free memory, and any marginal batch."""
    line = (
        f"spread: {format_bytes(margin.spread_bytes)} (floor {format_bytes(margin.floor_bytes)}"
        + (f", seen in this probe {format_bytes(margin.observed_bytes)}" if margin.observed_bytes is not None else "")
        + f"); the maximum's steady peak left {format_bytes(margin.max_free_bytes)} free"
    )
    for m in margin.marginal:
        line += f"; marginal {m.batch_size}: fit {m.fitted} of {m.runs} long runs, {format_bytes(m.free_bytes)} free"
    return line


def _data_line(data) -> str:
    """The data section's dataset and the samples the maximum trained on (``Result.data``)."""
    scanned = f"lengths of a seeded sample of {data.scanned}" if data.sampled else "every sample's length"
    line = (
        f"data: {data.samples} samples ({scanned}: {data.length_min:g} to {data.length_max:g}, mean "
        f"{data.length_mean:.1f})"
    )
    worst = data.worst_batch
    if worst is not None:
        shortest = f"{worst.shortest_length:g}" if worst.shortest_length is not None else "?"
        line += (
            f"; the maximum's batch is the {worst.batch_size} longest, lengths {shortest} to "
            f"{worst.longest_length:g}, from index {worst.first_indices[0]}"
        )
    return line


def _token_lines(tokens) -> list[str]:
    """search.unit tokens: the budget, then each bucket length's edge (``Result.tokens``)."""
    lines = [
        f"tokens: max {tokens.max_tokens}, recommended {tokens.recommended_tokens}, binding length "
        f"{tokens.binding_length} ({tokens.trials} trials)"
    ]
    for edge in tokens.lengths:
        fits = "-" if edge.max_fitting_samples is None else edge.max_fitting_samples
        if edge.first_failing_samples is None:
            lines.append(f"  length {edge.length:>6}: at least {fits} samples fit (not binding; {edge.trials} trials)")
        else:
            lines.append(
                f"  length {edge.length:>6}: {fits} fit, {edge.first_failing_samples} out of memory: at most "
                f"{edge.budget_limit} tokens ({edge.trials} trials)"
            )
    return lines


def render_table(result: Result) -> str:
    """The whole result for people: the answer, every trial, throughput, the memory breakdown, the plan.

    Rendered from the same ``Result`` the JSON is, field by field; nothing here
    is computed that the JSON does not hold.
    """
    lines = _heading_lines(result)
    lines.append("")
    lines += _trial_table(result.trials)
    lines += _after_trials_lines(result)
    lines += ["", f"{len(result.trials)} trials in {result.total_seconds:.1f} s"]
    return "\n".join(lines)


def _heading_lines(result: Result) -> list[str]:
    """What the probe answered and what it stood on (device, distribution, margin, data, tokens, cache, job): read
    first, before the trials that prove it."""
    lines: list[str] = []
    device = result.device
    where = f"{device.backend} {device.name}, capacity {format_bytes(device.capacity_bytes)}" if device else "no device"
    workload = result.spec.workload if result.spec is not None else f"{result.spec_path} (not a valid spec)"
    lines.append(f"isoprobe {result.isoprobe_version}: {workload} on {where}")
    lines.append(f"answer: {result.message}")
    if result.distributed is not None:
        info = result.distributed
        lines.append(
            f"distributed: {info.strategy}, {info.world_size} ranks ({info.world_size_source}, "
            f"{info.backend}): every batch here is a per-rank micro-batch"
        )
    if result.edge_margin is not None:
        lines.append(_margin_line(result.edge_margin))
    if result.data is not None:
        lines.append(_data_line(result.data))
    if result.tokens is not None:
        lines += _token_lines(result.tokens)
    if result.cache is not None:
        lines.append(
            f"cache: {'hit, no trial ran now' if result.cache.hit else 'stored'} "
            f"({result.cache.path}, probed {result.cache.stored_at})"
        )
    job = result.environment
    if job is not None and (job.slurm_job_id or job.cuda_visible_devices is not None):
        lines.append(
            f"job: {job.hostname}"
            + (f", Slurm job {job.slurm_job_id} on {job.slurm_node}" if job.slurm_job_id else "")
            + (
                f", GPUs {job.cuda_visible_devices!r} ({job.visible_devices_source})"
                if job.cuda_visible_devices is not None
                else ""
            )
        )
    return lines


def _trial_table(trials: Sequence[Trial]) -> list[str]:
    """Every trial, one row each, in the order they ran: the evidence the answer stands on."""
    lines: list[str] = []
    header = (
        f"{'#':>3}  {'batch':>6}  {'outcome':<16} {'peak':>10}  {'budget peak':>11}  {'samples/s':>10}  "
        f"{'seconds':>8}  purpose"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for trial in trials:
        lines.append(
            f"{trial.index:>3}  {trial.batch_size:>6}  {trial.outcome.value:<16} "
            f"{format_bytes(trial.peak_bytes) if trial.peak_bytes else '-':>10}  "
            f"{format_bytes(trial.budget_peak_bytes) if trial.budget_peak_bytes else '-':>11}  "
            f"{f'{trial.samples_per_second:.2f}' if trial.samples_per_second else '-':>10}  "
            f"{trial.seconds:>8.1f}  {trial.purpose}"
            + (f" (evaluation after training at {trial.training_batch_size})" if trial.training_batch_size else "")
        )
    return lines


def _after_trials_lines(result: Result) -> list[str]:
    """What the result derives from the trials (the recommendation, the job's settings, the evaluation,
    throughput, the memory breakdown, accumulation, allocators), each section after a blank line, in that order."""
    lines: list[str] = []
    if result.recommended_batch_size is not None and result.recommendation is not None:
        lines += ["", f"recommended: {result.recommended_batch_size} ({result.recommendation.note})"]
    if result.job_environment:
        settings = " ".join(f"{name}={value}" for name, value in sorted(result.job_environment.items()))
        lines += [
            "",
            f"holds with: {settings} (every trial ran with it: run the job with it too; --format env exports it)",
        ]
    if result.eval_stop_reason is not None:
        lines += [
            "",
            f"evaluation: max {result.eval_max_batch_size}, first failing "
            f"{result.eval_first_failing_batch_size} ({result.eval_stop_reason.value}; after training steps "
            f"at batch {result.eval_training_batch_size})",
        ]
    if result.throughput is not None:
        t = result.throughput
        lines += [
            "",
            f"throughput: fastest {t.fastest_batch_size} (best {t.best_samples_per_second:.2f} samples/s; {t.note})",
        ]
    if result.memory_breakdown is not None:
        lines += [
            "",
            "memory breakdown"
            + (
                f" (sizes from batch {result.memory_breakdown.from_batch_size})"
                if result.memory_breakdown.from_batch_size
                else ""
            )
            + ":",
        ]
        lines += [f"  {name:<28} {value}" for name, value in breakdown_rows(result)]
    if result.accumulation is not None:
        lines += ["", f"accumulation: {result.accumulation.note}"]
    if result.allocator_comparison is not None:
        comparison = result.allocator_comparison
        lines += ["", f"allocators: {comparison.note}"]
        for outcome in comparison.outcomes:
            best = "  <- best" if outcome.setting == comparison.best else ""
            lines.append(
                f"  {outcome.setting:<32} max {outcome.max_batch_size}  first failing "
                f"{outcome.first_failing_batch_size}  ({outcome.trials} trials){best}"
            )
    return lines


def breakdown_rows(result: Result) -> list[tuple[str, str]]:
    """The memory breakdown as (label, value) rows, in the order people learn the categories."""
    b = result.memory_breakdown
    if b is None:
        return []
    rows = [
        ("parameters", format_bytes(b.parameter_bytes) if b.parameter_bytes is not None else "-"),
        ("gradients", format_bytes(b.gradient_bytes) if b.gradient_bytes is not None else "-"),
        ("optimizer state", format_bytes(b.optimizer_state_bytes) if b.optimizer_state_bytes is not None else "-"),
        (
            "activations per sample",
            f"{format_bytes(int(b.activation_bytes_per_sample))} (slope of the peak)"
            if b.activation_bytes_per_sample is not None
            else "-",
        ),
        (
            "fixed part",
            f"{format_bytes(int(b.fixed_bytes))} (the line at batch 0)" if b.fixed_bytes is not None else "-",
        ),
    ]
    if b.cuda_context_bytes is not None:
        rows.append(("CUDA context and libraries", format_bytes(b.cuda_context_bytes)))
    if b.reserved_unallocated_bytes is not None:
        rows.append(("reserved, not allocated", format_bytes(b.reserved_unallocated_bytes)))
    return rows
