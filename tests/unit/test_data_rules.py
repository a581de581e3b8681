"""The pure rules of ``data:``: which samples are measured, which form the worst batch, what a trial is sent,
how far the search may go, and what the result says. No process, no torch."""

from __future__ import annotations

import pytest

from isoprobe.pipeline.data import SHOWN_INDICES, data_cap, data_info, request_indices
from isoprobe.protocol.messages import DataScan
from isoprobe.spec.data import INDICES_IN_REQUEST, SAMPLE_SEED, scanned_indices, worst_first


def test_worst_first_orders_longest_first_and_ties_by_index():
    indices = [0, 1, 2, 3, 4, 5]
    lengths = [5, 9, 5, 12, 9, 1]
    assert worst_first(indices, lengths) == [3, 1, 4, 0, 2, 5]


def test_worst_first_ties_by_index_whatever_order_they_come_in():
    assert worst_first([7, 3, 5], [4, 4, 4]) == [3, 5, 7]


def test_worst_first_refuses_lengths_that_do_not_match():
    with pytest.raises(ValueError, match="3 indices but 2 lengths"):
        worst_first([0, 1, 2], [1, 2])


def test_every_sample_is_scanned_up_to_the_limit():
    assert scanned_indices(10, 10) == list(range(10))
    assert scanned_indices(3, 200_000) == [0, 1, 2]


def test_a_larger_dataset_is_a_seeded_sample_of_the_limit():
    first = scanned_indices(1_000_000, 500)
    assert len(first) == len(set(first)) == 500
    assert first == sorted(first) and 0 <= first[0] and first[-1] < 1_000_000
    assert scanned_indices(1_000_000, 500) == first  # the same samples every time: parent and trial agree
    assert scanned_indices(1_000_000, 500, seed=SAMPLE_SEED + 1) != first


def _scan(lengths: list[float], samples: int | None = None) -> DataScan:
    indices = list(range(len(lengths)))
    order = worst_first(indices, lengths)
    head = order[:INDICES_IN_REQUEST]
    return DataScan(samples=samples or len(lengths), scanned=len(lengths), sampled=samples is not None,
                    head_indices=head, head_lengths=[lengths[i] for i in head], length_min=min(lengths),
                    length_mean=sum(lengths) / len(lengths), length_max=max(lengths), seconds=0.1)


def test_a_trial_is_sent_its_whole_batch_up_to_the_bound():
    scan = _scan([3, 8, 1, 8, 5])
    assert request_indices(scan, 3) == [1, 3, 4]
    assert request_indices(None, 3) is None


def test_a_batch_beyond_the_bound_is_sent_only_the_head():
    scan = _scan([float(i % 97) for i in range(INDICES_IN_REQUEST + 500)])
    sent = request_indices(scan, INDICES_IN_REQUEST + 10)
    assert len(sent) == INDICES_IN_REQUEST
    assert sent == scan.head_indices


def test_the_search_never_goes_beyond_the_dataset():
    scan = _scan([1, 2, 3])
    assert data_cap(None, scan) == 3
    assert data_cap(2, scan) == 2
    assert data_cap(10, scan) == 3
    assert data_cap(10, None) == 10


def test_the_result_names_the_worst_batch_at_the_maximum():
    lengths = [float(n) for n in (4, 30, 7, 30, 12, 2, 25) * 5]
    info = data_info(_scan(lengths), 15)  # ten of 30, then the five of 25: the 16th would be 12 long
    worst = info.worst_batch
    assert (worst.batch_size, worst.longest_length, worst.shortest_length) == (15, 30.0, 25.0)
    assert worst.first_indices == [1, 3, 8, 10, 15, 17, 22, 24, 29, 31, 6, 13, 20, 27, 34]
    assert info.length_max == 30 and info.length_min == 2 and not info.sampled and info.sample_seed is None


def test_the_result_lists_at_most_a_few_indices_and_says_when_sampled():
    lengths = [float(i) for i in range(100)]
    info = data_info(_scan(lengths, samples=1000), 40)
    assert len(info.worst_batch.first_indices) == SHOWN_INDICES
    assert info.sampled and info.sample_seed == SAMPLE_SEED and info.samples == 1000 and info.scanned == 100


def test_no_maximum_no_worst_batch():
    assert data_info(_scan([1.0, 2.0]), None).worst_batch is None


# --------------------------------------------------------------------------- the probe, over scripted trials


def _data_probe(lengths: list[float], per_sample: int):
    """A probe of a data spec over a device whose peak is linear in the batch; the check reports ``lengths``."""
    from isoprobe.executors.scripted import IMPORT_BASELINE_BYTES, ScriptedExecutor, inspected, linear
    from isoprobe.protocol.messages import Facts, MemoryReading

    from scripted_probe import GiB, MiB, probe

    facts = Facts(torch_version="2.0.0+scripted", memory_after_import=MemoryReading(data=IMPORT_BASELINE_BYTES),
                  data=_scan(lengths))
    spec = {"model": {"factory": "m.py:f"}, "data": {"dataset": "d.py:make"}, "target": {"task": "language_modeling"},
            "device": "cpu", "memory_budget": 2 * GiB, "recommendation": {"soak_steps": 0}}
    executor = ScriptedExecutor(linear(IMPORT_BASELINE_BYTES + 64 * MiB, per_sample * MiB),
                                inspected=inspected(facts))
    return probe(spec, executor)


def test_every_trial_is_sent_the_longest_samples_and_the_result_names_them():
    lengths = [float((i * 7) % 50 + 1) for i in range(300)]
    probed = _data_probe(lengths, per_sample=8)
    order = worst_first(list(range(300)), lengths)
    assert probed.executor.calls and all(call.request.data_indices == order[:call.batch_size]
                                         for call in probed.executor.calls)
    maximum = probed.result.max_batch_size
    assert probed.result.data.worst_batch.first_indices == order[:min(maximum, SHOWN_INDICES)]
    assert any("every trial trains on its B longest" in line for line in probed.lines)


def test_a_dataset_that_fits_whole_caps_the_search_at_its_size():
    probed = _data_probe([3.0, 1.0, 2.0, 5.0, 4.0], per_sample=1)
    assert max(probed.executor.batches) == 5
    assert (probed.result.max_batch_size, probed.result.limited_by) == (5, "dataset_size")
