"""The spec's ``search`` section: where the search starts, where it must stop, and what one trial is.

The options of the edge search (``isoprobe.search``, which reads them) and of
the trials it runs: caps, steps per trial, the steady-state rule and its
spread, retries, confirmations, parallel slots, how a trial's process starts,
and the token unit. ``MAX_BATCH_SIZE``, the largest batch any field may name,
is here because the search never tries more.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection
from isoprobe.spec.size_fields import ByteCountOrZero
from isoprobe.spec.units import MAX_BYTES

#: search.cycle_steps' default (``isoprobe.report.cycle``): a validation every 25 or 50 steps is common in scripts that
#: validate by steps; an epoch's end is usually further, and the result then says the answer covers training steps only.
DEFAULT_CYCLE_STEPS = 60
#: search.cycle_seconds' default, counted from the trial's first step.
DEFAULT_CYCLE_SECONDS = 120.0

#: The search never tries more (search.DEFAULT_CEILING); a start or cap above it is a typo.
MAX_BATCH_SIZE = 1 << 24


#: search.bucket_lengths: a length above this is a typo (a million tokens in one sample).
MAX_BUCKET_LENGTH = 1 << 20
#: search.bucket_lengths: at most this many; each costs at least one trial.
MAX_BUCKETS = 64


class SearchSpec(SpecSection):
    """Where the search starts, where it must stop, and what one trial is."""

    start_batch_size: int = Field(
        2,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="First batch tried. 2 by default: BatchNorm needs more than one sample in training.",
    )
    max_batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH_SIZE, description="Never try a batch above this. The answer is this value if it fits."
    )
    dataset_size: int | None = Field(
        None, ge=1, description="Number of samples in the dataset: a batch larger than the dataset is never tried."
    )
    steps: int = Field(
        3,
        ge=2,
        le=1000,
        description=(
            "Training steps per trial (at least 2: Adam's state is allocated at the first optimizer step, "
            "so the second step's peak can exceed the first's)."
        ),
    )
    steady_steps: int | None = Field(
        None,
        ge=0,
        le=10000,
        description=(
            "The most steps a trial that decides the maximum runs while its peak still rises (the trial right below "
            "the smallest failure, whose fit makes it the maximum; a maximum whose only fit was a shorter trial runs "
            "once more; any search.confirmations; the long-run search below a batch that failed the long run): it "
            "stops as soon as the peak has held still for 5 steps (so it runs at least 6). A peak still rising at "
            "this cap is still_rising, not fits. null: 30; 0: off (every trial runs search.steps, and the maximum "
            "is the batch that fit one trial of them)."
        ),
    )
    cycle_steps: int = Field(
        DEFAULT_CYCLE_STEPS,
        ge=0,
        le=100000,
        description=(
            "A command probe: the most optimizer steps a trial that decides the maximum (and the recommendation's "
            "soak) runs waiting for the script's first evaluation pass (forwards without gradients or in eval mode, "
            "more than in every step) and the step after it, so that the maximum has seen the script's later "
            "phases (validation on an EMA model at a larger eval batch, a checkpoint write). It stops as soon as it "
            "has seen one. The result's cycle says what was seen; when a trial reaches this bound without a pass, "
            "later trials no longer wait and the answer covers training steps only. 0: never wait."
        ),
    )
    cycle_seconds: float = Field(
        DEFAULT_CYCLE_SECONDS,
        gt=0,
        le=7 * 24 * 3600,
        description="A command probe: the most seconds, from its first step, a deciding trial waits for the "
        "script's first evaluation pass (with search.cycle_steps, whichever comes first).",
    )
    edge_spread: ByteCountOrZero | None = Field(
        None,
        le=MAX_BYTES,
        description=(
            "How far a batch's long-run peak may move between fresh processes and over steps (the spread): the "
            "maximum reported is a batch whose steady peak leaves more than this free below the capacity; one that "
            "fitted closer is reported in edge_margin.marginal, never as the maximum. null: the backend's measured "
            "floor (docs/steady-state.md), raised to what this probe saw between two runs of one batch; 0: off "
            "(the raw edge, a coin toss in a long run). Applies with the steady rule only (search.steady_steps "
            "not 0)."
        ),
    )
    trial_timeout: float = Field(
        600.0,
        gt=0,
        le=7 * 24 * 3600,
        description="Seconds one trial may take from the moment its process, imports done, receives the request; "
        "then it and everything it started is killed.",
    )
    retries: int = Field(
        1,
        ge=0,
        le=5,
        description=(
            "Extra attempts, each in a fresh process, for a batch whose trial crashed or timed out. If the "
            "failure persists, the batch counts as failing with that class (never as out of memory)."
        ),
    )
    confirmations: int | None = Field(
        None,
        ge=0,
        le=5,
        description=(
            "Extra runs of the maximum after its first fit, each in a fresh process and stepping until its peak is "
            "steady (search.steady_steps). If one fails, the edge is flaky and the answer moves down to the largest "
            "batch that fit every time it ran. null: 0 for the batch search, whose deciding trial (the batch right "
            "below the smallest failure) already stepped until steady and cleared the spread (search.edge_spread: "
            "how far a fresh process may move; a maximum whose only fit was a shorter trial still runs once more, "
            "until steady); 1 for the token search's binding batch and the evaluation batch, which keep their "
            "confirmation. 0: none beyond that (result.max_confirmed false)."
        ),
    )

    def confirmations_for(self, search: Literal["batch", "tokens", "eval"]) -> int:
        """search.confirmations as applied: the spec's, else 0 for the batch search (its deciding trial is the
        proof), 1 for the token and evaluation searches."""
        if self.confirmations is not None:
            return self.confirmations
        return 0 if search == "batch" else 1

    strategy: Literal["guided", "doubling"] = Field(
        "guided",
        description=(
            "guided: fit peak memory = a + k*batch to the trials that fit and jump next to the edge it predicts "
            "(falls back to bisection when the prediction misses); doubling: the classic double-then-bisect. "
            "Both find the same exact edge; guided needs fewer trials."
        ),
    )
    parallel: Literal["auto"] | Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description=(
            "Trials run at once, one per slot; the search then proposes up to that many batches per round "
            "(a k-ary split instead of a bisection) and finds the same exact edge in fewer rounds. On CUDA a "
            "slot is a visible GPU (auto: all of them; they must be the same model with the same memory). On "
            "the CPU backend a slot is one memory budget: at most min(cores, 80 % of RAM // budget) slots "
            "(auto: that many), so that the slots' caps together never exceed the machine. 1 (the default): "
            "one trial at a time. Not with a distributed strategy, where each trial is already a gang: a spec error."
        ),
    )
    warm_start: bool = Field(
        True,
        description=(
            "Start the next trial's process while the current one runs: it imports torch at idle priority "
            "(never touching the GPU), so that it only builds and trains when its turn comes. Saves the import, "
            "seconds per trial; false: each trial's process is started when the trial is due (same imports, "
            "same timeout; only slower). Gangs stepped by srun: see distributed.steps_ahead. With a command "
            "of the shape `python SCRIPT ...` or `python -m MODULE ...`, that process also starts the command's "
            "interpreter, which waits, having run nothing of the script's, until the trial hands it the batch, "
            "only with search.command_ahead."
        ),
    )

    estimate: bool = Field(
        True,
        description=(
            "Trace one training step on fake tensors in the environment check (seconds, no memory) and start the "
            "guided search at the edge it predicts, the measured peaks correcting it: fewer trials. false: no "
            "trace, and the search starts at start_batch_size. The answer is exact either way."
        ),
    )
    command_ahead: bool = Field(
        False,
        description=(
            "A `python SCRIPT ...` or `python -m MODULE ...` command (with search.warm_start): start each trial's "
            "process as a spare, not a fork, and have it start the command's interpreter ahead, waiting, with "
            "nothing of the script's run, until the trial hands it the batch (Trial.started_ahead). Off by default "
            "(issue 55): it takes only the interpreter's start off a trial's path, and on a busy node (6 busy "
            "loops on 2 cores) a probe with it took 1.4 to 1.7 times as long as one whose trials are forked and "
            "start the command when due (265 s against 184 s, 592 against 350), though on a quiet node 0.8 times."
        ),
    )
    fork_server: bool | None = Field(
        None,
        description=(
            "Fork every trial from one server process that imported torch and the model library once (it never "
            "creates a CUDA context nor runs a torch operation): a trial starts in milliseconds instead of "
            "seconds, and is still a fresh process with its own memory, cap, allocator and CUDA context, "
            "contained as a spawned one is, and measuring what a spawned one does (the server's threads and "
            "resident library pages are restored in each fork). null (the default): on the CPU backend, where "
            "this was measured; spawned on CUDA until it is measured on a GPU. true: on both; false: spawn "
            "every trial's process (warm_start then applies). A server that cannot start or dies is replaced "
            "by spawned processes."
        ),
    )

    unit: Literal["samples", "tokens"] = Field(
        "samples",
        description=(
            "What the answer counts. samples (the default): the largest batch. tokens: the largest token budget "
            "per batch T (samples x padded length) for a length-bucketing sampler: every bucket length L of "
            "search.bucket_lengths, filled with floor(T / L) samples of length L (input.shape[0]), fits. "
            "See docs/data.md#token-budgets."
        ),
    )
    bucket_lengths: list[Annotated[int, Field(ge=1, le=MAX_BUCKET_LENGTH)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BUCKETS,
        description=(
            "With unit tokens: the padded lengths your sampler's buckets produce (positive integers, e.g. "
            "[128, 256, 512, 1024]); each trial's input.shape[0] is one of them. The budget is the largest one "
            "every length fits; the result names the binding (worst) length."
        ),
    )

    @model_validator(mode="after")
    def _start_within_caps(self) -> SearchSpec:
        for name in ("max_batch_size", "dataset_size"):
            cap = getattr(self, name)
            if cap is not None and self.start_batch_size > cap:
                raise ValueError(f"start_batch_size {self.start_batch_size} is above {name} {cap}")
        if self.unit == "tokens" and self.bucket_lengths is None:
            raise ValueError(
                "bucket_lengths: unit tokens needs the lengths your sampler pads its buckets to, e.g. "
                "search.bucket_lengths: [128, 256, 512]"
            )
        if self.bucket_lengths is not None and self.unit != "tokens":
            raise ValueError("bucket_lengths: applies to unit tokens; set search.unit: tokens, or remove it")
        if self.unit == "tokens" and self.parallel != 1:
            raise ValueError(
                "unit: tokens runs one trial at a time (each length's trial decides where the next "
                "goes); set search.parallel to 1"
            )
        return self

    @property
    def cap(self) -> int | None:
        """The largest batch the search may try, or None when only memory limits it."""
        caps = [c for c in (self.max_batch_size, self.dataset_size) if c is not None]
        return min(caps) if caps else None
