"""What the probe tells people on stderr before its trials: the environment it checks, the target, the data, the
estimate. Notes only: nothing here decides anything (``report.output.Reporter``).
"""

from __future__ import annotations

from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.prediction import no_estimate, predicted_max
from isoprobe.protocol.messages import Facts
from isoprobe.report.output import Reporter
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes


def environment_check_note(spec: Spec) -> str:
    """What the environment check's child process does for this spec."""
    built = (
        "builds model.hf_trainer's Trainer once, without training it"
        if spec.model.hf_trainer is not None
        else "reads the devices; the command itself runs in each trial"
        if spec.command is not None
        else "builds the model on the meta device"
    )
    return f"checking the environment (a child process imports torch and {built})"


def describe_probe(spec: Spec, target: Target, facts: Facts, reporter: Reporter) -> None:
    """Everything said between the environment check and the first trial."""
    describe_target(spec, target, reporter)
    describe_data(target.data, reporter)
    if target.train_samples is not None and (spec.search.cap is None or target.train_samples < spec.search.cap):
        reporter.note(
            f"the Trainer's train_dataset holds {target.train_samples} samples: no batch above that is "
            "tried (the Trainer never draws a larger one)"
        )
    if spec.search.unit == "tokens":
        reporter.note(
            f"unit tokens: the largest token budget every bucket length of {spec.search.bucket_lengths} "
            "fits (floor(budget / L) samples of length L); each trial runs one length"
        )
    else:  # the estimate traces input.shape as written: it does not predict another length's edge
        describe_estimate(facts.estimate, target, reporter)


def describe_data(scan, reporter: Reporter) -> None:
    """With spec.data: what the environment check measured, and which batch every trial trains on."""
    if scan is None:
        return
    measured = f"a seeded sample of {scan.scanned} measured" if scan.sampled else "every length measured"
    reporter.note(
        f"data: {scan.samples} samples ({measured} in {scan.seconds:.1f} s), lengths {scan.length_min:g} "
        f"to {scan.length_max:g}, mean {scan.length_mean:.1f}; every trial trains on its B longest"
    )


def describe_estimate(estimate, target, reporter: Reporter) -> None:
    """Where the search will start, and why: the traced estimate's line, or why there is none."""
    if estimate is None:
        return
    predicted = predicted_max(estimate, target.search_capacity)
    if predicted is None:
        if estimate.note:
            reporter.note(f"{no_estimate(estimate)}; the search starts at search.start_batch_size")
        return
    reporter.note(
        f"estimate (one step traced on fake tensors in {estimate.seconds:.1f} s): "
        f"{format_bytes(estimate.fixed_bytes)} + {format_bytes(int(estimate.per_sample_bytes))} a sample, "
        f"so about {predicted} fit; the trials start near there and prove the edge"
    )


def describe_target(spec: Spec, target, reporter: Reporter) -> None:
    info = target.info
    if info.note:
        reporter.note(info.note)
    if target.backend == "cpu" and spec.training.precision == "fp16-mixed":
        reporter.note(
            "fp16 autocast on the CPU backend: most CPUs emulate float16 math, so steps run several "
            "times slower than fp32 (8x measured on AVX-512 without FP16); the memory is what fp16 needs"
        )
    if spec.distributed.gang:
        world = spec.distributed.world_size or 1
        reporter.note(
            f"distributed: {spec.distributed.strategy}, every trial a gang of {world} rank(s) "
            f"({'nccl, one GPU each' if target.backend == 'cuda' else 'gloo, the budget per rank'}); "
            "batches are per rank"
        )
    baseline = ""
    if info.import_baseline_bytes and spec.command is None:
        baseline = f", of which importing torch takes {format_bytes(info.import_baseline_bytes)}"
    elif info.import_baseline_bytes:  # what the check's process measured is isoprobe's, not the command's
        baseline = (
            f"; isoprobe's own check took {format_bytes(info.import_baseline_bytes)} after importing torch "
            "(the command's processes import what its script imports: their readings show it)"
        )
    reporter.note(f"backend {target.backend} ({info.name}), capacity {format_bytes(info.capacity_bytes)}{baseline}")
