"""The parent's side of ``spec.data``: which indices a trial is sent, the search's cap, what the result says.

Pure: everything comes from the environment check's ``DataScan`` (``child.core.data``).
"""

from __future__ import annotations

from isoprobe.protocol.messages import DataScan
from isoprobe.report.edge import DataInfo, WorstBatch
from isoprobe.spec.data import INDICES_IN_REQUEST, SAMPLE_SEED

#: The result lists this many of the worst batch's indices: enough to find the samples, short enough to read.
SHOWN_INDICES = 16


def request_indices(scan: DataScan | None, batch_size: int) -> list[int] | None:
    """The indices a trial of ``batch_size`` is sent: its whole batch, or the first INDICES_IN_REQUEST of it
    (the trial rebuilds the rest: sending 200 000 indices to every trial would cost more than rebuilding them)."""
    if scan is None:
        return None
    return scan.head_indices[: min(batch_size, INDICES_IN_REQUEST)]


def data_cap(cap: int | None, scan: DataScan | None, train_samples: int | None = None) -> int | None:
    """The search's cap with a dataset (spec.data's scan, or the length of an hf_trainer's train set): no batch
    larger than the dataset is tried (it could not be drawn)."""
    for samples in (scan.samples if scan is not None else None, train_samples):
        if samples is not None:
            cap = samples if cap is None else min(cap, samples)
    return cap


def data_info(scan: DataScan | None, max_fitting: int | None) -> DataInfo | None:
    """The result's ``data``: the lengths, and the samples and lengths of the maximum's batch."""
    if scan is None:
        return None
    worst = None
    if max_fitting is not None:
        known = max_fitting <= len(scan.head_lengths)
        worst = WorstBatch(
            batch_size=max_fitting,
            longest_length=scan.head_lengths[0],
            shortest_length=scan.head_lengths[max_fitting - 1] if known else None,
            first_indices=scan.head_indices[: min(max_fitting, SHOWN_INDICES)],
        )
    return DataInfo(
        samples=scan.samples,
        scanned=scan.scanned,
        sampled=scan.sampled,
        sample_seed=SAMPLE_SEED if scan.sampled else None,
        length_min=scan.length_min,
        length_mean=scan.length_mean,
        length_max=scan.length_max,
        scan_seconds=scan.seconds,
        worst_batch=worst,
    )
