"""training.eval_grad reaches the evaluation pass: the forward runs under the context the spec names.

inference_mode and no_grad keep different things (inference tensors cannot be saved for a later backward);
an evaluation trial that ignored the field would answer for the other one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from isoprobe.child.core import workload  # noqa: E402
from isoprobe.child.core.training import Step  # noqa: E402
from isoprobe.spec.model import Spec  # noqa: E402

MODELS = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "support" / "models.py")


@pytest.mark.parametrize(("eval_grad", "inference"), [("no_grad", False), ("inference_mode", True)])
def test_the_evaluation_forward_runs_under_the_spec_s_context(monkeypatch, eval_grad, inference):
    spec = Spec.model_validate({"model": {"factory": f"{MODELS}:big_linear", "kwargs": {"features": 4}},
                                "input": {"shape": [4]}, "target": {"classes": 4}, "optimizer": {"name": "sgd"},
                                "training": {"eval_pass": True, "eval_grad": eval_grad}, "device": "cpu"})
    step = Step(spec, torch.nn.Linear(4, 4), torch.device("cpu"), [])
    seen = []
    real = workload.forward_only

    def forward_only(*args, **kwargs):
        seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(workload, "forward_only", forward_only)
    step.evaluate(step.batch(2))
    assert seen == [(False, inference)]
