"""Every error isoprobe raises on purpose, and the documented exit codes.

The tree::

    IsoprobeError      exit 1: internal, a bug in isoprobe
    ├── SpecError      exit 2: the spec or the command line is wrong; lists every problem found
    ├── ProbeError     exit 4: the probe could not start (the environment check child failed), or
    │                  the system refused what it needs (no space left in TMPDIR for a trial's files),
    │                  or isoprobe's own fork server lost a trial it could not run again (not the batch's)
    └── OutputFailed   exit 74: the result could not be written (stdout on a full disk, plot -o, sweep --output)

Only a user's mistake travels as an exception. The other non-zero outcomes
(the start batch does not fit: 3; the probe could not answer: 4; interrupted:
130/143) are *answers*: a ``Result`` is still printed, its ``stop_reason`` says
why, and ``result.exit_code_for`` maps it to the code. The command prints a
``Result`` for the exceptions too (``report.stop``): a ``SpecError`` as stop
reason ``bad_spec`` (2), a ``ProbeError`` as ``error`` (4, with its ``trials``),
a bug as ``internal_error`` (1); only ``OutputFailed`` (74) has no document, since
stdout itself failed. Foreign exceptions
(YAML, pydantic, OS) are converted to ``SpecError`` where they happen
(``spec.load.py``), so the CLI never shows a traceback for a user's mistake.

The Python API (``isoprobe.probe``, ``isoprobe.load_spec``) raises this same tree,
exported from the package (``from isoprobe import SpecError, ProbeError,
IsoprobeError, Problem``): a ``SpecError``'s ``problems`` are every ``Problem``
found, each naming its field and, for an override, where it came from
(``search.max_batch_size (from --set search.max_batch_size=abc)``,
``(from overrides['search.steps'])``, ``(from probe(max_batch_size=0))``).
The non-zero outcomes above stay answers there too: a ``Result``. Ctrl-C is the
one exception: ``probe()`` raises ``KeyboardInterrupt`` once its children are
stopped (``OutputFailed`` and ``Terminated`` are the command's own).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    """Documented exit codes (README.md, "Exit codes")."""

    ANSWERED = 0
    INTERNAL = 1
    BAD_SPEC = 2
    START_DOES_NOT_FIT = 3
    NO_ANSWER = 4
    OUTPUT_FAILED = 74  # sysexits' EX_IOERR: stdout (or plot's PNG) could not be written, e.g. a full disk
    INTERRUPTED = 130
    STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away
    TERMINATED = 143


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` for a message, shortened: a user's value can be 5000 digits long, a message cannot.

    A value given in Python can be a dict a million levels deep, or hold itself: its type then.
    """
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # ValueError: an int beyond Python's int-to-text limit
        return f"a {type(value).__name__} too deep or too long to show"
    return text if len(text) <= limit else f"{text[: limit - 10]}... ({len(text)} characters)"


class IsoprobeError(Exception):
    """Base class of isoprobe's own errors."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where, what, and how to fix it."""

    field: str
    message: str
    fix: str = ""

    def render(self, source: str) -> str:
        where = f"{source}: {self.field}" if self.field else source
        text = f"{where}: {self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


class SpecError(IsoprobeError):
    """The spec (or a command-line override) cannot be used. Lists every problem at once."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{len(self.problems)} problem(s) in {self.source}:" if len(self.problems) > 1 else ""
        body = "\n".join(p.render(self.source) for p in self.problems)
        return f"{head}\n{body}" if head else body


class ProbeError(IsoprobeError):
    """The probe could not get as far as a trial, or could not go on: no answer, but not the user's spec either.

    ``trials``: the trials the probe had run when it stopped (``report.trial.Trial``; filled in by
    ``api.answer_for``), which the command prints in its document as the evidence.
    """

    def __init__(self, message: str, evidence: str = "", trials: list | tuple = ()):
        self.message = message
        self.evidence = evidence
        self.trials = list(trials)
        super().__init__(message)

    #: An evidence line at least this long that the message contains is already said (a shorter one, such as a
    #: traceback's ``raise``, may be in the message by chance).
    SAID_AT = 16

    def unsaid_evidence(self) -> str:
        """What is printed under the message: the evidence less what the message already says and less a line
        that repeats the one before it (Slurm's same refusal, twice), so that every line is said once."""
        kept: list[str] = []
        for line in self.evidence.rstrip().splitlines():
            text = line.strip()
            if (len(text) >= self.SAID_AT and text in self.message) or (kept and text == kept[-1].strip()):
                continue
            kept.append(line.rstrip())
        return "\n".join(kept).strip("\n")


class OutputFailed(IsoprobeError):
    """Writing the result (stdout, or ``plot``'s PNG) failed: the answer, if any, did not reach its reader.

    Not a closed pipe (that is exit 141, ``BrokenPipeError``): a full disk, an I/O
    error, a read-only destination. ``what`` names the destination, ``reason``
    the system's words.
    """

    def __init__(self, what: str, reason: str):
        self.what = what
        self.reason = reason
        super().__init__(f"cannot write {what}: {reason}")


class Terminated(BaseException):
    """Raised in the parent on SIGTERM, so that the same cleanup runs as for Ctrl-C (KeyboardInterrupt).

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it.
    """
