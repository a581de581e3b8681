"""Issue 27: a LightningModule probed under its own ``trainer.fit`` in fresh processes (real Lightning, CPU backend).

The edge is checked against an independent harness (``benchmarks/harness/lightning_edge.py``): a
fresh ``python -c`` process per batch that imports only lightning and runs a plain
``trainer.fit`` of the same module under the same cap, with none of isoprobe's trial
code in it. One OpenMP thread on both sides, as in test_plain_edge.py (with two, a
plain process's own edge moves by a sample from run to run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, SUPPORT, run_cli, run_one_trial
from isoprobe.spec.load import load_spec

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from lightning_edge import fits  # noqa: E402


LIT = SUPPORT / "lightning_models.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
BUDGET = 1280 * 1024**2


def hog(**model) -> dict:
    """HogModule (~16 MiB of activations a sample at these sizes: a few MiB of jitter is no sample), its own
    training_step, AdamW with a StepLR scheduler, gradient clipping; 5 steps a trial, no steady rule, no soak."""
    return {"model": {"lightning": f"{LIT}:HogModule", "kwargs": {"features": 262144, "depth": 8}, **model},
            "lightning": {"gradient_clip_val": 1.0},
            "device": "cpu", "memory_budget": BUDGET,
            "search": {"steps": 5, "steady_steps": 0, "start_batch_size": 16, "trial_timeout": 120},
            "recommendation": {"soak_steps": 0}}


def test_the_edge_is_the_edge_of_a_plain_fit(write_spec, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the harness's processes inherit it
    path = write_spec(hog())
    run = run_cli("run", str(path), env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.json
    top = result["max_batch_size"]
    assert result["stop_reason"] == "edge_found" and top > 16, result["message"]
    spec = load_spec(path)
    with ThreadPoolExecutor(2) as pool:
        at_edge, above = pool.map(lambda batch: fits(spec, batch, BUDGET), (top, top + 1))
    assert at_edge, f"isoprobe's maximum {top} does not fit a plain trainer.fit of 5 steps"
    assert not above, f"a plain trainer.fit fits {top + 1}, above isoprobe's maximum {top}"


def test_a_data_module_gets_the_batch_size_and_accumulation_steps_whole_optimizer_steps(tmp_path):
    """The batch size lands on the data module (its plain attribute), each batch has it, and a step is an
    optimizer step: with accumulate_grad_batches 3, 2 steps are 6 batches (the module checks each one's size)."""
    count = tmp_path / "batches"
    spec = hog(lightning=f"{LIT}:ModelOnly", datamodule=f"{LIT}:HogData", datamodule_kwargs={"features": 4096},
               kwargs={"features": 4096, "depth": 2, "check_batch": 5, "count_file": str(count)})
    spec["lightning"]["accumulate_grad_batches"] = 3
    spec["search"]["steps"] = 2
    result = run_one_trial(spec, 5, tmp_path, 2 * 1024**3)
    assert len(result["step_seconds"]) == 2
    assert json.loads((tmp_path / "batches.0").read_text()) == {"batches": 6, "world_size": 1, "wrapped": "ModelOnly"}
    with pytest.raises(AssertionError, match="a batch of 5, not 4"):
        spec["model"]["kwargs"]["check_batch"] = 4
        run_one_trial(spec, 5, tmp_path, 2 * 1024**3)


def test_a_gang_of_two_ranks_runs_lightnings_ddp_attached_to_it(write_spec, tmp_path):
    """Each rank's Trainer joins the gang's process group (LOCAL_RANK set, as torchrun sets it), so Lightning
    wraps the module in DistributedDataParallel over 2 ranks instead of launching processes of its own.

    One gang: the search starts at its cap, with no confirmation (the search path and a gang's confirmation are
    tests/integration/test_distributed.py's; here each rank's own record of the gang's one trial is the point)."""
    count = tmp_path / "ran"
    spec = hog(kwargs={"features": 4096, "depth": 2, "count_file": str(count)})
    spec["distributed"] = {"strategy": "ddp", "world_size": 2}
    spec["search"].update(max_batch_size=8, steps=2, start_batch_size=8, confirmations=0)
    run = run_cli("run", str(write_spec(spec)), env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.json
    assert result["max_batch_size"] == 8 and result["distributed"]["world_size"] == 2, result["message"]
    assert [t["batch_size"] for t in result["trials"]] == [8], result["trials"]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"ran.{rank}").read_text()) == {
            "batches": 2, "world_size": 2, "wrapped": "DistributedDataParallel"}


def test_a_training_step_that_raises_is_exit_4_with_the_users_traceback(write_spec):
    spec = hog(kwargs={"features": 64, "fail": True})
    spec["search"]["start_batch_size"] = 2
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 4, run.stderr[-3000:]
    assert "batch 2 raised ValueError: the user's training_step is broken" in run.stderr
    error = run.json["trials"][-1]["error"]
    assert error["type"] == "ValueError"  # the user's own exception, as Lightning raised it on
    tail = error["traceback_tail"].splitlines()
    assert "lightning_models.py" in tail[-3] and "in training_step" in tail[-3], tail[-4:]


def test_a_module_without_a_batch_size_is_a_spec_error_before_any_trial(write_spec):
    run = run_cli("run", str(write_spec(hog(lightning=f"{LIT}:NoBatchSize", kwargs={}))))
    assert run.returncode == 2, run.stderr[-3000:]
    assert "lightning.batch_arg_name" in run.stderr and "'batch_size' is in none of the module" in run.stderr
    assert "trial" not in run.stderr.split("lightning.batch_arg_name")[0].lower()


def trial_error(spec: dict, batch: int, workdir) -> str:
    """One trial of ``spec`` at ``batch`` in a fresh child (2 GiB cap) that must end in the user's error: its message."""
    from isoprobe.executors import Conditions
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    request = TrialRequest(spec=Spec.model_validate(spec), batch_size=batch, device="cpu",
                           memory_budget_bytes=2 * 1024**3, python_path=[str(SUPPORT)])
    end = classify_exit(run_once(request, Conditions(backend="cpu", memory_limit=2 * 1024**3), timeout=300,
                                 workdir=workdir))
    assert end.outcome.value == "error", (end, end.result and end.result.error)
    return end.result.error.message


SMALL = {"features": 4096, "depth": 2}


def test_a_train_dataloader_that_ignores_the_batch_size_is_an_error_not_batch_16_fits(write_spec):
    """Issue 34: the module's loader is built with batch_size=4 whatever was set, and the probe said 'batch 32
    fits' of batches of 12. The trial checks the batch that arrives before its first step: exit 4, naming the
    module, its train_dataloader() and the fix, and no verdict on memory."""
    spec = hog(lightning=f"{LIT}:IgnoresBatchSize", kwargs=SMALL)
    run = run_cli("run", str(write_spec(spec)), env=ONE_THREAD)
    assert run.returncode == 4, run.stderr[-3000:]
    assert [t["outcome"] for t in run.json["trials"]] == ["error"] and run.json["max_batch_size"] is None
    message = run.json["trials"][0]["error"]["message"]
    assert f"model.lightning {LIT}:IgnoresBatchSize: its train_dataloader() gave a batch of 4 samples where the " \
           "trial set the batch size to 16: a DataLoader with batch_size=4 does not read" in message
    assert "DataLoader(..., batch_size=self.hparams.batch_size)" in message
    assert "batch 16 raised ValueError: model.lightning" in run.stderr


@pytest.mark.parametrize("case", ["datamodule", "dataset"])
def test_a_batch_of_another_size_from_a_data_module_or_a_short_dataset_is_an_error(tmp_path, case):
    """The same class: a data module whose loader has a batch of its own (its batch_size attribute set and
    unused); a module whose dataset holds 6 samples, fewer than the batch 8 (the loader was built with 8, every
    batch has 6). Both were 'fits' at 8 before."""
    if case == "datamodule":
        spec = hog(lightning=f"{LIT}:ModelOnly", kwargs=SMALL, datamodule=f"{LIT}:IgnoringData",
                   datamodule_kwargs={"features": 4096})
        message = trial_error(spec, 8, tmp_path)
        assert f"model.datamodule {LIT}:IgnoringData: its train_dataloader() gave a batch of 4 samples" in message
        assert "(set on datamodule.batch_size, in the setup hook)" in message
    else:
        message = trial_error(hog(kwargs={**SMALL, "samples": 6}), 8, tmp_path)
        assert "holds 6 samples, fewer than the batch 8" in message
        assert message.endswith("set search.max_batch_size: 6 (no larger batch exists in this data)")


def test_a_plateau_scheduler_on_val_loss_and_a_modules_logger_run_as_in_the_real_fit(tmp_path):
    """Issue 34: trials turn validation off and had no logger, and the module's own code failed on what the trial
    took away, reported as the model's error: a ReduceLROnPlateau monitoring val_loss at the first epoch's end
    (MisconfigurationException), a training_step writing to self.logger.experiment (AttributeError on None). Now
    the plateau scheduler is not stepped in a trial and the logger is Lightning's DummyLogger: both fit. 10
    samples at batch 4: the epoch ends inside the trial's 5 steps, on a partial batch of 2 (which passes the
    batch check: the loader was built with 4)."""
    spec = hog(lightning=f"{LIT}:ValidatedPlateau", kwargs={**SMALL, "samples": 10})
    assert len(run_one_trial(spec, 4, tmp_path, 2 * 1024**3)["step_seconds"]) == 5
    spec = hog(lightning=f"{LIT}:LogsToItsLogger", kwargs=SMALL)
    assert len(run_one_trial(spec, 4, tmp_path, 2 * 1024**3)["step_seconds"]) == 5


CALLBACK_SCRIPT = textwrap.dedent("""\
    import json, sys
    import lightning as L
    sys.path.insert(0, {tests!r})
    from lightning_models import HogModule
    from isoprobe.lightning import IsolatedBatchSizeFinder

    if __name__ == "__main__":
        module = HogModule(features=4096, depth=2)
        finder = IsolatedBatchSizeFinder(memory_budget="2GiB", use={use!r},
                                         overrides={{"search.max_batch_size": 12, "search.steps": 2,
                                                    "search.start_batch_size": 12, "search.steady_steps": 0,
                                                    "recommendation.soak_steps": 0}})
        trainer = L.Trainer(accelerator="cpu", max_steps=3, gradient_clip_val=0.5, callbacks=[finder], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module)
        seen = trainer.train_dataloader.batch_size
        print(json.dumps({{"hparams": module.hparams.batch_size, "loader": seen, "steps": trainer.global_step,
                          "max": finder.result.max_batch_size, "recommended": finder.result.recommended_batch_size,
                          "clip": finder.result.spec.lightning.gradient_clip_val,
                          "source": finder.result.spec.model.lightning}}))
    """)


@pytest.fixture(scope="module")
def callback_cache(tmp_path_factory):
    """One result cache for both uses: the same Trainer is the same spec, so the second script's finder answers
    from the first one's probe (in one worker; each probes when xdist splits them). Under test here is where the
    callback puts the answer and that training then runs; the probe's edge is
    test_the_edge_is_the_edge_of_a_plain_fit's.
    The probe itself starts at its cap (12) with no steady rule and no soak: the search path is not the point."""
    return tmp_path_factory.mktemp("callback-cache")


@pytest.mark.parametrize("use", ["max", "recommended"])
def test_the_callback_sets_the_batch_where_lightnings_finder_does_and_training_runs(tmp_path, use, callback_cache):
    script = tmp_path / "train.py"
    script.write_text(CALLBACK_SCRIPT.format(tests=str(SUPPORT), use=use))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "ISOPROBE_CACHE_DIR": str(callback_cache), "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["max"] == 12  # the cap: 12 fits easily in 2 GiB
    assert seen["hparams"] == seen["loader"] == seen[use]
    assert seen["steps"] == 3 and seen["clip"] == 0.5
    assert seen["source"] == f"{SUPPORT / 'lightning_models.py'}:HogModule"
    assert "IsolatedBatchSizeFinder" in run.stderr
