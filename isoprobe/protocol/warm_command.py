"""A command's interpreter started ahead of its trial: which commands can be, the plan it is started from, and
the words between the trial's process and it (issue 49, part 3).

Before its first optimizer step a ``python train.py ...`` trial spends seconds that are not the script's work at
the batch: the interpreter's start and the imports of torch, Lightning, transformers (measured at 2.7 s for a
plain loop, 4.1 s for a LightningCLI script: ``benchmarks/studies/command_ahead_readings.py``). A trial's process
started ahead (a warm spare, ``executors.local``) starts the next trial's command meanwhile, exactly as the trial
would start it (the same interpreter, flags, script, working directory, environment, cap and session) but with the
batch's placeholder still in its arguments and no batch variable. At the end of the interpreter's start, the shim's
``sitecustomize`` (``child/shim/_isoprobe_warm.py``) imports the installed modules the script's own top-level
statements import, then waits. When the trial is due it gets the batch (its arguments and ``ISOPROBE_BATCH_SIZE``),
and the interpreter goes on to run the script itself, as it would have.

Only commands whose shape says what the interpreter would run are started so (``warm_shape``): a Python
interpreter, flags that change neither what it imports nor where (``-u``, ``-B``, ``-O``, ``-X opt``, ...), then a
script or ``-m module``. Anything else (a shell line, a launcher such as ``torchrun``, ``-c``, ``-E``/``-I``/``-S``
that would drop the shim) starts cold, as before. Pure but for reading a script: the parent decides with it, the
trial's process writes what the interpreter started ahead reads.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from importlib.machinery import PathFinder
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field

from isoprobe.spec.command import PLACEHOLDER

#: The runner's file in the trial's folder once its imports are done: ``READY cuda_initialized statements seconds``.
READY_FILE = "warm-ready"
#: The script's top-level imports, for the runner (``imports_file``), written in the trial's folder before it starts.
IMPORTS_FILE = "warm-imports"
#: The variable naming the pipe the trial comes on (the shim's ``_isoprobe_warm.FD_ENV``): only in the process
#: started ahead, which removes it at once.
FD_ENV = "ISOPROBE_WARM_FD"
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
    cwd: str | None = Field(description="The command's working directory (spec.command_dir; None: the trial "
                                        "process's own, as a trial started then would have it).")
    device: str = Field(description="The trials' device (cpu, cuda, cuda:N): the command's environment follows it.")
    memory_budget_bytes: int | None = Field(description="The trials' budget (the CUDA budget variable the shim "
                                                        "reads when torch's optimizers load, during the imports).")
    cuda_outside_bytes: float | None = Field(description="CUDA: the environment check's memory outside the "
                                                         "allocator, as trial requests carry it.")


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


def top_level_imports(source: bytes, filename: str) -> list[tuple[tuple[str, ...], str]]:
    """The script's module-level ``import`` statements, in order: the top-level modules each names and its text.
    Relative imports and ``from __future__`` are left out; a script that does not parse has none (it meets its own
    error when it runs). Parsed here, in the trial's process, so that the measured process builds no syntax tree."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = tuple(dict.fromkeys(alias.name.partition(".")[0] for alias in node.names))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module != "__future__":
            names = (node.module.partition(".")[0],)
        else:
            continue
        found.append((names, ast.unparse(node)))
    return found


def imports_file(statements: list[tuple[tuple[str, ...], str]]) -> bytes:
    """``IMPORTS_FILE``'s bytes: per statement its modules (spaces) and its text on the next line, NUL-separated."""
    return b"\0".join(f"{' '.join(names)}\n{text}".encode() for names, text in statements)


def module_source(name: str, search: list[str]) -> str | None:
    """The file ``python -m name`` runs, found on ``search`` without importing anything (no package's
    ``__init__`` runs); None where it is not there (a module of another interpreter's site-packages)."""
    spec = None
    path: list[str] | None = search
    parts = name.split(".")
    for depth in range(len(parts)):
        if path is None:
            return None
        spec = PathFinder.find_spec(".".join(parts[:depth + 1]), path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    if spec is not None and spec.submodule_search_locations is not None:
        main = PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        return main.origin if main is not None else None
    return spec.origin if spec is not None else None
