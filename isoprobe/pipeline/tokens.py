"""``search.unit: tokens``: the token search (``search.token_budget``) over real trials, then the recommendation.

Each oracle call is a normal fresh-process trial of the spec with
input.shape[0] set to the bucket length: the request's spec carries the
length, so the child builds its synthetic batch exactly as for any spec. The
recommendation and its soak then run at the binding length: that is the
bucket whose batch is closest to running out under the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from isoprobe.errors import Terminated
from isoprobe.pipeline.edge import edge_of, stop_reason_of
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.explain import Found
from isoprobe.pipeline.recommendation import recommend
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.edge import LengthEdgeInfo, TokenBudget
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.search.token_budget import TokenSearch, search_budget
from isoprobe.spec.model import Spec

#: How a token search that stopped on a trial's outcome stops the probe (as a batch search would).
_STOPS = {
    Outcome.ERROR: StopReason.ERROR,
    Outcome.CRASHED: StopReason.CRASHED,
    Outcome.TIMED_OUT: StopReason.TIMED_OUT,
    Outcome.STILL_RISING: StopReason.STILL_RISING,
    Outcome.OUT_OF_MEMORY: StopReason.START_DOES_NOT_FIT,
}


def spec_at_length(spec: Spec, length: int) -> Spec:
    """The spec with input.shape[0] set to ``length``: what a trial at that bucket length runs."""
    if spec.input is None:  # the spec's validation refuses unit tokens without it (spec.model._tokens_fit)
        raise ValueError("input: unit tokens needs input.shape, whose first dimension is the sequence length")
    shape = [length, *spec.input.shape[1:]]
    return spec.model_copy(update={"input": spec.input.model_copy(update={"shape": shape})})


@dataclass(frozen=True)
class TokensFound:
    """The probe's answer in tokens, and the binding length's edge as a batch answer (``Found``)."""

    found: Found
    tokens: TokenBudget | None


def token_search_and_recommend(spec: Spec, target: Target, runner: TrialRunner) -> TokensFound:
    """The token budget over real trials at each bucket length, then the recommendation at the binding length."""
    lengths = spec.search.bucket_lengths
    if lengths is None:  # the spec's validation refuses unit tokens without them (spec.search_section)
        raise ValueError("bucket_lengths: unit tokens needs the lengths your sampler pads its buckets to")

    def trial(purpose: str):
        def oracle(samples: int, length: int) -> Outcome:
            runner.at_length(spec_at_length(spec, length), length)
            # The binding batch's confirmation steps until its peak is steady, as the batch search's
            # confirmation of its maximum does.
            return runner.run(samples, purpose, rule=runner.steady_rule if purpose == "confirmation" else None).outcome

        return oracle

    try:
        answer = search_budget(
            trial("search"),
            lengths,
            start=spec.search.start_batch_size,
            cap=spec.search.cap,
            confirm=trial("confirmation"),
            retries=spec.search.retries,
            retry=trial("retry"),
            confirmations=spec.search.confirmations_for("tokens"),
        )
    except (KeyboardInterrupt, Terminated) as stopped:
        return TokensFound(Found(stop_reason_of(stopped), None, None), None)
    searched = len(runner.trials)
    found = _found(answer, spec.search.cap)
    recommended_tokens = None
    if found.stop in (StopReason.EDGE_FOUND, StopReason.CAPPED) and answer.binding_length is not None:
        runner.at_length(spec_at_length(spec, answer.binding_length), answer.binding_length)
        try:
            batch, recommendation = recommend(runner.spec, target, runner, edge_of(found))
        except (KeyboardInterrupt, Terminated) as stopped:
            return TokensFound(replace(found, stop=stop_reason_of(stopped)), _info(answer, None, searched))
        found = replace(found, recommended=batch, recommendation=recommendation)
        recommended_tokens = None if batch is None else batch * answer.binding_length
    return TokensFound(found, _info(answer, recommended_tokens, searched))


def _found(answer: TokenSearch, cap: int | None) -> Found:
    """The binding length's edge as the probe's batch answer (max_batch_size, first failing)."""
    if answer.stop is not None:
        return Found(_STOPS.get(answer.stop, StopReason.ERROR), None, None, answer.stop)
    if answer.capped:
        return Found(StopReason.CAPPED, cap, None)
    if answer.budget is None:  # not one sample of the binding length fits
        return Found(StopReason.START_DOES_NOT_FIT, None, 1, Outcome.OUT_OF_MEMORY)
    if answer.binding_length is None:  # search_budget answers a budget only with the length that binds it
        raise ValueError("a token budget without its binding length")
    edge = answer.edge(answer.binding_length)
    return Found(StopReason.EDGE_FOUND, edge.max_fitting, edge.first_failing, Outcome.OUT_OF_MEMORY)


def _info(answer: TokenSearch, recommended_tokens: int | None, trials: int) -> TokenBudget:
    lengths = [
        LengthEdgeInfo(
            length=e.length,
            max_fitting_samples=e.max_fitting,
            first_failing_samples=e.first_failing,
            budget_limit=e.budget_limit,
            trials=e.trials,
        )
        for e in answer.edges
    ]
    binding_samples = (
        answer.budget // answer.binding_length
        if answer.budget is not None and answer.binding_length is not None
        else None
    )
    return TokenBudget(
        max_tokens=answer.budget,
        binding_length=answer.binding_length,
        binding_samples=binding_samples,
        recommended_tokens=recommended_tokens,
        capped=answer.capped,
        lengths=lengths,
        trials=trials,
    )


def token_message(tokens: TokenBudget, batch_message: str) -> str:
    """The answer in words: the budget and its binding bucket first, then the binding length's batch edge."""
    if tokens.max_tokens is None:
        return f"no token budget: {batch_message}"
    if tokens.binding_length is None:
        return (
            f"token budget {tokens.max_tokens}: every bucket length fit the sample cap (search.max_batch_size), "
            f"so the cap binds, not memory; {batch_message}"
        )
    return (
        f"token budget {tokens.max_tokens}: every bucket length fits floor({tokens.max_tokens} / L) samples; "
        f"the binding length is {tokens.binding_length}, where {batch_message}"
    )
