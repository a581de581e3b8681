"""The trial process's side of a command started ahead (``protocol.warm_command``): start it while this process
waits for its request, then hand it the trial, or end it and let the trial start the command cold.

The command is started here as the trial would start it (``child.command_trial.start``): the same folder, environment
but for the batch, cap and session; under this process, so under its keeper, which ends it with everything else
of the trial. When the request comes, the trial takes it only if everything the trial would start differs from
what was started in the batch alone: the interpreter and script, the working directory, the environment, the cap.
Otherwise (another plan than the request's, a memory check's larger cap, a command that died waiting, an
interpreter not yet at its wait when the trial is due: a busy node) it is ended and the trial starts the command
cold, at once: a command started ahead changes when a verdict comes, never what it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from isoprobe.child.command_trial.start import (
    command_cap,
    command_environment,
    request_argv,
    request_environment,
    start_command,
)
from isoprobe.protocol.warm_command import WarmPlan, WarmShape, go_message, warm_shape
from isoprobe.protocol.wiring import WARM_FD_ENV, WARM_READY_FILE
from isoprobe.spec.command import BATCH_ENV

if TYPE_CHECKING:
    from isoprobe.protocol.messages import TrialRequest

#: How often the wait for the interpreter started ahead looks again.
_READY_POLL_SECONDS = 0.02


@dataclass
class Ahead:
    """A command started ahead: its process, where it writes, how it was started, and the channel's end."""

    plan: WarmPlan
    shape: WarmShape
    folder: Path
    process: subprocess.Popen
    env: dict[str, str]
    cap: int | None
    channel: int  # the write end of its channel: the trial, or EOF


@dataclass(frozen=True)
class Ready:
    """The interpreter started ahead waits for its trial: since when (``time.time()``)."""

    since: float


#: The command this process started ahead (at most one: a process runs one trial).
_ahead: Ahead | None = None


def start_ahead(plan_json: str) -> Ahead | None:
    """Start the plan's command ahead, if its shape allows (else None: the trial starts it cold)."""
    global _ahead
    plan = WarmPlan.model_validate_json(plan_json)
    shape = warm_shape(plan.argv)
    if shape is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="command-", dir=os.getcwd()))
    env = command_environment(
        folder,
        device=plan.device,
        memory_budget_bytes=plan.memory_budget_bytes,
        cuda_outside_bytes=plan.cuda_outside_bytes,
        batch_size=None,
    )
    cap = command_cap(plan.device)
    read, write = os.pipe()
    try:  # the command as the trial would start it, its placeholders still in: the batch comes on the pipe
        process = start_command(plan.argv, plan.cwd, env | {WARM_FD_ENV: str(read)}, folder, cap, pass_fds=(read,))
    except OSError:  # no such interpreter, say: the trial starts the command itself and reports that
        os.close(write)
        return None
    finally:
        os.close(read)
    _ahead = Ahead(plan, shape, folder, process, env, cap, write)
    return _ahead


def wait_ready(ahead: Ahead, seconds: float) -> Ready | None:
    """Wait (at most ``seconds``) until the interpreter started ahead waits for its trial; None if it ended first or
    took longer."""
    deadline = time.monotonic() + seconds
    while True:
        ready = is_ready(ahead)
        if ready is not None:
            return ready
        if ahead.process.poll() is not None or time.monotonic() >= deadline:
            return None
        time.sleep(_READY_POLL_SECONDS)


def is_ready(ahead: Ahead) -> Ready | None:
    """Whether the interpreter started ahead has reached its wait (its ``READY`` line), now."""
    try:
        words = (ahead.folder / WARM_READY_FILE).read_text().split()
    except OSError:
        return None
    if len(words) == 2 and words[0] == "READY":
        try:
            return Ready(float(words[1]))
        except ValueError:
            return None
    return None


def take(request: TrialRequest) -> Ahead | None:
    """The command started ahead, if it is the one this request's trial would start but for the batch (then the
    caller opens the gate and calls ``go``); else None, and whatever was started ahead is ended."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is None:
        return None
    spec = request.spec
    wanted = warm_shape(request_argv(request, request.batch_size))
    shape = ahead.shape
    same = (
        request_argv(request, None) == ahead.plan.argv
        and wanted is not None
        and (wanted.interpreter, wanted.module, wanted.target) == (shape.interpreter, shape.module, shape.target)
        and ahead.plan.cwd == spec.command_dir
        and _without_batch(request_environment(request, ahead.folder)) == ahead.env
        and command_cap(request.device) == ahead.cap
        and ahead.process.poll() is None
        and is_ready(ahead) is not None
    )  # not at its wait yet (a busy node): the trial starts it cold, now
    if not same:
        end(ahead)
        return None
    return ahead


def go(ahead: Ahead, request: TrialRequest) -> subprocess.Popen:
    """Hand the command its trial: the batch's variable and the words after the script, with the batch in them."""
    wanted = warm_shape(request_argv(request, request.batch_size))
    if wanted is None:  # ``take`` hands over only a command this request's argv has the shape of
        raise ValueError("the command started ahead has no shape at this request's batch")
    message = go_message({BATCH_ENV: str(request.batch_size)}, wanted.arguments)
    try:
        view = memoryview(message)
        while view:
            view = view[os.write(ahead.channel, view) :]
    except OSError:
        pass  # the command is gone: the trial reads its end as any command's
    finally:
        os.close(ahead.channel)
    return ahead.process


def end(ahead: Ahead) -> None:
    """End a command started ahead that no trial takes: its session, then reap it."""
    try:
        os.close(ahead.channel)
    except OSError:
        pass
    try:
        os.killpg(ahead.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        ahead.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _without_batch(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name != BATCH_ENV}
