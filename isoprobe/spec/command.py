"""A spec whose trials run the job's own command (``Spec.command``): its argv at one batch, and what must hold.

Pure (no processes): the parent validates the command and the child that runs a
trial builds the argv from the same functions, so the command a trial ran is
the one the result and the cache key name. The placeholder is replaced as text
(``str.replace``), never through ``str.format``: a command's other braces (a
JSON argument, a shell's ``${VAR}``) stay as they are.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

#: Replaced, wherever it appears in an argument, by the trial's batch size.
PLACEHOLDER = "{batch_size}"
#: Every process a command trial starts gets the trial's batch size in this variable (``batch_from: env``).
BATCH_ENV = "ISOPROBE_BATCH_SIZE"
#: The spec sections that describe a workload isoprobe builds itself: with a command, the script does all of it.
NOT_FOR_COMMANDS = ("model", "input", "target", "data", "optimizer", "lightning")
#: An environment variable's name, as ``command_env`` lists them.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def command_placeholder(spec) -> str:
    """Where the spec's command takes its batch from, as a message names it: '{batch_size}' or
    '$ISOPROBE_BATCH_SIZE'."""
    return PLACEHOLDER if spec.batch_from == "argument" else f"${BATCH_ENV}"


def command_words(command: str | Sequence[str], shell: bool) -> list[str]:
    """The command as given, as a list: a string split as a POSIX shell splits words (quotes, backslashes), or,
    with ``shell``, kept whole for ``sh -c``. Raises ValueError for a string no shell could split."""
    if not isinstance(command, str):
        return list(command)
    if shell:
        return [command]
    try:
        return shlex.split(command)
    except ValueError as exc:  # an unclosed quote: the message says which
        raise ValueError(
            f"command: cannot split {command!r} into words as a shell would ({exc}); close the "
            "quote, or give the command as a list of arguments"
        ) from None


def argv_for(command: str | Sequence[str], shell: bool, batch_size: int | None) -> list[str]:
    """The argv a trial runs: the placeholder replaced by ``batch_size`` (None: left as written, the cache key's
    form), under ``sh -c`` with ``shell``."""
    words = command_words(command, shell)
    if batch_size is not None:
        words = [word.replace(PLACEHOLDER, str(batch_size)) for word in words]
    return ["/bin/sh", "-c", words[0]] if shell else words


def uses_placeholder(command: str | Sequence[str]) -> bool:
    words = [command] if isinstance(command, str) else list(command)
    return any(PLACEHOLDER in word for word in words)


def shown_command(command: str | Sequence[str], limit: int = 160) -> str:
    """The command for a person: one line, quoted as a shell would need it, shortened past ``limit``."""
    text = command if isinstance(command, str) else shlex.join(list(command))
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def command_problems(command: str | Sequence[str], shell: bool, batch_from: str, command_env: Sequence[str]) -> None:
    """Raise the first thing that makes the command unusable, worded as the spec's other checks (``field: ...``)."""
    if isinstance(command, str) and not command.strip():
        raise ValueError("command: is empty; give the training command, e.g. python train.py --batch-size {batch_size}")
    if not isinstance(command, str) and shell:
        raise ValueError("shell: true runs the command as one shell line; give command as a string, not a list")
    words = command_words(command, shell)
    if not words or not words[0].strip():
        raise ValueError("command: is empty; give the training command, e.g. python train.py --batch-size {batch_size}")
    if batch_from == "argument" and not uses_placeholder(command):
        raise ValueError(
            f"command: has no {PLACEHOLDER} in its arguments, so every trial would run the same batch; "
            f"put {PLACEHOLDER} where the batch size goes (e.g. --batch-size {PLACEHOLDER}), or set "
            f"batch_from: env if the script reads ${BATCH_ENV} itself"
        )
    for name in command_env:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"command_env: {name!r} is not an environment variable's name")
