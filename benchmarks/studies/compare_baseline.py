"""isoprobe against the in-process baseline, on real specs, side by side in one run.

Run (from the repository root, with the package installed):

    python benchmarks/studies/compare_baseline.py specs/small-cnn.yaml specs/resnet50.yaml
    python benchmarks/studies/compare_baseline.py specs/small-cnn.yaml --variants guided,cold,doubling

For each spec it runs ``isoprobe run SPEC`` (one process per trial) and then
``benchmarks/harness/baseline_loop.py`` (one process for all trials: double until OOM,
bisect, ``gc.collect()`` and cache emptying between trials) under the same
memory cap and on the same device as isoprobe used. It prints, for each: trials
(to the edge, and in all), wall seconds, the answer, and isoprobe/baseline
ratios. isoprobe's extra runs (the confirmation of the maximum and the
recommended batch's check or soak) are counted in its total and its wall time;
"to answer" is the wall time less the recommendation's own trial (which the
baseline does not do), the figure issue 18 compares.

``--save DIR`` keeps every run's JSON (isoprobe's full result included).

Variants of isoprobe (``--variants``, default ``guided``): ``guided`` (the
spec's settings: on the CPU backend every trial forked from the fork server),
``spawned`` (``search.fork_server: false``: spawned trials with a warm spare),
``cold`` (``fork_server: false, warm_start: false``: every trial imports torch
itself), ``doubling`` (``search.strategy: doubling``), ``once``
(``search.confirmations: 0``: every batch runs once, the baseline's level of
checking; the recommended batch is still run), ``no-estimate``
(``search.estimate: false``: the search starts at the start batch, as before
the traced estimate). With ``guided``
and ``cold`` both run, it prints what the faster start saved per trial, batch by
batch. The numbers are measurements of this machine at this moment: run the
variants in one invocation to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from isoprobe.spec.load import load_spec  # noqa: E402
from isoprobe.executors.processes import child_environment, prepare_child  # noqa: E402

VARIANTS = {
    "guided": {},
    "spawned": {"fork_server": False, "warm_start": True},
    "cold": {"fork_server": False, "warm_start": False},
    "doubling": {"strategy": "doubling"},
    "once": {"confirmations": 0},
    "no-estimate": {"estimate": False},
}
#: Trials that are not steps towards the edge: the confirmation of the maximum, and the recommendation's.
EXTRA_PURPOSES = ("confirmation", "recommendation_check", "soak")
#: The recommendation's own trial: its seconds are reported as their own figure (issue 18), not in the
#: wall time compared with the baseline, which recommends nothing.
RECOMMENDATION_PURPOSES = ("recommendation_check", "soak")


def run_isoprobe(spec_path: Path, variant: str, device: str | None) -> dict:
    """``isoprobe run`` on the spec, or on a copy (next to it, so relative factories resolve) with the variant's settings."""
    settings = VARIANTS[variant]
    path = spec_path
    if settings:
        raw = yaml.safe_load(spec_path.read_text())
        raw.setdefault("search", {}).update(settings)
        path = spec_path.with_name(f".{spec_path.stem}.{variant}.benchmark.yaml")
        path.write_text(yaml.safe_dump(raw))
    command = ["isoprobe", "run", str(path), "--no-cache"] + (["--device", device] if device else [])
    try:
        began = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.monotonic() - began
    finally:
        if path != spec_path:
            path.unlink(missing_ok=True)
    if not done.stdout.strip():
        raise SystemExit(f"isoprobe printed no result for {spec_path} ({variant}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    trials = result["trials"]
    return {
        "name": f"isoprobe ({variant})",
        "max": result["max_batch_size"],
        "first_failing": result["first_failing_batch_size"],
        "to_edge": sum(t["purpose"] not in EXTRA_PURPOSES for t in trials),
        "total": len(trials),
        "wall": wall,
        "recommendation_seconds": sum(t["seconds"] for t in trials if t["purpose"] in RECOMMENDATION_PURPOSES),
        "batches": [t["batch_size"] for t in trials],
        "trials": trials,
        "result": result,
        "prediction": result.get("prediction"),
    }


def run_baseline(spec_path: Path, result: dict) -> dict:
    """The in-process loop in one child process, capped like isoprobe's trials were."""
    spec = load_spec(spec_path)
    device = result["device"]
    backend = device["backend"]
    budget = device["memory_budget_bytes"]
    request = {
        "spec": spec.model_dump(mode="json"),
        "device": "cpu" if backend == "cpu" else f"cuda:{device['index'] or 0}",
        "memory_budget_bytes": budget,
        "python_path": [str(spec_path.resolve().parent)],
    }
    with tempfile.TemporaryDirectory(prefix="isoprobe-baseline-") as scratch:
        request_path = Path(scratch) / "request.json"
        request_path.write_text(json.dumps(request))
        env = child_environment(os.environ, backend=backend, allocator=spec.allocator,
                                events_path=Path(scratch) / "unused")
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "harness" / "baseline_loop.py"), str(request_path)],
            capture_output=True, text=True, env=env,
            preexec_fn=prepare_child(budget if backend == "cpu" else None, os.getpid()),
        )
        wall = time.monotonic() - began
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the baseline failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    found = json.loads(lines[-1])
    return {
        "name": "in-process baseline",
        "max": found["max_batch_size"],
        "first_failing": found["first_failing_batch_size"],
        "to_edge": len(found["trials"]),
        "total": len(found["trials"]),
        "wall": wall,
        "batches": [t["batch_size"] for t in found["trials"]],
        "trials": found["trials"],
    }


def report(spec_path: Path, runs: list[dict], baseline: dict) -> None:
    device = runs[0]["result"]["device"]
    budget = device["memory_budget_bytes"]
    cap = f", budget {budget / 2**30:.2f} GiB" if budget else ""
    print(f"\n== {spec_path}  ({device['backend']}: {device['name']}{cap})")
    print(f"  {'run':<26} {'trials to edge':>14} {'all trials':>10} {'wall s':>8} {'to answer s':>11}   "
          "answer (max/first failing)")
    for run in runs + [baseline]:
        answer_wall = run["wall"] - run.get("recommendation_seconds", 0.0)
        print(f"  {run['name']:<26} {run['to_edge']:>14} {run['total']:>10} {run['wall']:>8.1f} {answer_wall:>11.1f}   "
              f"{run['max']}/{run['first_failing']}   batches {run['batches']}")
    for run in runs:
        answer_wall = run["wall"] - run["recommendation_seconds"]
        print(f"  ratio {run['name']} / baseline: trials to edge {run['to_edge'] / baseline['to_edge']:.2f}, "
              f"all trials {run['total'] / baseline['total']:.2f}, wall {run['wall'] / baseline['wall']:.2f}, "
              f"wall to the answer {answer_wall / baseline['wall']:.2f} (the recommendation's trial "
              f"{run['recommendation_seconds']:.1f} s on its own)"
              + ("" if run["max"] == baseline["max"] else f"  (answers differ: {run['max']} vs {baseline['max']})"))
        prediction = run.get("prediction") or {}
        if prediction.get("predicted_max") is not None:
            print(f"  estimate of {run['name']}: predicted {prediction['predicted_max']} against {run['max']} "
                  f"measured (error {prediction['error']:+.1%}), traced in {prediction['seconds']:.1f} s")
        elif prediction:
            print(f"  estimate of {run['name']}: none ({prediction.get('note')})")
    by_variant = {run["name"]: run for run in runs}
    warm, cold = by_variant.get("isoprobe (guided)"), by_variant.get("isoprobe (cold)")
    if warm and cold:
        cold_by_key = {(t["batch_size"], t["purpose"]): t for t in cold["trials"]}
        saved = [cold_by_key[(t["batch_size"], t["purpose"])]["seconds"] - t["seconds"]
                 for t in warm["trials"] if t["warm_start"] and (t["batch_size"], t["purpose"]) in cold_by_key]
        if saved:
            print(f"  warm start: {len(saved)} trials ran in both; each was faster warm by median "
                  f"{statistics.median(saved):.2f} s (min {min(saved):.2f}, max {max(saved):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--variants", default="guided", help="comma-separated: guided, spawned, cold, doubling, once, no-estimate")
    parser.add_argument("--device", help="override the specs' device (cpu, cuda, cuda:N)")
    parser.add_argument("--save", type=Path, help="folder to write every run's JSON into")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    for spec_path in args.specs:
        runs = [run_isoprobe(spec_path, variant, args.device) for variant in variants]
        baseline = run_baseline(spec_path, runs[0]["result"])
        report(spec_path, runs, baseline)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            for run in runs + [baseline]:
                name = run["name"].replace(" ", "-").replace("(", "").replace(")", "")
                (args.save / f"{spec_path.stem}.{name}.json").write_text(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()
