"""Stale answers from the cache on the job's own command (issue 47): an edit that changes the true edge is a new probe.

Each test probes a small command twice (the second must answer from the cache: the edit-free rerun is still a hit),
edits one thing the command depends on, and probes again: that must not be the cached answer. Each edit is one the
cache did not see before (checked against the code before the fix), each through a different way in:

- a config the script reads before it imports torch (the shim's audit hook started only with torch's optimizers);
- a launcher script run as the executable (``./wrapper.sh {batch_size}``: the key skipped the command's first word);
- a data folder named in the arguments, read by DataLoader workers (folders were not keyed; workers never reported
  what they read);
- a data folder named nowhere in the command, read by DataLoader workers alone (only the workers' reads tell).

CPU backend, a tiny model, one trial at batch 1 (capped there), no steady stepping or soak: a probe is one trial.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli


#: A tiny training loop: its width comes from the config (read before torch), an argument or its data files.
SCRIPT = '''
import json, os, sys
with open("config.json") as handle:          # before torch: what the shim could not see
    config = json.load(handle)
import torch
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, folder):
        self.paths = sorted(os.path.join(folder, name) for name in os.listdir(folder))
    def __len__(self):
        return 64
    def __getitem__(self, index):
        with open(self.paths[index % len(self.paths)]) as handle:   # in a DataLoader worker
            return torch.full((int(handle.read().split()[0]),), 0.5)

args = sys.argv[1:]
batch = int(args[-1])
folder = args[args.index("--data") + 1] if "--data" in args else config.get("data", "data")
width = int(config["width"])
loader = DataLoader(Files(folder), batch_size=batch, num_workers=2, persistent_workers=True)
model = torch.nn.Sequential(torch.nn.LazyLinear(width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
'''


@pytest.fixture
def project():
    """A command's folder: the script, its config and a data folder of 8 sample files. Short, under /tmp: a
    DataLoader worker's socket path under TMPDIR may not pass 107 bytes (tests/integration/test_command.py)."""
    folder = Path(tempfile.mkdtemp(prefix="ip-cc-", dir="/tmp"))
    (folder / "train.py").write_text(SCRIPT)
    (folder / "config.json").write_text('{"width": 16}')
    (folder / "data").mkdir()
    for i in range(8):
        (folder / "data" / f"{i}.txt").write_text("32\n")
    (folder / "tmp").mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def probe(project: Path, *command: str):
    run = run_cli("run", "--format", "json", "--memory-budget", "1536MiB", "--set", "search.start_batch_size=1",
                  "--set", "search.max_batch_size=1", "--set", "search.steady_steps=0",
                  "--set", "recommendation.soak_steps=0", "--", *command, cwd=project, cache_dir=project / "cache",
                  env={"TMPDIR": str(project / "tmp"), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.json


def widen(folder: Path) -> None:
    """Every sample rewritten in place, 128 times larger: the true edge moves."""
    for sample in folder.iterdir():
        sample.write_text("4096\n")


def probed_again_after(project: Path, edit, *command: str) -> None:
    """Probe, probe again (a hit, the same key), ``edit``, probe: a new probe (not a hit)."""
    first = probe(project, *command)
    assert first["cache"]["hit"] is False and first["trials"]
    again = probe(project, *command)
    assert again["cache"]["hit"] is True and again["cache"]["key"] == first["cache"]["key"]
    edit()
    edited = probe(project, *command)
    assert edited["cache"]["hit"] is False and edited["trials"], "the edit was answered from the cache"


def test_a_config_read_before_torch_is_imported_is_a_new_probe_when_edited(project):
    """The script opens config.json before ``import torch``: the shim's hook must see it from the interpreter's
    start (it started with torch's optimizer module, and the edit was answered from the cache)."""
    config = project / "config.json"
    probed_again_after(project, lambda: config.write_text('{"width": 2048}'),
                       sys.executable, "train.py", "{batch_size}")


def test_an_edited_launcher_script_run_as_the_command_is_a_new_probe(project):
    """``./wrapper.sh {batch_size}``: the launcher is the command's first word, a user's file, not an installed
    program, so it is keyed (the key skipped the first word)."""
    wrapper = project / "wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" train.py --data data "$1"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)

    def edit():  # the job now trains on another folder of larger samples
        shutil.copytree(project / "data", project / "wide")
        widen(project / "wide")
        wrapper.write_text(wrapper.read_text().replace("--data data", "--data wide"))

    probed_again_after(project, edit, "./wrapper.sh", "{batch_size}")


def test_an_edited_data_folder_named_in_the_arguments_is_a_new_probe(project):
    """``--data data``: the folder is keyed by its listing, so a sample rewritten in place (larger) is a new probe;
    only the DataLoader workers read its files."""
    probed_again_after(project, lambda: widen(project / "data"), sys.executable, "train.py", "--data", "data",
                       "{batch_size}")


def test_an_edited_data_file_only_dataloader_workers_read_is_a_new_probe(project):
    """The data folder is named nowhere in the command (the script's default): only the workers' reads tell the
    cache about its files, so the workers must report them (they never step, and never did)."""
    probed_again_after(project, lambda: widen(project / "data"), sys.executable, "train.py", "{batch_size}")
    entry = probe(project, sys.executable, "train.py", "{batch_size}")
    assert entry["cache"]["hit"] is True
    read = [path for path in entry["sources"] if path.startswith(str((project / "data").resolve()))]
    assert read, entry["sources"]  # the workers' reads: the entry's sources (each file: fewer than 17 were read)
