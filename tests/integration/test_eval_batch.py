"""Issue 28, part 4: with training.eval_pass the evaluation batch is a second edge, checked against a plain process.

The independent harness (``benchmarks/harness/plain_edge.py``, ``fits(..., eval_batch=E)``)
is a fresh ``python -c`` process that imports only torch, runs the classic
training loop at the training batch under the same cap, drops the epoch's batch
and output, and runs one evaluation forward under ``torch.no_grad()`` at E. The
evaluation maximum isoprobe reports must fit there (or, where isoprobe's own trial of it peaked within
``PRECISION_BYTES`` of the cap, the batch below it must), and one more must not
(unless isoprobe's own trials of that batch both fit and failed: an edge that
noise decides, which the search refuses to report as fitting; or unless the
plain process's peak at that batch lies within ``PRECISION_BYTES`` of the cap,
test_plain_edge.py's measured precision of the CPU edge: a run of the suite in
three workers once saw a plain process fit one evaluation sample more).
"""

from __future__ import annotations

import sys

from conftest import REPO, cli, run_cli
from isoprobe.spec.load import load_spec

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from plain_edge import fits, peak  # noqa: E402
from test_plain_edge import PRECISION_BYTES, assert_fits_in_a_plain_process  # noqa: E402  the CPU edge's rule


LM_HEAD = REPO / "benchmarks" / "specs" / "edge" / "lm-head.yaml"
BUDGET = "1GiB"


def test_the_evaluation_edge_is_its_own_larger_one_and_a_plain_process_agrees(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as test_plain_edge: one thread on both sides
    # Every trial runs search.steps (2) steps, as the harness's plain process does before its evaluation pass: no
    # steady rule on the training maximum's confirmation (test_probe_cpu.py and test_answers.py check the long run).
    sets = ["memory_budget=" + BUDGET, "training.eval_pass=true", "recommendation.soak_steps=0",
            "search.steady_steps=0"]
    run = run_cli("run", str(LM_HEAD), *[a for s in sets for a in ("--set", s)], timeout=600)
    assert run.returncode == 0, run.stderr
    result = run.json
    training, evaluation = result["max_batch_size"], result["eval_max_batch_size"]
    assert evaluation is not None and evaluation > training, (training, evaluation)
    assert result["eval_stop_reason"] == "edge_found"
    assert result["eval_training_batch_size"] == result["recommended_batch_size"]

    evals = [t for t in result["trials"] if t["training_batch_size"] is not None]
    trains = [t for t in result["trials"] if t["training_batch_size"] is None]
    assert evals and all(t["training_batch_size"] == result["recommended_batch_size"] for t in evals)
    assert all(t["applied"]["eval_pass"] is True for t in evals if t["outcome"] == "fits")
    assert all(t["applied"]["eval_pass"] is None for t in trains if t["outcome"] == "fits")  # training alone
    assert any(t["batch_size"] == evaluation and t["outcome"] == "fits" for t in evals)
    saved = tmp_path / "result.json"
    saved.write_text(run.stdout)
    assert f"export ISOPROBE_EVAL_BATCH_SIZE={evaluation}\n" in cli("show", str(saved), "--format", "env").stdout

    spec = load_spec(LM_HEAD, {"memory_budget": BUDGET, "training.eval_pass": True})
    after = result["eval_training_batch_size"]
    # The evaluation maximum fits in a plain process too, unless isoprobe's own trial of it peaked within the CPU
    # edge's precision of the cap: there either process fits or runs out by chance, and then the batch below must
    # fit (test_plain_edge.py's rule for the training maximum). Measured 2026-11-30: lm-head's evaluation at 196
    # peaks 0.20 to 0.29 MiB under the 1 GiB cap in a plain process, 195 at 1.18 to 1.28 MiB, 197 runs out; a
    # run of the whole suite saw the plain process at 196 run out once.
    own = max(t["budget_peak_bytes"] for t in evals if t["batch_size"] == evaluation and t["outcome"] == "fits")
    assert_fits_in_a_plain_process(lambda batch: fits(spec, after, spec.memory_budget, eval_batch=batch), evaluation,
                                   own, spec.memory_budget, (evaluation, evals))
    above = [t["outcome"] for t in evals if t["batch_size"] == evaluation + 1]
    if not ("fits" in above and len(set(above)) > 1):  # not flaky in isoprobe's own trials: the harness must agree
        # ... that one more runs out, unless its plain peak lies within the CPU edge's precision of the cap, where
        # either process fits or runs out by chance (test_plain_edge.py's rule, for the same reason).
        plain = peak(spec, after, spec.memory_budget, eval_batch=evaluation + 1)
        peaks = [(t["batch_size"], t["outcome"], t["budget_peak_bytes"]) for t in evals]
        assert plain is None or spec.memory_budget - plain < PRECISION_BYTES, (evaluation, plain, peaks)
