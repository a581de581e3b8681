"""The child's side of ``data:`` in this process (torch, no child process): the checks that make a spec error of
a bad dataset, the rebuilt order of a batch too long to send, and how a collated batch is read."""

from __future__ import annotations

import pytest
import torch

from isoprobe.child.core import data
from isoprobe.spec.data import INDICES_IN_REQUEST
from isoprobe.spec.model import Spec

from conftest import SUPPORT

DATASETS = '''
import torch
from torch.utils.data import IterableDataset

def lengths(count, offset=0):
    return [torch.zeros((index * 37 + offset) % 101 + 1, dtype=torch.long) for index in range(count)]

def raising():
    raise RuntimeError("broken on purpose")

def empty():
    return []

class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(3)

def stream():
    return Stream()

def words(sample):
    return "many"

def pair(samples):
    return torch.stack([s[:1] for s in samples]), torch.zeros(len(samples))
'''


@pytest.fixture
def datasets(tmp_path):
    path = tmp_path / "datasets.py"
    path.write_text(DATASETS)
    return str(path)


def _spec(datasets: str, dataset: str, **data) -> Spec:
    return Spec.model_validate({"model": {"factory": "m.py:f"}, "target": {"task": "language_modeling"},
                                "data": {"dataset": f"{datasets}:{dataset}", **data}})


@pytest.mark.parametrize(("dataset", "field", "says"), [
    ("raising", "data.dataset", "broken on purpose"),
    ("empty", "data.dataset", "empty dataset"),
    ("stream", "data.dataset", "IterableDataset (Stream)"),
])
def test_a_dataset_that_cannot_be_probed_is_its_fields_problem(datasets, dataset, field, says):
    with pytest.raises(data.DataProblem) as raised:
        data.scan(_spec(datasets, dataset), [])
    assert raised.value.field == field and says in str(raised.value)


def test_a_length_that_is_no_number_is_the_length_fields_problem(datasets):
    with pytest.raises(data.DataProblem) as raised:
        data.scan(_spec(datasets, "lengths", kwargs={"count": 5}, length=f"{datasets}:words"), [])
    assert raised.value.field == "data.length" and "'many' (str) for sample 0" in str(raised.value)


def test_the_default_length_is_the_largest_tensors_elements():
    assert data.default_length({"ids": torch.zeros(7), "mask": (torch.zeros(2, 5), torch.zeros(3))}) == 10
    with pytest.raises(TypeError, match="give data.length"):
        data.default_length({"text": "no tensor"})


def test_the_scan_reports_the_longest_first(datasets):
    scanned, collated = data.scan(_spec(datasets, "lengths", kwargs={"count": 300}), [])
    expected = sorted(range(300), key=lambda i: (-((i * 37) % 101 + 1), i))
    assert scanned.head_indices == expected and scanned.head_lengths[0] == 101 and not scanned.sampled
    assert collated.shape == (2, 101)  # default_collate of the two longest, both 101 long


def test_a_batch_longer_than_was_sent_is_rebuilt_and_checked(datasets):
    spec = _spec(datasets, "lengths", kwargs={"count": INDICES_IN_REQUEST + 300})
    dataset = data.build_dataset(spec, [])
    order = data.order(spec, dataset, []).indices
    batch = INDICES_IN_REQUEST + 100
    assert data.batch_indices(spec, dataset, batch, order[:INDICES_IN_REQUEST], []) == order[:batch]
    assert data.batch_indices(spec, dataset, 5, order[:5], []) == order[:5]
    other = data.build_dataset(_spec(datasets, "lengths", kwargs={"count": INDICES_IN_REQUEST + 300, "offset": 1}), [])
    with pytest.raises(ValueError, match="different dataset"):
        data.batch_indices(spec, other, batch, order[:INDICES_IN_REQUEST], [])


def test_a_sampled_scan_orders_the_unmeasured_samples_after(datasets):
    spec = _spec(datasets, "lengths", kwargs={"count": 50}, scan_limit=20)
    found = data.order(spec, data.build_dataset(spec, []), [])
    whole = found.first(50)
    assert (found.scanned, found.samples, len(found.indices), len(whole)) == (20, 50, 20, 50)
    assert sorted(whole) == list(range(50)) and whole[:20] == found.indices
    unmeasured = [i for i in range(50) if i not in found.lengths]
    assert whole[20:] == unmeasured and found.first(23) == whole[:23]


def test_the_collated_batch_is_read_as_model_batch_reads_its_pair(datasets):
    tensor = torch.zeros(2, 3)
    assert data.as_inputs_and_targets(tensor) == (tensor, None)
    keywords = {"input_ids": tensor}
    assert data.as_inputs_and_targets(keywords) == (keywords, None)
    inputs, targets = data.as_inputs_and_targets(data.collate(
        _spec(datasets, "lengths", collate_fn=f"{datasets}:pair"),
        data.build_dataset(_spec(datasets, "lengths", kwargs={"count": 4}), []), [0, 1], []))
    assert inputs.shape == (2, 1) and targets.shape == (2,)
    with pytest.raises(TypeError, match="a tuple of 3"):
        data.as_inputs_and_targets((tensor, tensor, tensor))


# --------------------------------------------------------------------------- issue 34: the user's data code in a trial

HOSTILE = str(SUPPORT / "hostile_data.py")


def _hostile(dataset: str, collate_fn: str | None = None, **data) -> Spec:
    return Spec.model_validate({
        "model": {"factory": "m.py:f"}, "target": {"task": "language_modeling"},
        "data": {"dataset": f"{HOSTILE}:{dataset}",
                 **({"collate_fn": f"{HOSTILE}:{collate_fn}"} if collate_fn else {}), **data}})


def _trial_batch(spec: Spec, batch_size: int, sent: list[int] | None = None):
    """The batch as a trial makes it (``workload.make_batch``: what ``child.core.trial`` calls and classifies)."""
    from isoprobe.child.core import workload

    if sent is None:
        scanned, _ = data.scan(spec, [])
        sent = scanned.head_indices[:batch_size]
    return workload.make_batch(spec, batch_size, torch.device("cpu"), [], None, sent)


def _verdict(exc: BaseException):
    from isoprobe.report.outcomes import classify_exception

    return classify_exception([cls.__name__ for cls in type(exc).__mro__], str(exc))


def test_an_allocation_failure_in_the_collate_fn_is_out_of_memory_not_an_error():
    """Issue 34: a MemoryError in the user's collate_fn at a trial's batch was wrapped in DataProblem, an error
    (exit 4) instead of out of memory. The real job builds the same batch in the same process: the trial must
    raise the user's own MemoryError, which the trial classifies as out of memory."""
    with pytest.raises(MemoryError) as raised:
        _trial_batch(_hostile("fixed", "memory_error_collate", kwargs={"samples": 8}), 4, sent=[0, 1, 2, 3])
    assert _verdict(raised.value).value == "out_of_memory"
    assert any("data.collate_fn" in note for note in getattr(raised.value, "__notes__", []))


def test_an_allocation_failure_while_the_trial_builds_the_dataset_is_out_of_memory_too():
    """The same class, in the dataset factory a trial runs (the real job builds its dataset in its process too)."""
    with pytest.raises(MemoryError) as raised:
        _trial_batch(_hostile("memory_error_dataset"), 4, sent=[0, 1, 2, 3])
    assert _verdict(raised.value).value == "out_of_memory"


def test_a_bug_in_the_collate_fn_is_the_users_error_named_by_its_own_type():
    """Issue 34: the user's KeyError was reported as isoprobe.child.core.data.DataProblem; it stays a KeyError (an
    error, not a memory verdict), its message theirs, with a note naming the field."""
    with pytest.raises(KeyError) as raised:
        _trial_batch(_hostile("fixed", "key_error_collate", kwargs={"samples": 8}), 4, sent=[0, 1, 2, 3])
    assert _verdict(raised.value).value == "error"
    assert type(raised.value) is KeyError
    assert any("data.collate_fn" in note for note in raised.value.__notes__)


def test_a_sample_that_cannot_be_read_is_named_by_the_users_exception_in_the_check():
    """The environment check reported dataset[3]'s KeyError as a RuntimeError: the type is the user's now."""
    with pytest.raises(data.DataProblem) as raised:
        data.scan(_hostile("raising_item"), [])
    assert (raised.value.field, raised.value.type) == ("data.dataset", "KeyError")
    assert "dataset[3]" in str(raised.value) and "record 3" in str(raised.value)


# --------------------------------------------------------------------------- issue 34: samples that change


def test_a_dataset_whose_reads_differ_is_refused_before_any_trial():
    """Issue 34: __getitem__ returning a random length on each read went unnoticed, and the answer (5) was
    above the worst batch the data can produce (4): the scan's longest samples are read again and compared."""
    with pytest.raises(data.DataProblem) as raised:
        data.scan(_hostile("wobbly", "pad_collate"), [])
    assert raised.value.field == "data.dataset" and raised.value.stage == "data.determinism"
    message = str(raised.value)
    assert "dataset[" in message and "another read" in message


def test_a_dataset_that_differs_from_one_build_to_the_next_is_refused_before_any_trial():
    """The same class across builds: an unseeded factory (every trial builds the dataset anew)."""
    with pytest.raises(data.DataProblem) as raised:
        data.scan(_hostile("unseeded", "pad_collate"), [])
    assert raised.value.stage == "data.determinism" and "second build" in str(raised.value)


def test_a_trial_whose_samples_are_not_longest_first_refuses_to_answer():
    """The same class across processes (a dataset that differs only in another process, where the check cannot
    see it): the trial measures the batch it was sent, which must be longest first as the check ordered it.
    Here the check's process is simulated by sending the samples shortest first."""
    spec = _hostile("varied", "pad_collate", kwargs={"samples": 64})
    dataset = data.build_dataset(spec, [])
    shortest_first = sorted(range(64), key=lambda i: (len(dataset[i]), i))
    with pytest.raises(ValueError, match="longest first"):
        _trial_batch(spec, 8, sent=shortest_first[:8])
    longest_first = shortest_first[::-1]
    assert _trial_batch(spec, 8, sent=longest_first[:8]).inputs.shape[0] == 8


# --------------------------------------------------------------------------- issue 34: a dataset of 10**9 samples


def test_a_huge_dataset_is_scanned_in_memory_bounded_by_the_scan_limit():
    """Issue 34: the order listed every unscanned index, O(len(dataset)) even with scan_limit 1000. Measured in
    memory (tracemalloc), not time: a list of 10**7 indices alone is 80 MB; the scan of 100 samples needs KBs."""
    import tracemalloc

    spec = _hostile("huge", kwargs={"samples": 10**7}, scan_limit=100)  # 10**7: today's code fails, not hangs
    dataset = data.build_dataset(spec, [])
    tracemalloc.start()
    try:
        found = data.order(spec, dataset, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (found.samples, found.scanned) == (10**7, 100)
    assert peak < 4 * 2**20, peak


def test_a_batch_beyond_the_scanned_samples_is_found_without_listing_the_dataset():
    """The same class in a trial: a batch larger than the scan takes the unscanned samples in index order,
    generated as far as the batch needs, not listed."""
    import tracemalloc

    spec = _hostile("huge", kwargs={"samples": 10**7}, scan_limit=50)
    dataset = data.build_dataset(spec, [])
    found = data.order(spec, dataset, [])
    tracemalloc.start()
    try:
        batch = data.batch_indices(spec, dataset, 60, found.indices[:50], [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    unscanned = [i for i in range(20) if i not in found.lengths][:10]
    assert batch == found.indices[:50] + unscanned
    assert peak < 4 * 2**20, peak
