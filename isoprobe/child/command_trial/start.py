"""How a command trial starts the command: its environment, its cap, its session (cold, or ahead of the trial).

One place, so that a command started ahead of its trial (``child.command_trial.warm``) is started exactly as the trial
would start it, and the trial can check that it was (the same environment but for the batch, the same cap).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from isoprobe.child.core.memory import data_cap
from isoprobe.protocol.command import SHIM_FOLDER
from isoprobe.protocol.wiring import (
    EVENTS_ENV,
    LIFELINE_ENV,
    PRELOAD_ENV,
    SHIM_CUDA_BUDGET_ENV,
    SHIM_CUDA_OUTSIDE_ENV,
    SHIM_DIR_ENV,
    WARM_PLAN_ENV,
)
from isoprobe.spec.command import BATCH_ENV, argv_for
from isoprobe.system.data_cap import set_exact

if TYPE_CHECKING:
    from isoprobe.protocol.messages import TrialRequest

#: Variables of isoprobe's own children that the user's command must not inherit.
OWN_VARIABLES = (EVENTS_ENV, LIFELINE_ENV, PRELOAD_ENV, WARM_PLAN_ENV)


def command_environment(
    folder: Path,
    *,
    device: str,
    memory_budget_bytes: int | None,
    cuda_outside_bytes: float | None,
    batch_size: int | None,
) -> dict[str, str]:
    """This child's environment (the backend's variables: the malloc threshold, no GPU on the CPU backend, the
    allocator setting) for the command, less isoprobe's own wiring, plus the batch and the shim. ``batch_size``
    None: no batch variable (a command started before its batch is known gets it when it is)."""
    env = {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])
    user_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != package_root]
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_FOLDER), *user_path])
    env[SHIM_DIR_ENV] = str(folder)
    env.pop(BATCH_ENV, None)
    if batch_size is not None:
        env[BATCH_ENV] = str(batch_size)
    if device.startswith("cuda") and memory_budget_bytes is not None:
        env[SHIM_CUDA_BUDGET_ENV] = str(memory_budget_bytes)
        if cuda_outside_bytes:  # the environment check's figure, where the parent had one
            env[SHIM_CUDA_OUTSIDE_ENV] = str(int(cuda_outside_bytes))
    return env


def request_environment(request: TrialRequest, folder: Path) -> dict[str, str]:
    """The command's environment for one trial request."""
    return command_environment(
        folder,
        device=request.device,
        memory_budget_bytes=request.memory_budget_bytes,
        cuda_outside_bytes=request.cuda_outside_bytes,
        batch_size=request.batch_size,
    )


def request_argv(request: TrialRequest, batch_size: int | None) -> list[str]:
    """The argv of the request's command at ``batch_size`` (None: its placeholders left in). A command trial's spec
    always has a command (the parent sends command trials for nothing else): None is refused, not run."""
    spec = request.spec
    if spec.command is None:
        raise ValueError("a command trial was asked for a spec without a command")
    return argv_for(spec.command, spec.shell, batch_size)


def command_cap(device: str) -> int | None:
    """The command's cap: on the CPU backend the budget itself on every process of the command (the credit for
    isoprobe's own modules was this process's); none on CUDA."""
    return data_cap() if not device.startswith("cuda") else None


def start_command(
    argv: Sequence[str],
    cwd: str | None,
    env: dict[str, str],
    folder: Path,
    cap: int | None,
    *,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, stdin from /dev/null, stdout and stderr to the trial's folder,
    ``RLIMIT_DATA`` set to ``cap`` before exec (inherited by torchrun's ranks and DataLoader workers)."""

    def prepare() -> None:
        if cap is not None:
            set_exact(cap)

    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=prepare,
            pass_fds=tuple(pass_fds),
        )
