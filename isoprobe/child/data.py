"""Batches from the user's dataset (``spec.data``): its lengths, the worst-first order, the collated worst batch.

Child-side only (torch imported lazily). The environment check calls ``scan``
once per probe and reports the longest samples (``protocol.DataScan``); each
trial calls ``worst_batch``, which collates the B longest samples as the
user's DataLoader would (their ``collate_fn``, else torch's
``default_collate``). Which samples those are is ``spec.data``'s pure rule,
so both sides pick the same ones.

Every problem raises ``DataProblem`` naming the spec field it belongs to, so
the environment check can turn it into a spec error (exit 2) before any trial.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Any

from isoprobe.child.references import import_callable
from isoprobe.protocol.messages import DataScan
from isoprobe.spec.data import INDICES_IN_REQUEST, scanned_indices, worst_first
from isoprobe.spec.model import Spec


class DataProblem(Exception):
    """Something in the data section cannot be used; ``field`` is the spec field to fix (data.dataset...)."""

    def __init__(self, field: str, cause: BaseException | str):
        self.field = field
        self.type = type(cause).__name__ if isinstance(cause, BaseException) else "ValueError"
        super().__init__(str(cause))


@dataclass
class Order:
    """The scanned samples, longest first (then the unscanned ones in index order), and the lengths by index."""

    indices: list[int]
    lengths: dict[int, float]
    samples: int
    scanned: int
    seconds: float


def _import(reference: str, python_path: list[str]):
    return import_callable(reference, python_path)


def build_dataset(spec: Spec, python_path: list[str]):
    """The user's map-style dataset, checked to be indexable and not empty; a DataProblem otherwise."""
    import torch

    try:
        dataset = _import(spec.data.dataset, python_path)(**spec.data.kwargs)
    except Exception as exc:  # the factory is the user's code: whatever it raises is their field's problem
        raise DataProblem("data.dataset", exc) from exc
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise DataProblem("data.dataset", TypeError(
            f"returned an IterableDataset ({type(dataset).__name__}), whose samples cannot be taken by index: "
            "materialise its longest samples into a map-style dataset (a list of samples is one), or make the "
            "batches with model.batch instead of data"))
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise DataProblem("data.dataset", TypeError(
            f"returned a {type(dataset).__name__}, not a map-style dataset (len(dataset) and dataset[i])"))
    try:
        size = len(dataset)
    except Exception as exc:
        raise DataProblem("data.dataset", exc) from exc
    if size == 0:
        raise DataProblem("data.dataset", ValueError("returned an empty dataset (len 0): there is no batch to try"))
    return dataset


def default_length(sample: Any) -> int:
    """The number of elements of the sample's largest tensor (in a tuple, list or dict, nested)."""
    import torch

    sizes = []

    def visit(value):
        if isinstance(value, torch.Tensor):
            sizes.append(value.numel())
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(sample)
    if not sizes:
        raise TypeError(f"a {type(sample).__name__} sample holds no tensor, so it has no default length: give "
                        "data.length, a function from a sample to its length")
    return max(sizes)


def _length_function(spec: Spec, python_path: list[str]):
    if spec.data.length is None:
        return default_length
    try:
        return _import(spec.data.length, python_path)
    except Exception as exc:
        raise DataProblem("data.length", exc) from exc


def _checked_length(value: Any, index: int) -> float:
    """A length must be a finite number >= 0: anything else is the length function's mistake, named."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise TypeError(f"returned {value!r} ({type(value).__name__}) for sample {index}: a length must be a "
                        "finite number >= 0")
    return float(value)


def order(spec: Spec, dataset, python_path: list[str]) -> Order:
    """Every scanned sample's length, and the worst-first order over them (``spec.data``'s rule)."""
    measure = _length_function(spec, python_path)
    started = time.perf_counter()
    samples = len(dataset)
    indices = scanned_indices(samples, spec.data.scan_limit)
    lengths = []
    for index in indices:
        try:
            sample = dataset[index]
        except Exception as exc:
            raise DataProblem("data.dataset", RuntimeError(f"dataset[{index}] raised {type(exc).__name__}: {exc}"))
        try:
            lengths.append(_checked_length(measure(sample), index))
        except Exception as exc:
            raise DataProblem("data.length", exc) from exc
    ordered = worst_first(indices, lengths)
    if len(indices) < samples:  # sampled: the samples not measured come after, in index order
        measured = set(indices)
        ordered += [index for index in range(samples) if index not in measured]
    return Order(ordered, dict(zip(indices, lengths)), samples, len(indices), time.perf_counter() - started)


def scan(spec: Spec, python_path: list[str]) -> tuple[DataScan, Any]:
    """The environment check's pass: the dataset, its lengths, and one collated batch of its two longest samples
    (so that a collate_fn that cannot collate them is a spec error too); returns the scan and the collated batch."""
    dataset = build_dataset(spec, python_path)
    found = order(spec, dataset, python_path)
    head = found.indices[:min(INDICES_IN_REQUEST, found.scanned)]
    lengths = list(found.lengths.values())
    collated = collate(spec, dataset, head[:2], python_path)
    return DataScan(samples=found.samples, scanned=found.scanned, sampled=found.scanned < found.samples,
                    head_indices=head, head_lengths=[found.lengths[i] for i in head], length_min=min(lengths),
                    length_mean=sum(lengths) / len(lengths), length_max=max(lengths),
                    seconds=round(found.seconds, 3)), collated


def collate(spec: Spec, dataset, indices: list[int], python_path: list[str]):
    """The samples at ``indices``, collated as the user's DataLoader collates them."""
    import torch

    try:
        function = _import(spec.data.collate_fn, python_path) if spec.data.collate_fn else None
    except Exception as exc:
        raise DataProblem("data.collate_fn", exc) from exc
    samples = [dataset[index] for index in indices]
    if function is None:
        return torch.utils.data.default_collate(samples)
    try:
        return function(samples)
    except Exception as exc:
        raise DataProblem("data.collate_fn", exc) from exc


def batch_indices(spec: Spec, dataset, batch_size: int, sent: list[int] | None, python_path: list[str]) -> list[int]:
    """The trial's batch: the indices the parent sent, or, for a batch longer than it sends, the order rebuilt.

    The rebuilt order must begin with what the parent sent: a dataset whose lengths differ from one build to
    the next has no worst batch to probe, and a trial on another batch would answer another question.
    """
    sent = sent or []
    if len(sent) >= batch_size:
        return sent[:batch_size]
    rebuilt = order(spec, dataset, python_path).indices
    if rebuilt[:len(sent)] != sent:
        raise RuntimeError("data.dataset built a different dataset in this trial than in the environment check (its "
                           "longest samples differ): the factory must build the same dataset each time (seed it)")
    if batch_size > len(rebuilt):
        raise ValueError(f"batch {batch_size} is larger than the dataset ({len(rebuilt)} samples)")
    return rebuilt[:batch_size]


def as_inputs_and_targets(collated) -> tuple[Any, Any]:
    """The collated batch as (inputs, targets), the way model.batch returns it: a tensor or a dict is all inputs
    (targets None); a pair is (inputs, targets)."""
    import torch

    if isinstance(collated, (torch.Tensor, dict)):
        return collated, None
    if isinstance(collated, (tuple, list)) and len(collated) == 2:
        return collated[0], collated[1]
    raise TypeError(f"the collated batch is a {type(collated).__name__}"
                    f"{f' of {len(collated)}' if isinstance(collated, (tuple, list)) else ''}: data.collate_fn must "
                    "return a tensor, a pair (inputs, targets) or a dict of the model's keyword arguments")
