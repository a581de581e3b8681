"""Spec options change what the child really does: each test here fails if the child ignored one."""

from __future__ import annotations

from conftest import MODELS, hog_spec, run_cli


def one_trial_spec(model: dict, **fields) -> dict:
    # One trial at batch 2: nothing to estimate (estimate off: no trace in the environment check).
    spec = hog_spec(start_batch_size=2, max_batch_size=2, confirmations=0, steady_steps=0, estimate=False)
    spec["model"] = model
    spec["recommendation"] |= {"headroom": 0.0}
    spec.update(fields)
    return spec


def test_the_optimizer_named_is_the_one_whose_state_is_measured(write_spec):
    peaks = {}
    for name, kwargs in (("sgd", {"momentum": 0.0}), ("adam", {})):
        spec = one_trial_spec(
            {"factory": f"{MODELS}:big_linear"},
            input={"shape": [4096]},
            target={"classes": 4096},
            optimizer={"name": name, "kwargs": kwargs},
        )
        run = run_cli("run", str(write_spec(spec, f"{name}.yaml")))
        assert run.returncode == 0, run.stderr
        [trial] = run.json["trials"]
        peaks[name] = trial["peak_bytes"]
    # Adam keeps two state tensors the size of the 64 MiB weights; plain SGD keeps none.
    assert peaks["adam"] - peaks["sgd"] > 100 * 1024**2, peaks


def test_integer_inputs_and_a_regression_target_reach_the_child(write_spec):
    spec = one_trial_spec(
        {"factory": f"{MODELS}:embedding_regressor"},
        input={"shape": [32], "dtype": "int64", "high": 1000},
        target={"shape": [4]},
    )
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 0, run.stderr  # float inputs would break the embedding; a CE loss the target
    assert [t["outcome"] for t in run.json["trials"]] == ["fits"]
