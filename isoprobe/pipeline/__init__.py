"""The parent's orchestration: everything between a valid spec and a ``Result``, without torch.

One module per job, in the order a probe runs them:

    answer.py       cache -> lock -> probe -> store: the result for a spec, from the cache or a probe
    pipeline.py     run_probe: environment check, search, recommendation, Result
    kinds.py        what each kind of probe adds: the main search (batch or tokens), allocators, evaluation, a command's
                    refusal, each one's part of the message
    notes.py        what the probe says on stderr before its first trial
    environment.py  the inspect child's facts -> the target device, the trials' process conditions
    inspect_failure.py  why the environment check failed, said by its last phase; an InspectProblem's spec field
    trials.py       TrialRunner: the search's oracle, one executor run per trial
    trial_record.py a finished child's run -> the result's Trial (a gang's: its deciding rank's) (pure)
    spread_rule.py  the spread rule over the probe's trials: the spread a batch must clear, marginal fits (pure)
    classify.py     a finished child's run -> one of the six outcomes, with evidence (pure)
    plausibility.py whether a 'fits' can be true, and whether it stayed within its budget (pure)
    edge.py         the edge search, the recommendation, the allocator comparison over the runner
    parallel.py     the search with several trials per round (search.parallel), one per slot
    steady_edge.py  the long-run search below a maximum that did not hold until steady
    recommendation.py  the recommendation and its soak
    explain.py      the one-sentence answer and what to try next (pure)
    estimate.py     ``isoprobe estimate``: the environment check's traced estimate alone
    prediction.py   the estimate on the parent's side: the search's prior, the result's prediction
    command_ahead.py  whether a command probe starts each trial's command ahead, and the plan for it
    data.py         spec.data on the parent's side: the indices a trial is sent, the cap, the result's data (pure)
    eval_edge.py    training.eval_pass: the evaluation batch's own edge, searched after the training one
    frontier.py     ``isoprobe frontier``: one answer per value of a field, each bounded by the ones before
    tokens.py       search.unit tokens: the token search over trials at each bucket length, recommended at the
                    binding one

Processes are the executor's business (``isoprobe.executors``); the trial
itself is ``isoprobe.child``; what crosses between them is ``isoprobe.protocol.messages``.
"""

__all__ = ["run_probe"]


def __getattr__(name: str):
    """``run_probe`` on first use: a cache hit (probe.answer) must not pay for importing the pipeline."""
    if name == "run_probe":
        from isoprobe.pipeline.pipeline import run_probe

        return run_probe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
