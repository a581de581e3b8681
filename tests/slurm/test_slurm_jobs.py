"""isoprobe inside real Slurm jobs (issue 7): batch scripts, a TaskProlog, the shared cache, GPUs.

A single-node cluster from conftest.py runs real jobs as root. The spec is a tiny CPU model
(tests/support/models.py:memory_hog) capped at batch 8, so a probe takes about 15 s on 2 cores; its
answers all differ (max 8, recommended 6, micro-batch 5 x 4 steps = 20), so a variable read
from the wrong field shows. Three probes run in the module (the first job, the TaskProlog on
its own cache, the array on its own cache); every other job reads the cache.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from conftest import MODELS

from .conftest import unavailable


ISOPROBE = shutil.which("isoprobe", path=str(Path(sys.executable).parent)) or shutil.which("isoprobe")
SPEC = {
    "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 262144, "depth": 4}},
    "input": {"shape": [262144]},
    "target": {"classes": 10},
    "optimizer": {"name": "sgd"},
    "search": {"start_batch_size": 2, "max_batch_size": 8, "steps": 2, "confirmations": 0, "trial_timeout": 120},
    "device": "cpu",
    "memory_budget": "1.5GiB",
    "recommendation": {"multiple_of": 3},
    "plan": {"target_global_batch": 20},
}
TRIAL_LINE = re.compile(r"^isoprobe: trial\s+\d+", re.MULTILINE)
# What --format env / taskprolog export, and the result field each comes from.
EXPORTED = {
    "ISOPROBE_MAX_BATCH_SIZE": lambda r: str(r["max_batch_size"]),
    "ISOPROBE_BATCH_SIZE": lambda r: str(r["recommended_batch_size"]),
    "ISOPROBE_STOP_REASON": lambda r: r["stop_reason"],
    "ISOPROBE_MICRO_BATCH_SIZE": lambda r: str(r["accumulation"]["micro_batch_size"]),
    "ISOPROBE_ACCUMULATION_STEPS": lambda r: str(r["accumulation"]["accumulation_steps"]),
    "ISOPROBE_GLOBAL_BATCH_SIZE": lambda r: str(r["accumulation"]["global_batch_size"]),
}


def q(value) -> str:
    return shlex.quote(str(value))


def results_in_log(text: str) -> list[dict]:
    """The result documents --log appended (each starts with a line '{'), in order."""
    decoder, found, offset = json.JSONDecoder(), [], 0
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == "{":
            found.append(decoder.raw_decode(text, offset)[0])
        offset += len(line)
    return found


def variables(text: str, prefix: str = "ISOPROBE_") -> dict[str, str]:
    """NAME=value lines (as ``env`` prints them) into a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith(prefix) and "=" in line)


@pytest.fixture(scope="module")
def work(tmp_path_factory, slurm_cluster):
    """The spec, and a preamble that gives a job this venv's isoprobe and a named cache folder."""
    folder = tmp_path_factory.mktemp("slurm-jobs")
    spec = folder / "spec.yaml"
    spec.write_text(json.dumps(SPEC))  # JSON is YAML
    assert ISOPROBE, "the isoprobe console script is not installed next to this Python"

    def preamble(cache: str, shell: str = "/bin/bash") -> str:
        return (
            f"#!{shell}\n"
            f"export PATH={q(Path(ISOPROBE).parent)}:/usr/bin:/bin\n"
            f"export ISOPROBE_CACHE_DIR={q(folder / 'cache' / cache)}\n"
            f"cd {q(folder)}\n"
        )

    return folder, spec, preamble


@pytest.fixture(scope="module")
def first_job(slurm_cluster, work):
    """A job that probes with an empty shared cache: its JSON result and --log text."""
    folder, spec, preamble = work
    log = folder / "first.log"
    job = slurm_cluster.run(
        preamble("shared") + f"isoprobe run {q(spec)} --format json --log {q(log)} > first.json\n",
        timeout=300,
    )
    assert job.state == "COMPLETED", job.describe()
    return json.loads((folder / "first.json").read_text()), log.read_text(), job


def test_the_cluster_runs_jobs_and_steps(slurm_cluster):
    """The fixture itself: a batch job, an srun step inside it, and a standalone srun."""
    job = slurm_cluster.run("hostname\nsrun --ntasks=1 sh -c 'echo step $SLURM_STEP_ID on $SLURMD_NODENAME'\n")
    assert job.state == "COMPLETED", job.describe()
    assert "step 0 on isonode" in job.stdout
    done = slurm_cluster.command("srun", "-N1", "sh", "-c", "echo $SLURM_JOB_ID")
    assert done.stdout.strip().isdigit()
    assert slurm_cluster.bring_up_seconds < 10


def test_a_task_prolog_sets_values_verbatim(slurm_cluster):
    """What --format taskprolog relies on: Slurm takes the rest of an export line as the value.

    Quotes are kept (no shell parses the line), '$' is not expanded, other lines are ignored, and
    'print' lines go to the task's stdout. The prolog runs before the batch step and before each
    srun step's tasks; a step sees what the batch step's prolog exported.
    """
    prolog = (
        "#!/bin/sh\n"
        "echo \"export SQ='a b'\"\n"
        "echo 'export PLAIN=c d'\n"
        "echo 'export DOLLAR=$HOME'\n"
        "echo 'not an instruction'\n"
        "echo 'print hello from the prolog'\n"
        "echo \"export STEP_SEEN=${STEP_SEEN:-none}+${SLURM_STEP_ID:-batch}\"\n"
    )
    script = (
        "printf '[%s] [%s] [%s] [%s]\\n' \"$SQ\" \"$PLAIN\" \"$DOLLAR\" \"$STEP_SEEN\"\n"
        "srun sh -c 'echo \"step [$STEP_SEEN]\"'\n"
    )
    with slurm_cluster.task_prolog(prolog):
        job = slurm_cluster.run(script)
    assert job.state == "COMPLETED", job.describe()
    lines = job.stdout.splitlines()
    assert "[\'a b\'] [c d] [$HOME] [none+batch]" in lines, job.describe()
    assert "step [none+batch+0]" in lines, job.describe()
    assert lines.count("hello from the prolog") == 2, job.describe()


@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/dash"])
def test_a_batch_script_evals_the_env_output(slurm_cluster, work, first_job, shell):
    """(a) eval "$(isoprobe run SPEC --format env)" in bash and in dash: the values are the JSON's."""
    if not Path(shell).exists():
        pytest.skip(f"{shell} is not installed")
    folder, spec, preamble = work
    result, _, _ = first_job
    names = list(EXPORTED)
    script = (
        preamble("shared", shell)
        + f"exports=$(isoprobe run {q(spec)} --format env) || exit 9\n"
        + 'eval "$exports"\n'
        + "".join(f'echo "{name}=${name}"\n' for name in names)
        + "srun sh -c 'echo \"STEP_BATCH_SIZE=$ISOPROBE_BATCH_SIZE\"'\n"
    )
    job = slurm_cluster.run(script, timeout=300)
    assert job.state == "COMPLETED", job.describe()
    got = variables(job.stdout)
    assert got == {name: EXPORTED[name](result) for name in names}, job.describe()
    assert f"STEP_BATCH_SIZE={result['recommended_batch_size']}" in job.stdout.splitlines()
    assert (got["ISOPROBE_MAX_BATCH_SIZE"], got["ISOPROBE_BATCH_SIZE"]) == ("8", "6")  # the spec's answer


def test_a_task_prolog_probes_and_exports_to_the_job(slurm_cluster, work, first_job):
    """(b) TaskProlog = isoprobe run --format taskprolog --log: the job's tasks get ISOPROBE_*.

    Its own cache, so the batch step's prolog really probes (about 15 s) and the srun step's
    prolog answers from the cache.
    """
    folder, spec, preamble = work
    result, _, _ = first_job
    log = folder / "taskprolog.log"
    prolog = preamble("taskprolog", "/bin/sh") + f"exec isoprobe run {q(spec)} --format taskprolog --log {q(log)}\n"
    script = "env | grep ^ISOPROBE_ | sort\nsrun sh -c 'echo STEP_$(env | grep ^ISOPROBE_BATCH_SIZE=)'\n"
    with slurm_cluster.task_prolog(prolog):
        job = slurm_cluster.run(script, timeout=300)
    assert job.state == "COMPLETED", job.describe() + "\n--- log\n" + (log.read_text() if log.exists() else "")
    got = variables(job.stdout)
    for name, field in EXPORTED.items():
        assert got.get(name) == field(result), (name, job.describe())  # unquoted: TaskProlog keeps quotes
    assert got["ISOPROBE_CACHE_HIT"] == "0"
    assert f"STEP_ISOPROBE_BATCH_SIZE={result['recommended_batch_size']}" in job.stdout.splitlines()
    logged = results_in_log(log.read_text())
    assert [r["cache"]["hit"] for r in logged] == [False, True]  # batch step probed, the srun step hit
    assert logged[0]["environment"]["slurm_job_id"] == job.job_id


def test_a_task_prolog_that_cannot_probe_falls_back_instead_of_failing_the_job(slurm_cluster, work):
    """Hook mode: with --fallback-batch-size a bad spec still exits 0; the job runs with the fallback.

    Without it, the TaskProlog's non-zero exit fails the job (Slurm's rule), and the node stays up.
    """
    folder, _, preamble = work
    bad = folder / "bad-spec.yaml"
    bad.write_text("model: {torchvision: resnet18}\n")  # no input section: a bad spec, exit 2
    log = folder / "fallback.log"
    hook = preamble("fallback", "/bin/sh") + f"exec isoprobe run {q(bad)} --format taskprolog --log {q(log)}"
    with slurm_cluster.task_prolog(hook + " --fallback-batch-size 16\n"):
        job = slurm_cluster.run("env | grep ^ISOPROBE_ | sort\n")
    assert job.state == "COMPLETED", job.describe()
    got = variables(job.stdout)
    assert (got["ISOPROBE_BATCH_SIZE"], got["ISOPROBE_FALLBACK"], got["ISOPROBE_ANSWERED"]) == ("16", "1", "0")
    assert any(line.startswith("isoprobe: ") and "16" in line for line in job.stdout.splitlines()), job.stdout  # print
    assert "16" in log.read_text()
    with slurm_cluster.task_prolog(hook + "\n"):
        failed = slurm_cluster.run("echo the job body ran\n")
    assert failed.state == "FAILED", failed.describe()
    assert "the job body ran" not in failed.stdout
    assert "TaskProlog failed" in failed.stderr
    for _ in range(50):  # the node stays in service (a failing Prolog, by contrast, drains it)
        node = slurm_cluster.command("sinfo", "-h", "-N", "-n", slurm_cluster.node, "-o", "%T").stdout.strip()
        if node == "idle":
            break
        time.sleep(0.1)
    assert node == "idle"


def test_a_second_job_answers_from_the_shared_cache(slurm_cluster, work, first_job):
    """(c) Same spec, same ISOPROBE_CACHE_DIR: cache.hit, no trial runs, seconds instead of a probe."""
    folder, spec, preamble = work
    first, first_log, _ = first_job
    assert first["cache"]["hit"] is False
    assert len(TRIAL_LINE.findall(first_log)) == len(first["trials"]) > 0
    log = folder / "second.log"
    script = (
        preamble("shared")
        + "start=$(date +%s%N)\n"
        + f"isoprobe run {q(spec)} --format json --log {q(log)} > second.json\n"
        + 'echo "rc=$? ms=$(( ($(date +%s%N) - start) / 1000000 ))"\n'
    )
    job = slurm_cluster.run(script)
    assert job.state == "COMPLETED", job.describe()
    rc, ms = re.search(r"rc=(\d+) ms=(\d+)", job.stdout).groups()
    second = json.loads((folder / "second.json").read_text())
    assert rc == "0"
    assert second["cache"]["hit"] is True
    assert second["cache"]["key"] == first["cache"]["key"]
    assert second["cache"]["stored_at"] == first["cache"]["stored_at"]
    assert second["trials"] == first["trials"]  # the stored trials, not new ones
    assert second["max_batch_size"] == first["max_batch_size"]
    assert second["recommended_batch_size"] == first["recommended_batch_size"]
    text = log.read_text()
    assert not TRIAL_LINE.search(text), text  # no trial ...
    assert "importing torch" not in text, text  # ... and no child process either
    assert int(ms) < 5000, f"a cache hit took {ms} ms"


def test_a_gpu_job_records_its_devices(slurm_cluster, work):
    """(d) --gres=gpu:fake:1: the job gets CUDA_VISIBLE_DEVICES and the result's environment has it."""
    if not slurm_cluster.gpus:
        unavailable("no fake GPUs: creating the device files (mknod) was refused")
    folder, spec, preamble = work
    script = (
        preamble("shared")
        + 'echo "CVD=${CUDA_VISIBLE_DEVICES-unset} JOB_GPUS=${SLURM_JOB_GPUS-unset}"\n'
        + f"isoprobe run {q(spec)} --format json > gpu-$SLURM_JOB_ID.json\n"
        + f"srun --gres=gpu:fake:1 isoprobe run {q(spec)} --format json > gpu-step-$SLURM_JOB_ID.json\n"
        + f"srun --gres=gpu:fake:1 env -u CUDA_VISIBLE_DEVICES isoprobe run {q(spec)} --format json"
        + " > gpu-slurm-only-$SLURM_JOB_ID.json\n"
    )
    job = slurm_cluster.run(script, timeout=300, gres="gpu:fake:1")
    assert job.state == "COMPLETED", job.describe()
    cvd, job_gpus = re.search(r"CVD=(\S+) JOB_GPUS=(\S+)", job.stdout).groups()
    assert cvd != "unset" and job_gpus != "unset", job.stdout
    batch = json.loads((folder / f"gpu-{job.job_id}.json").read_text())["environment"]
    assert batch["cuda_visible_devices"] == cvd
    assert batch["visible_devices_source"] == "CUDA_VISIBLE_DEVICES"
    assert batch["slurm_job_gpus"] == job_gpus
    assert batch["slurm_job_id"] == job.job_id
    assert batch["slurm_node"] == slurm_cluster.node
    step = json.loads((folder / f"gpu-step-{job.job_id}.json").read_text())["environment"]
    assert step["cuda_visible_devices"] == cvd
    assert step["slurm_step_gpus"] == cvd  # a step that asks for GPUs gets SLURM_STEP_GPUS
    assert step["slurm_job_id"] == job.job_id
    # Where only Slurm names the GPUs (a site or a container that drops CUDA_VISIBLE_DEVICES):
    slurm_only = json.loads((folder / f"gpu-slurm-only-{job.job_id}.json").read_text())["environment"]
    assert slurm_only["cuda_visible_devices"] == cvd
    assert slurm_only["visible_devices_source"] == "SLURM_STEP_GPUS"


def test_a_job_without_gpus_records_none(slurm_cluster, work):
    folder, spec, preamble = work
    job = slurm_cluster.run(preamble("shared") + f"isoprobe run {q(spec)} --format json > nogpu-$SLURM_JOB_ID.json\n", timeout=300)
    assert job.state == "COMPLETED", job.describe()
    environment = json.loads((folder / f"nogpu-{job.job_id}.json").read_text())["environment"]
    assert environment["cuda_visible_devices"] is None
    assert environment["slurm_job_gpus"] is None
    assert environment["slurm_job_id"] == job.job_id


def test_a_job_array_probes_once_for_all_its_tasks(slurm_cluster, work):
    """Two array tasks at once on one fresh cache: one probes, the other waits for its answer."""
    folder, spec, preamble = work
    script = (
        preamble("array")
        + f"isoprobe run {q(spec)} --format json --log array-$SLURM_ARRAY_TASK_ID.log"
        + " > array-$SLURM_ARRAY_TASK_ID.json\n"
    )
    job = slurm_cluster.run(
        script, timeout=300, array="1-2", output=str(folder / "array-%a.out"), error=str(folder / "array-%a.err")
    )
    files = [folder / f"array-{i}.{kind}" for i in (1, 2) for kind in ("err", "log")]
    assert job.state == "COMPLETED", "\n".join(f"--- {f.name}\n{f.read_text()}" for f in files if f.exists())
    results = [json.loads((folder / f"array-{i}.json").read_text()) for i in (1, 2)]
    assert sorted(r["cache"]["hit"] for r in results) == [False, True]
    assert results[0]["cache"]["key"] == results[1]["cache"]["key"]
    assert results[0]["trials"] == results[1]["trials"]
    assert sorted(r["environment"]["slurm_array_task_id"] for r in results) == ["1", "2"]
    trial_lines = [len(TRIAL_LINE.findall((folder / f"array-{i}.log").read_text())) for i in (1, 2)]
    assert sorted(trial_lines) == [0, len(results[0]["trials"])]
