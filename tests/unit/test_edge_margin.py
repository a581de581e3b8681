"""The spread rule (issue 34): a maximum that holds in every long run, or says it may not.

A deciding trial (the confirmation, a long-run trial) that fits with its steady peak closer to the capacity than
the spread (``search.margin``) is marginal: reported in ``edge_margin.marginal``, never as the maximum. Probes of
scripted devices through the real search, classification and result; and the pure arithmetic.
"""

from __future__ import annotations

from dataclasses import replace

from isoprobe.executors.scripted import Call, ScriptedExecutor, fits, linear, out_of_memory
from isoprobe.pipeline.trial_record import steps_heap_churn
from isoprobe.protocol.messages import StepDone
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report import steady
from isoprobe.report.steady import swing_bytes
from isoprobe.search import margin

from scripted_probe import HOG_PER_SAMPLE, MiB, hog_spec, probe

BUDGET = 1536 * MiB
#: memory_hog's device with 12 MiB more fixed: batch 25 peaks 1532 MiB, 4 MiB below the cap (inside the CPU
#: floor of 8 MiB), 24 peaks 1500 MiB (36 MiB free), 26 runs out of memory.
TIGHT_FIXED = BUDGET - 4 * MiB - 25 * HOG_PER_SAMPLE
#: The same with batch 25 at 7 MiB below the cap: inside a process's floor (8 MiB), outside a command's (6 MiB).
COMMAND_FIXED = BUDGET - 7 * MiB - 25 * HOG_PER_SAMPLE


# --------------------------------------------------------------------------- the arithmetic

def test_the_floor_is_the_larger_of_the_fixed_part_and_the_fraction_of_the_capacity():
    assert margin.floor_bytes("cpu", 1536 * MiB) == margin.FLOOR_BYTES["cpu"]
    assert margin.floor_bytes("cpu", 80 * 1024 * MiB) == int(margin.FLOOR_FRACTION["cpu"] * 80 * 1024 * MiB)
    assert margin.floor_bytes("cuda", 1024 * MiB) == margin.FLOOR_BYTES["cuda"]


def test_the_observed_spread_is_the_widest_gap_between_two_runs_after_the_same_step():
    assert margin.observed_bytes([[10, 20, 30]]) is None  # one run: nothing to compare
    assert margin.observed_bytes([[10, 20, 30], [12, 25]]) == 5  # only the steps both ran
    assert margin.observed_bytes([[10, 20], [12, 20], [10, 29]]) == 9
    spread = margin.spread_for("cpu", BUDGET, [[[0, 30 * MiB], [0, 10 * MiB]]])
    assert spread.observed_bytes == 20 * MiB and spread.bytes == 20 * MiB  # above the floor: it wins
    assert margin.spread_for("cpu", BUDGET, [], override=0).bytes == 0


def test_a_peak_clears_only_with_more_than_the_spread_free_and_the_jump_reaches_the_first_that_does():
    assert margin.clears(100, 110, 9) and not margin.clears(100, 110, 10)
    # 1 free, 8 needed, 2 a sample: 7 more to free, so 4 samples down (8 more free).
    assert margin.samples_to_clear(1, 8, 2.0) == 4
    assert margin.samples_to_clear(1, 8, None) == 1


# --------------------------------------------------------------------------- probes of scripted devices

def test_a_maximum_inside_the_spread_is_marginal_and_the_one_below_is_reported():
    probed = probe(hog_spec(), ScriptedExecutor(linear(TIGHT_FIXED, HOG_PER_SAMPLE)))
    result = probed.result
    assert probed.exit_code == 0 and result.stop_reason is StopReason.EDGE_FOUND
    assert result.max_batch_size == 24 and result.first_failing_batch_size in (None, 26)
    edge = result.edge_margin
    assert edge.spread_bytes == margin.FLOOR_BYTES["cpu"] and edge.capacity_bytes == BUDGET
    assert edge.max_free_bytes == 36 * MiB > edge.spread_bytes
    (marginal,) = edge.marginal
    assert (marginal.batch_size, marginal.runs, marginal.fitted, marginal.free_bytes) == (25, 1, 1, 4 * MiB)
    assert result.short_max_batch_size is None  # 25 is only too close to the cap
    # Issue 35: 25 ran once, stepping until steady; issue 49: as the line's edge, which it reached a tenth of a
    # sample above 25 (``steps.edge_first``), so no batch above it ran: 2, 13, 25, then 24 in the long run.
    assert len([t for t in result.trials if t.batch_size == 25]) == 1
    assert [t.batch_size for t in result.trials] == [2, 13, 25, 24]
    assert "batch 25 fit only inside the spread" in result.message
    # 24 is proven by a trial that ran until steady, like every maximum.
    (proof,) = [t for t in result.trials if t.batch_size == 24 and t.steady_rule is not None]
    assert proof.outcome is Outcome.FITS and proof.purpose == "long_run"
    assert any("marginal" in line for line in probed.lines)


def test_a_maximum_with_room_is_reported_as_before_with_its_margin():
    result = probe(hog_spec(), ScriptedExecutor(linear(TIGHT_FIXED - 20 * MiB, HOG_PER_SAMPLE))).result
    assert (result.max_batch_size, result.first_failing_batch_size) == (25, 26)
    assert result.edge_margin.max_free_bytes == 24 * MiB and result.edge_margin.marginal == []


def test_the_spread_is_raised_to_what_two_runs_of_one_batch_showed():
    """A device whose deciding runs peak 20 MiB apart from the search's after the same step: the 8 MiB floor
    would pass batch 25 (16 MiB free), the spread this probe measured does not."""
    fixed = BUDGET - 16 * MiB - 25 * HOG_PER_SAMPLE

    def jittery(call: Call):
        peak = fixed + HOG_PER_SAMPLE * call.batch_size
        if peak > BUDGET:
            return out_of_memory(at_step=1)
        if call.request.steady is None:
            return fits(peak, base_bytes=fixed, step_peaks=[peak, peak])
        return fits(peak, base_bytes=fixed, step_peaks=[peak - 20 * MiB] + [peak] * 6)

    # From 25: its first trial is a short one (nothing above it failed yet), so its proof is a second, steady run.
    result = probe(hog_spec(start_batch_size=25), ScriptedExecutor(jittery)).result
    assert result.edge_margin.observed_bytes == 20 * MiB and result.edge_margin.spread_bytes == 20 * MiB
    assert result.max_batch_size == 24
    assert [m.batch_size for m in result.edge_margin.marginal] == [25]


def test_the_jump_below_a_marginal_batch_follows_the_line_and_the_answer_is_exact():
    """2 MiB a sample, batch 25 leaves 1 MiB: the first batch that clears the 8 MiB spread is 21 (9 MiB free);
    the long-run search lands there and proves 22 to 24 marginal or not tried, never reported."""
    per_sample = 2 * MiB
    fixed = BUDGET - 1 * MiB - 25 * per_sample
    spec = hog_spec(start_batch_size=20)
    result = probe(spec, ScriptedExecutor(linear(fixed, per_sample))).result
    assert result.max_batch_size == 21
    # 22's short trial already left 7 MiB (issue 35: marginal without a steady run of its own: a long run's
    # peak only rises), so nothing above it ran: no batch was seen to fail, and the marginal ones bound it.
    assert result.first_failing_batch_size is None
    marginal = {m.batch_size for m in result.edge_margin.marginal}
    assert marginal == {22} and [t.steady_rule for t in result.trials if t.batch_size in marginal] == [None]
    assert len(result.trials) == 3  # 20 and 22 short, 21 until steady
    assert all(m.batch_size > 21 and m.free_bytes <= result.edge_margin.spread_bytes
               for m in result.edge_margin.marginal)
    assert result.edge_margin.max_free_bytes == 9 * MiB


def test_edge_spread_0_and_steady_steps_0_report_the_raw_edge():
    device = linear(TIGHT_FIXED, HOG_PER_SAMPLE)
    off = probe(hog_spec(edge_spread=0), ScriptedExecutor(device)).result
    assert off.max_batch_size == 25 and off.edge_margin is None
    short = probe(hog_spec(steady_steps=0), ScriptedExecutor(device)).result
    assert short.max_batch_size == 25 and short.edge_margin is None


def test_an_edge_spread_in_the_spec_replaces_the_floor():
    result = probe(hog_spec(edge_spread="40MiB"), ScriptedExecutor(linear(TIGHT_FIXED, HOG_PER_SAMPLE))).result
    assert result.edge_margin.floor_bytes == 40 * MiB
    assert result.max_batch_size == 23  # 23 leaves 68 MiB; 24 leaves 36, 25 leaves 4


def test_the_cache_trusts_an_answer_with_marginal_batches_and_rejects_a_forged_one():
    """A cached entry is checked before it is used (cache.trust): a marginal batch must lie above the maximum and
    have fit; the entry stays usable when the batch above the maximum is marginal rather than failing."""
    from isoprobe.cache.trust import _answer

    result = probe(hog_spec(), ScriptedExecutor(linear(TIGHT_FIXED, HOG_PER_SAMPLE))).result
    assert _answer(result) is None
    forged = result.model_copy(update={"edge_margin": result.edge_margin.model_copy(update={
        "marginal": [result.edge_margin.marginal[0].model_copy(update={"batch_size": 23})]})})
    assert "marginal batches [23]" in _answer(forged)
    only_marginal = result.model_copy(update={"first_failing_batch_size": None})
    assert _answer(only_marginal) is None


def test_only_an_fsdp_gangs_floor_is_wider_than_a_process():
    """An FSDP2 gang's deciding trial was measured reading 5 to 10 MiB less than independent plain ranks: its floor
    is GANG_FACTOR times a process's. DDP and ZeRO-1 trials read what independent ranks read: a process's floor."""
    process = margin.floor_bytes("cpu", BUDGET)
    assert margin.floor_bytes("cpu", BUDGET, "fsdp") == margin.GANG_FACTOR * process
    assert margin.spread_for("cpu", BUDGET, strategy="fsdp").bytes == 16 * MiB
    for strategy in ("none", "ddp", "zero1"):
        assert margin.floor_bytes("cpu", BUDGET, strategy) == process
        assert margin.spread_for("cpu", BUDGET, strategy=strategy).bytes == 8 * MiB


def test_the_table_view_says_the_spread_and_the_marginal_batch():
    from isoprobe.report.output import render_table

    table = render_table(probe(hog_spec(), ScriptedExecutor(linear(TIGHT_FIXED, HOG_PER_SAMPLE))).result)
    assert "spread: 8.00 MiB" in table and "marginal 25: fit 1 of 1 long runs, 4.00 MiB free" in table


def test_a_commands_floor_on_the_cpu_is_its_own_and_ignores_the_capacity_and_the_strategy():
    """A command trial reads the data segment the cap counts, so what its floor covers is only what one run cannot
    show of another (the heap's hold measured on the Lightning script): COMMAND_FLOOR_BYTES, not a process's 8 MiB.
    On CUDA it reads the allocator's reserved peak as isoprobe's own trials do, so it keeps their floor;
    edge_spread replaces both."""
    for capacity in (BUDGET, 80 * 1024 * MiB):
        for strategy in ("none", "ddp", "fsdp"):
            assert margin.floor_bytes("cpu", capacity, strategy, command=True) == margin.COMMAND_FLOOR_BYTES["cpu"]
    assert margin.COMMAND_FLOOR_BYTES["cpu"] < margin.floor_bytes("cpu", BUDGET)
    assert margin.floor_bytes("cuda", BUDGET, command=True) == margin.floor_bytes("cuda", BUDGET)
    assert margin.spread_for("cpu", BUDGET, command=True).bytes == 6 * MiB
    assert margin.spread_for("cpu", BUDGET, override=16 * MiB, command=True).bytes == 16 * MiB
    # What the probe saw itself still counts: two runs of one batch 7 MiB apart widen a command's spread to that.
    assert margin.spread_for("cpu", BUDGET, [[[0, 10 * MiB], [0, 17 * MiB]]], command=True).bytes == 7 * MiB


def command_spec() -> dict:
    """hog_spec as a command (``command:`` in place of the model's sections), its search started at 24."""
    spec = hog_spec()
    for section in ("model", "input", "target", "optimizer"):
        spec.pop(section, None)
    spec["command"] = ["python", "train.py", "--batch-size", "{batch_size}"]
    spec["search"]["start_batch_size"] = 24
    return spec


def test_a_probed_command_applies_a_commands_floor_where_a_model_spec_applies_a_processs():
    """The pipeline asks for a command's floor when the spec runs a command (``trials.TrialRunner.spread``): the
    same scripted device, whose 25 fits 7 MiB below the cap, answers 24 for a model spec (inside 8 MiB) and 25
    for a command (outside 6 MiB)."""
    device = linear(COMMAND_FIXED, HOG_PER_SAMPLE)
    own = probe(hog_spec(), ScriptedExecutor(device)).result
    assert own.max_batch_size == 24 and own.edge_margin.spread_bytes == margin.FLOOR_BYTES["cpu"]
    command = probe(command_spec(), ScriptedExecutor(device)).result
    assert command.edge_margin.spread_bytes == margin.COMMAND_FLOOR_BYTES["cpu"]
    assert command.max_batch_size == 25 and command.edge_margin.marginal == []


def test_a_swing_is_a_steps_own_peak_above_a_later_steps_and_the_first_step_is_left_out():
    """report.steady.swing_bytes: how much more one step of a process needed than a later step of the same process.
    The first step is left out (the optimizer's state appears in it), a rise that stays is growth (the steady
    rule's), and a step whose own peak is unknown (None: its line came with another's) counts for nothing."""
    assert swing_bytes([]) is None and swing_bytes([5, 10]) is None  # one known step after the first
    assert swing_bytes([1, 10, 10, 10]) == 0  # steady
    assert swing_bytes([1, 10, 11, 12]) == 0  # growth, not a swing
    assert swing_bytes([100, 10, 10]) == 0  # the first step's peak counts for nothing
    # The Lightning script's own run under no cap: one more input batch held for two steps, then let go.
    assert swing_bytes([1078, 1082, 1086, 1086, 1082, 1082]) == 4
    assert swing_bytes([0, 10, 14, 12, 13, 11]) == 3  # the largest drop to any later step
    assert swing_bytes([0, 10, None, 14, None, 11]) == 3
    # A swing widens the spread over the floor as two runs of one batch do; a smaller one leaves the floor.
    assert margin.spread_for("cpu", BUDGET, command=True, swings=[9 * MiB]).bytes == 9 * MiB
    assert margin.spread_for("cpu", BUDGET, command=True, swings=[MiB // 2]).bytes == margin.COMMAND_FLOOR_BYTES["cpu"]
    assert margin.spread_for("cpu", BUDGET, command=True, swings=[MiB // 2]).observed_bytes == MiB // 2


def test_a_swing_one_trial_saw_makes_a_commands_edge_with_less_free_marginal():
    """A command whose trials report a swing of 9 MiB (one step needed 9 MiB more than a later one, in one
    process): its 25, 7 MiB below the cap, clears the command's floor of 6 MiB but not the swing, so it is marginal
    and 24 (39 MiB free) is the maximum; the result says what widened the spread."""
    device = linear(COMMAND_FIXED, HOG_PER_SAMPLE)

    def swinging(call: Call):
        run = device(call)
        *events, result = run.events
        if result.outcome is Outcome.FITS:
            result = result.model_copy(update={"budget_swing_bytes": 9 * MiB})
        return replace(run, events=[*events, result])

    result = probe(command_spec(), ScriptedExecutor(swinging)).result
    assert result.max_batch_size == 24, result.message
    assert [m.batch_size for m in result.edge_margin.marginal] == [25]
    assert result.edge_margin.observed_bytes == 9 * MiB and result.edge_margin.spread_bytes == 9 * MiB
    assert all(t.budget_swing_bytes == 9 * MiB for t in result.trials if t.outcome is Outcome.FITS)


def test_a_commands_floor_is_the_heap_churn_its_fitting_trials_measured_plus_a_transient():
    """Only blocks freed within a step can be held into the next, so a command's floor is the most its heap churned
    in a step (``Trial.heap_churn_bytes``) plus CHURN_MARGIN_BYTES; without a measurement, COMMAND_FLOOR_BYTES.
    CUDA keeps a process's floor and edge_spread still replaces the floor."""
    churns = [MiB // 2, 4 * MiB + MiB // 10]
    assert margin.floor_bytes("cpu", BUDGET, command=True, heap_churns=churns) == 5 * MiB + MiB // 10
    assert margin.floor_bytes("cpu", BUDGET, command=True, heap_churns=[0]) == margin.CHURN_MARGIN_BYTES
    assert margin.floor_bytes("cpu", BUDGET, command=True, heap_churns=[]) == margin.COMMAND_FLOOR_BYTES["cpu"]
    # isoprobe's own trials: one process takes its measured churn too, with its own margin; a gang's ranks keep the
    # fixed floor.
    assert margin.floor_bytes("cpu", BUDGET, heap_churns=churns) == 4 * MiB + MiB // 10 + margin.OWN_CHURN_MARGIN_BYTES
    assert margin.floor_bytes("cpu", BUDGET, heap_churns=[]) == margin.FLOOR_BYTES["cpu"]
    for strategy in ("ddp", "zero1", "fsdp"):
        assert margin.floor_bytes("cpu", BUDGET, strategy, heap_churns=[0]) == margin.floor_bytes("cpu", BUDGET,
                                                                                                   strategy)
    assert margin.floor_bytes("cuda", BUDGET, command=True, heap_churns=[0]) == margin.floor_bytes("cuda", BUDGET)
    assert margin.spread_for("cpu", BUDGET, command=True, heap_churns=[0], override=9 * MiB).bytes == 9 * MiB
    # A swing larger than the floor still widens the spread.
    assert margin.spread_for("cpu", BUDGET, command=True, heap_churns=[0], swings=[3 * MiB]).bytes == 3 * MiB


#: memory_hog's device with batch 25 at 3 MiB below the cap: outside a command's floor when its heap churns
#: 1 MiB (2 MiB), inside it when it churns 4 MiB (5 MiB) or was not measured (6 MiB).
CHURN_FIXED = BUDGET - 3 * MiB - 25 * HOG_PER_SAMPLE


def churning(fitting: int | None, failing: int | None, swing: int | None = None):
    """CHURN_FIXED's device, its fitting trials reporting ``fitting`` bytes of heap churn (and ``swing``) and its
    failing ones ``failing`` (a real failing trial reports none: this checks the pipeline does not use it either)."""
    device = linear(CHURN_FIXED, HOG_PER_SAMPLE)

    def run(call: Call):
        done = device(call)
        *events, result = done.events
        fits = result.outcome is Outcome.FITS
        update = {"heap_churn_bytes": fitting if fits else failing, "budget_swing_bytes": swing if fits else None}
        return replace(done, events=[*events, result.model_copy(update=update)])
    return run


def test_a_command_whose_heap_churns_little_gets_its_edge_and_one_that_churns_a_batch_does_not():
    quiet = probe(command_spec(), ScriptedExecutor(churning(MiB, 64 * MiB))).result
    assert quiet.max_batch_size == 25, quiet.message
    assert quiet.edge_margin.floor_bytes == 2 * MiB and quiet.edge_margin.marginal == []
    churned = probe(command_spec(), ScriptedExecutor(churning(4 * MiB, None))).result
    assert churned.max_batch_size == 24 and [m.batch_size for m in churned.edge_margin.marginal] == [25]
    assert churned.edge_margin.floor_bytes == 5 * MiB
    unmeasured = probe(command_spec(), ScriptedExecutor(churning(None, None))).result
    assert unmeasured.max_batch_size == 24
    assert unmeasured.edge_margin.floor_bytes == margin.COMMAND_FLOOR_BYTES["cpu"]
    assert all(t.heap_churn_bytes == MiB for t in quiet.trials if t.outcome is Outcome.FITS)


def test_a_swing_widens_a_commands_spread_only_where_no_trial_measured_the_heap_churn():
    """A swing (one step's own peak above a later step's) is already in the trial's running peak; it stood in for
    the heap's hold in another run, which the measured churn bounds. With the churn measured (1 MiB: floor 2 MiB)
    a 4 MiB swing leaves 25 (3 MiB free) the maximum; without it the swing makes 25 marginal, as before. Measured
    on the torchrun DDP script: a trial at its edge swung 3.9 MiB with no heap churn at all."""
    measured = probe(command_spec(), ScriptedExecutor(churning(MiB, None, swing=4 * MiB))).result
    assert measured.max_batch_size == 25 and measured.edge_margin.spread_bytes == 2 * MiB, measured.message
    assert (measured.edge_margin.observed_bytes or 0) < 4 * MiB  # the swing is not what the probe observed
    unmeasured = probe(command_spec(), ScriptedExecutor(churning(None, None, swing=4 * MiB))).result
    assert unmeasured.max_batch_size == 24 and unmeasured.edge_margin.spread_bytes == margin.COMMAND_FLOOR_BYTES["cpu"]
    assert unmeasured.edge_margin.observed_bytes == 4 * MiB


# --------------------------------------------------------------------------- isoprobe's own trials' heap churn

def churning_steps(churns: list[int | None]):
    """CHURN_FIXED's device whose own trials read ``churns[k]`` of heap churn after step k+1 (StepDone), the last
    one for every later step: the path a real child's readings take (``pipeline.trial_record.steps_heap_churn``)."""
    device = linear(CHURN_FIXED, HOG_PER_SAMPLE)

    def run(call: Call):
        done = device(call)
        events = [e.model_copy(update={"heap_churn_bytes": churns[min(e.step - 1, len(churns) - 1)]})
                  if isinstance(e, StepDone) else e for e in done.events]
        return replace(done, events=events)
    return run


def test_the_least_floor_is_what_one_more_fitting_trial_can_leave():
    """A deciding trial's stop at the margin uses it: a floor from the churn only grows, and the next trial may read
    none; where the churn does not set the floor (a gang, CUDA) it is the floor itself; edge_spread replaces it."""
    assert margin.least_floor_bytes("cpu", BUDGET) == margin.OWN_CHURN_MARGIN_BYTES == MiB + MiB // 2
    assert margin.least_floor_bytes("cpu", BUDGET, heap_churns=[3 * MiB]) == 4 * MiB + MiB // 2
    assert margin.least_floor_bytes("cpu", BUDGET, command=True) == margin.CHURN_MARGIN_BYTES
    assert margin.least_floor_bytes("cpu", BUDGET, "fsdp") == margin.floor_bytes("cpu", BUDGET, "fsdp")
    assert margin.least_floor_bytes("cuda", BUDGET) == margin.floor_bytes("cuda", BUDGET)
    assert margin.least_floor_bytes("cpu", BUDGET, override=9 * MiB) == 9 * MiB
    assert margin.spread_for("cpu", BUDGET, heap_churns=[2 * MiB], least=True).bytes == 3 * MiB + MiB // 2


def test_an_own_trials_churn_is_the_most_its_steps_after_the_first_read():
    steps = [StepDone(step=k + 1, seconds=0.1, heap_churn_bytes=c) for k, c in enumerate([9 * MiB, MiB, None, 2])]
    assert steps_heap_churn(steps) == MiB  # the first step (building the optimizer's state) is left out
    assert steps_heap_churn(steps[:1]) is None and steps_heap_churn([]) is None


def test_a_model_whose_heap_churns_little_gets_its_edge_and_one_that_churns_a_batch_does_not():
    """The same rule as a command's, for a model spec's one process (its margin: 1.5 MiB): 25 peaks 3 MiB under
    the cap. Its steps churn half a MiB after a first step of 9 MiB: floor 2 MiB, 25 is the maximum. 4 MiB a step:
    floor 5.5 MiB, 25 is marginal. Not read (a single step, CUDA, no glibc): the process's fixed floor (8 MiB), 25 is
    marginal."""
    quiet = probe(hog_spec(), ScriptedExecutor(churning_steps([9 * MiB, MiB // 2]))).result
    assert quiet.max_batch_size == 25, quiet.message
    assert quiet.edge_margin.floor_bytes == 2 * MiB and quiet.edge_margin.marginal == []
    assert all(t.heap_churn_bytes == MiB // 2 for t in quiet.trials if t.outcome is Outcome.FITS)
    churned = probe(hog_spec(), ScriptedExecutor(churning_steps([0, 4 * MiB]))).result
    assert churned.max_batch_size == 24 and [m.batch_size for m in churned.edge_margin.marginal] == [25]
    assert churned.edge_margin.floor_bytes == 5 * MiB + MiB // 2
    unread = probe(hog_spec(), ScriptedExecutor(churning_steps([None]))).result
    assert unread.max_batch_size == 24 and unread.edge_margin.floor_bytes == margin.FLOOR_BYTES["cpu"]


def test_a_first_fit_that_decides_steps_until_steady_though_it_is_inside_the_fixed_floor():
    """The search's first trial at the cap (25) decides: no trial has read the churn before it, so the fixed floor
    (8 MiB) would stop it at the margin after search.steps, and its own churn (0: floor 1.5 MiB) would then let it
    clear with 2 steps run, never shown steady. Its stop is at the least floor it can end with (1.5 MiB), so it
    steps until its peak holds still, and the maximum it proves is steady."""
    result = probe(hog_spec(start_batch_size=25, max_batch_size=25),
                   ScriptedExecutor(churning_steps([0]))).result
    (proof,) = result.trials
    assert result.max_batch_size == 25 and result.edge_margin.floor_bytes == margin.OWN_CHURN_MARGIN_BYTES
    assert proof.steady_rule.stop_at_bytes == BUDGET - margin.OWN_CHURN_MARGIN_BYTES
    assert len(proof.step_budget_peak_bytes) > proof.steady_rule.window
    assert steady.is_steady(proof.step_budget_peak_bytes, proof.steady_rule), proof.step_budget_peak_bytes


def churning_small(small_below: int, small: int, large: int):
    """CHURN_FIXED's device, its fitting trials below ``small_below`` churning ``small`` bytes of heap (a small
    batch's activations sit under the mmap threshold) and the others ``large``."""
    device = linear(CHURN_FIXED, HOG_PER_SAMPLE)

    def run(call: Call):
        done = device(call)
        *events, result = done.events
        churn = (small if call.batch_size < small_below else large) if result.outcome is Outcome.FITS else None
        return replace(done, events=[*events, result.model_copy(update={"heap_churn_bytes": churn})])
    return run


def test_a_churn_read_far_below_the_edge_does_not_set_the_floor_at_the_edge():
    """issue 46: the torchrun DDP script's trial at 2 churned 7 MiB, every trial from 4 to 30 under 1 MiB, and that
    one reading set an 8 MiB floor at 30 (its own edge, 7 MiB free). A churn counts where the batch it judges is at
    most twice its own."""
    spec = command_spec()
    spec["search"]["start_batch_size"] = 2  # the search starts small and measures its way up, as that probe did
    result = probe(spec, ScriptedExecutor(churning_small(12, 7 * MiB, MiB // 2))).result
    small = [t.batch_size for t in result.trials if t.outcome is Outcome.FITS and t.batch_size < 12]
    assert small, "the search must have run a small batch for this test to mean anything"
    assert result.max_batch_size == 25, result.message
    assert result.edge_margin.floor_bytes == MiB // 2 + margin.CHURN_MARGIN_BYTES and result.edge_margin.marginal == []
    # The same churn read at half the edge or more still counts.
    near = probe(spec, ScriptedExecutor(churning_small(26, 7 * MiB, MiB // 2))).result
    assert near.max_batch_size == 24 and [m.batch_size for m in near.edge_margin.marginal] == [25]


def test_near_keeps_the_readings_at_half_the_batch_or_more():
    readings = [(2, 7 * MiB), (4, MiB), (15, 2 * MiB), (30, MiB)]
    assert margin.near(readings, 30) == [2 * MiB, MiB]
    assert margin.near(readings, None) == [7 * MiB, MiB, 2 * MiB, MiB]
