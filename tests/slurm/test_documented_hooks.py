"""docs/slurm.md's TaskProlog and its pre-job hook, run as written on two real nodes (issue 56, item 1).

Slurm runs a TaskProlog for every task of every step, the probe's own trial steps included: those tasks carry
``ISOPROBE_SPEC`` and ``SLURM_STEP_ID`` but no ``ISOPROBE_BATCH_SIZE`` yet. The documented prolog started
``isoprobe run`` again in each, which waited for the probe's own cache lock; no rank ever started, and after
2 x 120 s the probe blamed the allocation, the job fell back to 16 4 min 38 s late. Here the snippets are taken
from docs/slurm.md, with only the site's paths replaced (the install, the shared cache and log folders, the
training script), and run in a job of two nodes whose probe is a DDP gang stepping across them; the job then
trains at the answer with one rank on each node.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest

from conftest import MODELS, REPO

from slurm_jobs import PYTHON, write_spec

HARNESS = REPO / "benchmarks" / "harness" / "steady_harness.py"
DOCS = (REPO / "docs" / "slurm.md").read_text()
BUDGET = "1200MiB"
SPEC = {
    "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 65536, "depth": 2}},
    "input": {"shape": [65536]},
    "target": {"classes": 10},
    "optimizer": {"name": "sgd"},
    "search": {"start_batch_size": 2, "max_batch_size": 4, "steps": 2, "confirmations": 0, "steady_steps": 0},
    "recommendation": {"soak_steps": 0},
    "device": "cpu",
    "memory_budget": BUDGET,
    "distributed": {"strategy": "ddp", "world_size": 2},
}


def snippet(after: str, language: str) -> str:
    """The first ```language block of docs/slurm.md after the line ``after``."""
    text = DOCS[DOCS.index(after):]
    found = re.search(rf"```{language}\n(.*?)```", text, re.S)
    assert found, f"no {language} block after {after!r} in docs/slurm.md"
    return found.group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory, two_node_cluster):
    """The site's paths: an install of isoprobe (a wrapper running this tree), a shared cache and a log folder."""
    root = tmp_path_factory.mktemp("documented-hooks")
    install = root / "opt" / "isoprobe" / "bin" / "isoprobe"
    install.parent.mkdir(parents=True)
    install.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(PYTHON)} -m isoprobe \"$@\"\n")
    install.chmod(0o755)
    for name in ("cache", "logs", "runs"):
        (root / name).mkdir()
    return root


def sited(text: str, site: Path) -> str:
    return (text.replace("/opt/isoprobe/bin/isoprobe", str(site / "opt" / "isoprobe" / "bin" / "isoprobe"))
            .replace("/shared/isoprobe-cache", str(site / "cache")).replace("/shared/isoprobe-logs", str(site / "logs"))
            .replace("$HOME/isoprobe-logs", str(site / "logs")))


def training(spec: Path, site: Path) -> str:
    """The user's training step for ``srun python train.py --batch-size "$ISOPROBE_BATCH_SIZE"``: 10 steps of the
    spec's workload, one rank a node, under the spec's budget, by a loop that imports nothing of isoprobe."""
    return (f"{shlex.quote(PYTHON)} {shlex.quote(str(HARNESS))} --slurm-task {shlex.quote(str(spec))} --steps 10 "
            f"--memory-budget {BUDGET} --folder {shlex.quote(str(site / 'runs'))}/$SLURM_JOB_ID --batch")


def trained_on_both_nodes(stdout: str, batch: str) -> bool:
    return all(f"rank {rank} on {node}: batch {batch}, 10 of 10 steps" in stdout for rank, node in ((0, "n1"), (1, "n2")))


def test_the_documented_task_prolog_probes_once_across_two_nodes_and_the_job_trains_at_its_answer(two_node_cluster,
                                                                                                  site):
    prolog = sited(snippet("`/etc/slurm/isoprobe-taskprolog.sh` (executable", "sh"), site)
    assert "ISOPROBE_TRIAL" in prolog and "--format taskprolog" in prolog
    spec = write_spec(site, SPEC, "prolog")
    job_line = snippet("The job then only reads the variables:", "bash")
    assert "srun python train.py --batch-size \"$ISOPROBE_BATCH_SIZE\"" in job_line
    script = (f"mkdir -p {shlex.quote(str(site / 'runs'))}/$SLURM_JOB_ID\n"
              "env | grep '^ISOPROBE_' | sort\n"
              f"srun {training(spec, site)} \"$ISOPROBE_BATCH_SIZE\"\n")
    began = time.monotonic()
    with two_node_cluster.task_prolog(prolog):
        job = two_node_cluster.run(script, timeout=600, nodes=2, ntasks_per_node=1,
                                   export=f"ALL,ISOPROBE_SPEC={spec}")
    seconds = time.monotonic() - began
    log = site / "logs" / f"{job.job_id}.log"
    logged = log.read_text() if log.exists() else "(no log)"
    assert job.state == "COMPLETED", job.describe() + "\n--- log\n" + logged
    said = dict(line.split("=", 1) for line in job.stdout.splitlines() if line.startswith("ISOPROBE_"))
    assert said.get("ISOPROBE_ANSWERED") == "1" and "ISOPROBE_FALLBACK" not in said, job.describe() + logged
    assert said["ISOPROBE_MAX_BATCH_SIZE"] == "4", said
    assert trained_on_both_nodes(job.stdout, said["ISOPROBE_BATCH_SIZE"]), job.describe()
    assert "every trial one Slurm job step" in logged  # the probe's trials were steps across the nodes
    assert "Slurm started no rank" not in logged
    print(f"documented TaskProlog on two nodes: answer {said['ISOPROBE_MAX_BATCH_SIZE']}, batch "
          f"{said['ISOPROBE_BATCH_SIZE']}, job {seconds:.1f} s")


def test_the_documented_pre_job_hook_answers_on_two_nodes_beside_the_task_prolog(two_node_cluster, site):
    prolog = sited(snippet("`/etc/slurm/isoprobe-taskprolog.sh` (executable", "sh"), site)
    hook = snippet("In a job that should train anyway, name a fallback:", "bash")
    assert "--fallback-batch-size 32" in hook and "srun python train.py --batch-size \"$ISOPROBE_BATCH_SIZE\"" in hook
    spec = write_spec(site, SPEC, "hook")
    body = (sited(hook, site).replace("isoprobe run spec.yaml", f"{site / 'opt/isoprobe/bin/isoprobe'} run {spec}")
            .replace("python train.py --batch-size", training(spec, site)))
    script = (f"export ISOPROBE_CACHE_DIR={shlex.quote(str(site / 'cache'))}\n"
              f"mkdir -p {shlex.quote(str(site / 'runs'))}/$SLURM_JOB_ID\n" + body
              + 'echo "hook_max=$ISOPROBE_MAX_BATCH_SIZE hook_batch=$ISOPROBE_BATCH_SIZE '
                'hook_fallback=${ISOPROBE_FALLBACK:-0}"\n')
    with two_node_cluster.task_prolog(prolog):  # the site's prolog is there; this job asks for no probe of its own
        job = two_node_cluster.run(script, timeout=600, nodes=2, ntasks_per_node=1)
    assert job.state == "COMPLETED", job.describe()
    said = dict(word.split("=", 1) for line in job.stdout.splitlines() for word in line.split()
                if word.startswith("hook_"))
    assert said["hook_fallback"] == "0" and said["hook_max"] == "4", job.describe()
    assert trained_on_both_nodes(job.stdout, said["hook_batch"]), job.describe()
