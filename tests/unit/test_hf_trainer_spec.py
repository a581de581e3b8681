"""model.hf_trainer in the spec: the user's Trainer brings its own data, loss, optimizer and options.

What the spec must then not say (it would be silently ignored), what it may
(training.eval_pass, the search, the device and budget), and that the spec
survives its trip to the trial as JSON (every field set there).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from isoprobe.errors import SpecError
from isoprobe.spec.load import check_references, load_spec
from isoprobe.spec.model import Spec

TRAINER = """\
model:
  hf_trainer: trainers.py:build_trainer
  kwargs: {layers: 2}
device: cpu
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "trainers.py").write_text("def build_trainer(batch_size, layers=2):\n    pass\n", encoding="utf-8")
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problem(path: Path, overrides: dict | None = None):
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


def test_a_trainer_spec_needs_no_input_target_or_optimizer(tmp_path):
    spec = load_spec(write(tmp_path, TRAINER))
    assert spec.model.source == "hf_trainer"
    assert spec.model.library == "transformers"
    assert spec.model.hf_trainer == f"{tmp_path / 'trainers.py'}:build_trainer"  # resolved against the spec's folder
    check_references(spec, str(tmp_path / "spec.yaml"))


def test_the_spec_survives_its_trip_to_the_trial_as_json(tmp_path):
    spec = load_spec(write(tmp_path, TRAINER + "training: {eval_pass: true}\n"))
    again = Spec.model_validate_json(spec.model_dump_json())  # every field set, defaults included
    assert again == spec


@pytest.mark.parametrize(("extra", "named"), [
    ("input: {shape: [64], dtype: int64, high: 4000}\n", "'input'"),
    ("target: {task: language_modeling}\n", "'target'"),
    ("optimizer: {name: sgd}\n", "'optimizer'"),
    ("training: {precision: bf16-mixed}\n", "'training.precision'"),
    ("training: {gradient_checkpointing: true}\n", "'training.gradient_checkpointing'"),
    ("training: {output_lifetime: freed_before_backward}\n", "'training.output_lifetime'"),
])
def test_what_the_trainer_owns_is_refused_and_named(tmp_path, extra, named):
    found = problem(write(tmp_path, TRAINER + extra))
    assert found.field == "model.hf_trainer"
    assert named in found.message and "would be ignored" in found.message
    assert "TrainingArguments" in found.message


def test_a_loss_or_step_beside_the_trainer_is_refused(tmp_path):
    found = problem(write(tmp_path, TRAINER.replace("  kwargs:", "  loss: trainers.py:loss\n  kwargs:")))
    assert "'model.loss'" in found.message


def test_an_override_of_a_trainer_owned_option_is_refused_too(tmp_path):
    found = problem(write(tmp_path, TRAINER), {"training.precision": "bf16-mixed"})
    assert "'training.precision'" in found.message


def test_eval_pass_and_the_search_apply(tmp_path):
    spec = load_spec(write(tmp_path, TRAINER + "training: {eval_pass: true}\nsearch: {steps: 5, max_batch_size: 64}\n"))
    assert spec.training.eval_pass and spec.search.steps == 5


def test_a_distributed_strategy_is_refused(tmp_path):
    found = problem(write(tmp_path, TRAINER + "distributed: {strategy: ddp, world_size: 2}\n"))
    assert found.field == "distributed.strategy" and "hf_trainer" in found.message


def test_two_sources_are_refused(tmp_path):
    found = problem(write(tmp_path, TRAINER.replace("  kwargs:", "  factory: trainers.py:build_trainer\n  kwargs:")))
    assert "exactly one" in found.message and "hf_trainer" in found.message


def test_a_missing_function_is_named_before_any_trial(tmp_path):
    spec = load_spec(write(tmp_path, TRAINER.replace("build_trainer", "build_trainr")))
    with pytest.raises(SpecError) as info:
        check_references(spec, str(tmp_path / "spec.yaml"))
    (found,) = info.value.problems
    assert found.field == "model.hf_trainer" and "did you mean 'build_trainer'" in found.fix


def test_the_search_stops_at_the_length_of_the_trainers_train_set():
    """Issue 34: a Trainer whose train set holds fewer samples than a batch the search reaches failed that trial
    (exit 4, the answer lost). The environment check reports the train set's length (Facts.train_samples), and
    the search stops there: over a scripted device where 25 would fit, a train set of 20 answers 20, limited by the
    dataset, said before the first trial; a larger set leaves the memory edge alone."""
    from isoprobe.executors.scripted import IMPORT_BASELINE_BYTES, ScriptedExecutor, inspected, linear
    from isoprobe.protocol.messages import Facts, MemoryReading
    from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, probe

    def executor(samples):
        facts = Facts(torch_version="2.0.0+scripted", memory_after_import=MemoryReading(data=IMPORT_BASELINE_BYTES),
                      train_samples=samples)
        return ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE), inspected=inspected(facts))

    spec = {"model": {"hf_trainer": "trainers.py:build_trainer"}, "device": "cpu", "memory_budget": "1.5GiB",
            "search": {"steps": 2, "steady_steps": 0}, "recommendation": {"soak_steps": 0}}
    short = probe(spec, executor(20))
    assert short.result.max_batch_size == 20 and short.result.limited_by == "dataset_size"
    assert max(short.executor.batches) == 20
    note = next(i for i, line in enumerate(short.lines) if "train_dataset holds 20 samples" in line)
    assert note < next(i for i, line in enumerate(short.lines) if line.startswith("isoprobe: trial"))
    assert probe(spec, executor(4096)).result.max_batch_size == HOG_MAX
