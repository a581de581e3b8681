"""The search's oracle: each call runs one trial through the executor and records it as a ``Trial``.

``TrialRunner`` knows what a trial is *for* (search, retry, confirmation,
recommendation check, memory check), what each was asked to do (against which
its 'fits' is vetted, ``pipeline.plausibility``), and when an ambiguous library
error needs evidence (a re-run with more memory) before it counts as out of
memory. It does not know how a process is started: that is the executor's
job, so the same runner drives real children, a gang of ranks, or a scripted
executor in a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from isoprobe.errors import ProbeError
from isoprobe.executors import ChildRun, Executor
from isoprobe.executors.rounds import run_round
from isoprobe.search.insights import step_throughput
from isoprobe.report.outcomes import Outcome, card_was_full, free_at_failure, maybe_allocation_failure
from isoprobe.report.output import Reporter
from isoprobe.pipeline.classify import classify_exit
from isoprobe.pipeline.environment import Target, trial_conditions
from isoprobe.pipeline.plausibility import Asked
from isoprobe.pipeline.data import request_indices
from isoprobe.protocol.messages import StepDone, TrialRequest
from isoprobe.report import steady
from isoprobe.report.result import RankTrial, Trial
from isoprobe.search.history import Observation
from isoprobe.search.margin import Spread, clears, near, spread_for
from isoprobe.spec.model import Spec
from isoprobe.report.steady import SteadyRule
from isoprobe.spec.units import format_bytes

#: The purposes whose trials the search itself asked for (its history).
_SEARCH_PURPOSES = ("search", "retry", "confirmation")


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
        eval_seconds=_rounded(result.eval_seconds, 4) if result else None,
        applied=result.applied if result else None,
        seconds=round(run.seconds, 3),
        warm_start=run.warm,
        forked=run.forked,
        phase=end.phase,
        error=result.error if result else None,
        exit_code=run.returncode,
        signal=end.signal_name,
        stderr_tail=run.stderr_tail if keep_stderr and run.stderr_tail else None,
        reclassified=end.evidence,
        command_ranks=result.command_ranks if result else None,
        budget_swing_bytes=result.budget_swing_bytes if result else None,
        heap_churn_bytes=(result.heap_churn_bytes if result and result.heap_churn_bytes is not None
                          else steps_heap_churn(step_events)),
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
    return (f"isoprobe's fork server failed while it ran a trial of batch {batch_size} ({run.lost}"
            + (f"; {times} times in a row" if times > 1 else "") + "). That says nothing about the batch, so "
            "the probe stops without an answer rather than count it. Run it again; if this repeats, set "
            "search.fork_server: false to spawn each trial instead")


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
        deciding = unfit[0] if unfit else max(
            range(len(per_rank)), key=lambda r: (per_rank[r].budget_peak_bytes or per_rank[r].peak_bytes or 0, -r))
    ranks = [
        RankTrial(rank=rank, outcome=trial.outcome, peak_bytes=trial.peak_bytes,
                  budget_peak_bytes=trial.budget_peak_bytes, base_bytes=trial.base_bytes, sizes=trial.sizes,
                  exit_code=trial.exit_code,
                  stopped_by_gang=run.failed_rank is not None and rank != run.failed_rank,
                  node=run.ranks[rank].node)
        for rank, trial in enumerate(per_rank)
    ]
    churns = [trial.heap_churn_bytes for trial in per_rank if trial.heap_churn_bytes is not None]
    return per_rank[deciding].model_copy(update={
        "ranks": ranks, "failed_rank": run.failed_rank, "gang_stop_seconds": run.gang_stop_seconds,
        "seconds": round(run.seconds, 3), "heap_churn_bytes": max(churns) if churns else None,
    })


class TrialRunner:
    """Runs trials through an executor and keeps them all, in order, as the result's ``trials``."""

    def __init__(self, spec: Spec, target: Target, executor: Executor, python_path: list[str], reporter: Reporter):
        self.spec = spec
        self.target = target
        self.executor = executor
        self.python_path = python_path
        self.reporter = reporter
        self.trials: list[Trial] = []
        self.allocator_label: str | None = None  # set while comparing allocators: tags each trial
        #: Set during the evaluation search (training.eval_pass): each trial runs this training batch's steps, then
        #: one evaluation pass at the batch it is asked for (``pipeline.eval_edge``).
        self.eval_after: int | None = None
        self.length: int | None = None  # set by the token search: the bucket length its trials run at (and are tagged with)
        self.conditions = trial_conditions(spec, target.backend, target.info.memory_budget_bytes,
                                           model_imports=target.model_imports)
        #: How long a trial that decides the maximum steps (None: search.steady_steps is 0, every trial is short).
        # A quiet heap's shorter window where its trials read their heap churn: one process of isoprobe's own on the
        # CPU backend (a gang's ranks and a command keep the window: their growth was measured to pause).
        quiet = target.backend == "cpu" and spec.command is None and spec.distributed.strategy == "none"
        self.steady_rule = steady.rule_for(spec.search.steps, spec.search.steady_steps, quiet=quiet)

    def at_length(self, spec: Spec, length: int) -> None:
        """From now on trials run ``spec`` (whose input.shape[0] is ``length``) and are tagged with the length."""
        self.spec = spec
        self.length = length

    def same_question(self) -> list[Trial]:
        """The trials that asked what the next one asks: at the current length (all of them without one)."""
        return [t for t in self.trials if t.length == self.length]

    def use_allocator(self, label: str) -> None:
        """From now on trials run under this ``allocators`` entry (and are tagged with it)."""
        self.allocator_label = label
        self.conditions = trial_conditions(self.spec, self.target.backend, self.target.info.memory_budget_bytes,
                                           label, self.target.model_imports)
        self.executor.prestart(self.conditions)

    def run(self, batch_size: int, purpose: str = "search", steps: int | None = None,
            rule: SteadyRule | None = None) -> Trial:
        """One trial (``steps``: instead of search.steps; ``rule``: steps on until steady); an ambiguous library error needs evidence before it
        is classified: a re-run with more memory under a budget, the card's free memory at the failure without."""
        budget = self.target.info.memory_budget_bytes
        trial = self._launch(batch_size, purpose, budget, steps, rule)
        if not (trial.outcome is Outcome.ERROR and trial.error is not None
                and maybe_allocation_failure(trial.error.message)):
            return trial
        headline = f"{trial.error.type}: {trial.error.message.splitlines()[0] if trial.error.message else ''}"
        if budget is not None:
            larger = self._larger_budget(budget)
            check = self._launch(batch_size, "memory_check", larger, steps, rule)
            if check.outcome is Outcome.FITS:
                trial = self._reclassify(trial, (
                    f"{headline} under the {format_bytes(budget)} budget, but batch {batch_size} fit with "
                    f"{format_bytes(larger) if larger else 'no cap'} (trial {check.index}): an allocation failure"))
        elif self.target.backend == "cuda" and (memory := trial.error.cuda_memory) is not None:
            free = free_at_failure(memory.free_bytes, memory.reserved_bytes, memory.allocated_bytes)
            if card_was_full(free, memory.total_bytes):
                trial = self._reclassify(trial, (
                    f"{headline} with {format_bytes(free)} of {format_bytes(memory.total_bytes)} free on the card, "
                    f"the allocator's cache counted as free (this process had {format_bytes(memory.allocated_bytes)} "
                    "allocated): a library could not get its memory, an allocation failure"))
        return trial

    def _reclassify(self, trial: Trial, reason: str) -> Trial:
        """An ambiguous error proven to be an allocation failure: out_of_memory, with the evidence."""
        trial = trial.model_copy(update={"outcome": Outcome.OUT_OF_MEMORY, "reclassified": reason})
        self.trials[trial.index - 1] = trial
        self.reporter.note(f"trial {trial.index} reclassified as out_of_memory: {reason}")
        return trial

    def _larger_budget(self, budget: int) -> int | None:
        """Twice the budget: on CPU capped at the machine's RAM; on CUDA no cap at all (the whole card)."""
        if self.target.backend == "cuda":
            return None
        return min(2 * budget, self.target.info.total_memory_bytes)

    def _launch(self, batch_size: int, purpose: str, budget: int | None, steps: int | None = None,
                rule: SteadyRule | None = None) -> Trial:
        index = len(self.trials) + 1
        evaluation = self.eval_after is not None
        request = TrialRequest(spec=self.spec, batch_size=self.eval_after if evaluation else batch_size,
                               eval_batch_size=batch_size if evaluation else None, device=self.target.device,
                               memory_budget_bytes=budget, python_path=self.python_path, steps=steps, steady=rule,
                               cuda_outside_bytes=self.target.cuda_outside_bytes if self.spec.command else None,
                               # the longest samples first: any batch of the trial (training or evaluation) is a prefix
                               data_indices=request_indices(self.target.data, max(batch_size, self.eval_after or 0)))
        conditions = self.conditions
        if self.target.backend == "cpu" and budget != conditions.memory_limit:
            conditions = replace(conditions, memory_limit=budget)
        recorded: list[Trial] = []
        # A round of one: the trial is recorded with SIGINT/SIGTERM held from the moment its child's end is seen,
        # so a signal then never drops it (issue 25).
        timeout = self.timeout(rule.max_steps if rule else steps)
        run_round(self.executor, [(request, conditions, timeout, f"trial{index:03d}-b{batch_size}")],
                  lambda slot, run: recorded.append(self.record(run, batch_size, purpose,
                                                                self._asked(budget, steps, rule))))
        return recorded[0]

    def record(self, run: ChildRun, batch_size: int, purpose: str, asked: Asked) -> Trial:
        """A finished run as the next of ``trials``, printed (after why it was run again, if it was).

        The executor calls this with SIGINT/SIGTERM held (``executors.rounds``).
        """
        index = len(self.trials) + 1
        for reason in run.lost_before:
            self.reporter.note(f"trial {index} (batch {batch_size}) was run again: {reason}; isoprobe's failure, "
                               "not the batch's, so it is not counted")
        trial = trial_from_run(run, index, batch_size, purpose, asked)
        if self.eval_after is not None:  # its steps ran at the training batch: no throughput of batch_size's
            trial = trial.model_copy(update={"training_batch_size": self.eval_after, "samples_per_second": None,
                                             "step_seconds_spread": None})
        if self.allocator_label is not None:
            trial = trial.model_copy(update={"allocator": self.allocator_label})
        if self.length is not None:
            trial = trial.model_copy(update={"length": self.length})
        self.trials.append(trial)
        self.reporter.trial(trial)
        if trial.reclassified:  # not what the child said: the reason, where people read the progress
            self.reporter.note(f"  trial {index} is {trial.outcome.value}: {trial.reclassified}")
        return trial

    def timeout(self, steps: int | None) -> float:
        """search.trial_timeout, stretched for a trial of more steps than the search's (a soak)."""
        timeout = self.spec.search.trial_timeout
        return timeout * max(1.0, (steps or 0) / self.spec.search.steps)

    def _asked(self, budget: int | None, steps: int | None = None, rule: SteadyRule | None = None) -> Asked:
        """What a trial of this probe is asked to do, under ``budget``: what its 'fits' is vetted against."""
        # An evaluation pass is asked of an evaluation trial, and of every hf_trainer trial (the Trainer's own).
        eval_pass = self.eval_after is not None or (self.spec.training.eval_pass and self.spec.model.hf_trainer is not None)
        return Asked(steps=steps or self.spec.search.steps, backend=self.target.backend, budget_bytes=budget,
                     eval_pass=eval_pass, steady=rule,
                     # A command's processes import what its script imports, not what the check's process did.
                     import_memory=self.target.import_memory if self.spec.command is None else None)

    def observe(self, batch_size: int, deciding: bool = False) -> Observation:
        """The search's oracle. A batch seen before is a retry (after a crash or timeout) or a confirmation.

        ``deciding`` (``search.decides``): the trial would be the maximum if it fit, so it steps until its peak is
        steady (the steady rule) and its fit is the maximum's proof; a confirmation always does."""
        earlier = [t for t in self.trials if t.batch_size == batch_size and t.purpose in _SEARCH_PURPOSES
                   and t.allocator == self.allocator_label and t.training_batch_size == self.eval_after]
        if not earlier:
            purpose = "search"
        elif earlier[-1].outcome in (Outcome.CRASHED, Outcome.TIMED_OUT):
            purpose = "retry"
        else:
            purpose = "confirmation"
        # A trial that decides the reported maximum steps until its peak is steady (isoprobe.report.steady).
        # An evaluation trial is one pass after the steps: nothing in it grows with more steps.
        steady_rule = self.deciding_rule(batch_size) if (deciding or purpose == "confirmation") and self.eval_after is None \
            else None
        trial = self.run(batch_size, purpose, rule=steady_rule)
        return self.observation(trial)

    def observation(self, trial: Trial) -> Observation:
        """What the search learns from ``trial``; a trial that fit inside the spread is marginal (``margin_of``),
        which the search treats as a long-run failure: the maximum is looked for below it.

        A short trial counts too (issue 35): its peak after search.steps steps is at most what the same batch
        reaches in the long run, so if it already left no more than the spread free, a steady run of the batch
        could only leave less, and proving that again in a second process (a steady run of 7 steps or more)
        was the most expensive trial of a probe that ends below it anyway."""
        observation = observation_of(trial, self.spec.search.steps)
        if (margin := self.marginal(trial)) is not None:
            if held_still(trial):
                how = f"fit the long run, but its steady peak left {format_bytes(margin.free)} free"
            else:  # a short trial, or a deciding one that stopped where its peak reached the margin
                how = (f"fit {len(trial.step_seconds)} steps, but its peak already left only "
                       f"{format_bytes(margin.free)} free (a long run's only rises)")
            self.reporter.note(
                f"batch {trial.batch_size} {how}, within the spread of {format_bytes(margin.spread)} (how far "
                "a long run's peak moves between fresh processes and over steps): marginal, a coin toss in a "
                "long run, not the maximum")
            observation = replace(observation, long_run=True)
        return observation

    def deciding_rule(self, batch: int | None = None) -> SteadyRule | None:
        """The steady rule for a trial that decides the maximum, with the stop at the spread (``past_the_margin``):
        a peak that reaches the capacity less the spread ends the trial, which is then marginal. The least spread
        the probe can have after this trial: its own heap churn, read as it runs, may lower a floor no trial has
        measured yet, and a trial stopped short must never turn out to clear it. ``batch``: the trial's (the floor
        is read where it decides, ``search.margin.near``)."""
        if self.steady_rule is None:
            return None
        rule = steady.watching_for(self.steady_rule, self.rising_rate(batch))
        spread = self.spread(least=True, batch=batch)
        if spread is None:
            return rule
        return rule.model_copy(update={"stop_at_bytes": max(0, self.target.search_capacity - spread.bytes)})

    def rising_rate(self, batch: int | None) -> float | None:
        """The fastest rise (bytes a step) of this probe's trials that were still rising at the cap, scaled down
        to ``batch`` where it is smaller (a leak that keeps part of each batch grows with the batch): what a
        deciding trial at ``batch`` must be able to see (``steady.watching_for``). None: no trial was."""
        rates = []
        for t in self.same_question():
            if t.outcome is not Outcome.STILL_RISING:
                continue
            rate = steady.rising_rate(t.step_budget_peak_bytes or t.step_peak_bytes or [])
            if rate:
                scale = min(1.0, batch / t.batch_size) if batch else 1.0
                rates.append(rate * scale)
        return max(rates) if rates else None

    def marginal(self, trial: Trial) -> "Margin | None":
        """The margin of a training trial that fit with no more than the spread free (marginal); None otherwise
        (an evaluation trial's batch is another question: the spread rule does not apply to it)."""
        if trial.outcome is not Outcome.FITS or trial.training_batch_size is not None:
            return None
        margin = self.margin_of(trial)
        return margin if margin is not None and not margin.clears else None

    def spread(self, least: bool = False, batch: int | None = None) -> Spread | None:
        """The spread this probe applies (``search.margin``); None where no rule applies (no steady rule, or
        search.edge_spread 0). ``least``: the least it can be once one more trial has fit, for a trial that
        has not measured its own heap churn yet (``deciding_rule``). ``batch``: the batch it judges; the heap
        churns and swings of trials far below it do not count (``search.margin.near``); None: all of them."""
        if self.steady_rule is None or self.spec.search.edge_spread == 0:
            return None
        runs: dict[int, list[list[int]]] = {}
        swings: list[tuple[int, int]] = []
        churns: list[tuple[int, int]] = []  # fitting trials' only: one that ran out at twice the batch churned twice
        for t in self.same_question():
            if t.purpose != "memory_check" and t.training_batch_size is None and t.allocator == self.allocator_label:
                peaks = t.step_budget_peak_bytes or t.step_peak_bytes
                if peaks:
                    runs.setdefault(t.batch_size, []).append(peaks)
                if t.budget_swing_bytes is not None:
                    swings.append((t.batch_size, t.budget_swing_bytes))
                if t.heap_churn_bytes is not None and t.outcome is Outcome.FITS:
                    churns.append((t.batch_size, t.heap_churn_bytes))
        swings, churns = near(swings, batch), near(churns, batch)
        return spread_for(self.target.backend, self.target.search_capacity,
                          [r for r in runs.values() if len(r) > 1], self.spec.search.edge_spread,
                          # A command's processes (torchrun's ranks too) get a command's floor: its reading is the
                          # data segment the cap counts (search.margin.COMMAND_FLOOR_BYTES).
                          strategy=self.spec.distributed.strategy, command=self.spec.command is not None,
                          # A swing stands in for the heap's hold only where no trial measured the churn that
                          # bounds it (search.margin.CHURN_MARGIN_BYTES): a swing is already in the trial's peak. The
                          # least spread leaves swings out: the next trial may measure the churn and drop them.
                          swings=[] if churns or least else swings, heap_churns=churns, least=least)

    def margin_of(self, trial: Trial) -> "Margin | None":
        """How much a deciding trial's steady peak left free below the capacity, against the spread at its batch."""
        spread = self.spread(batch=trial.batch_size)
        peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
        if spread is None or peak is None:
            return None
        free = self.target.search_capacity - peak
        return Margin(free, spread.bytes, clears(peak, self.target.search_capacity, spread.bytes))


@dataclass(frozen=True)
class Margin:
    """A deciding trial's free memory at its steady peak, and whether that clears the spread."""

    free: int
    spread: int
    clears: bool


def held_still(trial: Trial) -> bool:
    """Whether a trial stepped until its peak held still by its steady rule (not one stopped at the margin, nor a
    short one). Its steps' heap churns as the trial keeps them: the most after the first (``heap_churn_bytes``)."""
    if trial.steady_rule is None:
        return False
    peaks = trial.step_budget_peak_bytes or trial.step_peak_bytes
    return steady.is_steady(peaks, trial.steady_rule, [None] + [trial.heap_churn_bytes] * (len(peaks) - 1))


def observation_of(trial: Trial, short_steps: int) -> Observation:
    """What the search learns from a trial; a deciding trial that failed only after the search's steps
    (out of memory at a later step, or still rising) is a long-run failure (``Observation.long_run``)."""
    if trial.outcome is not Outcome.FITS:
        long_run = trial.steady_rule is not None and (
            trial.outcome is Outcome.STILL_RISING
            or (trial.outcome is Outcome.OUT_OF_MEMORY and len(trial.step_seconds) >= short_steps))
        return Observation(trial.batch_size, trial.outcome, long_run=long_run, steady=trial.steady_rule is not None)
    peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
    return Observation(trial.batch_size, trial.outcome, peak, trial.base_bytes, steady=trial.steady_rule is not None)
