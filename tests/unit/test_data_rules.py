"""The pure rules of ``data:``: which samples are measured, which form the worst batch, what a trial is sent,
how far the search may go, and what the result says. No process, no torch."""

from __future__ import annotations

import pytest

from isoprobe.pipeline.data import SHOWN_INDICES, data_cap, data_info, request_indices
from isoprobe.protocol.messages import DataScan
from isoprobe.spec.data import INDICES_IN_REQUEST, SAMPLE_SEED, scanned_indices, worst_first
from isoprobe.spec.model import Spec


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


def test_a_search_capped_by_the_dataset_says_so_not_a_field_the_user_never_set():
    """Issue 34: 'larger batches were not tried because of dataset_size' where the user set no dataset_size: the
    message names what bounded the search, the dataset's length."""
    probed = _data_probe([3.0, 1.0, 2.0, 5.0, 4.0], per_sample=1)
    assert "dataset_size" not in probed.result.message
    assert "the dataset (data.dataset) has 5 samples" in probed.result.message


@pytest.mark.parametrize(("search", "says"), [
    ({"max_batch_size": 5}, "search.max_batch_size is 5"),
    ({"dataset_size": 3}, "search.dataset_size is 3"),
])
def test_a_capped_search_names_the_field_and_its_value(search, says):
    """The same class: the other caps are named as the spec spells them (search.*), with the value that bound."""
    from isoprobe.executors.scripted import ScriptedExecutor, linear

    from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, hog_spec, probe

    probed = probe(hog_spec(start_batch_size=2, **search), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    assert probed.result.stop_reason.value == "capped" and says in probed.result.message, probed.result.message


# --------------------------------------------------------------------------- the environment check's phase


def _inspect_run(*events):
    from isoprobe.executors import ChildRun

    return ChildRun(returncode=-9, timed_out=True, seconds=30.0, events=list(events))


def test_a_check_stopped_in_the_data_scan_names_the_data_scan_not_the_model_build():
    """Issue 34: a dataset whose scan outlived the check's timeout was blamed on the model build. The check
    reports where its scan is (``DataScanning``) and the failure names the scan, its size and the fix."""
    from isoprobe.pipeline.inspect_failure import inspect_failure
    from isoprobe.protocol.messages import DataScanning, Started, Warm

    spec = Spec.model_validate({"model": {"factory": "m.py:f"}, "target": {"task": "language_modeling"},
                                "data": {"dataset": "d.py:make", "scan_limit": 1000}, "search": {"trial_timeout": 30}})
    warm = Warm(modules=["torch"], seconds=1.0, cuda_initialized=False, idle_priority=False)
    scanning = DataScanning(stage="scanning", samples=10**9, scanning=1000)
    message = inspect_failure(_inspect_run(Started(pid=1), warm, DataScanning(stage="building"), scanning), spec)
    assert "model" not in message.split("fix")[0].lower().replace("model_built", ""), message
    assert "1000 of its 1000000000 samples" in message and "data.scan_limit" in message, message
    building = inspect_failure(_inspect_run(Started(pid=1), warm, DataScanning(stage="building")), spec)
    assert "data.dataset" in building and "building the model" not in building, building
    done = inspect_failure(_inspect_run(Started(pid=1), warm, DataScanning(stage="building"), scanning,
                                        DataScanning(stage="done", samples=10**9, scanning=1000)), spec)
    assert "building the model" in done, done
