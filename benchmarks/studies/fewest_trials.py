"""Trials and CPU seconds to the answer, before and after issue 49 ("a proof in the fewest trials"), side by side.

Each case runs once under each source tree given (``--tree LABEL=PATH``: a checkout of isoprobe, e.g. a git worktree
of the commit before the issue), alternating which goes first from case to case, with the product's defaults (no
cache, no forced start: the search opens where the estimate or the start puts it, one OpenMP thread). Counted: the
search's trials (``search`` and ``long_run``: the edge's proof), every trial, the answer and the first failing
batch, and the CPU seconds of the whole probe (isoprobe and every process it waited for). Prints one markdown
table; ``--json FILE`` keeps every number.

    git worktree add --detach /tmp/before a57b5c3
    python benchmarks/studies/fewest_trials.py --tree before=/tmp/before --tree after=. --json out.json
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

COMMANDS = Path("tests") / "commands"
BIN = Path(sys.executable).parent

#: (name, the run's arguments after ``isoprobe run``). A command's budget is the one its own edge was measured at
#: (docs/measurements.md, "The job's own command").
CASES = [
    ("specs/small-cnn.yaml", ["specs/small-cnn.yaml"]),
    ("specs/resnet50.yaml", ["specs/resnet50.yaml"]),
    ("held-out convnet (peers)", ["benchmarks/specs/heldout/convnet-plain.yaml"]),
    ("plain_loop.py, 1 GiB", ["--memory-budget", "1GiB", "--", sys.executable, str(COMMANDS / "plain_loop.py"),
                              "--batch-size", "{batch_size}", "--max-steps", "100000"]),
    ("torchrun ddp_train.py, 895 MiB", ["--memory-budget", "895MiB", "--", str(BIN / "torchrun"), "--standalone",
                                        "--nproc-per-node", "2", str(COMMANDS / "ddp_train.py"), "--batch-size",
                                        "{batch_size}", "--max-steps", "100000"]),
    ("lightning_cli.py, 1085 MiB", ["--memory-budget", "1085MiB", "--", sys.executable,
                                    str(COMMANDS / "lightning_cli.py"), "fit", "--data.batch_size", "{batch_size}",
                                    "--trainer.max_steps", "100000"]),
    ("hf_trainer_script.py, 1152 MiB", ["--memory-budget", "1152MiB", "--", sys.executable,
                                        str(COMMANDS / "hf_trainer_script.py"), "--per_device_train_batch_size",
                                        "{batch_size}", "--max_steps", "100000", "--output_dir",
                                        "/tmp/isoprobe-bench-hf-out", "--report_to", "none", "--save_strategy", "no",
                                        "--use_cpu", "--disable_tqdm", "true"]),
    ("accelerate_script.py, 1028 MiB", ["--memory-budget", "1028MiB", "--", str(BIN / "accelerate"), "launch",
                                        "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                                        "--dynamo_backend", "no", "--cpu", str(COMMANDS / "accelerate_script.py"),
                                        "--batch-size", "{batch_size}", "--max-steps", "100000"]),
]


def probe(tree: Path, arguments: list[str]) -> dict:
    """One probe of ``arguments`` with the isoprobe of ``tree``, run from that tree."""
    with tempfile.TemporaryDirectory(prefix="isoprobe-fewest-") as scratch:
        env = {**os.environ, "TMPDIR": scratch, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", "--no-cache", "--format", "json", *arguments],
                              capture_output=True, text=True, env=env, cwd=tree)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout) if done.stdout.strip() else {}
    trials = result.get("trials", [])
    search = [t for t in trials if t["purpose"] in ("search", "long_run")]
    return {"returncode": done.returncode, "answer": result.get("max_batch_size"),
            "first_failing": result.get("first_failing_batch_size"),
            "search_trials": len(search), "trials": len(trials),
            "sequence": [(t["batch_size"], t["purpose"], t["outcome"], t.get("steady_rule") is not None)
                         for t in search],
            "predicted": (result.get("prediction") or {}).get("predicted_max"),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "wall_s": round(wall, 1), "message": result.get("message"), "stderr_tail": done.stderr[-800:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH",
                        help="a source tree to run (twice or more: the columns, in this order)")
    parser.add_argument("--only", nargs="*", help="case names containing any of these words (default: all)")
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    trees = [(label, Path(path).resolve()) for label, path in (t.split("=", 1) for t in args.tree)]
    cases = [c for c in CASES if not args.only or any(word in c[0] for word in args.only)]
    rows = []
    for index, (name, arguments) in enumerate(cases):
        order = trees if index % 2 == 0 else list(reversed(trees))
        row = {"case": name}
        for label, tree in order:
            row[label] = probe(tree, arguments)
            print(f"{name} [{label}]: {json.dumps(row[label]['sequence'])} -> {row[label]['answer']} "
                  f"({row[label]['cpu_s']} CPU s)", file=sys.stderr, flush=True)
        rows.append(row)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    labels = [label for label, _ in trees]
    print("| case | " + " | ".join(f"{label}: search trials (all) | {label}: answer / first failing | "
                                    f"{label}: CPU s" for label in labels) + " |")
    print("|---|" + "---|---|---|" * len(labels))
    for row in rows:
        cells = []
        for label in labels:
            r = row[label]
            cells += [f"{r['search_trials']} ({r['trials']})", f"{r['answer']} / {r['first_failing']}",
                      f"{r['cpu_s']}"]
        print(f"| {row['case']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
