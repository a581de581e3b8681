"""A command started ahead answers what a command started cold answers (issue 55, part 3), on held-out scripts.

With ``search.command_ahead`` (off by default) each trial's ``python SCRIPT`` is started ahead of its trial and waits at the
end of its interpreter's start until it gets the batch (``child/shim/_isoprobe_warm.py``). Issue 49 also imported the
script's installed top-level imports there, and scripts could see it; issue 55 removed that. These four scripts
(tests/commands/, written for this check and never used to tune isoprobe) each depend on something a start ahead
could have changed before their first line:

- ``threads_first.py`` sets ``OMP_NUM_THREADS=2`` before ``import torch`` and holds a scratch copy of the batch per
  torch thread: torch imported ahead (with the environment's ``OMP_NUM_THREADS=1``) would fit larger batches;
- ``vendored_first.py`` puts ``vendored/`` first on ``sys.path`` and imports its fork of the installed ``tqdm``,
  which keeps one more batch alive: the installed ``tqdm`` imported ahead would fit larger batches;
- ``batch_at_import.py`` trains at the batch ``batch_env_module`` read from ``$ISOPROBE_BATCH_SIZE`` at its import
  (probed with ``batch_from: env``, no placeholder): imported ahead, before the batch is set, it would train at 16;
- ``reexec_self.py`` re-executes itself (``os.execv``) at its top, then trains: a second image of one PID.

For each, the same probe runs twice under the same cap, once with warm start on and once with every trial cold
(``search.warm_start=false``), and the answers must be the same batch. Each script also appends to
``$HELDOUT_RECORD`` what it saw at its start, once per image (two lines a trial for the re-exec), so every trial of
both probes is checked to have run the script as a cold start runs it: its batch, torch's threads, the file ``tqdm``
came from, the batch the module read, the re-exec's PID. The caps put each script's steady peak at its maximum
2-3 MiB above the command's floor (at least 1 MiB) and the batch above it 1-3 MiB over the cap (4-7 MiB a sample;
readings move about 0.25 MiB between runs), so the two probes' answers do not differ by a coin toss at the edge.
``search.cycle_steps=0``: the scripts have no evaluation pass to wait for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import REPO, run_cli

COMMANDS = REPO / "tests" / "commands"
VENDORED = COMMANDS / "vendored"
#: What a trial's command asks for steps: more than any trial runs (the trial ends the command, not the script).
LONG_RUN = "100000"


def expected_threads() -> int:
    """torch's threads in a cold interpreter that sets OMP_NUM_THREADS=2 before importing torch, as
    threads_first.py does (2, or fewer on a machine with fewer CPUs: torch caps the variable at them)."""
    code = ("import os; os.environ['OMP_NUM_THREADS'] = '2'; os.environ['MKL_NUM_THREADS'] = '2'\n"
            "import torch; print(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    return int(done.stdout.strip())


def check_threads(records: list[dict], trials: list[dict]) -> None:
    threads = expected_threads()
    assert len(records) == len(trials), (records, [t["batch_size"] for t in trials])
    for record, trial in zip(records, trials):
        assert record["batch"] == trial["batch_size"], (record, trial["batch_size"])
        assert record["threads"] == threads and record["torch_before_first_line"] is False, record


def check_vendored(records: list[dict], trials: list[dict]) -> None:
    assert len(records) == len(trials), (records, [t["batch_size"] for t in trials])
    for record, trial in zip(records, trials):
        assert record["batch"] == trial["batch_size"], (record, trial["batch_size"])
        assert Path(record["tqdm_file"]) == VENDORED / "tqdm" / "__init__.py", record
        assert record["tqdm_before_first_line"] is False, record


def check_batch_at_import(records: list[dict], trials: list[dict]) -> None:
    assert len(records) == len(trials), (records, [t["batch_size"] for t in trials])
    for record, trial in zip(records, trials):
        assert record["batch"] == trial["batch_size"], (record, trial["batch_size"])
        assert record["module_read"] == record["env_now"] == str(trial["batch_size"]), record
        assert record["module_before_first_line"] is False, record


def check_reexec(records: list[dict], trials: list[dict]) -> None:
    assert len(records) == 2 * len(trials), (records, [t["batch_size"] for t in trials])
    for before, after, trial in zip(records[0::2], records[1::2], trials):
        assert (before["stage"], after["stage"]) == ("before_exec", "after_exec"), (before, after)
        assert before["pid"] == after["pid"], (before, after)  # one process, two images
        assert before["argv"] == ["--batch-size", str(trial["batch_size"]), "--max-steps", LONG_RUN], before
        assert after["batch"] == trial["batch_size"] and after["hash_seed"] == "0", after
        assert before["torch_before_first_line"] is False and after["torch_before_first_line"] is False


@dataclass(frozen=True)
class Case:
    script: str
    command: list[str]
    budget: str  # per process: each script's peak at its maximum sits mid-way in the window a sample spans
    start: int  # where the search starts: a few trials below the edge
    options: tuple[str, ...]
    check: Callable[[list[dict], list[dict]], None]


def python_script(name: str, *arguments: str) -> list[str]:
    return [sys.executable, str(COMMANDS / name), *arguments]


CASES = [
    Case("threads_first.py", python_script("threads_first.py", "--batch-size", "{batch_size}", "--max-steps",
                                           LONG_RUN), "1022MiB", 16, (), check_threads),
    Case("vendored_first.py", python_script("vendored_first.py", "--batch-size", "{batch_size}", "--max-steps",
                                            LONG_RUN), "1023MiB", 32, (), check_vendored),
    Case("batch_at_import.py", python_script("batch_at_import.py", "--max-steps", LONG_RUN), "1026MiB", 40,
         ("--set", "batch_from=env"), check_batch_at_import),
    Case("reexec_self.py", python_script("reexec_self.py", "--batch-size", "{batch_size}", "--max-steps", LONG_RUN),
         "1026MiB", 40, (), check_reexec),
]


@pytest.fixture
def scratch():
    """This test's own TMPDIR (the trials' folders), short on purpose, as in test_command.py."""
    folder = Path(tempfile.mkdtemp(prefix="ip-ahead-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def probe(case: Case, scratch: Path, warm: bool):
    """``isoprobe run`` of the case's command with warm start on or off; the result and the script's records."""
    record = scratch / f"record-{'warm' if warm else 'cold'}.jsonl"
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", case.budget,
                   "--set", f"search.start_batch_size={case.start}", "--set", "recommendation.soak_steps=0",
                   "--set", "search.cycle_steps=0", "--set", f"search.warm_start={'true' if warm else 'false'}",
                   "--set", "search.command_ahead=true",
                   *case.options, "--", *case.command, timeout=600, cwd=REPO,
                   env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1", "HELDOUT_RECORD": str(record)})
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return done, records


@pytest.mark.parametrize("case", CASES, ids=[case.script.removesuffix(".py") for case in CASES])
def test_warm_start_on_answers_what_every_trial_started_cold_answers(case, scratch):
    """The same maximum with warm start on as with every trial cold; every trial of both ran the script as a cold
    start runs it (its records); with warm start on, every trial after the first was started ahead, none with it
    off. (With it off, isoprobe's own trial process may still be forked from its fork server, ``trials[].forked``
    and ``warm_start``: the command itself starts when its trial is due, ``started_ahead`` false.)"""
    warm, warm_records = probe(case, scratch, warm=True)
    assert warm.returncode == 0, warm.stderr[-3000:]
    cold, cold_records = probe(case, scratch, warm=False)
    assert cold.returncode == 0, cold.stderr[-3000:]
    on, off = warm.json, cold.json
    print(f"{case.script} under {case.budget}: warm start on {on['max_batch_size']} "
          f"({[(t['batch_size'], t['outcome']) for t in on['trials']]}), off {off['max_batch_size']} "
          f"({[(t['batch_size'], t['outcome']) for t in off['trials']]})")
    assert on["max_batch_size"] is not None and on["max_batch_size"] == off["max_batch_size"], (
        [(t["batch_size"], t["outcome"]) for t in on["trials"]],
        [(t["batch_size"], t["outcome"]) for t in off["trials"]], on["message"], off["message"])
    ahead = {name: [(t["batch_size"], t["started_ahead"]) for t in result["trials"]]
             for name, result in (("on", on), ("off", off))}
    assert all(t["started_ahead"] for t in on["trials"][1:]), ahead
    assert not any(t["started_ahead"] for t in off["trials"]), ahead
    case.check(warm_records, on["trials"])
    case.check(cold_records, off["trials"])
