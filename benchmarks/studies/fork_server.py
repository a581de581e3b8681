"""How fast a trial starts: forked from the fork server, a warm spare, a cold spawn, side by side.

    python benchmarks/studies/fork_server.py [SPEC.yaml] [--trials N] [--batch B]

Runs N trials of one batch (default: specs/small-cnn.yaml, batch 8, 4 trials)
through the local executor in each of the three ways a probe can start them,
one after the other as a probe does (the environment check first, then the
trials; a warm spare imports while the trial before it runs). For each way it
prints the median *start-to-first-step* time (from the executor's ``run`` to
the child's first completed step, as the child stamped it), the median whole
trial, the CPU time the machine spent (user + system, children included), and
the ratios against the warm spare, measured in this one invocation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from isoprobe.executors.local import LocalExecutor  # noqa: E402
from isoprobe.pipeline.classify import classify_exit  # noqa: E402
from isoprobe.pipeline.environment import inspect_conditions, trial_conditions  # noqa: E402
from isoprobe.protocol.messages import InspectRequest, StepDone, TrialRequest  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402

WAYS = {"forked": {"fork": ("cpu",)}, "warm spare": {"warm": True}, "cold spawn": {}}


def measure(spec, spec_path: Path, way: str, trials: int, batch: int) -> dict:
    budget = spec.memory_budget or 3 * 1024**3
    conditions = trial_conditions(spec, "cpu", budget)
    python_path = [str(spec_path.parent)]
    first_steps, wholes = [], []
    cpu_before = os.times()
    wall = time.monotonic()
    with tempfile.TemporaryDirectory() as folder, LocalExecutor(Path(folder), **WAYS[way]) as executor:
        executor.prestart(conditions)
        executor.run(InspectRequest(spec=spec, python_path=python_path), inspect_conditions(spec),
                     timeout=600, name="inspect")
        for index in range(trials):
            began = time.time()
            run = executor.run(TrialRequest(spec=spec, batch_size=batch, device="cpu", memory_budget_bytes=budget,
                                            python_path=python_path), conditions, timeout=600, name=f"t{index}")
            outcome = classify_exit(run).outcome.value
            steps = [event for event in run.events if isinstance(event, StepDone)]
            if outcome != "fits" or not steps:
                raise SystemExit(f"{way}: trial {index} did not fit ({outcome}); pick a smaller --batch")
            first_steps.append(steps[0].t - began)
            wholes.append(time.time() - began)
    cpu_after = os.times()
    cpu = sum(cpu_after[i] - cpu_before[i] for i in range(4))
    return {"first_step": statistics.median(first_steps), "trial": statistics.median(wholes), "cpu": cpu,
            "wall": time.monotonic() - wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "specs" / "small-cnn.yaml"))
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    path = Path(args.spec).resolve()
    spec = load_spec(path)
    print(f"{path.name}: {args.trials} trials of batch {args.batch} after an environment check, CPU backend, "
          f"{os.cpu_count()} cores")
    results = {way: measure(spec, path, way, args.trials, args.batch) for way in WAYS}
    base = results["warm spare"]
    print(f"{'':12} {'start->1st step':>16} {'trial':>9} {'CPU s':>8} {'wall s':>8}   vs warm spare (1st step, CPU)")
    for way, r in results.items():
        print(f"{way:12} {r['first_step']:15.3f}s {r['trial']:8.3f}s {r['cpu']:8.1f} {r['wall']:8.1f}   "
              f"{r['first_step'] / base['first_step']:.2f}x, {r['cpu'] / base['cpu']:.2f}x")


if __name__ == "__main__":
    main()
