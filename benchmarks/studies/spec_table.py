"""Run ``isoprobe run`` on each given spec and print one table: the answer, the trials, the time.

This is how the shipped specs' numbers in docs/measurements.md were produced::

    python benchmarks/studies/spec_table.py specs/*.yaml
    python benchmarks/studies/spec_table.py specs/gpt2-small-lm.yaml --memory-budget 6GiB
    python benchmarks/studies/spec_table.py specs/*.yaml --save /tmp/table   # also keep each result JSON

Each spec runs as a user runs it (the installed CLI, a fresh process), one after the other,
so that the trials do not share the CPU. The estimate traced before the first trial
(``prediction``) is shown with its error against the measured maximum. What a spec's trials really ran with (precision,
channels_last, checkpointed blocks...) is read from the result's ``applied`` and shown in the
last column, so the table shows the options took effect. Not a test: times depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _isoprobe() -> list[str]:
    script = Path(sys.executable).parent / "isoprobe"
    found = str(script) if script.exists() else shutil.which("isoprobe")
    return [found] if found else [sys.executable, "-m", "isoprobe"]


def _applied_summary(result: dict) -> str:
    fitting = [t for t in result.get("trials", []) if t.get("outcome") == "fits" and t.get("applied")]
    if not fitting:
        return "-"
    applied = fitting[-1]["applied"]
    parts = [applied.get("mode") or "", applied.get("precision") or ""]
    if applied.get("output_dtype"):
        parts.append(f"out {applied['output_dtype']}")
    if applied.get("grad_scaler"):
        parts.append("GradScaler")
    if applied.get("channels_last"):
        parts.append("channels_last")
    if applied.get("checkpointing"):
        parts.append(f"checkpointing {applied['checkpointing']} ({applied.get('checkpointed_blocks')})")
    if applied.get("compiled"):
        parts.append("compiled")
    if applied.get("cudnn_benchmark"):
        parts.append("cudnn.benchmark")
    if applied.get("eval_pass"):
        parts.append("eval pass")
    return ", ".join(p for p in parts if p)


def _predicted(result: dict) -> str:
    """The traced estimate's maximum and its error against the measured one, or why there was none."""
    prediction = result.get("prediction") or {}
    if prediction.get("predicted_max") is None:
        return f"none ({prediction['note']})" if prediction.get("note") else "-"
    return f"{prediction['predicted_max']} ({prediction['error']:+.1%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--memory-budget", default=None, help="passed to every run")
    parser.add_argument("--save", default=None, help="folder to keep each result JSON in")
    args = parser.parse_args()
    rows = []
    for spec in args.specs:
        command = [*_isoprobe(), "run", spec, "--no-cache"]  # a probe is what is measured
        if args.memory_budget:
            command += ["--memory-budget", args.memory_budget]
        started = time.monotonic()
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - started
        try:
            result = json.loads(run.stdout)
        except ValueError:
            print(f"{spec}: exit {run.returncode}, no result\n{run.stderr[-2000:]}", file=sys.stderr)
            rows.append((spec, "-", "-", "-", "-", "-", f"{seconds:.1f}", f"exit {run.returncode}"))
            continue
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            (Path(args.save) / (Path(spec).stem + ".json")).write_text(run.stdout)
        device = result.get("device") or {}
        budget = device.get("capacity_bytes")
        where = f"{device.get('backend', '-')} ({budget / 1024**3:.2f} GiB)" if budget else device.get("backend", "-")
        rows.append((
            spec,
            where,
            str(result.get("max_batch_size")),
            str(result.get("first_failing_batch_size")),
            _predicted(result),
            str(len(result.get("trials", []))),
            f"{seconds:.1f}",
            _applied_summary(result),
        ))
        print(f"{spec}: exit {run.returncode}: {result.get('message')} ({seconds:.1f} s)", file=sys.stderr, flush=True)
    header = ("Spec", "Backend (capacity)", "Max batch", "First failing", "Estimate (error)", "Trials", "Seconds",
              "Applied (last fitting trial)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
