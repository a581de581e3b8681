"""The result as shell variables: ``eval "$(isoprobe run spec.yaml --format env)"`` and Slurm's TaskProlog.

Whatever isoprobe prints here is executed by a shell, so it is a contract with
two dialects:

- ``env`` (POSIX sh: bash, dash, zsh): ``export NAME=VALUE`` with every value
  quoted by ``shlex.quote``, and warnings as ``echo '...' >&2`` so they reach the
  job's stderr without becoming commands of their own.
- ``taskprolog``: Slurm reads a TaskProlog's stdout line by line and takes
  ``export NAME=VALUE`` literally (no shell parses it: quotes would end up in the
  value) and prints ``print TEXT`` lines in the task's output. Values are therefore
  written bare, and isoprobe only writes values that need no quoting: numbers and
  identifiers (anything else is left out, never mangled).

Pure: renders from the ``Result`` model (or, in hook mode, from the fallback),
like every other view.
"""

from __future__ import annotations

import re
import shlex

from isoprobe.report.result import Result

DIALECTS = ("env", "taskprolog")
PREFIX = "ISOPROBE_"
_BARE = re.compile(r"^[A-Za-z0-9_.:+-]*$")


def result_variables(result: Result) -> list[tuple[str, str]]:
    """The variables a job needs, in a stable order; absent answers are left out, not exported empty."""
    values: list[tuple[str, str | int | None]] = [
        ("ANSWERED", int(result.answered)),
        ("STOP_REASON", result.stop_reason.value),
        ("MAX_BATCH_SIZE", result.max_batch_size),
        ("BATCH_SIZE", result.recommended_batch_size if result.answered else None),
        ("FASTEST_BATCH_SIZE", result.throughput.fastest_batch_size if result.throughput else None),
        ("EVAL_BATCH_SIZE", result.eval_max_batch_size if result.answered else None),  # training.eval_pass
    ]
    if result.tokens is not None:  # a token-bucketing sampler's budget per batch, and the worst bucket it was set by
        values += [
            ("MAX_TOKENS", result.tokens.max_tokens),
            ("TOKENS", result.tokens.recommended_tokens if result.answered else None),
            ("BINDING_LENGTH", result.tokens.binding_length),
        ]
    if result.accumulation is not None:
        plan = result.accumulation
        values += [
            ("MICRO_BATCH_SIZE", plan.micro_batch_size),
            ("ACCUMULATION_STEPS", plan.accumulation_steps),
            ("GLOBAL_BATCH_SIZE", plan.global_batch_size),
            ("WORLD_SIZE", plan.world_size),
        ]
    if result.distributed is not None:  # the batches above are per rank: say for how many and which strategy
        values += [("STRATEGY", result.distributed.strategy), ("PROBED_RANKS", result.distributed.world_size)]
    values.append(("BACKEND", result.device.backend if result.device else None))
    values.append(("CACHE_HIT", int(result.cache.hit) if result.cache else 0))
    variables = [(PREFIX + name, str(value)) for name, value in values if value is not None]
    # The environment the answer holds in, under its own names: the job runs with what every trial ran with.
    return variables + sorted(result.job_environment.items()) if result.answered else variables


def fallback_variables(batch_size: int, reason: str) -> list[tuple[str, str]]:
    """Hook mode: what a job gets when the probe could not answer and the user named a fallback."""
    return [
        (PREFIX + "ANSWERED", "0"),
        (PREFIX + "STOP_REASON", reason),
        (PREFIX + "BATCH_SIZE", str(batch_size)),
        (PREFIX + "FALLBACK", "1"),
        (PREFIX + "CACHE_HIT", "0"),
    ]


def render(variables: list[tuple[str, str]], warnings: list[str], dialect: str) -> str:
    """The lines for ``dialect`` (``env`` or ``taskprolog``), warnings first."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    lines = []
    for warning in warnings:
        text = " ".join(f"isoprobe: {warning}".split())  # one line: a newline would start a new command
        lines.append(f"echo {shlex.quote(text)} >&2" if dialect == "env" else f"print {text}")
    for name, value in variables:
        if dialect == "env":
            lines.append(f"export {name}={shlex.quote(value)}")
        elif _BARE.match(value):
            lines.append(f"export {name}={value}")
    return "\n".join(lines)
