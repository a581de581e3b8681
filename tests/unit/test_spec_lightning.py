"""The spec of a LightningModule (``model.lightning``, ``model.datamodule``, the ``lightning`` section): what it
takes, and each section it makes unneeded named as such, not asked for."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from isoprobe.errors import SpecError
from isoprobe.spec.load import check_references, load_spec

MODELS = Path(__file__).resolve().parent.parent / "support" / "lightning_models.py"


def spec_file(tmp_path: Path, extra: str = "", model: str = "") -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(f"""\
        model:
          lightning: {MODELS}:HogModule
          kwargs: {{features: 64}}
        """) + textwrap.indent(textwrap.dedent(model), "  ") + textwrap.dedent(extra), encoding="utf-8")
    return path


def problem(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return "\n".join(f"{p.field}: {p.message}" for p in info.value.problems)


def test_a_module_alone_is_a_spec_without_input_target_or_optimizer(tmp_path):
    spec = load_spec(spec_file(tmp_path, "lightning: {gradient_clip_val: 0.5, accumulate_grad_batches: 4}\n",
                               f"datamodule: {MODELS}:HogData\ndatamodule_kwargs: {{features: 64}}\n"))
    check_references(spec, str(tmp_path / "spec.yaml"))
    assert spec.model.source == "lightning" and spec.model.library == "lightning"
    assert spec.model.datamodule == f"{MODELS}:HogData"
    assert spec.lightning.gradient_clip_val == 0.5 and spec.lightning.accumulate_grad_batches == 4
    assert spec.lightning.batch_arg_name == "batch_size"


def test_relative_references_resolve_against_the_spec_folder(tmp_path):
    (tmp_path / "lit.py").write_text("class Net: pass\nclass Data: pass\n")
    path = tmp_path / "spec.yaml"
    path.write_text("model: {lightning: 'lit.py:Net', datamodule: 'lit.py:Data'}\n")
    spec = load_spec(path)
    assert spec.model.lightning == f"{tmp_path / 'lit.py'}:Net"
    assert spec.model.datamodule == f"{tmp_path / 'lit.py'}:Data"


@pytest.mark.parametrize("section, words", [
    ("input: {shape: [4]}\n", "input: not used with model.lightning (the batches come from"),
    ("target: {classes: 3}\n", "target: not used with model.lightning (the loss is the module's training_step"),
    ("optimizer: {name: sgd}\n", "optimizer: not used with model.lightning (the optimizer is the module's "
                                 "configure_optimizers()"),
    ("training: {channels_last: true}\n", "training.channels_last: not applied to a LightningModule"),
    ("training: {eval_pass: true}\n", "training.eval_pass: not applied to a LightningModule"),
    ("training: {mode: inference}\n", "training.mode: model.lightning runs trainer.fit"),
    ("distributed: {strategy: fsdp, world_size: 2}\n", "distributed.strategy: fsdp is not run through Lightning"),
])
def test_what_the_module_does_itself_is_named_not_asked_for(tmp_path, section, words):
    assert words in problem(spec_file(tmp_path, section))


def test_the_model_step_fields_are_refused(tmp_path):
    assert "model.loss: not used with model.lightning" in problem(spec_file(tmp_path, model="loss: 'm.py:f'\n"))


def test_the_lightning_section_needs_the_module(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"model": {"factory": "m.py:f"}, "input": {"shape": [4]},
                                    "target": {"classes": 2}, "lightning": {"gradient_clip_val": 1.0}}))
    assert "lightning: this section sets the Trainer for model.lightning" in problem(path)


def test_a_datamodule_needs_the_module(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"model": {"factory": "m.py:f", "datamodule": "m.py:D"},
                                    "input": {"shape": [4]}, "target": {"classes": 2}}))
    assert "a LightningDataModule goes with model.lightning" in problem(path)


def test_datamodule_kwargs_need_a_datamodule(tmp_path):
    assert "datamodule_kwargs: set model.datamodule" in problem(spec_file(tmp_path, model="datamodule_kwargs: {a: 1}\n"))


@pytest.mark.parametrize("extra, field", [
    ("lightning: {accumulate_grad_batches: 0}\n", "lightning.accumulate_grad_batches"),
    ("lightning: {gradient_clip_val: -1}\n", "lightning.gradient_clip_val"),
    ("lightning: {gradient_clip_algorithm: norms}\n", "lightning.gradient_clip_algorithm"),
    ("lightning: {batch_arg_name: 'batch size'}\n", "lightning.batch_arg_name"),
    ("lightning: {max_epochs: 3}\n", "lightning.max_epochs"),
])
def test_trainer_arguments_are_checked(tmp_path, extra, field):
    assert field in problem(spec_file(tmp_path, extra))


def test_a_reference_must_name_a_class(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("model: {lightning: lit.py}\n")
    assert "lightning 'lit.py' must look like 'package.module:ClassName'" in problem(path)


def test_a_class_the_file_does_not_define_is_named_before_any_trial(tmp_path):
    (tmp_path / "lit.py").write_text("class LitNet: pass\n")
    path = tmp_path / "spec.yaml"
    path.write_text("model: {lightning: 'lit.py:LitNte'}\n")
    with pytest.raises(SpecError) as info:
        check_references(load_spec(path), str(path))
    assert "did you mean 'LitNet'" in str(info.value.problems)
