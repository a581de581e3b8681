"""podman for the container tier: the flags every command needs here, and the image's run arguments.

Every podman command gets ``--runtime runc`` and explicit ulimits (measured, ../shared/notes/containers.md:
crun refuses this machine's hybrid cgroup layout; the runtime cannot copy the host's rlimits). A module of
its own (not conftest.py) so that the tests can import it by a name no other folder uses.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

REQUIRE = os.environ.get("ISOPROBE_REQUIRE_CONTAINER") == "1"
IMAGE_ENV = "ISOPROBE_CONTAINER_IMAGE"
BUILD_SCRIPT = REPO / "tests" / "container" / "build_image.sh"
DEFAULT_IMAGE = "localhost/isoprobe:test"
RUNTIME = ("--runtime", "runc")
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def unavailable(reason: str):
    """Skip with the reason, or fail with it where the container tier is required (CI)."""
    if REQUIRE:
        pytest.fail(f"ISOPROBE_REQUIRE_CONTAINER=1 but the container tier cannot run: {reason}", pytrace=False)
    pytest.skip(f"no container image: {reason}")


def podman(*args: str, timeout: float = 300, check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
    """``podman --runtime runc ARGS``, output captured as text."""
    done = subprocess.run(
        ["podman", *RUNTIME, *args], capture_output=True, text=True, timeout=timeout, input=input,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def run_args(image: str, *args: str, volumes: tuple[str, ...] = (), detach: bool = False, name: str | None = None):
    """``podman run`` arguments for the image as a user runs it (its own entrypoint and user), plus our flags."""
    command = ["run", *LIMITS]
    if detach:
        command.append("-d")
    else:
        command.append("--rm")
    if name:
        command += ["--name", name]
    for volume in volumes:
        command += ["-v", volume]
    return [*command, image, *args]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(predicate, timeout: float, every: float = 0.5):
    """Poll ``predicate`` until it returns something true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()
