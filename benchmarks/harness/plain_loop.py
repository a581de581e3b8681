"""Does an answer hold in a plain training loop? Re-run its batches with a hand-written step.

    python benchmarks/harness/plain_loop.py SPEC.yaml RESULT.json [--steps N]

For the result's maximum, the batch above it and the recommended batch, runs
one trial each in a fresh process under the same cap, with ``plain_step``
below as the spec's ``model.step``: the loop of the classic batch-size
article, written out (``outputs = model(inputs); loss = criterion(outputs,
targets); loss.backward(); optimizer.step()``), so ``outputs`` lives through
the backward pass and into the next forward. Prints each outcome, and whether
the result holds there: the maximum and the recommended batch fit, the batch
above the maximum does not.

This is the check behind training.output_lifetime: a result probed with
``through_backward`` (the default) holds here; one probed with
``freed_before_backward`` is for loops that free the output before backward,
and may not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from isoprobe.executors import Conditions  # noqa: E402
from isoprobe.executors.local import run_once  # noqa: E402
from isoprobe.pipeline.classify import classify_exit  # noqa: E402
from isoprobe.protocol.messages import TrialRequest  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402


#: The loop's variables. In ``for x, y in loader: outputs = model(x); ...`` the names ``outputs`` and
#: ``loss`` outlive the iteration: the previous step's are released only when the next forward has
#: returned and the name is rebound. A step written as a function would free them at its return.
loop: dict = {}


def plain_step(model, optimizer, batch, device):
    """One iteration of a plain loop. Language models (3-d outputs) predict the next token."""
    import torch.nn.functional as F

    inputs, targets = batch
    optimizer.zero_grad()
    loop["outputs"] = model(inputs)
    outputs = loop["outputs"]
    if outputs.dim() == 3:
        loss = F.cross_entropy(outputs[:, :-1].reshape(-1, outputs.shape[-1]), targets[:, 1:].reshape(-1))
    else:
        loss = F.cross_entropy(outputs, targets)
    loop["loss"] = loss
    del outputs, loss
    loop["loss"].backward()
    optimizer.step()


def outcome(spec, batch: int, steps: int, budget: int | None, workdir: Path) -> str:
    request = TrialRequest(spec=spec, batch_size=batch, device="cpu", memory_budget_bytes=budget,
                           python_path=[str(Path(__file__).resolve().parent)], steps=steps)
    run = run_once(request, Conditions(backend="cpu", memory_limit=budget), timeout=1800, workdir=workdir)
    return classify_exit(run).outcome.value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("result")
    parser.add_argument("--steps", type=int, default=None, help="steps per trial (default: the spec's search.steps)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    result = json.loads(Path(args.result).read_text())
    if result["device"]["backend"] != "cpu":
        sys.exit("plain_loop.py re-runs CPU results (the cap is the CPU backend's)")
    plain = spec.model_copy(update={"model": spec.model.model_copy(update={"step": "plain_loop:plain_step"})})
    budget = result["device"]["memory_budget_bytes"]
    steps = args.steps or spec.search.steps
    maximum, recommended = result["max_batch_size"], result["recommended_batch_size"]
    expected = {maximum: "fits", maximum + 1: "out_of_memory"}
    if recommended is not None:
        expected[recommended] = "fits"
    holds = True
    with tempfile.TemporaryDirectory(prefix="plain-loop-") as workdir:
        for batch in sorted(expected):
            got = outcome(plain, batch, steps, budget, Path(workdir))
            holds &= got == expected[batch]
            print(f"batch {batch:>6}: {got:<14} (the result says {expected[batch]})", flush=True)
    lifetime = result["spec"]["training"]["output_lifetime"]
    print(f"{args.result} (output_lifetime {lifetime}): {'holds' if holds else 'does NOT hold'} in a plain loop")
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
