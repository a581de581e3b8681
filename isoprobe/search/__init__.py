"""Pure decisions: where to look next, when to stop, what to recommend. No processes, no I/O, no torch.

Every function here is a function of what the trials have shown (``history.Observation``), so the
search is unit-tested over a scripted oracle without starting a process.

    edge_search.py  the edge search: the next batch, or the conclusion
    history.py      observations, the search's limits, and each batch's verdict
    steps.py        where to look inside the open bracket: doubling, and the model-guided step
    parallel.py     several trials per round, one per slot
    long_run.py     where the long-run edge lies when a short run's peak had not settled
    headroom.py     from the maximum to a recommendation: headroom, then rounding
    margin.py       the spread: how far a long-run peak moves between processes, and the rule a maximum clears
    soak.py         did the recommendation survive a long run, and if not, which batch would
    plan.py         from the recommendation to micro-batch x accumulation steps x ranks
    insights.py     throughput and where the memory goes, from the trials that ran
    frontier_bounds.py  what a frontier point borrows from the others, and the bracket a borrowed bound narrows
    token_budget.py search.unit tokens: the largest token budget every bucket length fits, over fits(samples, length)
"""
