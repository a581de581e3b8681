"""How far each rank of a command got, and the words for a rank that fell behind the others (issue 56, item 6).

A command trial's supervisor (``child.command_trial.supervisor``) reads each process's optimizer steps; a step of the
trial is one
that every rank has made, and that is all the parent saw. So a trial whose ranks were apart when it ended (rank 1
hung before its first step while rank 0 stepped up to the gate, a rank that exited without stepping) read as "no
optimizer step seen" and blamed the script's optimizer, and a hung rank was never named. These words name the rank
behind, its pid and its steps, and how far the others got; the cause that no process stepped at all (an optimizer
that is not torch's) is left to the trials where none did. Pure: the supervisor's records in, words out. Both sides
use it: the supervisor for a command that exited, the parent for a trial killed at its timeout (from the last
``protocol.command.CommandSeen``, which the supervisor writes as it goes).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.report.strict import Strict

#: How many ranks a message names on each side; the rest are counted.
_NAMED = 4
#: How many of the command's last lines a message quotes (the rest are in the trial's tail).
_QUOTED_LINES = 3
_QUOTED_CHARS = 160


class RankProgress(Strict):
    """One process of a command that imported torch's optimizers (its shim said hello), as the supervisor saw it."""

    pid: int
    rank: int | None = Field(None, description="RANK, as its launcher set it; null: none.")
    world_size: int | None = Field(None, description="WORLD_SIZE, as its launcher set it; null: none.")
    steps: int = Field(0, ge=0, description="The optimizer steps it had made.")
    forward: Literal["began", "returned"] | None = Field(
        None,
        description="Where it was in its next step: the model's training forward had begun, or returned "
        "(its backward and optimizer step next); null: neither yet (its data, or a wait before the forward).",
    )
    ended: bool = Field(False, description="Gone, with no exception of its own, while the command ran on.")

    @property
    def name(self) -> str:
        return f"rank {self.rank} (pid {self.pid})" if self.rank is not None else f"pid {self.pid}"


def ranks_of(processes: list[RankProgress]) -> tuple[list[RankProgress], int]:
    """The command's ranks and how many a launcher declared: the processes with a rank of a WORLD_SIZE over one,
    by rank (a rank seen twice, a script that re-executed itself: the process that stepped more); with none, the
    processes that stepped (a plain script: one)."""
    launched = [(rank, p) for p in processes if (rank := p.rank) is not None and (p.world_size or 1) > 1]
    if launched:
        by_rank: dict[int, RankProgress] = {}
        for rank, process in launched:
            if rank not in by_rank or process.steps > by_rank[rank].steps:
                by_rank[rank] = process
        return [by_rank[r] for r in sorted(by_rank)], max(p.world_size or 1 for _, p in launched)
    stepping = sorted((p for p in processes if p.steps), key=lambda p: p.pid)
    return stepping, len(stepping)


def any_stepped(processes: list[RankProgress]) -> bool:
    return any(p.steps for p in processes)


#: How far into its next step a rank was, for ordering: before its forward, inside it, past it.
_FORWARD_ORDER = {None: 0, "began": 1, "returned": 2}


def _progress(process: RankProgress) -> tuple[int, int]:
    return process.steps, _FORWARD_ORDER[process.forward]


def behind(processes: list[RankProgress]) -> str | None:
    """Which ranks fell behind the others, and how far the others got: "rank 1 (pid 12) stopped after optimizer
    step 1, before the forward pass of step 2, while rank 0 (pid 11) made 1 and was past the forward pass of step 2
    (in its backward or optimizer step)". Ranks at the same step are told apart by where they were in the next one
    (``RankProgress.forward``): under DDP the peers of a rank hung before its forward wait in the backward's
    all-reduce, one step count with it. None: nothing of any rank seen (no step, no forward), or none behind (one
    process, or every rank as far as the others and every rank the launcher declared seen)."""
    ranks, world = ranks_of(processes)
    if not ranks or not any(p.steps or p.forward for p in ranks):
        return None
    missing = [r for r in range(world) if r not in {p.rank for p in ranks}] if ranks[0].rank is not None else []
    least = min(_progress(p) for p in ranks)
    if least == max(_progress(p) for p in ranks):
        if not missing:
            return None
        lagging, ahead = [], ranks
    else:
        lagging = [p for p in ranks if _progress(p) == least]
        ahead = [p for p in ranks if _progress(p) > least]
    marks = any(p.forward for p in ranks)  # the shim saw the model's forwards (a torch.nn.Module's)
    words = [_fell_behind(p, marks) for p in lagging[:_NAMED]]
    if missing:
        numbers = ", ".join(str(r) for r in missing[:_NAMED]) + (
            f" and {len(missing) - _NAMED} more" if len(missing) > _NAMED else ""
        )
        words.append(
            f"rank{'s' if len(missing) > 1 else ''} {numbers} never reached torch's optimizers (no process "
            f"of the command said it was {'them' if len(missing) > 1 else 'it'})"
        )
    if len(lagging) > _NAMED:
        words.append(f"{len(lagging) - _NAMED} more rank(s) as far")
    others = ", ".join(_got_to(p) for p in ahead[:_NAMED])
    if len(ahead) > _NAMED:
        others += f" and {len(ahead) - _NAMED} more rank(s) as far or further"
    return f"{'; '.join(words)}, while {others}"


def _fell_behind(process: RankProgress, marks: bool) -> str:
    made = "made no optimizer step" if not process.steps else f"stopped after optimizer step {process.steps}"
    return f"{process.name} {made}{_within(process, behind=marks)}" + (
        " and ended with no error of its own" if process.ended else ""
    )


def _got_to(process: RankProgress) -> str:
    return f"{process.name} made {process.steps or 'none'}{_within(process, behind=False)}"


def _within(process: RankProgress, *, behind: bool) -> str:
    """Where in its next step the rank was; ``behind``: say so of one that had not begun its forward too."""
    after = process.steps + 1
    if process.forward == "returned":
        return f" and was past the forward pass of step {after} (in its backward or optimizer step)"
    if process.forward == "began":
        return f", inside the forward pass of step {after}"
    return f", before the forward pass of step {after}" if behind and not process.ended else ""


def level(processes: list[RankProgress]) -> str | None:
    """Every rank as far as the others (none behind, some stepped): "rank 0 (pid 11), rank 1 (pid 12) made 2
    optimizer step(s) each"; None otherwise."""
    if not any_stepped(processes) or behind(processes) is not None:
        return None
    ranks, _ = ranks_of(processes)
    names = ", ".join(p.name for p in ranks[:_NAMED]) + (
        f" and {len(ranks) - _NAMED} more" if len(ranks) > _NAMED else ""
    )
    return f"{names} made {ranks[0].steps} optimizer step(s){' each' if len(ranks) > 1 else ''}"


#: What ``printed`` says of a command whose stdout and stderr were read empty.
PRINTED_NOTHING = "the command printed nothing on stdout or stderr"


def printed(stderr: str, stdout: str) -> str:
    """The command's last lines, quoted (stderr's; stdout's when stderr has none), or that it printed nothing."""
    for stream, text in (("stderr", stderr), ("stdout", stdout)):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            quoted = " / ".join(f'"{line[:_QUOTED_CHARS]}"' for line in lines[-_QUOTED_LINES:])
            return f"the command's last lines on {stream}: {quoted}"
    return PRINTED_NOTHING


def tails(stderr: str, stdout: str) -> str:
    """Both tails as one text, each under its name (a trial's ``traceback_tail``)."""
    return (
        f"--- the command's stderr, last lines ---\n{stderr.rstrip() or '(nothing)'}\n"
        f"--- its stdout, last lines ---\n{stdout.rstrip() or '(nothing)'}\n"
    )


#: The error types of a command trial killed at its timeout, as the parent records it from the supervisor's last
#: ``CommandSeen`` (the trial's outcome stays timed_out): a rank behind the others, or none (every rank at one
#: step, or no step at all).
RANK_BEHIND = "CommandRankBehind"
TIMED_OUT = "CommandTimedOut"


def timed_out_words(processes: list[RankProgress], stderr: str, stdout: str) -> tuple[str, str]:
    """What a command trial killed at its timeout had come to, and its error type: the rank behind and how far the
    others got (``RANK_BEHIND``), every rank at one step, or no step by any process; then the command's last
    lines."""
    apart = behind(processes)
    kind = RANK_BEHIND if apart is not None else TIMED_OUT
    if apart is not None:
        story = (
            f"{apart}: the rank behind hangs, or waits for something its peers do not (they wait for it in a "
            "collective, or at isoprobe's gate after their steps)"
        )
    elif (even := level(processes)) is not None:
        story = (
            (
                f"{even}, and none made the next: a step that takes longer than the timeout, or ranks that all "
                "wait (a collective none of them completes)"
            )
            if len(ranks_of(processes)[0]) > 1
            else (f"{even}, and not the next: a step that takes longer than the timeout, or a wait of its own")
        )
    else:
        story = "no process of the command made an optimizer step" + (
            ", though the model's training forward passes ran" if any(p.forward for p in processes) else ""
        )
    return f"{story}; {printed(stderr, stdout)}", kind
