"""Issue 46, part 2: the data loop is the user's. A collate_fn that builds big batches (a decoded volume a sample):
isoprobe's maximum is the edge of a plain ``for x, y in DataLoader(...)`` loop in a fresh process under the same
cap, where the previous batch is still bound while the next one is collated.

Before, a trial collated its batch once, before the first step: no previous batch beside it, and no gradients or
optimizer state yet. The plain loop here is the truth: nothing of isoprobe runs in it (``plain_edge.environment``
writes out the trial's memory settings), and it is bisected one fresh process per batch.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import yaml

from conftest import REPO, TESTS, run_cli

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
import plain_edge  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402


VOLUMES = TESTS / "data" / "volumes.py"
BUDGET = "1.25GiB"
STEPS = 3

#: The user's loop: a DataLoader over the dataset with their collate_fn (no workers), the classic step.
LOOP = r"""
import importlib.util, json, sys
config = json.loads(sys.argv[1])
try:
    import torch
    import torch.nn.functional as F
    spec = importlib.util.spec_from_file_location("volumes", config["volumes"])
    volumes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(volumes)
    dataset = volumes.Volumes()
    model = volumes.volume_model()
    optimizer = torch.optim.Adam(model.parameters())
    loader = torch.utils.data.DataLoader(dataset, batch_size=config["batch"], collate_fn=volumes.decode_collate,
                                         drop_last=True)
    step = 0
    while step < config["steps"]:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            outputs = model(x)
            loss = F.cross_entropy(outputs, y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == config["steps"]:
                break
except (MemoryError, torch.OutOfMemoryError):
    sys.exit(3)
except RuntimeError as error:
    sys.exit(3 if "can't allocate memory" in str(error) or "Cannot allocate memory" in str(error) else 1)
"""


def _plain_fits(spec, batch: int, budget: int) -> bool:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    run = subprocess.run([sys.executable, "-c", LOOP, json.dumps({"volumes": str(VOLUMES), "batch": batch,
                                                                   "steps": STEPS})],
                         env=plain_edge.environment(spec), preexec_fn=cap, capture_output=True, text=True, cwd="/")
    assert run.returncode in (0, 3), run.stderr[-3000:]
    return run.returncode == 0


def _spec(tmp_path, lifetime: str | None = None) -> str:
    spec = {
        "model": {"factory": f"{VOLUMES}:volume_model"},
        "data": {"dataset": f"{VOLUMES}:Volumes", "collate_fn": f"{VOLUMES}:decode_collate"},
        "target": {"classes": 10},
        "optimizer": {"name": "adam"},
        "search": {"steps": STEPS, "trial_timeout": 300, "steady_steps": 0},
        "device": "cpu",
        "memory_budget": BUDGET,
        "recommendation": {"soak_steps": 0},
    }
    if lifetime:
        spec["training"] = {"input_lifetime": lifetime}
    path = tmp_path / "volumes.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_big_batch_collate_gets_the_edge_of_the_users_own_dataloader_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = _spec(tmp_path)
    run = run_cli("run", path, "--no-cache", timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    assert {t["applied"]["input_lifetime"] for t in run.json["trials"] if t.get("applied")} == {"through_next_batch"}
    spec = load_spec(path)
    assert _plain_fits(spec, maximum, spec.memory_budget), f"the user's loop runs out at isoprobe's maximum {maximum}"
    assert not _plain_fits(spec, maximum + 1, spec.memory_budget), f"the user's loop trains {maximum + 1} too"
    # A loop that reuses one batch fits more: the shape the spec says is the one measured.
    once = run_cli("run", _spec(tmp_path, "one_batch"), "--no-cache", timeout=900)
    assert once.returncode == 0, once.stderr
    assert once.json["max_batch_size"] > maximum
