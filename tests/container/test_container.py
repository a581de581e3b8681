"""The project's image, built by podman and run for real (runc): what README's container section promises.

One image per session (``container_image``, tests/container/conftest.py). The shipped small-cnn spec is
the workload (15-30 s on 2 CPU cores); the runs that only need *a* probe in flight or *an* answer from a
mounted spec use it unchanged or capped, never a made-up model. A named volume holds the cache for the
first three tests, in order: a fresh probe, the same probe answered from the volume by a new container,
and that answer `eval`ed by a host shell.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from podman_support import LIMITS, REPO, podman, run_args, unique, wait_for


SHIPPED = "/opt/isoprobe/specs/small-cnn.yaml"


@pytest.fixture(scope="module")
def cache_volume(container_image):
    """A named volume for /cache, shared by the first three tests, removed at the end."""
    name = unique("isoprobe-test-cache")
    podman("volume", "create", name, check=True)
    yield name
    podman("volume", "rm", "-f", name)


@pytest.fixture(scope="module")
def first_run(container_image, cache_volume):
    """The shipped small-cnn spec, CPU backend, as the image's user, into the empty cache volume: (run, JSON)."""
    began = time.monotonic()
    done = podman(*run_args(container_image, "run", SHIPPED, volumes=(f"{cache_volume}:/cache",)), timeout=400)
    done.seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(done.stdout)


def test_shipped_spec_runs_on_cpu_as_uid_1000_and_caches_in_the_volume(container_image, cache_volume, first_run):
    done, result = first_run
    assert result["answered"] is True and result["stop_reason"] == "edge_found", result["message"]
    assert result["device"]["backend"] == "cpu"
    assert result["recommended_batch_size"] >= 8 and result["recommended_batch_size"] % 8 == 0
    assert result["trials"], "a fresh cache must mean a real probe"
    assert result["cache"]["hit"] is False and result["cache"]["path"].startswith("/cache/")
    # The probe itself ran as uid 1000: the cache entry it wrote into the volume is owned by it.
    mountpoint = podman("volume", "inspect", "--format", "{{.Mountpoint}}", cache_volume, check=True).stdout.strip()
    entry = Path(mountpoint) / Path(result["cache"]["path"]).relative_to("/cache")
    assert entry.is_file(), f"no cache entry at {entry}"
    assert (entry.stat().st_uid, entry.stat().st_gid) == (1000, 1000)
    print(f"first run: {done.seconds:.1f} s, {len(result['trials'])} trials: {result['message']}")


def test_the_cache_volume_outlives_the_container(container_image, cache_volume, first_run):
    _, first = first_run
    began = time.monotonic()
    done = podman(*run_args(container_image, "run", SHIPPED, volumes=(f"{cache_volume}:/cache",)), timeout=400)
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(done.stdout)
    assert again["cache"]["hit"] is True, again["message"]
    assert again["cache"]["path"] == first["cache"]["path"]
    assert (again["max_batch_size"], again["recommended_batch_size"]) == (
        first["max_batch_size"], first["recommended_batch_size"])
    print(f"second run (new container, same volume): {seconds:.1f} s, cache hit: {again['message']}")


def test_env_format_is_evaled_by_a_host_shell(container_image, cache_volume, first_run):
    _, first = first_run
    podman_run = " ".join(["podman", "--runtime", "runc", *run_args(
        container_image, "run", SHIPPED, "--format", "env", volumes=(f"{cache_volume}:/cache",))])
    script = f'set -e; eval "$({podman_run})"; echo "$ISOPROBE_BATCH_SIZE $ISOPROBE_CACHE_HIT $ISOPROBE_BACKEND"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(first["recommended_batch_size"]), "1", "cpu"]
    print(f"host shell after eval: ISOPROBE_BATCH_SIZE={done.stdout.split()[0]}")


def test_specs_mounted_read_only_at_specs_with_a_factory_next_to_them(container_image, tmp_path):
    """A relative spec path in the read-only /specs (the working directory); its factory file found beside it.

    The spec is the shipped one capped at 32 (half the trials): the answer 32, capped, is this spec's and
    not the shipped file's (136), so it proves which file was read.
    """
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = yaml.safe_load((REPO / "specs" / "small-cnn.yaml").read_text())
    spec["search"]["max_batch_size"] = 32
    (specs / "capped.yaml").write_text(yaml.safe_dump(spec))
    (specs / "tiny_models.py").write_text((REPO / "specs" / "tiny_models.py").read_text())
    before = sorted(p.name for p in specs.iterdir())
    done = podman(*run_args(container_image, "run", "capped.yaml", volumes=(f"{specs}:/specs:ro",)), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert (result["stop_reason"], result["max_batch_size"]) == ("capped", 32), result["message"]
    assert sorted(p.name for p in specs.iterdir()) == before, "isoprobe wrote into the specs folder"
    print(f"mounted spec: {result['message']}")


def test_podman_stop_mid_probe_gives_the_partial_json_exit_143_and_leaves_nothing(container_image):
    name = unique("isoprobe-test-stop")
    podman(*run_args(container_image, "run", SHIPPED, detach=True, name=name), check=True)
    try:
        def trials_started() -> int:
            logs = podman("logs", name)
            return sum(1 for line in logs.stderr.splitlines() if line.startswith("isoprobe: trial "))

        assert wait_for(lambda: trials_started() >= 2, 120), podman("logs", name).stderr[-3000:]
        # In flight: isoprobe as PID 1 (the init), the probe under it, and a trial's processes under that.
        top = podman("top", name, "pid", "ppid", "user", "hpid", "args", check=True).stdout.splitlines()[1:]
        rows = [line.split(None, 4) for line in top if line.strip()]
        assert len(rows) >= 3, top
        assert {row[2] for row in rows} == {"isoprobe"}, top  # every process as the image's user (uid 1000)
        assert any(row[0] == "1" and "isoprobe" in row[4] for row in rows), top
        assert any("isoprobe.child" in row[4] for row in rows), top  # a trial's process (or its fork server)
        host_pids = [int(row[3]) for row in rows]

        began = time.monotonic()
        stop = podman("stop", "-t", "30", name, timeout=60)
        took = time.monotonic() - began
        assert stop.returncode == 0, stop.stderr
        state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name, check=True).stdout.split()
        assert state == ["exited", "143"], state
        assert took < 25, f"podman stop took {took:.1f} s: isoprobe did not end by itself before the SIGKILL"
        logs = podman("logs", name)
        result = json.loads(logs.stdout)  # one JSON document: anything else fails to parse
        assert result["stop_reason"] == "terminated" and result["answered"] is False
        assert len(result["trials"]) >= 2
        left = [pid for pid in host_pids if _alive(pid)]
        assert not left, f"the container's processes still alive on the host: {left}"
        assert podman("top", name).returncode != 0, "podman top still lists processes of a stopped container"
        print(f"podman stop: {took:.2f} s, exit 143, {len(result['trials'])} trials in the partial JSON, "
              f"{len(rows)} processes before the stop, none after")
    finally:
        podman("rm", "-f", "-v", name)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_the_image_holds_the_torch_and_torchvision_the_other_tiers_test(container_image):
    """build_image.sh pins the image to the releases of the python that runs these tests (the Dockerfile's
    PIP_CONSTRAINT): without the pins the index's newest torch went in (2.15.0 against the host's 2.14.1, whose
    CUDA libraries outgrew a CI machine's disk mid-build). Read from the installed metadata: nothing is imported."""
    from importlib.metadata import version

    script = "from importlib.metadata import version; print(version('torch'), version('torchvision'))"
    done = podman("run", "--rm", *LIMITS, "--entrypoint", "python", container_image, "-c", script, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    host = [version(name).split("+")[0] for name in ("torch", "torchvision")]
    assert [v.split("+")[0] for v in done.stdout.split()] == host, (done.stdout, host)
