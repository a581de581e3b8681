"""Issue 28, part 3: ``search.unit: tokens``: a token budget every bucket of a length-bucketing sampler fits.

Checked against an independent harness (``benchmarks/harness/token_edge.py``): a fresh
``python -c`` process per bucket that imports only torch and trains the
classic loop under the same cap on floor(T / L) samples of length L. Every
bucket must fit at isoprobe's budget T (no tolerance), and at T + 1 tokens the
binding bucket, whose batch grows by one sample, must run out of memory, or
come within the CPU edge's precision of the cap (as in test_plain_edge.py).

One OpenMP thread on both sides, as in test_plain_edge.py.
"""

from __future__ import annotations

import sys

import yaml

from conftest import REPO, SUPPORT, cli, run_cli
from isoprobe.spec.load import load_spec

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from token_edge import check  # noqa: E402


#: The CPU edge's precision, measured in tests/integration/test_plain_edge.py (PRECISION_BYTES there): a batch whose
#: plain peak is this close to the cap fits or runs out by chance, in a plain process as in a trial.
PRECISION_BYTES = 512 * 1024
#: Not multiples of each other, so that the floors differ from bucket to bucket.
LENGTHS = [48, 100, 260]


def _spec(tmp_path) -> str:
    """tests/support/models.py's lm_head (its logits are most of a sample) under 1.25 GiB, at three bucket lengths.

    The token search doubles from search.start_batch_size at the longest length (the traced estimate is not used by
    it: off, so the environment check does not trace); 8 there skips the trials at 2 and 4 samples, which fit far
    below the edge (about 12 at 260 tokens): the search's path is tests/unit/test_token_budget.py's, its answer
    this test's."""
    spec = {
        "model": {"factory": f"{SUPPORT / 'models.py'}:lm_head", "kwargs": {"vocabulary": 8000, "width": 64}},
        "input": {"shape": [64], "dtype": "int64", "high": 8000},
        "target": {"task": "language_modeling"},
        "optimizer": {"name": "adam"},
        "search": {"steps": 2, "trial_timeout": 300, "unit": "tokens", "bucket_lengths": LENGTHS,
                   "steady_steps": 0, "start_batch_size": 8, "estimate": False},
        "device": "cpu",
        "memory_budget": "1.25GiB",
        "recommendation": {"soak_steps": 0},
    }
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_token_budget_fits_every_bucket_and_one_more_token_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # isoprobe's trials and the harness's processes both inherit it
    path = _spec(tmp_path)
    run = run_cli("run", path, timeout=900)
    assert run.returncode == 0, run.stderr
    tokens = run.json["tokens"]
    budget, binding = tokens["max_tokens"], tokens["binding_length"]
    trials = [(t["batch_size"], t["length"], t["outcome"]) for t in run.json["trials"]]
    assert {t["length"] for t in run.json["trials"]} == set(LENGTHS)  # every length was asked (or ruled out)
    assert run.json["max_batch_size"] == tokens["binding_samples"] == budget // binding
    assert tokens["recommended_tokens"] == binding * run.json["recommended_batch_size"]
    spec = load_spec(path)
    found = check(spec, budget, spec.memory_budget)
    assert found["all_fit"], (found, trials)
    # The binding bucket's batch one sample larger (T + 1 tokens) runs out in a plain process too, unless its plain
    # peak lies within the CPU edge's precision of the cap (test_plain_edge.py: it fits or not by chance there).
    above = found["at_budget_plus_one"][binding]
    assert above["samples"] == budget // binding + 1
    assert not above["fits"] or spec.memory_budget - above["peak_bytes"] < PRECISION_BYTES, (found, trials)
    saved = tmp_path / "result.json"
    saved.write_text(run.stdout)
    exported = cli("show", "--format", "env", str(saved)).stdout.splitlines()
    assert f"export ISOPROBE_MAX_TOKENS={budget}" in exported
    assert f"export ISOPROBE_BINDING_LENGTH={binding}" in exported
