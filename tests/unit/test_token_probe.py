"""search.unit tokens through the whole probe, over a scripted device whose memory depends on the length.

The trials' requests must carry the bucket length (input.shape[0]); the result's budget is the minimum over the
lengths of each one's limit, computed here from the device's own formula; the recommendation and its soak run at
the binding length; ``--format env`` exports the budget.
"""

from __future__ import annotations

import pytest

from isoprobe.executors.scripted import IMPORT_BASELINE_BYTES, ScriptedExecutor, linear
from isoprobe.report.shell import result_variables

from scripted_probe import GiB, MiB, probe

LENGTHS = [40, 100, 250]
FIXED = IMPORT_BASELINE_BYTES + 64 * MiB


def per_sample(length: int) -> int:
    """Quadratic in the length (attention), so the longest bucket binds unless the floors say otherwise."""
    return length * 40 * 1024 + length * length * 200


def overhead(length: int) -> int:
    """A large cost per sample whatever its length, so the shortest bucket binds (the longer ones' edges are smaller
    sample counts, inside the binding one's range: a recommendation line over them would be wrong)."""
    return 24 * MiB + length * 4 * 1024


def _spec(**search) -> dict:
    return {"model": {"factory": "m.py:f"}, "input": {"shape": [64], "dtype": "int64", "high": 100},
            "target": {"task": "language_modeling"}, "device": "cpu", "memory_budget": 2 * GiB,
            "search": {"unit": "tokens", "bucket_lengths": LENGTHS, **search}}


def _device(cost=per_sample):
    return lambda call: linear(FIXED, cost(call.request.spec.input.shape[0]))(call)


def _truth(budget_bytes: int, cost=per_sample) -> tuple[int, int]:
    """The budget and the binding length, from the device's formula (the search's answer is not used)."""
    limits = {}
    for length in LENGTHS:
        edge = (budget_bytes - FIXED) // cost(length)
        limits[length] = length * (edge + 1) - 1
    smallest = min(limits.values())
    return smallest, max(length for length, limit in limits.items() if limit == smallest)


@pytest.mark.parametrize("cost", [per_sample, overhead])
def test_the_probe_answers_in_tokens_and_recommends_at_the_binding_length(cost):
    probed = probe(_spec(), ScriptedExecutor(_device(cost)))
    tokens = probed.result.tokens
    assert (tokens.max_tokens, tokens.binding_length) == _truth(2 * GiB, cost)
    assert probed.result.answered and probed.result.max_batch_size == tokens.max_tokens // tokens.binding_length
    # every request carried its length, and every trial is tagged with the length it ran
    assert {call.request.spec.input.shape[0] for call in probed.executor.calls} == set(LENGTHS)
    assert [t.length for t in probed.trials] == [c.request.spec.input.shape[0] for c in probed.executor.calls]
    # The recommendation's proof is at the binding length: its soak, or (issue 35) the binding batch's steady
    # confirmation, at a larger batch of the same length.
    soaks = [t for t in probed.trials if t.purpose == "soak"]
    proof = probed.result.recommendation.proven_by_trial
    assert all(t.length == tokens.binding_length for t in soaks)
    assert soaks or (proof is not None and probed.trials[proof - 1].length == tokens.binding_length
                     and probed.trials[proof - 1].steady_rule is not None)
    assert tokens.recommended_tokens == tokens.binding_length * probed.result.recommended_batch_size
    assert tokens.trials == len([t for t in probed.trials if t.purpose in ("search", "confirmation")])
    exported = dict(result_variables(probed.result))
    assert exported["ISOPROBE_MAX_TOKENS"] == str(tokens.max_tokens)
    assert exported["ISOPROBE_BINDING_LENGTH"] == str(tokens.binding_length)
    assert any(line.startswith("isoprobe: trial") and f"x {tokens.binding_length}" in line for line in probed.lines)


@pytest.mark.parametrize("cost", [per_sample, overhead])
def test_the_recommendation_reads_only_the_binding_lengths_trials(cost):
    """A memory line over every length's trials would mix per-sample costs that differ by the length: the
    recommendation's line is exactly the binding length's."""
    probed = probe(_spec(), ScriptedExecutor(_device(cost)))
    binding = probed.result.tokens.binding_length
    assert binding == (min(LENGTHS) if cost is overhead else max(LENGTHS))
    model = probed.result.recommendation.memory_model
    # With the shortest binding, one batch fit at it: its line runs from that trial's base reading to its peak
    # (issue 35), and none is drawn through the longer lengths' trials (whose slope is another length's).
    assert (model.points == 1) if cost is overhead else (model.per_sample_bytes == cost(binding))


def test_samples_is_still_the_default():
    spec = _spec()
    del spec["search"]
    probed = probe(spec, ScriptedExecutor(linear(FIXED, per_sample(64))))
    assert probed.result.tokens is None and all(t.length is None for t in probed.trials)
    assert "ISOPROBE_MAX_TOKENS" not in dict(result_variables(probed.result))


@pytest.mark.parametrize("confirmations", [0, 2])
def test_the_token_search_runs_the_confirmations_asked(confirmations):
    """Issue 34, the same class in the token search: it ran the binding batch's confirmation once whatever
    search.confirmations said (0 still ran one, 2 ran one). Now it runs as many as asked (0: none where the binding
    batch already ran at its own length), and the budget is the same."""
    plain = probe(_spec(), ScriptedExecutor(_device()))
    probed = probe(_spec(confirmations=confirmations), ScriptedExecutor(_device()))
    tokens = probed.result.tokens
    assert (tokens.max_tokens, tokens.binding_length) == (plain.result.tokens.max_tokens, _truth(2 * GiB)[1])
    at = [t for t in probed.trials if t.length == tokens.binding_length and t.batch_size == tokens.binding_samples]
    assert [t.purpose for t in at].count("confirmation") == confirmations, probed.sequence()
    assert probed.result.max_confirmed == (confirmations > 0)
