"""Every model source and every task trains end to end in a real child, on the CPU backend.

One trial per source and task with a tiny configuration (a few seconds each),
each of which must fit, plus full ``isoprobe run`` invocations through the CLI
for an optional source and for a spec error the inspect child catches. The
optional sources (timm, transformers) are skipped when not installed.
"""

from __future__ import annotations

import pytest

from conftest import MODELS, run_cli, run_one_trial


BUDGET = 3 * 1024**3

GPT2_TINY = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 128}
BERT_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "vocab_size": 1000, "max_position_embeddings": 64}


def spec(model: dict, **sections) -> dict:
    d = {"model": model, "optimizer": {"name": "sgd"}, "search": {"steps": 2}, "device": "cpu"}
    d.update(sections)
    return d


def fits(d: dict, batch: int, tmp_path) -> dict:
    """One trial of the spec ``d`` at ``batch`` in a fresh child; asserts it fits and returns its result event."""
    result = run_one_trial(d, batch, tmp_path, BUDGET)
    assert len(result["step_seconds"]) == 2
    return result


def one_trial_cli_spec(d: dict) -> dict:
    """A full probe that runs exactly one trial: start = max = 2, no trace (the start is given), no confirmation,
    no headroom."""
    d = dict(d)
    d["search"] = {"steps": 2, "start_batch_size": 2, "max_batch_size": 2, "confirmations": 0, "trial_timeout": 300,
                   "steady_steps": 0, "estimate": False}
    d["recommendation"] = {"headroom": 0.0, "soak_steps": 0}
    d["memory_budget"] = "3GiB"
    return d


# --------------------------------------------------------------------------- torchvision, one per task


def test_torchvision_classification(tmp_path):
    d = spec({"torchvision": "resnet18", "kwargs": {"num_classes": 10}},
             input={"shape": [3, 32, 32]}, target={"classes": 10})
    applied = fits(d, 2, tmp_path)["applied"]
    assert applied["output_dtype"] == applied["loss_dtype"] == "float32"


def test_torchvision_segmentation(tmp_path):
    d = spec({"torchvision": "lraspp_mobilenet_v3_large", "kwargs": {"num_classes": 5, "weights_backbone": None}},
             input={"shape": [3, 64, 64]}, target={"task": "segmentation", "classes": 5})
    assert fits(d, 2, tmp_path)["applied"]["loss_dtype"] == "float32"


def test_torchvision_detection_with_an_eval_pass(tmp_path):
    # min_size/max_size: the model would resize every image up to 320 pixels; kept at 128 it is 3x faster.
    model = {"torchvision": "fasterrcnn_mobilenet_v3_large_320_fpn",
             "kwargs": {"num_classes": 5, "min_size": 128, "max_size": 128}}
    d = spec(model,
             input={"shape": [3, 128, 128]}, target={"task": "detection", "classes": 5, "boxes_per_image": 2},
             training={"eval_pass": True})
    result = fits(d, 2, tmp_path)
    # Training returns the model's own losses; the eval pass calls it without targets.
    assert result["applied"]["loss_dtype"] == "float32"
    assert result["applied"]["eval_pass"] is True


# --------------------------------------------------------------------------- factories


def test_factory_regression(tmp_path):
    d = spec({"factory": "models:big_linear", "kwargs": {"features": 32}}, input={"shape": [32]},
             target={"shape": [32]})  # no task: regression, from the shape
    assert fits(d, 4, tmp_path)["applied"]["output_dtype"] == "float32"


def test_factory_language_model(tmp_path):
    d = spec({"factory": "models:tiny_lm"}, input={"shape": [16], "dtype": "int64", "high": 1000},
             target={"task": "language_modeling"}, training={"gradient_checkpointing": True})
    applied = fits(d, 2, tmp_path)["applied"]
    assert applied["checkpointing"] == "blocks"  # the encoder's ModuleList of layers
    assert applied["checkpointed_blocks"] == 2


def test_factory_with_its_own_batch_and_loss(tmp_path):
    d = spec({"factory": "models:pair_scorer", "batch": "models:pair_batch", "loss": "models:pair_loss"})
    assert "input" not in d and "target" not in d
    applied = fits(d, 8, tmp_path)["applied"]
    assert applied["loss_dtype"] == "float32"


# --------------------------------------------------------------------------- optional sources


def test_timm_with_its_own_checkpointing_switch(tmp_path):
    pytest.importorskip("timm")
    d = spec({"timm": "resnet18", "kwargs": {"num_classes": 10}}, input={"shape": [3, 32, 32]},
             target={"classes": 10}, training={"gradient_checkpointing": True})
    applied = fits(d, 2, tmp_path)["applied"]
    assert applied["checkpointing"] in ("model", "blocks")


def test_huggingface_causal_lm_with_its_own_checkpointing(tmp_path):
    pytest.importorskip("transformers")
    d = spec({"huggingface": "gpt2", "kwargs": GPT2_TINY}, input={"shape": [32], "dtype": "int64", "high": 1000},
             target={"task": "language_modeling"}, training={"gradient_checkpointing": True})
    applied = fits(d, 2, tmp_path)["applied"]
    assert applied["checkpointing"] == "model"  # gradient_checkpointing_enable
    assert applied["checkpointed_blocks"] >= 1
    assert applied["loss_dtype"] == "float32"


def test_huggingface_sequence_classification(tmp_path):
    pytest.importorskip("transformers")
    d = spec({"huggingface": "bert", "kwargs": BERT_TINY}, input={"shape": [16], "dtype": "int64", "high": 1000},
             target={"classes": 3})
    applied = fits(d, 4, tmp_path)["applied"]
    assert applied["output_dtype"] == "float32"


# --------------------------------------------------------------------------- through the CLI


def test_a_full_run_with_a_huggingface_model(write_spec):
    pytest.importorskip("transformers")
    d = one_trial_cli_spec(spec({"huggingface": "gpt2", "kwargs": GPT2_TINY},
                                input={"shape": [32], "dtype": "int64", "high": 1000},
                                target={"task": "language_modeling"}))
    run = run_cli("run", str(write_spec(d)))
    assert run.returncode == 0, run.stderr
    result = run.json
    assert result["max_batch_size"] == 2
    [trial] = result["trials"]
    assert trial["outcome"] == "fits"
    assert trial["applied"]["mode"] == "train"
    assert trial["applied"]["precision"] == "fp32"
    assert trial["applied"]["loss_dtype"] == "float32"


def test_checkpointing_a_model_without_stages_is_refused_before_any_trial(write_spec):
    d = one_trial_cli_spec(spec({"factory": f"{MODELS}:big_linear", "kwargs": {"features": 64}},
                                input={"shape": [64]}, target={"classes": 64},
                                training={"gradient_checkpointing": True}))
    run = run_cli("run", str(write_spec(d)))
    assert run.returncode == 2, run.stderr
    assert "training.gradient_checkpointing" in run.stderr
    assert run.json["stop_reason"] == "bad_spec"  # every stop prints its document (issue 56)
    assert "Traceback" not in run.stderr
