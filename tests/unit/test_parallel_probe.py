"""search.parallel through the probe with scripted children: the same answer as one slot, a crashing slot retried,
and a signal mid-round that keeps every trial that had ended (issue 25); ``executors.rounds`` with fake children."""

from __future__ import annotations

import re
import signal
from dataclasses import replace

import pytest

from canned_local import CannedLocal

from isoprobe.errors import Terminated
from isoprobe.executors import ChildRun, rounds
from isoprobe.executors.fork_server_choice import SERVER_LOSSES
from isoprobe.executors.rounds import run_round
from isoprobe.executors.scripted import ScriptedExecutor, crashed, fits, linear
from isoprobe.report.outcomes import Outcome
from isoprobe.report.output import Reporter
from isoprobe.pipeline import run_probe
from isoprobe.pipeline.parallel import cpu_slot_limit
from isoprobe.search.edge_search import progress
from isoprobe.search.history import Limits, Observation
from isoprobe.spec.model import Spec
from scripted_probe import (HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, SPEC_PATH, every_purpose, every_purpose_spec, hog_spec,
                            probe)


def with_slots(slots, **search):
    spec = hog_spec(**search)
    spec["search"]["parallel"] = slots
    return spec


def test_two_slots_find_the_one_slot_answer_and_every_trial_is_in_the_result():
    one = probe(with_slots(1), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    two = probe(with_slots(2), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    assert (two.result.max_batch_size, two.result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert (one.result.max_batch_size, one.result.stop_reason) == (two.result.max_batch_size, two.result.stop_reason)
    assert [t.index for t in two.trials] == list(range(1, len(two.trials) + 1))
    assert any("2 slots" in line for line in two.lines)
    assert all(t.outcome.value == "fits" for t in two.at(HOG_MAX))


def test_a_slot_that_crashes_mid_round_is_retried_in_a_fresh_process():
    def faults(call):
        return crashed(signal.SIGSEGV) if call.number == 3 else None

    two = probe(with_slots(2), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, faults=faults)))
    crashed_trial = two.trials[2]
    assert crashed_trial.outcome.value == "crashed"
    assert any(t.purpose == "retry" and t.batch_size == crashed_trial.batch_size for t in two.trials[3:])
    assert two.result.max_batch_size == HOG_MAX and two.result.first_failing_batch_size == HOG_MAX + 1


@pytest.mark.parametrize("budget, cores, ram, slots", [
    (1 << 30, 2, 24 << 30, 2), (8 << 30, 16, 24 << 30, 2), (1 << 30, 1, 64 << 30, 1), (32 << 30, 8, 16 << 30, 1)])
def test_cpu_slots_are_bounded_by_cores_and_by_the_budgets_within_ram(budget, cores, ram, slots):
    assert cpu_slot_limit(budget, cores, ram) == slots


# --------------------------------------------------------------------------- a signal mid-round (issue 25)

#: A trial's progress line (``output.trial_line``), not a note about a trial.
TRIAL_LINE = re.compile(r"isoprobe: trial +\d+ +batch ")
SIGNALS = [pytest.param(KeyboardInterrupt, "interrupted", 130, id="SIGINT"),
           pytest.param(Terminated, "terminated", 143, id="SIGTERM")]


def two_slot_every_purpose_spec() -> dict:
    spec = every_purpose_spec()
    spec["search"]["parallel"] = 2
    return spec


def _stopping_at(number: int | None, signal=KeyboardInterrupt):
    device = every_purpose()

    def script(call):
        if call.number == number:
            raise signal()
        return device(call)

    return script


@pytest.fixture(scope="module")
def uninterrupted():
    return probe(two_slot_every_purpose_spec(), ScriptedExecutor(_stopping_at(None)))


def test_the_rounds_interrupted_below_have_a_crash_an_ambiguous_error_and_every_purpose(uninterrupted):
    assert {t.purpose for t in uninterrupted.trials} == {
        "search", "retry", "memory_check", "confirmation", "soak"}
    # Round 2 is 26 (crashes) beside 52 (an ambiguous error): a signal in its second slot follows a crash.
    assert uninterrupted.sequence()[2:4] == [(26, "search", "crashed"), (52, "search", "out_of_memory")]
    assert uninterrupted.trials[3].reclassified is not None  # an error until its memory check (after the round)
    assert uninterrupted.result.stop_reason.value == "edge_found"


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_at_any_trial_of_a_round_keeps_every_trial_that_had_ended(uninterrupted, signal, reason, code):
    ran = uninterrupted.trials
    for n in range(1, len(ran) + 1):
        probed = probe(two_slot_every_purpose_spec(), ScriptedExecutor(_stopping_at(n, signal)))
        result, context = probed.result, f"signal at trial {n}"
        assert (result.stop_reason.value, probed.exit_code, result.answered) == (reason, code, False), context
        before = ran[: n - 1]
        assert [(t.index, t.batch_size, t.purpose) for t in result.trials] == \
            [(t.index, t.batch_size, t.purpose) for t in before], context
        for got, then in zip(result.trials, before):
            # A trial whose memory check was cut off keeps what the child said; otherwise it is the same trial.
            cut_off = then.reclassified is not None and not any(
                t.purpose == "memory_check" and t.batch_size == then.batch_size and t.index > then.index
                for t in before)
            assert got.outcome == (Outcome.ERROR if cut_off else then.outcome), context
        printed = [line for line in probed.lines if TRIAL_LINE.match(line)]
        assert len(printed) == n - 1, context  # every ended trial's line, the interrupted round's included
        # Only a batch that fit every time it ran is reported, and only a failure that is a verdict.
        if result.max_batch_size is not None:
            runs = [t for t in result.trials if t.batch_size == result.max_batch_size and t.purpose != "memory_check"]
            assert runs and all(t.outcome is Outcome.FITS for t in runs), context
        assert (result.max_batch_size or 0) <= uninterrupted.result.max_batch_size, context
        # ... and all that the ended trials proved: the bounds read off them, as the search would.
        known = progress([Observation(t.batch_size, t.outcome) for t in result.trials
                          if t.purpose in ("search", "retry", "confirmation")], Limits(start=1))
        assert (result.max_batch_size, result.first_failing_batch_size) == (known.max_fitting, known.first_failing), \
            context
        if result.first_failing_batch_size is not None:
            assert any(t.batch_size == result.first_failing_batch_size and t.outcome is Outcome.OUT_OF_MEMORY
                       for t in result.trials), context


def test_a_signal_in_a_round_after_its_other_slot_crashed_keeps_the_crash_and_owes_its_retry():
    probed = probe(two_slot_every_purpose_spec(), ScriptedExecutor(_stopping_at(4, Terminated)))
    assert probed.sequence() == [(12, "search", "fits"), (24, "search", "fits"), (26, "search", "crashed")]
    assert probed.result.max_batch_size == 24
    assert probed.result.first_failing_batch_size is None  # a crash with a retry owed is no verdict
    assert "stopped by SIGTERM" in probed.result.message


def test_each_trial_of_a_round_is_printed_before_the_next_one_is_asked_for():
    lines: list[str] = []
    device = every_purpose()
    printed_at_call = []

    def script(call):
        printed_at_call.append(sum(bool(TRIAL_LINE.match(line)) for line in lines))
        return device(call)

    executor = ScriptedExecutor(script)
    run_probe(Spec.model_validate(two_slot_every_purpose_spec()), SPEC_PATH, Reporter(lines.append), environ={},
              executor=executor)
    assert printed_at_call == list(range(len(executor.calls)))


# --------------------------------------------------------------------------- executors.rounds with concurrent children


class FakeLaunch:
    """A launched child whose ``poll`` answers from a list (its last answer repeats)."""

    def __init__(self, slot: int, polls: list, run: ChildRun):
        self.slot, self.polls, self.run = slot, list(polls), run
        self.delivered, self.events_path = 0.0, None
        self.timed_out = self.verdict_at_timeout = False
        self.stopped = False

    def poll(self):
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]


class Concurrent:
    """The local executor's launch/stop/collect pieces over ``FakeLaunch``es, with a log of what was done."""

    def __init__(self, *launches: FakeLaunch):
        self.launches, self.log = list(launches), []

    def launch(self, request, conditions, *, timeout, name):
        return self.launches[request]

    def stop(self, launch):
        launch.stopped = True
        self.log.append(("stop", launch.slot))

    def collect(self, launch):
        assert launch.stopped, "collected before it was stopped"
        self.log.append(("collect", launch.slot))
        return launch.run


def _jobs(count: int) -> list[tuple]:
    return [(slot, None, 1e9, f"s{slot}") for slot in range(count)]  # the request is the slot: FakeLaunch's index


def test_a_round_reports_each_child_as_it_ends_not_in_slot_order():
    slow, fast = FakeLaunch(0, [None, None, None, 0], fits(1)), FakeLaunch(1, [None, 0], fits(2))
    reported = []
    run_round(Concurrent(slow, fast), _jobs(2), lambda slot, run: reported.append((slot, run.events[-1].peak_bytes)))
    assert reported == [(1, 2), (0, 1)]


@pytest.mark.parametrize("signal", [KeyboardInterrupt, Terminated])
def test_a_child_that_ended_just_before_the_signal_is_still_reported(monkeypatch, signal):
    # Slot 0 ends between the round's look at it and the signal (which lands in the sleep); slot 1 hangs;
    # slot 2 was ended by the same signal (a scheduler signals the whole job): stopped, not finished.
    ended, hanging = FakeLaunch(0, [None, 0], fits(1)), FakeLaunch(1, [None], fits(2))
    killed = FakeLaunch(2, [None, -15], crashed(15))

    def the_signal_lands(seconds):
        raise signal()

    monkeypatch.setattr(rounds.time, "sleep", the_signal_lands)
    executor, reported = Concurrent(ended, hanging, killed), []
    with pytest.raises(signal):
        run_round(executor, _jobs(3), lambda slot, run: reported.append(slot))
    assert reported == [0]
    assert ended.stopped and hanging.stopped and killed.stopped  # no child of the round outlives it
    assert executor.log.index(("stop", 0)) < executor.log.index(("collect", 0))


# --------------------------------------------------------------------------- a slot the fork server lost (issue 25)

GONE = "the fork server is gone (its channel closed: killed or crashed)"


class Servers:
    """The fork servers' bookkeeping, as far as a round uses it: how many lost servers were dropped."""

    def __init__(self, log):
        self.log = log

    def drop_lost(self):
        self.log.append(("drop_lost",))


class Relaunching(Concurrent):
    """``Concurrent`` where each request has a list of launches, one per attempt; the names launched are logged."""

    def __init__(self, attempts: dict[int, list[FakeLaunch]]):
        super().__init__()
        self.attempts, self.servers = attempts, Servers(self.log)

    def launch(self, request, conditions, *, timeout, name):
        self.log.append(("launch", name))
        return self.attempts[request].pop(0)


def test_a_slot_the_fork_server_lost_is_launched_again_and_only_its_rerun_is_reported():
    # Slot 0's server is killed mid-round: its first attempt comes back lost; slot 1 is still running meanwhile.
    lost = FakeLaunch(0, [None, 0], replace(crashed(9), lost=GONE))
    again, other = FakeLaunch(0, [None, 0], fits(10)), FakeLaunch(1, [None, None, None, None, 0], fits(20))
    executor, reported = Relaunching({0: [lost, again], 1: [other]}), []
    run_round(executor, _jobs(2), lambda slot, run: reported.append((slot, run)))
    assert [(slot, run.events[-1].peak_bytes, run.lost, run.lost_before) for slot, run in reported] == [
        (0, 10, None, (GONE,)), (1, 20, None, ())]
    log = executor.log
    assert log.index(("stop", 0)) < log.index(("drop_lost",)) < log.index(("launch", "s0-again1"))
    assert lost.stopped and again.stopped and other.stopped


def test_a_slot_lost_on_every_server_comes_back_lost_once_the_spawned_attempt_is_lost_too():
    # Attempts after SERVER_LOSSES losses are spawned, where no server can lose them; were one lost all the
    # same, it is reported as it is, for the probe to refuse (trial_from_run: ProbeError), never run for ever.
    attempts = [FakeLaunch(0, [0], replace(crashed(9), lost=GONE)) for _ in range(SERVER_LOSSES + 1)]
    executor, reported = Relaunching({0: attempts}), []
    run_round(executor, _jobs(1), lambda slot, run: reported.append(run))
    assert [(run.lost, run.lost_before) for run in reported] == [(GONE, (GONE,) * SERVER_LOSSES)]
    assert [entry for entry in executor.log if entry[0] == "launch"] == [
        ("launch", "s0"), *(("launch", f"s0-again{n}") for n in range(1, SERVER_LOSSES + 1))]


def test_a_slot_found_lost_as_the_signal_lands_is_neither_reported_nor_launched_again(monkeypatch):
    lost, ended = FakeLaunch(0, [None, 0], replace(crashed(9), lost=GONE)), FakeLaunch(1, [None, 0], fits(2))

    def the_signal_lands(seconds):
        raise KeyboardInterrupt()

    monkeypatch.setattr(rounds.time, "sleep", the_signal_lands)
    executor, reported = Relaunching({0: [lost], 1: [ended]}), []
    with pytest.raises(KeyboardInterrupt):
        run_round(executor, _jobs(2), lambda slot, run: reported.append(slot))
    assert reported == [1]  # the ended trial is kept; the lost one is nothing the batch did
    assert ("drop_lost",) not in executor.log and lost.stopped


@pytest.fixture
def canned(tmp_path):
    def make(lose):
        return CannedLocal(linear(HOG_FIXED, HOG_PER_SAMPLE), tmp_path, lose=lose)

    return make


def test_a_probe_whose_server_is_lost_mid_round_at_the_edge_finds_the_edge_and_says_what_was_run_again(canned):
    # The edge's first slot is lost (its server killed or stopped while the round ran): before the fix the
    # probe stopped there (ProbeError, exit 4).
    edge = []

    def lose(name, attempt):
        if not name.endswith(f"-b{HOG_MAX}") or edge:
            return None
        edge.append(name)  # the first run of the edge, only
        return GONE

    executor = canned(lose)
    lines: list[str] = []
    result = run_probe(Spec.model_validate(with_slots(2)), SPEC_PATH, Reporter(lines.append), environ={},
                       executor=executor)
    assert (result.max_batch_size, result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert f"{edge[0]}-again1" in executor.launched
    assert executor.dropped == 1
    edge = [t for t in result.trials if t.batch_size == HOG_MAX]
    assert edge and all(t.outcome is Outcome.FITS for t in edge)
    notes = [line for line in lines if "was run again" in line]
    assert len(notes) == 1 and f"batch {HOG_MAX}" in notes[0] and GONE in notes[0] and "not counted" in notes[0]
    assert [t.index for t in result.trials] == list(range(1, len(result.trials) + 1))
