"""model.hf_trainer for real: a tiny GPT-2 in the user's own Hugging Face Trainer, on the CPU backend.

The edge isoprobe finds is checked against an independent harness
(``benchmarks/harness/hf_trainer_edge.py``): a fresh ``python -c`` process per batch
that builds the same Trainer and runs ``trainer.train()`` for 5 steps under the
same cap (RLIMIT_DATA, MALLOC_MMAP_THRESHOLD_), with nothing of isoprobe in it.
One OpenMP thread on both sides, as in test_plain_edge.py (with two, the
threads' allocations interleave differently from run to run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from hf_trainer_edge import trains  # noqa: E402


SPEC = REPO / "tests" / "data" / "hf" / "trainer.yaml"
BUILDER = f"{REPO / 'tests' / 'support' / 'hf_trainers.py'}:build_trainer"
#: Close above the import baseline (about 854 MiB with transformers' Trainer), so the edge is a small batch
#: (30, about 4.4 MiB a sample), with the edge's peak about half a sample below the cap. Not 1 GiB: there the
#: plain process's edge, 34, peaked ~0.07 MiB under the cap, below the ~0.2 MiB a trial's process still holds
#: more than a plain one (test_plain_edge.py), so isoprobe found 33, forked and spawned alike.
BUDGET = 1009 * 1024**2


def probe(*extra: str, spec=SPEC):
    """Every trial runs search.steps (the spec's 5) optimizer steps, the maximum's confirmation too (no steady
    rule: the harness's plain trainer.train() runs 5; test_probe_cpu.py checks the long run), and no soak."""
    return run_cli("run", str(spec), "--memory-budget", str(BUDGET), "--set", "recommendation.soak_steps=0",
                   "--set", "search.steady_steps=0", *extra, timeout=600, env={"OMP_NUM_THREADS": "1"})


def test_the_edge_is_a_plain_trainer_train_edge(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the harness's processes inherit it, as isoprobe's trials do
    run = probe()
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    trials = [(t["batch_size"], t["outcome"], len(t["step_seconds"])) for t in run.json["trials"]]
    assert all(steps >= 5 for _, outcome, steps in trials if outcome == "fits"), trials
    assert trains(BUILDER, {}, maximum, BUDGET, 5), (maximum, trials)
    assert not trains(BUILDER, {}, maximum + 1, BUDGET, 5), (maximum, trials)


def test_one_trial_step_is_one_optimizer_step_with_accumulation(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""\
model:
  hf_trainer: {BUILDER}
  kwargs: {{accumulation: 3, eval_samples: 64}}
device: cpu
training: {{eval_pass: true}}
search: {{steps: 5, start_batch_size: 4, max_batch_size: 4, steady_steps: 0, confirmations: 0}}
""", encoding="utf-8")
    run = probe(spec=spec)
    assert run.returncode == 0, run.stderr
    trial = run.json["trials"][0]
    assert trial["batch_size"] == 4 and trial["outcome"] == "fits"
    assert len(trial["step_seconds"]) == 5  # search.steps optimizer steps, each of 3 micro-batches
    assert trial["eval_seconds"] is not None and trial["eval_seconds"] > 0


def test_a_forward_pass_that_raises_is_exit_4_with_the_users_traceback(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  hf_trainer: {REPO}/tests/support/hf_trainers.py:broken_trainer\ndevice: cpu\n",
                    encoding="utf-8")
    run = probe(spec=spec)
    assert run.returncode == 4, run.stderr
    assert "no such head 'lm_hed'" in run.stderr
    (trial,) = run.json["trials"]
    assert trial["outcome"] == "error" and trial["error"]["type"] == "ValueError"
    assert "hf_trainers.py" in trial["error"]["traceback_tail"]  # the user's frame, not only isoprobe's
    assert "in forward" in trial["error"]["traceback_tail"]


def refused(tmp_path, spec_text: str):
    """``isoprobe run`` of this spec, which the environment check must refuse: exit 2 (the run, for its words)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text, encoding="utf-8")
    run = probe(spec=spec)
    assert run.returncode == 2, run.stderr
    return run


def test_a_function_that_ignores_its_batch_size_is_refused_before_any_trial(tmp_path):
    """The environment check builds the Trainer once (issue 34): what every trial would refuse is a spec error,
    exit 2, before the first trial (it was exit 4, after one)."""
    run = refused(tmp_path,
                  f"model:\n  hf_trainer: {REPO}/tests/support/hf_trainers.py:ignores_the_batch\ndevice: cpu\n")
    assert "model.hf_trainer" in run.stderr and "per_device_train_batch_size is 8" in run.stderr
    assert "trial" not in run.stderr.lower().split("model.hf_trainer")[0]


def test_eval_pass_without_an_eval_dataset_is_refused_before_any_trial(tmp_path):
    """Issue 34: training.eval_pass with a Trainer that has no eval_dataset failed in the first trial, after its
    training steps (exit 4). Now the environment check refuses it: exit 2, naming training.eval_pass and the fix."""
    run = refused(tmp_path, f"model:\n  hf_trainer: {BUILDER}\ndevice: cpu\ntraining: {{eval_pass: true}}\n")
    assert "training.eval_pass" in run.stderr and "has no eval_dataset: pass eval_dataset=... to the Trainer" in run.stderr
    assert "isoprobe: trial" not in run.stderr


def test_a_train_set_smaller_than_the_batches_caps_the_search_at_its_length(tmp_path):
    """Issue 34: a train set of 20 samples and a search from 16: the trial at 32 failed ('fewer than the batch',
    exit 4) and took the answer with it. The environment check reads the train set's length and the search stops
    there: 20 is the answer, limited by the dataset (the Trainer never draws a larger batch), said before the
    first trial."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  hf_trainer: {BUILDER}\n  kwargs: {{samples: 20}}\ndevice: cpu\n"
                    "search: {steps: 2, start_batch_size: 16, steady_steps: 0, confirmations: 0}\n", encoding="utf-8")
    run = probe(spec=spec)
    assert run.returncode == 0, run.stderr
    assert run.json["max_batch_size"] == 20 and run.json["limited_by"] == "dataset_size", run.json["message"]
    assert [t["batch_size"] for t in run.json["trials"]] == [16, 20]
    note = "the Trainer's train_dataset holds 20 samples: no batch above that is tried"
    assert note in run.stderr and run.stderr.index(note) < run.stderr.index("isoprobe: trial")


def test_kwargs_the_function_cannot_take_are_a_spec_error(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  hf_trainer: {REPO}/tests/support/hf_trainers.py:build_trainer\n  kwargs: {{layer: 2}}\n"
                    "device: cpu\n", encoding="utf-8")
    run = probe(spec=spec)
    assert run.returncode == 2, run.stderr
    assert "model.hf_trainer" in run.stderr and "unexpected keyword argument 'layer'" in run.stderr


def test_find_batch_size_from_a_training_script_never_imports_torch_there(tmp_path):
    """The Python entry, as a user's script calls it: its own build_trainer (in __main__, under the guard)."""
    script = tmp_path / "train.py"
    script.write_text(f"""\\
import json
import sys

sys.path.insert(0, {str(REPO / 'tests' / 'support')!r})


def build_trainer(batch_size, layers=2):
    from hf_trainers import build_trainer as tests_builder

    return tests_builder(batch_size, layers=layers)


if __name__ == "__main__":
    from isoprobe.huggingface import find_batch_size

    result = find_batch_size(build_trainer, kwargs={{"layers": 2}}, device="cpu", memory_budget="{BUDGET}",
                             max_batch_size=4, target_global_batch=16, cache=False, quiet=True,
                             overrides={{"search.start_batch_size": 4, "search.steady_steps": 0,
                                        "search.confirmations": 0, "recommendation.soak_steps": 0}})
    print(json.dumps({{"max": result.max_batch_size, "steps": result.accumulation.accumulation_steps,
                      "micro": result.accumulation.micro_batch_size, "spec": result.spec.model.hf_trainer,
                      "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}}))
""", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["max"] == 4  # the cap: 4 fits far below the budget's edge
    assert answer["micro"] * answer["steps"] == 16
    assert answer["spec"] == f"{script}:build_trainer"
    assert not answer["torch"] and not answer["transformers"]
