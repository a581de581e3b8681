"""Where the framework runs the trial, its evaluation is scheduled early (issue 55): a deciding trial of
``model.lightning`` validates after the search's steps (two batches of the module's own val_dataloader, at its own
eval batch), one of ``model.hf_trainer`` evaluates inside the Trainer's loop (``control.should_evaluate``), and both
step on until steady. Checked against the framework's own fit and train, under the same cap, with the user's
evaluation every 3 steps (benchmarks/harness: nothing of isoprobe in those processes).

Measured when written (1280 MiB): the Lightning module fits 30 for 3 training steps, but its own fit validating
every 3 steps fits 21 and runs out at 22; isoprobe answers 21. The Trainer's own train() with its evaluation
trains 51 and runs out at 52; isoprobe answers 50 (its trial process holds a little more than a plain one: the
edge of test_hf_trainer.py's budget note).
"""

from __future__ import annotations

import sys

from conftest import REPO, run_cli
from isoprobe.spec.load import load_spec

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from hf_trainer_edge import trains  # noqa: E402
from lightning_edge import fits  # noqa: E402

DATA = REPO / "tests" / "data" / "cycle"
BUDGET = 1280 * 1024**2
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def test_a_lightning_module_that_validates_is_answered_with_its_validation_seen(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec_path = DATA / "lightning_validates.yaml"
    run = run_cli("run", str(spec_path), env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.json
    assert result["max_cycle"].startswith("evaluation seen at step 4"), result["max_cycle"]
    top, failing = result["max_batch_size"], result["first_failing_batch_size"]
    spec = load_spec(spec_path)
    assert fits(spec, top, BUDGET, 7, validate_every=3), f"{top} does not fit the module's own validating fit"
    assert not fits(spec, failing + 1, BUDGET, 7, validate_every=3), f"{failing + 1} fits the validating fit"


def test_a_trainer_that_evaluates_is_answered_with_its_evaluation_seen(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = run_cli("run", str(DATA / "hf_trainer_evaluates.yaml"), env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.json
    assert result["max_cycle"].startswith("evaluation seen at step 4"), result["max_cycle"]
    builder = f"{REPO / 'tests' / 'support' / 'hf_trainers.py'}:evaluating_trainer"
    top, failing = result["max_batch_size"], result["first_failing_batch_size"]
    assert trains(builder, {}, top, BUDGET, 7), f"{top} does not train in the Trainer's own train() with evaluation"
    assert not trains(builder, {}, failing + 2, BUDGET, 7), f"{failing + 2} trains in the Trainer's own train()"
