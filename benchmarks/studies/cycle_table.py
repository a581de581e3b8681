"""Held-out command scripts, probed with the defaults and checked against the user's own job (issue 55's table).

For each case: ``isoprobe run --no-cache --format json --memory-budget B -- COMMAND`` with nothing else set (the
defaults: the steady rule, the cycle's wait, warm start); its answer, first failing batch, trials, the whole
probe's wall and CPU seconds (the children's, from ``getrusage``) and what the maximum saw of the script's cycle
(``max_cycle``). Then the job as the pre-job hook leaves it (``benchmarks/harness/command_truth.py``'s
``run_once``: the same cap on every process, only what ``isoprobe show --format env`` exports, nothing of isoprobe
in the process): ``--truth-steps`` steps (past the first evaluation of a script that validates) at the maximum,
and above the first failing batch (or the largest marginal one, which fit only inside the spread: the edge's coin
tosses, which the job's own runs also fit in some runs and not in others).

    PYTHONPATH=. python benchmarks/studies/cycle_table.py --json out.json [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMANDS = REPO / "tests" / "commands"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
import command_truth  # noqa: E402

PY = sys.executable
#: (name, budget, command with {batch_size} and {max_steps}): issue 56's shapes, the held-out scripts, then the five of last round.
CASES = [
    *[(f"batch_shapes {mode}", "1GiB", [PY, str(COMMANDS / "batch_shapes.py"), "--mode", mode, "--batch-size",
                                         "{batch_size}", "--max-steps", "{max_steps}"])
      for mode in ("views", "images", "packed")],  # issue 56: shapes issue 47's batch check refused (micro-batches: no edge)
    ("validates_every_k (EMA eval every 12 at 4x)", "1GiB",
     [PY, str(COMMANDS / "validates_every_k.py"), "--batch-size", "{batch_size}", "--max-steps", "{max_steps}",
      "--eval-every", "12"]),
    ("threads_first", "1GiB", [PY, str(COMMANDS / "threads_first.py"), "--batch-size", "{batch_size}",
                               "--max-steps", "{max_steps}"]),
    ("vendored_first", "1GiB", [PY, str(COMMANDS / "vendored_first.py"), "--batch-size", "{batch_size}",
                                "--max-steps", "{max_steps}"]),
    ("batch_at_import (batch_from env)", "1GiB", [PY, str(COMMANDS / "batch_at_import.py"), "--max-steps",
                                                  "{max_steps}"]),
    ("reexec_self", "1GiB", [PY, str(COMMANDS / "reexec_self.py"), "--batch-size", "{batch_size}", "--max-steps",
                             "{max_steps}"]),
    ("plain_loop", "1GiB", [PY, str(COMMANDS / "plain_loop.py"), "--batch-size", "{batch_size}", "--max-steps",
                            "{max_steps}"]),
    ("torchrun ddp_train", "894MiB", [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                                      str(COMMANDS / "ddp_train.py"), "--batch-size", "{batch_size}", "--max-steps",
                                      "{max_steps}"]),
    ("lightning_cli", "1085MiB", [PY, str(COMMANDS / "lightning_cli.py"), "fit", "--data.batch_size", "{batch_size}",
                                  "--trainer.max_steps", "{max_steps}"]),
    ("hf_trainer_script", "1152MiB", [PY, str(COMMANDS / "hf_trainer_script.py"), "--per_device_train_batch_size",
                                      "{batch_size}", "--max_steps", "{max_steps}", "--output_dir",
                                      "/tmp/isoprobe-cycle-hf-out", "--report_to", "none", "--save_strategy", "no",
                                      "--use_cpu", "--disable_tqdm", "true"]),
    ("accelerate launch", "1GiB", [str(BIN / "accelerate"), "launch", "--num_processes", "1", "--num_machines", "1",
                                   "--mixed_precision", "no", "--dynamo_backend", "no", "--cpu",
                                   str(COMMANDS / "accelerate_script.py"), "--batch-size", "{batch_size}",
                                   "--max-steps", "{max_steps}"]),
]


def probe(budget: str, template: list[str], extra: list[str]) -> tuple[dict, float, float, int]:
    command = ["100000" if word == "{max_steps}" else word for word in template]
    if "--batch-size" not in command and not any("{batch_size}" in word for word in command):
        extra = [*extra, "--set", "batch_from=env"]
    with tempfile.TemporaryDirectory(prefix="isoprobe-cycle-") as scratch:
        env = {**os.environ, "TMPDIR": scratch, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([PY, "-m", "isoprobe", "run", "--no-cache", "--format", "json", "--memory-budget",
                               budget, *extra, "--", *command], capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr[-2000:]}
    return result, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, done.returncode


def exported(result: dict) -> dict[str, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(result, handle)
    lines = subprocess.run([PY, "-m", "isoprobe", "show", handle.name, "--format", "env"], capture_output=True,
                           text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    os.unlink(handle.name)
    return command_truth.exports_of(lines)


def marginal(result: dict) -> list[int]:
    """The batches that fit only inside the spread (``edge_margin.marginal``): the edge's coin tosses."""
    return [m["batch_size"] for m in (result.get("edge_margin") or {}).get("marginal", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="a substring of the cases' names")
    parser.add_argument("--truth-steps", type=int, default=30)
    parser.add_argument("--set", action="append", default=[], help="FIELD=VALUE for every probe (isoprobe --set)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    extra = [word for pair in args.set for word in ("--set", pair)]
    rows = []
    for name, budget, template in CASES:
        if args.only and args.only not in name:
            continue
        scripts = [Path(word) for word in template if word.endswith(".py")]
        if not all(script.exists() for script in scripts):  # a held-out script not in this tree
            continue
        result, wall, cpu, code = probe(budget, template, extra)
        row = {"case": name, "budget": budget, "exit": code, "answer": result.get("max_batch_size"),
               "first_failing": result.get("first_failing_batch_size"), "trials": len(result.get("trials", [])),
               "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cycle": result.get("max_cycle"),
               "message": result.get("message", result.get("stderr"))}
        if row["answer"]:
            env = exported(result)
            cap = command_truth.parse_size(budget)
            with tempfile.TemporaryDirectory(prefix="isoprobe-cycle-truth-") as folder:
                above = (row["first_failing"] or max([row["answer"], *marginal(result)])) + 1
                for label, batch in (("at_max", row["answer"]), ("above", above)):
                    # a script that takes its batch from the environment (batch_from: env) gets it there
                    batch_env = {} if any("{batch_size}" in word for word in template) else {
                        "ISOPROBE_BATCH_SIZE": str(batch)}
                    run = command_truth.run_once(template, batch, args.truth_steps, cap, 600, Path(folder),
                                                 exported={**env, **batch_env})
                    row[label] = f"{batch}: {run.outcome}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n| case | answer / first failing | trials | wall s | CPU s | phases seen at the maximum | "
          f"job at max ({args.truth_steps} steps) | job above the first failing |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} ({row['budget']}) | {row['answer']} / {row['first_failing']} | {row['trials']} | "
              f"{row['wall_s']} | {row['cpu_s']} | {row['cycle']} | {row.get('at_max')} | {row.get('above')} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
