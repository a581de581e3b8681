"""Issue 28, part 1: with ``data:``, isoprobe's maximum is the edge of a plain process on the dataset's worst batch.

Checked against an independent harness (``benchmarks/data_edge.py``): a fresh
``python -c`` process per batch that imports only torch, builds the dataset,
measures the lengths itself, takes the B longest, pads them with the user's
collate_fn and trains the classic loop under the same cap. The maximum must fit
there and one more must not; and the same model at the dataset's mean length
(``benchmarks/plain_edge.py``'s fixed-shape trial) must fit more than the
maximum: what a probe of the average batch would have answered, and what the
epoch's longest batch would have run out of memory on.

One OpenMP thread on both sides, as in test_plain_edge.py (the plain edge moves
by a sample from run to run with two).
"""

from __future__ import annotations

import statistics
import sys

import pytest
import yaml

from conftest import REPO, TESTS, run_cli
from isoprobe.spec.load import load_spec
from isoprobe.spec.model import Spec

sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "specs"))
from data_edge import at_length, worst_batch_fits  # noqa: E402
from plain_edge import fits  # noqa: E402
import text_data  # noqa: E402

pytestmark = pytest.mark.integration

VOCABULARY = 8000


def _spec(tmp_path, dataset: str, kwargs: dict) -> str:
    """tests/models.py's lm_head (its logits are most of a sample) on ``dataset`` under 1.25 GiB.

    Every trial runs search.steps (2) steps, the confirmation of the maximum too (no steady rule) and no soak: the
    harness's plain process runs the same 2 steps, so the edge both sides prove is the same one (the maximum's long
    run is checked in test_probe_cpu.py and test_answers.py, the soak in test_real_loop.py)."""
    spec = {
        "model": {"factory": f"{TESTS / 'models.py'}:lm_head", "kwargs": {"vocabulary": VOCABULARY, "width": 64}},
        "data": {"dataset": f"{REPO / 'specs' / 'text_data.py'}:{dataset}", "kwargs": kwargs,
                 "collate_fn": f"{REPO / 'specs' / 'text_data.py'}:pad_collate"},
        "target": {"task": "language_modeling"},
        "optimizer": {"name": "adam"},
        "search": {"steps": 2, "trial_timeout": 300, "steady_steps": 0},
        "device": "cpu",
        "memory_budget": "1.25GiB",
        "recommendation": {"soak_steps": 0},
    }
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_worst_batch_edge_is_the_plain_one_and_below_the_mean_lengths(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # isoprobe's trials and the harness's processes both inherit it
    # Stored shortest first: a trial that took the first B samples instead of the B longest would fit more.
    kwargs = {"samples": 2000, "shortest": 12, "longest": 128, "shortest_first": True}
    path = _spec(tmp_path, "text_dataset", kwargs)
    run = run_cli("run", path, timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    spec = load_spec(path)
    trials = [(t["batch_size"], t["outcome"]) for t in run.json["trials"]]
    assert worst_batch_fits(spec, maximum, spec.memory_budget), (maximum, trials)
    assert not worst_batch_fits(spec, maximum + 1, spec.memory_budget), (maximum, trials)
    lengths = text_data.text_dataset(**kwargs).lengths  # the test's own count, not the result's
    worst = run.json["data"]["worst_batch"]
    assert worst["longest_length"] == max(lengths)
    assert worst["shortest_length"] == sorted(lengths, reverse=True)[maximum - 1]
    mean = round(statistics.mean(lengths))
    assert run.json["data"]["length_mean"] == pytest.approx(statistics.mean(lengths))
    at_mean = Spec.model_validate(at_length(path, mean, VOCABULARY))
    assert fits(at_mean, maximum + 1, spec.memory_budget), (mean, maximum)  # the average batch's answer is larger


def test_one_long_sample_in_ten_thousand_is_the_one_that_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    kwargs = {"samples": 10_000, "typical": 24, "longest": 256}
    path = _spec(tmp_path, "rare_long_dataset", kwargs)
    run = run_cli("run", path, timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    lengths = text_data.rare_long_dataset(**kwargs).lengths
    rare = lengths.index(max(lengths))
    assert lengths.count(max(lengths)) == 1
    data = run.json["data"]
    assert (data["samples"], data["scanned"], data["sampled"]) == (10_000, 10_000, False)
    assert data["worst_batch"]["first_indices"][0] == rare
    assert data["worst_batch"]["longest_length"] == 256
    spec = load_spec(path)
    assert not worst_batch_fits(spec, maximum + 1, spec.memory_budget)  # with the long sample, one more fails
    typical = Spec.model_validate(at_length(path, max(lengths[:rare] + lengths[rare + 1:]), VOCABULARY))
    assert fits(typical, maximum + 1, spec.memory_budget)  # without it, one more fits: the rare sample decides
