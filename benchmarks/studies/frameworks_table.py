"""Lightning's and Hugging Face's in-process batch-size finders beside isoprobe's two paths: one model, one cap, one run.

    OMP_NUM_THREADS=1 python benchmarks/studies/frameworks_table.py [--budget BYTES] [--auto-find-from 128]
        [--start 16] [--survive 50] [--json FILE]

Issue 27's "Done when" table. The model is tests/support/hf_trainers.py's tiny GPT-2, trained two ways:
by a Hugging Face Trainer (``benchmarks/specs/frameworks/hf_trainer.yaml``: ``build_trainer``) and by
``trainer.fit`` of a LightningModule with the same model, data, loss, optimizer, clipping and
precision (``benchmarks/specs/frameworks/frameworks_lightning.yaml``: ``frameworks_models.py:LitGPT2``). For each:

- the in-process finder, in one fresh process under the cap, as its documentation runs it:
  ``Tuner.scale_batch_size(mode="binsearch")`` (what ``BatchSizeFinder`` runs; from the spec's
  ``search.start_batch_size``) and ``auto_find_batch_size=True`` (Accelerate's
  ``find_executable_batch_size``, from ``--auto-find-from``);
- isoprobe, as a user runs it: ``python -m isoprobe run SPEC --no-cache --memory-budget BYTES``;
- the loop's true edge: a plain fresh process per batch (the loop and nothing of isoprobe),
  doubling from ``--start`` then bisecting;
- whether each answer trains ``--survive`` steps in a fresh plain process of its own loop.

Every process runs under the same ``RLIMIT_DATA`` cap and malloc setting, at one OpenMP thread
(set here for everything this starts: with two, the plain edge moves by a sample between runs).
The logic is the two harnesses' (benchmarks/harness/lightning_edge.py, benchmarks/harness/hf_trainer_edge.py),
imported, not repeated. The table is printed as markdown on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS / "harness"))
os.environ["OMP_NUM_THREADS"] = "1"  # before anything starts a process: every trial inherits it

import hf_trainer_edge as hf  # noqa: E402
import lightning_edge as lit  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402 - the parent reads the specs; no trial imports isoprobe

LIGHTNING_SPEC = BENCHMARKS / "specs" / "frameworks" / "frameworks_lightning.yaml"
HF_SPEC = BENCHMARKS / "specs" / "frameworks" / "hf_trainer.yaml"
VERSIONS = ("torch", "lightning", "transformers", "accelerate")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed(label: str, run):
    """Run one measurement, saying when it starts and how long it took (the table's times are measured inside)."""
    say(f"-- {label} ...")
    started = time.perf_counter()
    out = run()
    say(f"-- {label}: {out} ({time.perf_counter() - started:.1f} s)")
    return out


def measure(budget: int, auto_from: int, start: int, survive: int) -> dict:
    """Every number of the table, in the order they are measured."""
    lightning, trainer = load_spec(str(LIGHTNING_SPEC)), load_spec(str(HF_SPEC))
    builder, kwargs, steps = trainer.model.hf_trainer, trainer.model.kwargs, trainer.search.steps
    if steps != lightning.search.steps:
        raise SystemExit(f"the two specs' search.steps differ ({lightning.search.steps}, {steps}): one trial each")
    lit.trial_config(lightning, 1)  # refuse an unsupported spec before any process

    def report(loop: str):
        return lambda batch, fit: say(f"   {loop} plain batch {batch:>4}: {'trains' if fit else 'out_of_memory'}")

    rows = {
        "lightning binsearch": timed("Lightning Tuner.scale_batch_size(binsearch)",
                                     lambda: lit.lightning_finder(lightning, budget)),
        "isoprobe lightning": timed("isoprobe run (model.lightning)",
                                    lambda: lit.isoprobe_answer(str(LIGHTNING_SPEC), budget)),
        "auto_find_batch_size": timed(f"auto_find_batch_size from {auto_from}",
                                      lambda: hf.auto_find(builder, kwargs, auto_from, budget, steps)),
        "isoprobe hf_trainer": timed("isoprobe run (model.hf_trainer)",
                                     lambda: lit.isoprobe_answer(str(HF_SPEC), budget)),
    }
    rows["auto_find_batch_size"]["answer"] = rows["auto_find_batch_size"].get("batch")
    rows["auto_find_batch_size"]["trials"] = len(rows["auto_find_batch_size"].get("tried", [])) or None
    edges = {"lightning": timed("Lightning plain edge", lambda: _timed_edge(
                 lambda: lit.edge(lightning, budget, start, report=report("lightning")))),
             "hf": timed("Trainer plain edge", lambda: _timed_edge(
                 lambda: hf.edge(builder, kwargs, budget, steps, start, report=report("hf"))))}
    survives = {"lightning": lambda batch: lit.fits(lightning, batch, budget, survive),
                "hf": lambda batch: hf.trains(builder, kwargs, batch, budget, survive)}
    for name, row in rows.items():
        row["loop"] = "lightning" if name in ("lightning binsearch", "isoprobe lightning") else "hf"
        row["true_edge"] = edges[row["loop"]]["edge"]
        if survive and row["answer"]:
            row["survives"] = timed(f"{name}: {row['answer']} for {survive} steps",
                                    lambda: survives[row["loop"]](row["answer"]))
    return {"budget": budget, "steps": steps, "survive_steps": survive, "auto_find_from": auto_from,
            "start_batch_size": {"lightning": lightning.search.start_batch_size,
                                 "hf": trainer.search.start_batch_size},
            "edges": edges, "rows": rows}


def _timed_edge(find) -> dict:
    started = time.perf_counter()
    return {"edge": find(), "seconds": time.perf_counter() - started}


FINDERS = {
    "lightning binsearch": "Lightning `Tuner.scale_batch_size(mode=\"binsearch\")` (`BatchSizeFinder`)",
    "auto_find_batch_size": "HF `auto_find_batch_size=True` (`find_executable_batch_size`)",
    "isoprobe lightning": "isoprobe, `model.lightning`",
    "isoprobe hf_trainer": "isoprobe, `model.hf_trainer`",
}


def table(measured: dict) -> str:
    """The markdown table, one row per finder, and a line per row on how its answer came about."""
    survive = measured["survive_steps"]
    lines = [f"| finder | loop | answer | true edge | trials | wall s (to the answer, imports included) | "
             f"survives {survive} steps |", "|---|---|---|---|---|---|---|"]
    notes = []
    for name in FINDERS:
        row = measured["rows"][name]
        answer = row["answer"]
        survives = "-" if "survives" not in row else ("yes" if row["survives"] else "no")
        loop = "`trainer.fit`" if row["loop"] == "lightning" else "`Trainer.train()`"
        lines.append(f"| {FINDERS[name]} | {loop} | {answer} | {row['true_edge']} | {row.get('trials') or '-'} | "
                     f"{row['seconds']:.1f} | {survives} |")
        if "tried" in row:
            extra = f" (before its 5 % margin: {row['before_margin']})" if row.get("before_margin", answer) != answer else ""
            notes.append(f"- {FINDERS[name]}: tried {', '.join(map(str, row['tried']))}{extra}.")
        if "recommended" in row:
            notes.append(f"- {FINDERS[name]}: answer = `max_batch_size`; recommended {row['recommended']}.")
        if row.get("error") or row.get("failed"):
            notes.append(f"- {FINDERS[name]}: failed: {(row.get('error') or row.get('failed'))[-300:]!r}")
    for loop, found in measured["edges"].items():
        notes.append(f"- true edge, {'trainer.fit' if loop == 'lightning' else 'Trainer.train()'}: {found['edge']} "
                     f"({found['seconds']:.1f} s of plain processes)")
    return "\n".join(lines + [""] + notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=1280 * 2**20, help="RLIMIT_DATA in bytes (default 1.25 GiB)")
    parser.add_argument("--auto-find-from", type=int, default=128,
                        help="auto_find_batch_size's first batch (Accelerate's default start: 128)")
    parser.add_argument("--start", type=int, default=16, help="the first batch the plain edges try")
    parser.add_argument("--survive", type=int, default=50, help="train each answer this many steps (0: skip)")
    parser.add_argument("--json", metavar="FILE", help="also write every number measured here as JSON")
    args = parser.parse_args()
    started = time.perf_counter()
    measured = measure(args.budget, args.auto_find_from, args.start, args.survive)
    measured["total_seconds"] = time.perf_counter() - started
    command = "OMP_NUM_THREADS=1 python " + shlex.join(["benchmarks/studies/frameworks_table.py", *sys.argv[1:]])
    print(f"command: {command}\ndate: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}\n"
          f"cap: RLIMIT_DATA {args.budget} bytes ({args.budget / 2**20:.0f} MiB), "
          f"MALLOC_MMAP_THRESHOLD_={lit.MALLOC_MMAP_THRESHOLD}, OMP_NUM_THREADS=1, device cpu, "
          f"{measured['steps']} steps a trial\n"
          f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.python_version()}, "
          f"load average at the end {os.getloadavg()[0]:.1f}\n"
          f"versions: {', '.join(f'{name} {importlib.metadata.version(name)}' for name in VERSIONS)}\n"
          f"total: {measured['total_seconds']:.0f} s\n")
    print(table(measured))
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
