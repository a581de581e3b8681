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

from dataclasses import replace

from isoprobe.executors import ChildRun, Conditions, Executor
from isoprobe.executors.rounds import run_round
from isoprobe.pipeline.command_ahead import command_plan
from isoprobe.pipeline.data import request_indices
from isoprobe.pipeline.environment import Target, trial_conditions
from isoprobe.pipeline.plausibility import Asked
from isoprobe.pipeline.spread_rule import Margin, fastest_rise, held_still, margin_against, observation_of, probe_spread
from isoprobe.pipeline.trial_record import judged_against, trial_from_run
from isoprobe.protocol.messages import TrialRequest
from isoprobe.report import steady
from isoprobe.report.cycle import CycleRule
from isoprobe.report.outcomes import Outcome, card_was_full, free_at_failure, handle_creation, maybe_allocation_failure
from isoprobe.report.output import Reporter
from isoprobe.report.steady import SteadyRule
from isoprobe.report.trial import Trial
from isoprobe.search.history import Observation
from isoprobe.search.margin import Spread
from isoprobe.spec.command import command_placeholder
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes

#: The purposes whose trials the search itself asked for (its history).
_SEARCH_PURPOSES = ("search", "retry", "confirmation")


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
        self.length: int | None = (
            None  # set by the token search: the bucket length its trials run at (and are tagged with)
        )
        self.conditions = self._conditions(None)
        #: How long a trial that decides the maximum steps (None: search.steady_steps is 0, every trial is short).
        # A quiet heap's shorter window where its trials read their heap churn: one process of isoprobe's own on the
        # CPU backend (a gang's ranks and a command keep the window: their growth was measured to pause).
        quiet = target.backend == "cpu" and spec.command is None and spec.distributed.strategy == "none"
        self.steady_rule = steady.rule_for(spec.search.steps, spec.search.steady_steps, quiet=quiet)
        #: A command probe's deciding trials wait for the script's first evaluation pass (``report.cycle``), a
        #: framework's evaluate early; None
        #: once one of them reached the bound without seeing any (later trials would only wait as long again).
        # model.lightning and model.hf_trainer schedule the user's evaluation early instead (their runners).
        framework = spec.model.lightning is not None or spec.model.hf_trainer is not None
        #: A probe runs one trial of purpose batch_check at most (``_check_batch``).
        self.batch_checked = False
        self.cycle_rule = (
            CycleRule(max_steps=spec.search.cycle_steps, max_seconds=spec.search.cycle_seconds)
            if (spec.command is not None or framework) and spec.search.cycle_steps
            else None
        )

    def _conditions(self, allocator_label: str | None) -> Conditions:
        """How this probe's trial processes start (with a command's plan to start it ahead, ``command_ahead``)."""
        conditions = trial_conditions(
            self.spec,
            self.target.backend,
            self.target.info.memory_budget_bytes,
            allocator_label,
            self.target.model_imports,
        )
        return replace(
            conditions,
            command_plan=command_plan(
                self.spec, self.target.device, self.target.info.memory_budget_bytes, self.target.cuda_outside_bytes
            ),
        )

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
        self.conditions = self._conditions(label)
        self.executor.prestart(self.conditions)

    def run(
        self, batch_size: int, purpose: str = "search", steps: int | None = None, rule: SteadyRule | None = None
    ) -> Trial:
        """One trial (``steps``: instead of search.steps; ``rule``: steps on until steady); an ambiguous library
        error needs evidence before it is classified: a re-run with more memory under a budget, the card's free
        memory at the failure without."""
        budget = self.target.info.memory_budget_bytes
        trial = self._launch(batch_size, purpose, budget, steps, rule)
        trial = self._check_batch(trial, budget)
        error = trial.error
        if trial.outcome is not Outcome.ERROR or error is None or not maybe_allocation_failure(error.message):
            return trial
        headline = f"{error.type}: {error.message.splitlines()[0] if error.message else ''}"
        if budget is not None:
            larger = self._larger_budget(budget)
            check = self._launch(batch_size, "memory_check", larger, steps, rule)
            if check.outcome is Outcome.FITS:
                trial = self._reclassify(
                    trial,
                    (
                        f"{headline} under the {format_bytes(budget)} budget, but batch {batch_size} fit with "
                        f"{format_bytes(larger) if larger else 'no cap'} (trial {check.index}): an allocation failure"
                    ),
                )
        elif self.target.backend == "cuda" and (memory := error.cuda_memory) is not None:
            free = free_at_failure(memory.free_bytes, memory.reserved_bytes, memory.allocated_bytes, error.message)
            cache = (
                "a library handle's creation, which never gets the allocator's cache back"
                if handle_creation(error.message)
                else "the allocator's cache counted as free"
            )
            if card_was_full(free, memory.total_bytes):
                trial = self._reclassify(
                    trial,
                    (
                        f"{headline} with {format_bytes(free)} of {format_bytes(memory.total_bytes)} free on the card, "
                        f"{cache} (this process had {format_bytes(memory.allocated_bytes)} "
                        "allocated): a library could not get its memory, an allocation failure"
                    ),
                )
        return trial

    def _check_batch(self, trial: Trial, budget: int | None) -> Trial:
        """A command trial that fit with its batch nowhere in its model's inputs, and no trial at half its batch or
        less to compare it with: the command at a quarter of the batch, once a probe, and the trial judged against
        it (``report.batch_check``): a finder that settled below the batch, or a fixed batch, is refused here."""
        check = trial.batch_check
        if (
            self.spec.command is None
            or self.batch_checked
            or trial.outcome is not Outcome.FITS
            or check is None
            or check.verdict != "unclear"
            or trial.batch_size < 4
            or any(t.batch_check is not None and 2 * t.batch_size <= trial.batch_size for t in self.same_question())
        ):
            return trial
        self.batch_checked = True
        self.reporter.note(
            f"trial {trial.index}: batch {trial.batch_size} is nowhere in the model's inputs; running "
            f"the command at {trial.batch_size // 4} to compare"
        )
        reference = self._launch(trial.batch_size // 4, "batch_check", budget)
        judged = judged_against(trial, [reference], command_placeholder(self.spec))
        if judged is not trial:
            if judged.error is None:  # judged_against answers another trial only as the error it found
                raise RuntimeError(f"trial {trial.index}: judged against batch {reference.batch_size} without an error")
            self.trials[trial.index - 1] = judged
            self.reporter.note(f"  trial {trial.index} is an error: {judged.error.message}")
        return judged

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

    def _launch(
        self,
        batch_size: int,
        purpose: str,
        budget: int | None,
        steps: int | None = None,
        rule: SteadyRule | None = None,
    ) -> Trial:
        index = len(self.trials) + 1
        evaluation = self.eval_after is not None
        waits = self.cycle_rule if (rule is not None or steps is not None) and not evaluation else None
        request = TrialRequest(
            spec=self.spec,
            batch_size=self.eval_after if evaluation else batch_size,
            eval_batch_size=batch_size if evaluation else None,
            device=self.target.device,
            memory_budget_bytes=budget,
            python_path=self.python_path,
            steps=steps,
            steady=rule,
            cycle=waits,
            cuda_outside_bytes=self.target.cuda_outside_bytes if self.spec.command else None,
            margin_check_bytes=None if evaluation else self._margin_check(batch_size),
            # the longest samples first: any batch of the trial (training or evaluation) is a prefix
            data_indices=request_indices(self.target.data, max(batch_size, self.eval_after or 0)),
        )
        conditions = self.conditions
        if self.target.backend == "cpu" and budget != conditions.memory_limit:
            conditions = replace(conditions, memory_limit=budget)
        recorded: list[Trial] = []
        # A round of one: the trial is recorded with SIGINT/SIGTERM held from the moment its child's end is seen,
        # so a signal then never drops it (issue 25).
        timeout = self.timeout(max(rule.max_steps if rule else steps or 0, waits.max_steps if waits else 0) or None)
        run_round(
            self.executor,
            [(request, conditions, timeout, f"trial{index:03d}-b{batch_size}")],
            lambda slot, run: recorded.append(
                self.record(run, batch_size, purpose, self._asked(budget, steps, rule, waits))
            ),
        )
        self._learn_cycle(recorded[0])
        return recorded[0]

    def _learn_cycle(self, trial: Trial) -> None:
        """A deciding trial that waited for the script's evaluation pass to the bound and saw none: later trials do
        not wait (each would run as long again to see nothing), and the progress says so."""
        seen = trial.cycle
        if self.cycle_rule is None or seen is None or not seen.waited or seen.bound not in ("steps", "seconds"):
            return
        self.cycle_rule = None
        self.reporter.note(
            f"trial {trial.index} saw no evaluation pass within {seen.steps} steps "
            f"(search.cycle_{seen.bound}): later trials do not wait for one, and the answer covers "
            "training steps only"
        )

    def record(self, run: ChildRun, batch_size: int, purpose: str, asked: Asked) -> Trial:
        """A finished run as the next of ``trials``, printed (after why it was run again, if it was).

        The executor calls this with SIGINT/SIGTERM held (``executors.rounds``).
        """
        index = len(self.trials) + 1
        for reason in run.lost_before:
            self.reporter.note(
                f"trial {index} (batch {batch_size}) was run again: {reason}; isoprobe's failure, "
                "not the batch's, so it is not counted"
            )
        trial = trial_from_run(run, index, batch_size, purpose, asked)
        if self.eval_after is not None:  # its steps ran at the training batch: no throughput of batch_size's
            trial = trial.model_copy(
                update={"training_batch_size": self.eval_after, "samples_per_second": None, "step_seconds_spread": None}
            )
        if self.allocator_label is not None:
            trial = trial.model_copy(update={"allocator": self.allocator_label})
        if self.length is not None:
            trial = trial.model_copy(update={"length": self.length})
        if self.spec.command is not None and purpose != "batch_check":  # that one is the trial it checks' judge
            trial = judged_against(trial, self.trials, command_placeholder(self.spec))
        self.trials.append(trial)
        self.reporter.trial(trial)
        if trial.reclassified:  # not what the child said: the reason, where people read the progress
            self.reporter.note(f"  trial {index} is {trial.outcome.value}: {trial.reclassified}")
        return trial

    def timeout(self, steps: int | None) -> float:
        """search.trial_timeout, stretched for a trial of more steps than the search's (a soak)."""
        timeout = self.spec.search.trial_timeout
        return timeout * max(1.0, (steps or 0) / self.spec.search.steps)

    def _asked(
        self,
        budget: int | None,
        steps: int | None = None,
        rule: SteadyRule | None = None,
        cycle: CycleRule | None = None,
    ) -> Asked:
        """What a trial of this probe is asked to do, under ``budget``: what its 'fits' is vetted against."""
        # An evaluation pass is asked of an evaluation trial, and of every hf_trainer trial (the Trainer's own).
        eval_pass = self.eval_after is not None or (
            self.spec.training.eval_pass and self.spec.model.hf_trainer is not None
        )
        return Asked(
            steps=steps or self.spec.search.steps,
            backend=self.target.backend,
            budget_bytes=budget,
            eval_pass=eval_pass,
            steady=rule,
            cycle=cycle,
            # A command's processes import what its script imports, not what the check's process did.
            import_memory=self.target.import_memory if self.spec.command is None else None,
        )

    def observe(self, batch_size: int, deciding: bool = False) -> Observation:
        """The search's oracle. A batch seen before is a retry (after a crash or timeout) or a confirmation.

        ``deciding`` (``search.decides``): the trial would be the maximum if it fit, so it steps until its peak is
        steady (the steady rule) and its fit is the maximum's proof; a confirmation always does."""
        earlier = [
            t
            for t in self.trials
            if t.batch_size == batch_size
            and t.purpose in _SEARCH_PURPOSES
            and t.allocator == self.allocator_label
            and t.training_batch_size == self.eval_after
        ]
        if not earlier:
            purpose = "search"
        elif earlier[-1].outcome in (Outcome.CRASHED, Outcome.TIMED_OUT):
            purpose = "retry"
        else:
            purpose = "confirmation"
        # A trial that decides the reported maximum steps until its peak is steady (isoprobe.report.steady).
        # An evaluation trial is one pass after the steps: nothing in it grows with more steps.
        steady_rule = (
            self.deciding_rule(batch_size)
            if (deciding or purpose == "confirmation") and self.eval_after is None
            else None
        )
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
                how = (
                    f"fit {len(trial.step_seconds)} steps, but its peak already left only "
                    f"{format_bytes(margin.free)} free (a long run's only rises)"
                )
            self.reporter.note(
                f"batch {trial.batch_size} {how}, within the spread of {format_bytes(margin.spread)} (how far "
                "a long run's peak moves between fresh processes and over steps): marginal, a coin toss in a "
                "long run, not the maximum"
            )
            observation = replace(observation, long_run=True)
        return observation

    def _margin_check(self, batch: int) -> int | None:
        """CUDA, isoprobe's own loop: the reading at which a trial tests its margin instead of reading it
        (``TrialRequest.margin_check_bytes``): the capacity less the least spread at ``batch``."""
        if self.target.backend != "cuda" or self.spec.command is not None:
            return None
        spread = self.spread(least=True, batch=batch)
        return None if spread is None else max(0, self.target.search_capacity - spread.bytes)

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
        """The fastest rise of this probe's still-rising trials, at ``batch`` (``spread_rule.fastest_rise``)."""
        return fastest_rise(self.same_question(), batch)

    def marginal(self, trial: Trial) -> Margin | None:
        """The margin of a training trial that fit with no more than the spread free (marginal); None otherwise
        (an evaluation trial's batch is another question: the spread rule does not apply to it)."""
        if trial.outcome is not Outcome.FITS or trial.training_batch_size is not None:
            return None
        margin = self.margin_of(trial)
        return margin if margin is not None and not margin.clears else None

    def spread(self, least: bool = False, batch: int | None = None) -> Spread | None:
        """The spread this probe applies (``spread_rule.probe_spread``); None where no rule applies (no steady
        rule, or search.edge_spread 0)."""
        if self.steady_rule is None or self.spec.search.edge_spread == 0:
            return None
        return probe_spread(
            self.same_question(),
            allocator=self.allocator_label,
            backend=self.target.backend,
            capacity=self.target.search_capacity,
            edge_spread=self.spec.search.edge_spread,
            strategy=self.spec.distributed.strategy,
            command=self.spec.command is not None,
            least=least,
            batch=batch,
        )

    def margin_of(self, trial: Trial) -> Margin | None:
        """How much a deciding trial's steady peak left free below the capacity, against the spread at its batch."""
        return margin_against(trial, self.spread(batch=trial.batch_size), self.target.search_capacity)
