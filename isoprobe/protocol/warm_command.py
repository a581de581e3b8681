"""A command's interpreter started ahead of its trial: which commands can be, the plan it is started from, and
the words between the trial's process and it (issue 49, part 3).

A trial's process started ahead (a warm spare, ``executors.local``) starts the next trial's command meanwhile,
exactly as the trial would start it (the same interpreter, flags, script, working directory, environment, cap and
session) but with the batch's placeholder still in its arguments and no batch variable. At the end of the
interpreter's start, the shim's ``sitecustomize`` (``child/shim/_isoprobe_warm.py``) waits. When the trial is due it
gets the batch (its arguments and ``ISOPROBE_BATCH_SIZE``), and the interpreter goes on to run the script itself,
from its first line, as it would have.

What is started ahead is only what every process of the command runs before the script anyway: the interpreter's
start and the shim. Issue 49 imported the script's installed top-level imports there too (2.7 s of a plain loop's
start-up, 4.1 s of a LightningCLI script's), and issue 55 found scripts that see it: threads set before
``import torch``, a vendored fork put first on ``sys.path``, a module reading the batch from the environment at
import, a script that re-executes itself. So nothing of the script's runs before its trial.

Only commands whose shape says what the interpreter would run are started so (``warm_shape``): a Python
interpreter, flags that change neither what it imports nor where (``-u``, ``-B``, ``-O``, ``-X opt``, ...), then a
script or ``-m module``. Anything else (a shell line, a launcher such as ``torchrun``, ``-c``, ``-E``/``-I``/``-S``
that would drop the shim) starts cold, as before. Pure: the parent decides with it, the trial's process writes what
the interpreter started ahead reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from isoprobe.spec.command import PLACEHOLDER

#: An interpreter's name: ``python``, ``python3``, ``python3.11``, a path to one.
_INTERPRETER = re.compile(r"python[0-9.]*")
#: Flags without a value that leave what the interpreter imports, and from where, as it is.
_PLAIN_FLAGS = frozenset("bBdOqsuv")
#: Flags with a value (``-X opt`` or ``-Xopt``), which do the same.
_VALUE_FLAGS = frozenset("WX")


class WarmPlan(BaseModel):
    """What a trial process waiting for its request needs to start the command as a trial of this probe would."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(description="The command's words with the batch placeholder still in them.")
    cwd: str | None = Field(
        description="The command's working directory (spec.command_dir; None: the trial "
        "process's own, as a trial started then would have it)."
    )
    device: str = Field(description="The trials' device (cpu, cuda, cuda:N): the command's environment follows it.")
    memory_budget_bytes: int | None = Field(
        description="The trials' budget (the CUDA budget variable the shim "
        "reads when torch's optimizers load, during the imports)."
    )
    cuda_outside_bytes: float | None = Field(
        description="CUDA: the environment check's memory outside the allocator, as trial requests carry it."
    )


@dataclass(frozen=True)
class WarmShape:
    """A command an interpreter can be started ahead for: ``interpreter`` (its word and flags) runs ``target``."""

    interpreter: tuple[str, ...]
    module: bool  # ``-m target`` rather than a script's path
    target: str
    arguments: tuple[str, ...]  # the words after the target (with the batch in them, or the placeholder): the
    # interpreter's sys.argv[1:], which the trial's arguments replace in the process started ahead


def warm_shape(argv: Sequence[str]) -> WarmShape | None:
    """The command's shape if an interpreter can be started ahead for it, else None (it starts cold)."""
    if not argv or not _INTERPRETER.fullmatch(os.path.basename(argv[0])):
        return None
    index = 1
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "-":
        word = argv[index]
        if word == "-m":
            if index + 1 >= len(argv):
                return None
            return _shape(argv, index, True, argv[index + 1], index + 2)
        letters = word[1:]
        if letters[:1] in _VALUE_FLAGS:
            index += 1 if len(letters) > 1 else 2
            continue
        if not letters or not set(letters) <= _PLAIN_FLAGS:
            return None  # -c, -E, -I, -S, -i, --long options...: started as written
        index += 1
    if index >= len(argv) or argv[index] == "-":
        return None
    return _shape(argv, index, False, argv[index], index + 1)


def _shape(argv: Sequence[str], flags_end: int, module: bool, target: str, rest: int) -> WarmShape | None:
    interpreter = tuple(argv[:flags_end])
    if any(PLACEHOLDER in word for word in (*interpreter, target)):
        return None  # the batch chooses the interpreter or the script: nothing to start before it is known
    return WarmShape(interpreter, module, target, tuple(argv[rest:]))


def go_message(environment: dict[str, str], arguments: Sequence[str]) -> bytes:
    """The trial, for the runner: the variables to set, then the words after the target. NUL-separated, as argv
    is (a word cannot hold a NUL)."""
    words = [str(len(environment)), *(f"{name}={value}" for name, value in environment.items()), *arguments]
    return b"\0".join(os.fsencode(word) for word in words)
