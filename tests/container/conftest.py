"""The project's image, built with podman once per session (or once per CI run), for the tests in this folder.

``container_image`` is the image's name. CI (.ci/run) builds it before pytest starts, with
``tests/container/build_image.sh``, and names it in ``ISOPROBE_CONTAINER_IMAGE``: the ~8 minute build
(torch's wheels) then stays out of the test run's time, and the image is built once per CI run. Without
that variable the fixture runs the same script itself, once per session (root only: debootstrap makes the
base image). Every test here shares the one image (and podman's storage): they run in one xdist worker
(tests/conftest.py's ONE_WORKER).

Without podman the tests skip, with the reason; with ``ISOPROBE_REQUIRE_CONTAINER=1`` (set by .ci/run)
they fail instead, so CI cannot pass without having run them. tests/slurm/conftest.py does the same for
its cluster.

podman's flags and the shared helpers are in podman_support.py.

The leftover-process check in tests/conftest.py sees a container's processes too: rootful podman's conmon
and the container's processes are descendants of pytest (a child subreaper), so a container still running
when its test ends fails that test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from podman_support import BUILD_SCRIPT, DEFAULT_IMAGE, IMAGE_ENV, podman, unavailable


@pytest.fixture(scope="session")
def container_image() -> str:
    """The image's name: ISOPROBE_CONTAINER_IMAGE (built by CI), else built here once per session."""
    if shutil.which("podman") is None:
        unavailable("podman is not installed (apt-get install podman runc debootstrap uidmap slirp4netns fuse-overlayfs)")
    named = os.environ.get(IMAGE_ENV)
    if named:
        if podman("image", "exists", named).returncode != 0:
            unavailable(f"{IMAGE_ENV}={named} names no image in podman's storage (tests/container/build_image.sh builds it)")
        return named
    if os.geteuid() != 0:
        unavailable(f"building the base image needs root (debootstrap); or build it and set {IMAGE_ENV}")
    for tool in ("debootstrap", "runc"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed, needed to build the image")
    began = time.monotonic()
    done = subprocess.run(["bash", str(BUILD_SCRIPT), DEFAULT_IMAGE], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        unavailable(f"{BUILD_SCRIPT.name} exited {done.returncode} after {time.monotonic() - began:.0f} s:\n"
                    f"{(done.stdout + done.stderr)[-3000:]}")
    return DEFAULT_IMAGE
