"""The child's side of ``data:`` in this process (torch, no child process): the checks that make a spec error of
a bad dataset, the rebuilt order of a batch too long to send, and how a collated batch is read."""

from __future__ import annotations

import pytest
import torch

from isoprobe.child import data
from isoprobe.spec.data import INDICES_IN_REQUEST
from isoprobe.spec.model import Spec

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
    with pytest.raises(RuntimeError, match="different dataset"):
        data.batch_indices(spec, other, batch, order[:INDICES_IN_REQUEST], [])


def test_a_sampled_scan_orders_the_unmeasured_samples_after(datasets):
    spec = _spec(datasets, "lengths", kwargs={"count": 50}, scan_limit=20)
    found = data.order(spec, data.build_dataset(spec, []), [])
    assert (found.scanned, found.samples, len(found.indices)) == (20, 50, 50)
    assert sorted(found.indices) == list(range(50))
    unmeasured = [i for i in range(50) if i not in found.lengths]
    assert found.indices[20:] == unmeasured


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
