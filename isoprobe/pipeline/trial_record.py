"""A finished child's run as the result's ``Trial``: its classified outcome and what it measured.

Recording is separate from running (``pipeline.trials``) because every path that ends with a child's run
comes here: the search's trials, a gang's ranks, and the tests that hand it canned runs. Pure: no
processes; the classification is ``pipeline.classify``'s.
"""

from __future__ import annotations

from isoprobe.errors import ProbeError
from isoprobe.executors import ChildRun
from isoprobe.pipeline.classify import classify_exit
from isoprobe.pipeline.plausibility import Asked
from isoprobe.protocol.command import CommandSeen
from isoprobe.protocol.messages import MESSAGE_CHARS, StepDone, last_of
from isoprobe.report.batch_check import NOT_TRAINED, contradiction, contradiction_message
from isoprobe.report.outcomes import Outcome
from isoprobe.report.rank_progress import ranks_of, tails, timed_out_words
from isoprobe.report.trial import ErrorInfo, RankTrial, Trial
from isoprobe.search.insights import step_throughput


def _rounded(value, digits: int):
    return None if value is None else round(float(value), digits)


def trial_from_run(run: ChildRun, index: int, batch_size: int, purpose: str, asked: Asked | None = None) -> Trial:
    """A finished child's run as the result's ``Trial``: its classified outcome and what it measured.

    ``asked``: what the trial was asked to do, against which a 'fits' is vetted (``classify_exit``).
    A run whose end isoprobe's own fork server lost (``ChildRun.lost``) is no
    outcome of the batch's at all: it raises ``ProbeError`` (the executor re-runs
    such runs, so one comes here only when the failures went on; see ``lost_run``).
    """
    if run.lost is not None:
        raise ProbeError(lost_run(run, batch_size))
    if run.ranks:
        return _gang_trial(run, index, batch_size, purpose, asked)
    end = classify_exit(run, asked)
    result = end.result
    fits = end.outcome is Outcome.FITS
    keep_stderr = end.outcome in (Outcome.CRASHED, Outcome.TIMED_OUT, Outcome.ERROR) or bool(end.evidence)
    steps = result.step_seconds if result else []
    speed, spread = step_throughput(batch_size, steps) if fits else (None, None)
    # Every step's reading, also those of a trial that failed later (a soak that ran out at step 9).
    step_events = [e for e in run.events if isinstance(e, StepDone)]
    error = result.error if result else None
    stderr_tail = run.stderr_tail if keep_stderr and run.stderr_tail else None
    command_ranks = result.command_ranks if result else None
    seen = last_of(run.events, CommandSeen) if end.outcome is Outcome.TIMED_OUT and result is None else None
    if seen is not None:  # a command trial killed at its timeout: what its supervisor had seen (issue 56)
        message, kind = timed_out_words(seen.processes, seen.stderr_tail, seen.stdout_tail)
        error = ErrorInfo(
            type=kind, message=message[:MESSAGE_CHARS], traceback_tail=tails(seen.stderr_tail, seen.stdout_tail)
        )
        stderr_tail = stderr_tail if (stderr_tail or "").strip() else (seen.stderr_tail or None)
        command_ranks = sum(1 for p in ranks_of(seen.processes)[0] if p.steps) or None
    return Trial(
        index=index,
        batch_size=batch_size,
        purpose=purpose,
        outcome=end.outcome,
        peak_bytes=result.peak_bytes if result else None,
        peak_allocated_bytes=result.peak_allocated_bytes if result else None,
        budget_peak_bytes=result.budget_peak_bytes if result else None,
        base_bytes=result.base_bytes if result else None,
        alloc_retries=result.alloc_retries if result else None,
        step_seconds=[round(s, 4) for s in steps],
        step_peak_bytes=[e.peak_bytes for e in step_events if e.peak_bytes is not None],
        step_held_bytes=[e.held_bytes for e in step_events if e.held_bytes is not None],
        step_budget_peak_bytes=[e.budget_peak_bytes for e in step_events if e.budget_peak_bytes is not None],
        steady_rule=asked.steady if asked is not None else None,
        samples_per_second=_rounded(speed, 3),
        step_seconds_spread=_rounded(spread, 4),
        sizes=result.sizes if fits and result else None,
        compile_seconds=_rounded(result.compile_seconds, 3) if result else None,
        first_step_seconds=_rounded(result.first_step_seconds, 3) if result else None,
        started_ahead=result.started_ahead if result else None,
        cycle=result.cycle if result else None,
        batch_check=result.batch_check if result else None,
        busy_seconds=round(run.busy_seconds, 1) if run.busy_seconds else None,
        busy_at_timeout=run.busy_at_timeout and end.outcome is Outcome.TIMED_OUT,
        eval_seconds=_rounded(result.eval_seconds, 4) if result else None,
        applied=result.applied if result else None,
        seconds=round(run.seconds, 3),
        warm_start=run.warm,
        forked=run.forked,
        phase=end.phase,
        error=error,
        exit_code=run.returncode,
        signal=end.signal_name,
        stderr_tail=stderr_tail,
        reclassified=end.evidence,
        command_ranks=command_ranks,
        budget_swing_bytes=result.budget_swing_bytes if result else None,
        heap_churn_bytes=(
            result.heap_churn_bytes if result and result.heap_churn_bytes is not None else steps_heap_churn(step_events)
        ),
    )


def steps_heap_churn(step_events: list[StepDone]) -> int | None:
    """An own trial's heap churn (``report.result.Trial.heap_churn_bytes``): the most its steps after the first
    read (``StepDone.heap_churn_bytes``); the first builds what the run keeps (the optimizer's state). None with
    fewer than two steps read."""
    churns = [e.heap_churn_bytes for e in step_events[1:] if e.heap_churn_bytes is not None]
    return max(churns) if churns else None


def lost_run(run: ChildRun, batch_size: int) -> str:
    """What people read when isoprobe's own machinery kept failing a trial: no answer rather than a lower one."""
    times = len(run.lost_before) + 1
    return (
        f"isoprobe's fork server failed while it ran a trial of batch {batch_size} ({run.lost}"
        + (f"; {times} times in a row" if times > 1 else "")
        + "). That says nothing about the batch, so "
        "the probe stops without an answer rather than count it. Run it again; if this repeats, set "
        "search.fork_server: false to spawn each trial instead"
    )


def _gang_trial(run: ChildRun, index: int, batch_size: int, purpose: str, asked: Asked | None) -> Trial:
    """A gang's run: it fits only if every rank fits; otherwise it is the first failing rank's outcome.

    Each rank is classified on its own, by the same rules as a single trial.
    The deciding rank is the one the supervisor saw fail first; with none, a
    rank whose 'fits' did not hold up (implausible, over its budget), else the
    rank with the highest peak in the budget's units, which is the one the
    search's memory line must follow.
    """
    per_rank = [trial_from_run(rank_run, index, batch_size, purpose, asked) for rank_run in run.ranks]
    deciding = run.failed_rank
    if deciding is None:
        unfit = [rank for rank, trial in enumerate(per_rank) if trial.outcome is not Outcome.FITS]
        deciding = (
            unfit[0]
            if unfit
            else max(
                range(len(per_rank)), key=lambda r: (per_rank[r].budget_peak_bytes or per_rank[r].peak_bytes or 0, -r)
            )
        )
    ranks = [
        RankTrial(
            rank=rank,
            outcome=trial.outcome,
            peak_bytes=trial.peak_bytes,
            budget_peak_bytes=trial.budget_peak_bytes,
            base_bytes=trial.base_bytes,
            sizes=trial.sizes,
            exit_code=trial.exit_code,
            stopped_by_gang=run.failed_rank is not None and rank != run.failed_rank,
            node=run.ranks[rank].node,
        )
        for rank, trial in enumerate(per_rank)
    ]
    churns = [trial.heap_churn_bytes for trial in per_rank if trial.heap_churn_bytes is not None]
    return per_rank[deciding].model_copy(
        update={
            "ranks": ranks,
            "failed_rank": run.failed_rank,
            "gang_stop_seconds": run.gang_stop_seconds,
            "seconds": round(run.seconds, 3),
            "heap_churn_bytes": max(churns) if churns else None,
        }
    )


def judged_against(trial: Trial, earlier: list[Trial], placeholder: str) -> Trial:
    """A command trial that fit, judged against the earlier trials of the same question (``report.batch_check``'s
    rule across trials): an error naming both batches when the two prove the script did not train at the larger
    one; else the trial as it was."""
    if trial.outcome is not Outcome.FITS or trial.batch_check is None or trial.training_batch_size is not None:
        return trial
    others = [
        (t.batch_size, t.batch_check)
        for t in earlier
        if t.training_batch_size is None and t.allocator == trial.allocator and t.length == trial.length
    ]
    found = contradiction(trial.batch_size, trial.batch_check, others)
    if found is None:
        return trial
    large, large_check, small, small_check = found
    message = contradiction_message(large, small, large_check, small_check, placeholder)
    return trial.model_copy(
        update={
            "outcome": Outcome.ERROR,
            "error": ErrorInfo(type=NOT_TRAINED, message=message[:MESSAGE_CHARS], traceback_tail=""),
        }
    )
