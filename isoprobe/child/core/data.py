"""Batches from the user's dataset (``spec.data``): its lengths, the worst-first order, the collated worst batch.

Child-side only (torch imported lazily). The environment check calls ``scan``
once per probe and reports the longest samples (``protocol.DataScan``); each
trial calls ``trial_batch``, which collates the B longest samples as the
user's DataLoader would (their ``collate_fn``, else torch's
``default_collate``). Which samples those are is ``spec.data``'s pure rule,
so both sides pick the same ones.

In the environment check every problem raises ``DataProblem`` naming the spec
field it belongs to, so that it becomes a spec error (exit 2) before any
trial. In a trial the user's own exception is raised instead, unwrapped: a
MemoryError (or torch's out-of-memory error) while the user's code builds the
batch is out of memory at that batch, since the real job builds the same batch
in the same process, and any other exception is the user's error under its own
name (``child.core.trial`` classifies both).

The worst batch is only the worst if a sample is the same each time it is
read: the check reads the longest samples again, in the same dataset and in a
second build of it, and a trial checks that the samples it was sent are still
longest first where it runs (``DETERMINISM``).
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from isoprobe.child.core.references import import_callable
from isoprobe.protocol.messages import DataScan
from isoprobe.spec.data import INDICES_IN_REQUEST, SAMPLE_SEED, DataSpec, scanned_indices, worst_first
from isoprobe.spec.model import Spec

#: Besides the head of the order (the samples trials train on), the check reads this many other scanned
#: samples again (a seeded sample): a sample whose length changes could be longer than any the scan saw.
RECHECKED_OTHERS = 256

#: What a dataset whose samples change from read to read is told (the environment check's and a trial's error).
DETERMINISM = (
    "isoprobe trains every trial on the dataset's longest samples, found by reading each once, so "
    "dataset[i] must return the same sample every time, in every build and process: seed any random "
    "crop, augmentation or sampling from the index (random.Random(i)), or, for the probe, return each "
    "sample at the longest length it can take"
)


class DataProblem(Exception):
    """Something in the data section cannot be used; ``field`` is the spec field to fix (data.dataset...).

    ``cause``: the exception the user's code raised (or the check's own), kept so that a trial raises it as
    it was; ``stage``: the environment check's stage (the field, or data.determinism)."""

    def __init__(self, field: str, cause: BaseException | str, where: str = "", stage: str | None = None):
        self.field = field
        self.stage = stage or field
        self.cause = cause if isinstance(cause, BaseException) else ValueError(cause)
        self.type = type(self.cause).__name__
        self.where = where
        super().__init__(f"{cause}{f' ({where})' if where else ''}")

    def user_exception(self, doing: str) -> BaseException:
        """The user's exception as they raised it, with a note saying where isoprobe called their code."""
        where = f", {self.where}" if self.where else ""
        note = f"isoprobe: raised in {self.field}{where}, while {doing}"
        if hasattr(self.cause, "add_note"):
            self.cause.add_note(note)  # Python 3.11+: the traceback shows it
        else:
            notes = [*getattr(self.cause, "__notes__", []), note]
            self.cause.__notes__ = notes  # type: ignore[attr-defined]  # Python 3.10: __notes__ is 3.11's (PEP 678)
        return self.cause


@dataclass
class Order:
    """The scanned samples, longest first, and their lengths by index (O(scanned), whatever len(dataset) is)."""

    indices: list[int]
    lengths: dict[int, float]
    samples: int
    scanned: int
    seconds: float

    def first(self, count: int) -> list[int]:
        """The first ``count`` of the whole order: the scanned samples longest first, then (for a sampled scan)
        the unscanned ones in index order, generated as far as ``count`` needs, never listed."""
        head = self.indices[:count]
        if len(head) == count or self.scanned == self.samples:
            return head
        unscanned = (index for index in range(self.samples) if index not in self.lengths)
        return head + list(itertools.islice(unscanned, count - len(head)))


def _data(spec: Spec) -> DataSpec:
    """``spec.data``: nothing here runs for a spec without a data section (its trials take no samples)."""
    if spec.data is None:
        raise ValueError("the spec has no data section")
    return spec.data


def _import(reference: str, python_path: list[str]):
    return import_callable(reference, python_path)


def build_dataset(spec: Spec, python_path: list[str]):
    """The user's map-style dataset, checked to be indexable and not empty; a DataProblem otherwise."""
    import torch

    try:
        data = _data(spec)
        dataset = _import(data.dataset, python_path)(**data.kwargs)
    except Exception as exc:  # the factory is the user's code: whatever it raises is their field's problem
        raise DataProblem("data.dataset", exc) from exc
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise DataProblem(
            "data.dataset",
            TypeError(
                f"returned an IterableDataset ({type(dataset).__name__}), whose samples cannot be taken by index: "
                "materialise its longest samples into a map-style dataset (a list of samples is one), or make the "
                "batches with model.batch instead of data"
            ),
        )
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise DataProblem(
            "data.dataset",
            TypeError(f"returned a {type(dataset).__name__}, not a map-style dataset (len(dataset) and dataset[i])"),
        )
    try:
        size = len(dataset)
    except Exception as exc:
        raise DataProblem("data.dataset", exc, "len(dataset)") from exc
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
        raise TypeError(
            f"a {type(sample).__name__} sample holds no tensor, so it has no default length: give "
            "data.length, a function from a sample to its length"
        )
    return max(sizes)


def _length_function(spec: Spec, python_path: list[str]):
    length = _data(spec).length
    if length is None:
        return default_length
    try:
        return _import(length, python_path)
    except Exception as exc:
        raise DataProblem("data.length", exc) from exc


def _checked_length(value: Any, index: int) -> float:
    """A length must be a finite number >= 0: anything else is the length function's mistake, named."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise TypeError(
            f"returned {value!r} ({type(value).__name__}) for sample {index}: a length must be a finite number >= 0"
        )
    return float(value)


def _read(dataset, index: int):
    """``dataset[index]``; what it raises is the data.dataset field's problem, the user's exception kept."""
    try:
        return dataset[index]
    except Exception as exc:
        raise DataProblem("data.dataset", exc, f"reading dataset[{index}]") from exc


def _length(measure, sample, index: int) -> float:
    try:
        return _checked_length(measure(sample), index)
    except DataProblem:
        raise
    except Exception as exc:
        raise DataProblem("data.length", exc, f"measuring dataset[{index}]") from exc


def order(spec: Spec, dataset, python_path: list[str]) -> Order:
    """Every scanned sample's length, and the worst-first order over them (``spec.data``'s rule).

    Time and memory are O(scan_limit) whatever len(dataset) is: the unscanned samples are never listed
    (``Order.first`` generates them when a batch needs more than were scanned)."""
    measure = _length_function(spec, python_path)
    started = time.perf_counter()
    samples = len(dataset)
    indices = scanned_indices(samples, _data(spec).scan_limit)
    lengths = [_length(measure, _read(dataset, index), index) for index in indices]
    return Order(
        worst_first(indices, lengths),
        dict(zip(indices, lengths, strict=True)),
        samples,
        len(indices),
        time.perf_counter() - started,
    )


def _rechecked(found: Order) -> list[int]:
    """The scanned samples read again: the head of the order (what trials train on) and a seeded sample of the rest."""
    head = found.indices[:INDICES_IN_REQUEST]
    rest = found.indices[len(head) :]
    others = random.Random(SAMPLE_SEED).sample(rest, min(RECHECKED_OTHERS, len(rest)))
    return head + sorted(others)


def check_deterministic(spec: Spec, dataset, found: Order, python_path: list[str], build: str) -> None:
    """Read the samples ``_rechecked`` picks again from ``dataset`` and compare their lengths with the scan's;
    a DataProblem (stage data.determinism) at the first that differs. ``build``: which build was read again."""
    measure = _length_function(spec, python_path)
    if len(dataset) != found.samples:
        raise DataProblem(
            "data.dataset",
            ValueError(f"len(dataset) is {len(dataset)} in {build} where the scan's was {found.samples}"),
            stage="data.determinism",
        )
    for index in _rechecked(found):
        length = _length(measure, _read(dataset, index), index)
        if length != found.lengths[index]:
            raise DataProblem(
                "data.dataset",
                ValueError(
                    f"dataset[{index}] was {found.lengths[index]:g} long in the scan and {length:g} in another read "
                    f"({build}): the longest batch the scan found is not the longest the data can produce"
                ),
                stage="data.determinism",
            )


def scan(
    spec: Spec, python_path: list[str], report: Callable[..., None] = lambda stage, samples=None, scanning=None: None
) -> tuple[DataScan, Any]:
    """The environment check's pass: the dataset, its lengths, the longest samples read again (in this build and
    in a second one), and one collated batch of its two longest samples (so that a collate_fn that cannot
    collate them is a spec error too); returns the scan and the collated batch.

    ``report(stage, samples, scanning)`` is told where the pass is ('building', 'scanning', 'done'), so that a
    check stopped by its timeout can say it was here (``protocol.DataScanning``)."""
    report("building")
    dataset = build_dataset(spec, python_path)
    samples = len(dataset)
    report("scanning", samples, min(samples, _data(spec).scan_limit))
    found = order(spec, dataset, python_path)
    check_deterministic(spec, dataset, found, python_path, "the same build")
    head = found.indices[: min(INDICES_IN_REQUEST, found.scanned)]
    lengths = list(found.lengths.values())
    collated = collate_samples(spec, [_read(dataset, index) for index in head[:2]], python_path)
    del dataset  # before the second build: a dataset held in memory is not held twice
    report("building")
    again = build_dataset(spec, python_path)
    report("scanning", samples, min(samples, _data(spec).scan_limit))
    check_deterministic(spec, again, found, python_path, "a second build of data.dataset")
    report("done", samples, found.scanned)
    return DataScan(
        samples=found.samples,
        scanned=found.scanned,
        sampled=found.scanned < found.samples,
        head_indices=head,
        head_lengths=[found.lengths[i] for i in head],
        length_min=min(lengths),
        length_mean=sum(lengths) / len(lengths),
        length_max=max(lengths),
        seconds=round(found.seconds, 3),
    ), collated


def collate_samples(spec: Spec, samples: list, python_path: list[str]):
    """``samples``, collated as the user's DataLoader collates them."""
    import torch

    try:
        collate_fn = _data(spec).collate_fn
        function = _import(collate_fn, python_path) if collate_fn else None
    except Exception as exc:
        raise DataProblem("data.collate_fn", exc) from exc
    try:
        return function(samples) if function is not None else torch.utils.data.default_collate(samples)
    except Exception as exc:
        raise DataProblem("data.collate_fn", exc, f"collating {len(samples)} samples") from exc


def collate(spec: Spec, dataset, indices: list[int], python_path: list[str]):
    """The samples at ``indices``, collated as the user's DataLoader collates them."""
    return collate_samples(spec, [_read(dataset, index) for index in indices], python_path)


def batch_indices(spec: Spec, dataset, batch_size: int, sent: list[int] | None, python_path: list[str]) -> list[int]:
    """The trial's batch: the indices the parent sent, or, for a batch longer than it sends, the order rebuilt.

    The rebuilt order must begin with what the parent sent: a dataset whose lengths differ from one build to
    the next has no worst batch to probe, and a trial on another batch would answer another question.
    """
    sent = sent or []
    if len(sent) >= batch_size:
        return sent[:batch_size]
    rebuilt = order(spec, dataset, python_path)
    if rebuilt.indices[: len(sent)] != sent:
        raise ValueError(
            f"data.dataset built a different dataset in this trial than in the environment check (its "
            f"longest samples differ): {DETERMINISM}"
        )
    if batch_size > rebuilt.samples:
        raise ValueError(f"batch {batch_size} is larger than the dataset ({rebuilt.samples} samples)")
    return rebuilt.first(batch_size)


def _check_longest_first(spec: Spec, samples: list, indices: list[int], sent: int, python_path: list[str]) -> None:
    """The first ``sent`` samples were sent longest first (the check's order): they must be so here too."""
    measure = _length_function(spec, python_path)
    previous = None
    for index, sample in zip(indices[:sent], samples, strict=False):  # samples: every index's, checked: the sent
        length = _length(measure, sample, index)
        if previous is not None and length > previous[1]:
            raise ValueError(
                f"data.dataset: the samples this trial was sent are not longest first where it runs: dataset["
                f"{index}] is {length:g} long here, after dataset[{previous[0]}] of {previous[1]:g}, though the "
                f"environment check (another process) measured them the other way round. The dataset differs "
                f"from one process to the next (unseeded randomness, or an order that depends on hash()). "
                f"{DETERMINISM}"
            )
        previous = index, length


def trial_batch(spec: Spec, batch_size: int, sent: list[int] | None, python_path: list[str]) -> tuple[Any, Any]:
    """A trial's dataset and its batch: the B longest samples, collated by the user's collate_fn.

    Raises what the user's code raised, as it raised it (with a note naming the field): a MemoryError in the
    collate_fn at this batch is this batch running out of memory, a KeyError is the user's KeyError.
    """
    try:
        dataset = build_dataset(spec, python_path)
        indices = batch_indices(spec, dataset, batch_size, sent, python_path)
        samples = [_read(dataset, index) for index in indices]
        _check_longest_first(spec, samples, indices, len(sent or []), python_path)
        return dataset, collate_samples(spec, samples, python_path)
    except DataProblem as problem:
        failure = problem
    # Raised here, outside the except block, so that the user's exception does not get DataProblem as its context.
    raise failure.user_exception(f"building the trial's batch of {batch_size} (its longest samples)")


def as_inputs_and_targets(collated) -> tuple[Any, Any]:
    """The collated batch as (inputs, targets), the way model.batch returns it: a tensor or a dict is all inputs
    (targets None); a pair is (inputs, targets)."""
    import torch

    if isinstance(collated, (torch.Tensor, dict)):
        return collated, None
    if isinstance(collated, (tuple, list)) and len(collated) == 2:
        return collated[0], collated[1]
    raise TypeError(
        f"the collated batch is a {type(collated).__name__}"
        f"{f' of {len(collated)}' if isinstance(collated, (tuple, list)) else ''}: data.collate_fn must "
        "return a tensor, a pair (inputs, targets) or a dict of the model's keyword arguments"
    )
