"""The spec rules of the model sources, tasks and training options: validation only, no processes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from isoprobe.errors import Problem, SpecError
from isoprobe.spec.load import load_spec


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str):
    return load_spec(write(tmp_path, text))


def refused(tmp_path: Path, text: str) -> Problem:
    """The one problem the spec has."""
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    problems = info.value.problems
    assert len(problems) == 1, problems
    return problems[0]


IMAGE = "input: {shape: [3, 32, 32]}\ntarget: {classes: 10}\n"
TOKENS = "input: {shape: [64], dtype: int64, high: 1000}\n"
FLAT = "input: {shape: [16]}\ntarget: {classes: 10}\n"


# --------------------------------------------------------------------------- model sources


@pytest.mark.parametrize(
    "model, source",
    [
        ("{torchvision: resnet18}", "torchvision"),
        ("{timm: convnext_tiny}", "timm"),
        ("{huggingface: bert, kwargs: {num_hidden_layers: 2}}", "huggingface"),
        ("{factory: 'models:deep_mlp'}", "factory"),
    ],
)
def test_each_model_source_alone_is_valid(tmp_path, model, source):
    spec = load(tmp_path, f"model: {model}\n" + IMAGE)
    assert spec.model.source == source


@pytest.mark.parametrize(
    "model, named",
    [
        ("{timm: resnet18, huggingface: gpt2}", "timm, huggingface"),
        ("{torchvision: resnet18, timm: resnet18}", "torchvision, timm"),
        ("{huggingface: gpt2, factory: 'm:f'}", "huggingface, factory"),
        ("{kwargs: {num_classes: 10}}", "none"),
    ],
)
def test_exactly_one_model_source(tmp_path, model, named):
    problem = refused(tmp_path, f"model: {model}\n" + IMAGE)
    assert problem.field == "model"
    assert "exactly one of" in problem.message and named in problem.message


def test_timm_and_huggingface_may_not_be_empty(tmp_path):
    for source in ("timm", "huggingface"):
        problem = refused(tmp_path, f"model: {{{source}: ''}}\n" + IMAGE)
        assert problem.field == f"model.{source}"


@pytest.mark.parametrize("field", ["batch", "loss"])
@pytest.mark.parametrize("reference", ["no_colon", "module:", ":function", "module:1st", "m:f:g"])
def test_batch_and_loss_must_be_callable_references(tmp_path, field, reference):
    problem = refused(tmp_path, f"model: {{factory: 'm:f', {field}: '{reference}'}}\n" + FLAT)
    assert problem.field == f"model.{field}"
    assert f"{field} {reference!r} must look like" in problem.message


def test_batch_and_loss_in_file_form_are_resolved_against_the_spec(tmp_path):
    (tmp_path / "helpers.py").write_text("def make(batch_size, device): ...\ndef loss(output, targets): ...\n")
    spec = load(tmp_path, "model: {factory: 'm:f', batch: 'helpers.py:make', loss: 'helpers.py:loss'}\n")
    assert spec.model.batch == f"{(tmp_path / 'helpers.py').resolve()}:make"
    assert spec.model.loss == f"{(tmp_path / 'helpers.py').resolve()}:loss"
    assert spec.input is None and spec.target is None


def test_a_batch_or_loss_file_that_does_not_exist_is_named(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f', batch: 'nowhere.py:make'}\ntarget: {classes: 10}\n")
    assert problem.field == "model.batch"
    assert "no such file" in problem.message


# --------------------------------------------------------------------------- which sections are optional


def test_input_may_be_left_out_only_with_model_batch(tmp_path):
    spec = load(tmp_path, "model: {factory: 'm:f', batch: 'm:make'}\ntarget: {classes: 10}\n")
    assert spec.input is None
    problem = refused(tmp_path, "model: {factory: 'm:f', loss: 'm:loss'}\ntarget: {classes: 10}\n")
    assert problem.field == "input"
    assert "model.batch" in problem.message


def test_target_may_be_left_out_only_with_model_loss(tmp_path):
    spec = load(tmp_path, "model: {factory: 'm:f', loss: 'm:loss'}\ninput: {shape: [16]}\n")
    assert spec.target is None
    problem = refused(tmp_path, "model: {factory: 'm:f', batch: 'm:make'}\ninput: {shape: [16]}\n")
    assert problem.field == "target"
    assert "model.loss" in problem.message


# --------------------------------------------------------------------------- tasks


def test_the_task_is_inferred_from_classes_or_shape(tmp_path):
    assert load(tmp_path, "model: {factory: 'm:f'}\n" + FLAT).target.resolved_task == "classification"
    regression = load(tmp_path, "model: {factory: 'm:f'}\ninput: {shape: [16]}\ntarget: {shape: [4]}\n")
    assert regression.target.task is None
    assert regression.target.resolved_task == "regression"


def test_an_explicit_task_wins(tmp_path):
    spec = load(tmp_path, "model: {factory: 'm:f'}\ninput: {shape: [3, 8, 8]}\n"
                          "target: {task: segmentation, classes: 5}\n")
    assert spec.target.resolved_task == "segmentation"
    detection = load(tmp_path, "model: {torchvision: fasterrcnn_resnet50_fpn}\ninput: {shape: [3, 64, 64]}\n"
                               "target: {task: detection, classes: 5, boxes_per_image: 3}\n")
    assert detection.target.boxes_per_image == 3


@pytest.mark.parametrize(
    "target, words",
    [
        ("{classes: 10, shape: [3]}", "exactly one of"),
        ("{task: classification}", "classification needs 'classes'"),
        ("{task: segmentation, shape: [3]}", "'shape' is for regression"),
        ("{task: regression, classes: 3}", "regression takes 'shape'"),
        ("{task: detection, classes: 3, boxes_per_image: 0}", "greater than or equal to 1"),
        ("{task: translation, classes: 3}", "language_modeling"),
    ],
)
def test_the_target_fields_must_fit_the_task(tmp_path, target, words):
    problem = refused(tmp_path, f"model: {{factory: 'm:f'}}\ninput: {{shape: [3, 8, 8]}}\ntarget: {target}\n")
    assert problem.field.startswith("target")
    assert words in problem.message


def test_language_modeling_takes_token_ids(tmp_path):
    spec = load(tmp_path, "model: {factory: 'm:f'}\n" + TOKENS + "target: {task: language_modeling}\n")
    assert spec.target.resolved_task == "language_modeling"
    assert spec.target.classes is None


@pytest.mark.parametrize(
    "given",
    [
        "input: {shape: [64]}",  # float32 ids
        "input: {shape: [4, 64], dtype: int64, high: 1000}",  # not one sequence
    ],
)
def test_language_modeling_refuses_other_inputs(tmp_path, given):
    problem = refused(tmp_path, f"model: {{factory: 'm:f'}}\n{given}\ntarget: {{task: language_modeling}}\n")
    assert problem.field == "input"
    assert "int64" in problem.message and "high" in problem.message


def test_int64_input_without_high_is_refused(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f'}\ninput: {shape: [64], dtype: int64}\n"
                                "target: {task: language_modeling}\n")
    assert problem.field == "input"
    assert "needs 'high'" in problem.message


def test_language_modeling_with_its_own_batch_needs_no_input(tmp_path):
    spec = load(tmp_path, "model: {factory: 'm:f', batch: 'm:make'}\ntarget: {task: language_modeling}\n")
    assert spec.input is None


def test_detection_takes_images(tmp_path):
    problem = refused(tmp_path, "model: {torchvision: fasterrcnn_resnet50_fpn}\ninput: {shape: [64]}\n"
                                "target: {task: detection, classes: 5}\n")
    assert problem.field == "input.shape"


def test_huggingface_takes_language_modeling_or_classification(tmp_path):
    assert load(tmp_path, "model: {huggingface: gpt2}\n" + TOKENS + "target: {task: language_modeling}\n")
    assert load(tmp_path, "model: {huggingface: bert}\n" + TOKENS + "target: {classes: 3}\n")
    problem = refused(tmp_path, "model: {huggingface: gpt2}\n" + TOKENS + "target: {shape: [4]}\n")
    assert problem.field == "target.task"
    assert "language_modeling or classification" in problem.message
    problem = refused(tmp_path, "model: {huggingface: bert}\ninput: {shape: [3, 8, 8]}\n"
                                "target: {task: segmentation, classes: 3}\n")
    assert problem.field == "target.task"


# --------------------------------------------------------------------------- training options


def test_training_defaults(tmp_path):
    training = load(tmp_path, "model: {torchvision: resnet18}\n" + IMAGE).training
    assert training.mode == "train"
    assert training.precision == "fp32"
    assert training.compile_backend == "inductor"
    assert not any([training.channels_last, training.gradient_checkpointing, training.compile,
                    training.cudnn_benchmark, training.eval_pass])


def test_every_training_option_is_read(tmp_path):
    training = load(
        tmp_path,
        "model: {torchvision: resnet18}\n" + IMAGE + "training: {precision: bf16-mixed, channels_last: true, "
        "gradient_checkpointing: true, compile: true, compile_backend: aot_eager, cudnn_benchmark: true, "
        "eval_pass: true}\n",
    ).training
    assert (training.precision, training.compile_backend) == ("bf16-mixed", "aot_eager")
    assert all([training.channels_last, training.gradient_checkpointing, training.compile,
                training.cudnn_benchmark, training.eval_pass])


def test_an_unknown_precision_or_mode_is_refused(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT + "training: {precision: fp8}\n")
    assert problem.field == "training.precision"
    assert "bf16-true" in problem.message
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT + "training: {mode: eval}\n")
    assert problem.field == "training.mode"


def test_a_misspelled_training_option_is_refused(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT + "training: {gradient_checkpoint: true}\n")
    assert problem.field == "training.gradient_checkpoint"
    assert "gradient_checkpointing" in problem.fix


def test_channels_last_needs_image_input(tmp_path):
    assert load(tmp_path, "model: {torchvision: resnet18}\n" + IMAGE + "training: {channels_last: true}\n")
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT + "training: {channels_last: true}\n")
    assert problem.field == "training.channels_last"
    assert "[channels, height, width]" in problem.message
    # With its own batch maker the images are the user's business.
    assert load(tmp_path, "model: {factory: 'm:f', batch: 'm:make'}\ntarget: {classes: 10}\n"
                          "training: {channels_last: true}\n")


def test_inference_refuses_gradient_checkpointing(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT +
                      "training: {mode: inference, gradient_checkpointing: true}\n")
    assert problem.field == "training.gradient_checkpointing"
    assert "backward" in problem.message and "inference" in problem.message


def test_inference_refuses_an_eval_pass(tmp_path):
    problem = refused(tmp_path, "model: {factory: 'm:f'}\n" + FLAT + "training: {mode: inference, eval_pass: true}\n")
    assert problem.field == "training.eval_pass"
    assert "inference" in problem.message


def test_inference_with_the_other_options_is_valid(tmp_path):
    training = load(tmp_path, "model: {torchvision: resnet18}\n" + IMAGE +
                    "training: {mode: inference, precision: bf16-true, channels_last: true, compile: true}\n").training
    assert training.mode == "inference"


# --------------------------------------------------------------------------- issue 6: allocators, plan, objective


def test_allocators_compare_two_or_more_distinct_settings_and_replace_allocator(tmp_path):
    base = "model: {torchvision: resnet18}\ninput: {shape: [3, 32, 32]}\ntarget: {classes: 10}\n"
    assert load(tmp_path, base + "allocators: [default, 'expandable_segments:True']\n").allocators
    one = refused(tmp_path, base + "allocators: [default]\n")
    assert one.field == "allocators"
    twice = refused(tmp_path, base + "allocators: [default, default]\n")
    assert twice.field == "allocators" and "once" in twice.message
    both = refused(tmp_path, base + "allocator: 'expandable_segments:True'\nallocators: [default, 'a:1']\n")
    assert both.field == "allocators" and "either" in both.message


def test_plan_and_objective_fields_are_validated(tmp_path):
    base = "model: {torchvision: resnet18}\ninput: {shape: [3, 32, 32]}\ntarget: {classes: 10}\n"
    spec = load(tmp_path, base + "plan: {target_global_batch: 1024, world_size: 8}\n"
                                 "recommendation: {objective: throughput, throughput_tolerance: 0.05}\n")
    assert spec.plan.target_global_batch == 1024 and spec.recommendation.objective == "throughput"
    assert refused(tmp_path, base + "plan: {target_global_batch: 0}\n").field == "plan.target_global_batch"
    assert refused(tmp_path, base + "recommendation: {objective: fastest}\n").field == "recommendation.objective"
    assert refused(tmp_path, base + "recommendation: {throughput_tolerance: 1.5}\n").field == \
        "recommendation.throughput_tolerance"
