"""The five command scripts probed on a busy node, warm start on and off, beside the same probes on a quiet one
(issue 55, part 2).

A busy node is made as a shared one is: ``--loops`` CPU-bound processes (``while True: pass``), each in a session of
its own (its own autogroup, as another user's job), running for the whole study. For each of the five command
cases of ``fewest_trials.py`` (the plain loop, torchrun DDP, the LightningCLI script, the HF Trainer script,
``accelerate launch``), ``isoprobe run`` with the command started ahead (``search.command_ahead``, with
``search.warm_start``) and without (``search.warm_start`` false), alternating which goes first,
with the defaults (``--rounds`` rounds); then, with ``--quiet``, the same probes with the loops stopped. Per probe:
the answer, the first failing batch, trials, timed-out trials, the seconds a busy node added to timeouts
(``trials[].busy_seconds``), and the whole probe's wall and CPU seconds.

    PYTHONPATH=. python benchmarks/studies/busy_node_probes.py --loops 6 --rounds 1 --quiet --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from command_ahead_probes import probe  # noqa: E402  (warm start on/off, timed, the children's CPU)
from fewest_trials import CASES  # noqa: E402  (the same commands and budgets)

COMMAND_CASES = [case for case in CASES if "--" in case[1]]
BUSY_LOOP = "while True:\n    pass\n"


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(count)]


def one(label: str, arguments: list[str], mode: str, node: str) -> dict:
    run = probe(arguments, mode)
    result = {"case": label, "node": node, **run}
    print(json.dumps({k: result[k] for k in ("case", "node", "mode", "returncode", "answer", "first_failing",
                                             "trials", "wall_s", "cpu_s")}), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quiet", action="store_true", help="also probe each case with the loops stopped")
    parser.add_argument("--only", help="a substring of the cases to run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    cases = [case for case in COMMAND_CASES if args.only is None or args.only in case[0]]
    rows: list[dict] = []
    loops = busy_loops(args.loops)
    try:
        for round_index in range(args.rounds):
            for index, (label, arguments) in enumerate(cases):
                modes = ("ahead", "cold") if (round_index + index) % 2 == 0 else ("cold", "ahead")
                for mode in modes:
                    rows.append(one(label, arguments, mode, f"busy ({args.loops} loops)"))
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if args.quiet:
        for label, arguments in cases:
            rows.append(one(label, arguments, "ahead", "quiet"))
    print("\n| case | node | warm start | answer / first failing | trials | timed out | busy s added | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['node']} | {'on' if row['mode'] == 'ahead' else 'off'} | "
              f"{row['answer']} / {row['first_failing']} | {row['trials']} | {row.get('timed_out', 0)} | "
              f"{row.get('busy_s', 0)} | {row['wall_s']} | {row['cpu_s']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
