"""The trial's step holds the previous output exactly as long as a plain loop's ``outputs = model(x)`` does.

A plain loop rebinds ``outputs`` as the forward pass returns: the previous
step's output is released before this step's loss is computed. Held until
after the loss instead, a language model whose loss copies its logits peaked
3.3 MiB above the plain loop and its edge fell a sample short (lm-head: 100
against 101, ``benchmarks/studies/edge_table.py``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from isoprobe.child.core import workload  # noqa: E402
from isoprobe.child.core.training import Step  # noqa: E402
from isoprobe.spec.model import Spec  # noqa: E402

MODELS = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "support" / "models.py")


def step_for(lifetime: str) -> Step:
    spec = Spec.model_validate({"model": {"factory": f"{MODELS}:big_linear", "kwargs": {"features": 4}},
                                "input": {"shape": [4]}, "target": {"classes": 4}, "optimizer": {"name": "sgd"},
                                "training": {"output_lifetime": lifetime}, "device": "cpu"})
    return Step(spec, torch.nn.Linear(4, 4), torch.device("cpu"), [])


@pytest.mark.parametrize(("lifetime", "held"), [("through_backward", [True, True]),
                                                 ("freed_before_backward", [False, False])])
def test_the_output_is_held_from_the_moment_the_forward_returns(monkeypatch, lifetime, held):
    step = step_for(lifetime)
    at_loss = []
    real = workload.loss_of

    def loss_of(spec, output, targets):
        at_loss.append(step._held is output)  # this step's output, not the previous one's, nor nothing
        return real(spec, output, targets)

    monkeypatch.setattr(workload, "loss_of", loss_of)
    batch = step.batch(2)
    step.run(batch)
    step.run(batch)
    assert at_loss == held
