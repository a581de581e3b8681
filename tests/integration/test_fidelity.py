"""Every option of the spec's ``training`` section changes what the trial really does.

Each test here fails if its option were silently ignored: a memory option must
move the measured peak (``budget_peak_bytes``, the data segment the CPU cap
counts) in the direction it promises, and every option must show in
``applied``, which the child reads back from torch rather than copying from
the spec. One real child process per measurement, on the CPU backend, with
models small enough for a few seconds a trial; measurements that two tests
share run once per module. Nothing here asserts a time.
"""

from __future__ import annotations

import copy

import pytest

from conftest import MODELS, run_cli, run_one_trial


MiB = 1024**2
BUDGET = 3 * 1024**3

# deep_mlp narrow and with a wide hidden layer: ~50 KiB of saved activations per sample for
# little compute and ~1.5 MiB of weights, so at this batch the activations dominate what the
# step adds above the weights (measured: ~300 MiB without checkpointing, ~50 MiB with).
MLP = {"factory": "models:deep_mlp", "kwargs": {"width": 32, "expansion": 16, "depth": 12}}
MLP_BATCH = 6144
# big_linear at 6144 features: 144 MiB of weights, so optimizer state and weight dtype show.
LINEAR = {"factory": "models:big_linear", "kwargs": {"features": 6144}}
RESNET = {"torchvision": "resnet18", "kwargs": {"num_classes": 10}}


def spec(model: dict, **sections) -> dict:
    """A one-trial spec: two steps, plain SGD (no optimizer state) unless the test names another."""
    d = {
        "model": model,
        "optimizer": {"name": "sgd", "kwargs": {"momentum": 0.0}},
        "search": {"steps": 2},
        "device": "cpu",
    }
    d.update(sections)
    return d


def run_trial(d: dict, batch: int, tmp_path) -> dict:
    """One trial in a fresh child under the CPU cap; its ``result`` event (which must say 'fits')."""
    result = run_one_trial(d, batch, tmp_path, BUDGET)
    assert result["applied"], result
    return result


SETUPS: dict[str, tuple[dict, int]] = {
    "mlp": (spec(MLP, input={"shape": [32]}, target={"classes": 10}), MLP_BATCH),
    "mlp_checkpointed": (
        spec(MLP, input={"shape": [32]}, target={"classes": 10}, training={"gradient_checkpointing": True}),
        MLP_BATCH,
    ),
    "mlp_inference": (spec(MLP, input={"shape": [32]}, target={"classes": 10}, training={"mode": "inference"}),
                      MLP_BATCH),
    "linear_sgd": (spec(LINEAR, input={"shape": [6144]}, target={"classes": 6144}), 4),
    # amsgrad: a third state tensor, which shows only if the kwargs reach the optimizer.
    "linear_adam": (
        spec(LINEAR, input={"shape": [6144]}, target={"classes": 6144},
             optimizer={"name": "adam", "kwargs": {"fused": True, "amsgrad": True}}),
        4,
    ),
    "linear_fp16_mixed": (
        spec(LINEAR, input={"shape": [6144]}, target={"classes": 6144}, training={"precision": "fp16-mixed"}), 4
    ),
    "linear_bf16_mixed": (
        spec(LINEAR, input={"shape": [6144]}, target={"classes": 6144}, training={"precision": "bf16-mixed"}), 4
    ),
    "linear_bf16_true": (
        spec(LINEAR, input={"shape": [6144]}, target={"classes": 6144}, training={"precision": "bf16-true"}), 4
    ),
    "lm_short": (
        spec({"factory": "models:tiny_lm"}, input={"shape": [32], "dtype": "int64", "high": 1000},
             target={"task": "language_modeling"}),
        16,
    ),
    "lm_long": (
        spec({"factory": "models:tiny_lm"}, input={"shape": [256], "dtype": "int64", "high": 1000},
             target={"task": "language_modeling"}),
        16,
    ),
    "eval_heavy": (spec({"factory": "models:eval_heavy", "kwargs": {"features": 512}},
                        input={"shape": [512]}, target={"classes": 10}), 2048),
    "eval_heavy_with_eval": (
        spec({"factory": "models:eval_heavy", "kwargs": {"features": 512}}, input={"shape": [512]},
             target={"classes": 10}, training={"eval_pass": True}),
        2048,
    ),
    # channels_last and cudnn_benchmark share their trials: both on in one, both off in the other.
    "resnet_on": (
        spec(RESNET, input={"shape": [3, 32, 32]}, target={"classes": 10},
             training={"channels_last": True, "cudnn_benchmark": True}),
        4,
    ),
    "resnet_off": (
        spec(RESNET, input={"shape": [3, 32, 32]}, target={"classes": 10},
             training={"channels_last": False, "cudnn_benchmark": False}),
        4,
    ),
    "compiled": (
        spec({"factory": "models:compiled_only"}, input={"shape": [16]}, target={"classes": 10},
             training={"compile": True, "compile_backend": "aot_eager"}),
        4,
    ),
}


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """``trial(name)``: the result of SETUPS[name], measured once per module."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            d, batch = SETUPS[name]
            cache[name] = run_trial(copy.deepcopy(d), batch, tmp_path_factory.mktemp(name))
            result = cache[name]
            print(f"{name}: budget_peak {result['budget_peak_bytes'] / MiB:.1f} MiB, "
                  f"base {result['base_bytes'] / MiB:.1f} MiB, applied {result['applied']}")
        return cache[name]

    return get


def above_base(result: dict) -> int:
    """What the step adds above the weights, gradients and optimizer state (and the imports)."""
    return result["budget_peak_bytes"] - result["base_bytes"]


def peaks(*results: dict) -> list[str]:
    return [f"peak {r['budget_peak_bytes'] / MiB:.1f} MiB, base {r['base_bytes'] / MiB:.1f} MiB" for r in results]


# --------------------------------------------------------------------------- memory options


def test_gradient_checkpointing_lowers_the_peak(trial):
    plain, checkpointed = trial("mlp"), trial("mlp_checkpointed")
    assert checkpointed["applied"]["checkpointing"] == "blocks"
    assert checkpointed["applied"]["checkpointed_blocks"] >= 2
    assert plain["applied"]["checkpointing"] is None
    # Measured: ~1180 vs ~930 MiB in all, ~310 vs ~50 MiB above the weights.
    assert checkpointed["budget_peak_bytes"] < 0.85 * plain["budget_peak_bytes"], peaks(plain, checkpointed)
    assert above_base(checkpointed) < 0.5 * above_base(plain), peaks(plain, checkpointed)


def test_adam_keeps_state_that_plain_sgd_does_not(trial):
    sgd, adam = trial("linear_sgd"), trial("linear_adam")
    # Adam with amsgrad keeps three state tensors the size of the 144 MiB of weights (exp_avg,
    # exp_avg_sq, max_exp_avg_sq); SGD with momentum 0 keeps none. Measured: ~1580 vs ~1150 MiB.
    # Were the kwargs dropped, it would be 288 MiB either way (Adam without amsgrad; SGD's default
    # momentum 0.9 keeps a buffer): below the bound.
    assert adam["budget_peak_bytes"] - sgd["budget_peak_bytes"] > 350 * MiB, peaks(sgd, adam)
    assert adam["base_bytes"] - sgd["base_bytes"] > 350 * MiB, peaks(sgd, adam)


def test_optimizer_kwargs_reach_the_optimizer(trial, write_spec):
    # fused Adam exists on the CPU: the trial fits, with amsgrad's state (see above) ...
    assert trial("linear_adam")["applied"]["mode"] == "train"
    # ... and a keyword the optimizer does not take is refused before any trial.
    d = spec({"factory": f"{MODELS}:big_linear", "kwargs": {"features": 64}}, input={"shape": [64]},
             target={"classes": 64},
             optimizer={"name": "adam", "kwargs": {"lr": 0.001, "betas_typo": [0.9, 0.99]}})
    run = run_cli("run", str(write_spec(d)))
    assert run.returncode == 2, run.stderr
    assert "optimizer.kwargs" in run.stderr
    assert "betas_typo" in run.stderr
    assert run.json["stop_reason"] == "bad_spec"  # every stop prints its document (issue 56)


def test_inference_needs_far_less_than_training_at_the_same_batch(trial):
    train, inference = trial("mlp"), trial("mlp_inference")
    assert inference["applied"]["mode"] == "inference"
    assert inference["applied"]["grad_scaler"] is False
    assert inference["applied"]["loss_dtype"] is None  # no loss, no backward
    # No saved activations, no gradients: the inference step adds a fraction of what training adds.
    # Measured: ~850 vs ~1190 MiB in all, ~70 vs ~310 MiB above the weights.
    assert above_base(inference) < 0.4 * above_base(train), peaks(train, inference)
    assert inference["budget_peak_bytes"] < 0.85 * train["budget_peak_bytes"], peaks(train, inference)


def test_the_language_model_peak_grows_with_the_sequence_length(trial):
    short, long = trial("lm_short"), trial("lm_long")
    # Logits (batch, sequence, vocabulary) in float32 and their float copy for the loss, and attention
    # (batch, heads, sequence, sequence). Measured: ~190 vs ~25 MiB above the weights.
    assert above_base(long) > 2 * above_base(short), peaks(short, long)
    assert long["budget_peak_bytes"] - short["budget_peak_bytes"] > 40 * MiB, peaks(short, long)


def test_the_eval_pass_runs_and_its_peak_counts(trial):
    without, with_eval = trial("eval_heavy"), trial("eval_heavy_with_eval")
    assert with_eval["applied"]["eval_pass"] is True
    assert with_eval["eval_seconds"] is not None and with_eval["eval_seconds"] >= 0
    assert without["applied"]["eval_pass"] is None and without.get("eval_seconds") is None
    # eval_heavy's evaluation forward runs 16 copies of the batch (32768 rows of 512 floats, 64 MiB a
    # tensor): far above the training step. Measured: ~190 vs ~50 MiB above the weights.
    assert with_eval["budget_peak_bytes"] - without["budget_peak_bytes"] > 80 * MiB, peaks(without, with_eval)
    assert above_base(with_eval) > 2.5 * above_base(without), peaks(without, with_eval)


# --------------------------------------------------------------------------- precision


def test_fp32_trains_in_float32(trial):
    applied = trial("linear_sgd")["applied"]
    assert applied["precision"] == "fp32"
    assert applied["weights_dtype"] == applied["output_dtype"] == applied["loss_dtype"] == "float32"
    assert applied["grad_scaler"] is False


def test_fp16_mixed_autocasts_to_float16_with_a_grad_scaler(trial):
    applied = trial("linear_fp16_mixed")["applied"]
    assert applied["precision"] == "fp16-mixed"
    assert applied["output_dtype"] == "float16"
    assert applied["weights_dtype"] == "float32"  # mixed: the master weights stay in float32
    assert applied["grad_scaler"] is True


def test_bf16_mixed_autocasts_to_bfloat16_without_a_scaler(trial):
    applied = trial("linear_bf16_mixed")["applied"]
    assert applied["precision"] == "bf16-mixed"
    assert applied["output_dtype"] == "bfloat16"
    assert applied["weights_dtype"] == "float32"
    assert applied["grad_scaler"] is False


def test_bf16_true_halves_the_weights(trial):
    fp32, bf16 = trial("linear_sgd"), trial("linear_bf16_true")
    assert bf16["applied"]["weights_dtype"] == "bfloat16"
    assert bf16["applied"]["output_dtype"] == "bfloat16"
    assert bf16["applied"]["grad_scaler"] is False
    # Weights and gradients: 2 x 144 MiB in float32, half that in bfloat16.
    # Measured: ~1000 vs ~1150 MiB. (The peaks are alike: converting the built float32 model to bfloat16
    # holds both copies for a moment.)
    assert fp32["base_bytes"] - bf16["base_bytes"] > 100 * MiB, peaks(fp32, bf16)


# --------------------------------------------------------------------------- the other levers


def test_channels_last_converts_the_model_and_the_batch(trial):
    on, off = trial("resnet_on")["applied"], trial("resnet_off")["applied"]
    assert on["channels_last"] is True and on["input_channels_last"] is True
    assert off["channels_last"] is False and not off.get("input_channels_last")


def test_cudnn_benchmark_is_set_as_asked(trial):
    assert trial("resnet_on")["applied"]["cudnn_benchmark"] is True
    assert trial("resnet_off")["applied"]["cudnn_benchmark"] is False


def test_compile_runs_the_model_through_torch_compile(trial):
    # compiled_only raises when its forward runs eagerly: that it fits shows the compiled graph ran.
    result = trial("compiled")
    assert result["applied"]["compiled"] is True
    assert result["compile_seconds"] is not None and result["compile_seconds"] >= 0
    assert trial("linear_sgd").get("compile_seconds") is None
    assert trial("linear_sgd")["applied"]["compiled"] is None
