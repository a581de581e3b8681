"""Stale answers from the cache on the job's own command (issue 56, item 5): a config reached through a symbolic link
that is then moved to another target, and a file read by C++ (``torch.from_file``).

Each test probes a small command, probes again (a hit: nothing changed), makes its change, and probes again: that
must be a probe, not the cached answer. Against the code before the fix, both were answered from the cache: the
trials reported a read's real path only (``configs/v1/config.json``, still as probed after the link moved), and
``torch.from_file`` opens its file in C++, where the shim's audit hook on ``open`` sees nothing.

CPU backend, a tiny model, one trial at batch 1 (capped there), no steady stepping or soak: a probe is one trial.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli

#: Its width comes from a config read through a link (before torch) and a factor read by torch.from_file.
SCRIPT = '''
import json, sys
with open("configs/current/config.json") as handle:     # configs/current -> v1: a link in a parent folder
    config = json.load(handle)
import torch
factor = torch.from_file("factor.bin", size=1, dtype=torch.float32)   # read in C++: no open() in Python
width = int(config["width"] * factor.item())
model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = int(sys.argv[-1])
while True:
    optimizer.zero_grad()
    model(torch.randn(batch, 8)).sum().backward()
    optimizer.step()
'''


@pytest.fixture
def project():
    folder = Path(tempfile.mkdtemp(prefix="ip-cl-", dir="/tmp"))
    (folder / "train.py").write_text(SCRIPT)
    for version, width in (("v1", 16), ("v2", 2048)):
        (folder / "configs" / version).mkdir(parents=True)
        (folder / "configs" / version / "config.json").write_text(json.dumps({"width": width}))
    (folder / "configs" / "current").symlink_to("v1")
    (folder / "factor.bin").write_bytes(struct.pack("f", 1.0))
    (folder / "tmp").mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def probe(project: Path):
    run = run_cli("run", "--format", "json", "--memory-budget", "1536MiB", "--set", "search.start_batch_size=1",
                  "--set", "search.max_batch_size=1", "--set", "search.steady_steps=0", "--set", "search.cycle_steps=0",
                  "--set", "recommendation.soak_steps=0", "--", sys.executable, "train.py", "{batch_size}",
                  cwd=project, cache_dir=project / "cache", env={"TMPDIR": str(project / "tmp"),
                                                                 "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def probed_again_after(project: Path, edit) -> str:
    """Probe, probe again (a hit), ``edit``, probe: a new probe, not a hit; its stderr."""
    first = probe(project).json
    assert first["cache"]["hit"] is False and first["trials"]
    assert probe(project).json["cache"]["hit"] is True
    edit()
    edited = probe(project)
    assert edited.json["cache"]["hit"] is False and edited.json["trials"], "the change was answered from the cache"
    return edited.stderr


def test_a_config_read_through_a_link_that_is_moved_to_another_target_is_a_new_probe(project):
    def move():
        (project / "configs" / "current").unlink()
        (project / "configs" / "current").symlink_to("v2")

    stderr = probed_again_after(project, move)
    real = project.resolve() / "configs"
    assert (f"{real / 'current' / 'config.json'} changed since it was probed (a symbolic link on its path leads to "
            f"{real / 'v2' / 'config.json'} now, not to {real / 'v1' / 'config.json'}); probing again") in stderr


def test_a_file_read_by_torch_from_file_is_a_new_probe_when_edited(project):
    stderr = probed_again_after(project, lambda: (project / "factor.bin").write_bytes(struct.pack("f", 128.0)))
    assert f"{project.resolve() / 'factor.bin'} changed since it was probed; probing again" in stderr
