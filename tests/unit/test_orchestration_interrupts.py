"""SIGINT and SIGTERM at every point of a probe, and nothing outliving it, as orchestration.

A real signal raises ``KeyboardInterrupt`` (SIGINT) or ``errors.Terminated``
(isoprobe's SIGTERM handler) wherever the parent is; while a trial runs, that
is inside the executor's ``run``. Here the script raises it at the Nth trial,
for every N of a probe that goes through every purpose of a trial (search,
retry, memory check, confirmation, recommendation check), and the result must
hold exactly the trials that ran before it, with the right stop reason and exit
code. That the real child's process group dies within 2 s is
tests/integration/test_interrupt.py's business.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from isoprobe.errors import ProbeError, SpecError, Terminated
from isoprobe.executors import ChildRun
from isoprobe.executors.scripted import ScriptedExecutor, crashed, inspected, linear
from isoprobe.report.outcomes import Outcome
from isoprobe.report.output import result_json
from isoprobe.protocol.messages import InspectProblem, InspectRequest
from isoprobe.report.result import Result, exit_code_for
from scripted_probe import SPEC_PATH, GiB, MiB, every_purpose, every_purpose_spec, faulty_spec, probe

SIGNALS = [pytest.param(KeyboardInterrupt, "interrupted", 130, id="SIGINT"),
           pytest.param(Terminated, "terminated", 143, id="SIGTERM")]


def _script(stop_at: int | None = None, signal: type[BaseException] = KeyboardInterrupt):
    device = every_purpose()

    def script(call):
        if call.number == stop_at:
            raise signal()
        return device(call)

    return script


@pytest.fixture(scope="module")
def uninterrupted():
    return probe(every_purpose_spec(), ScriptedExecutor(_script()))


def test_the_probe_interrupted_below_goes_through_every_purpose(uninterrupted):
    purposes = [t.purpose for t in uninterrupted.trials]
    assert set(purposes) == {"search", "retry", "memory_check", "confirmation", "soak"}
    assert uninterrupted.result.stop_reason.value == "edge_found"


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_at_any_trial_keeps_exactly_the_trials_before_it(uninterrupted, signal, reason, code):
    ran = uninterrupted.trials
    for n in range(1, len(ran) + 1):
        executor = ScriptedExecutor(_script(stop_at=n, signal=signal))
        probed = probe(every_purpose_spec(), executor)  # checks that the executor was closed
        result, context = probed.result, f"signal at trial {n}"
        assert result.stop_reason.value == reason, context
        assert exit_code_for(result.stop_reason) == code, context
        assert result.answered is False and result.recommended_batch_size is None, context
        assert len(executor.calls) == n, context  # the Nth was running when the signal came, and nothing after it
        before = ran[: n - 1]
        assert [(t.index, t.batch_size, t.purpose) for t in result.trials] == \
            [(t.index, t.batch_size, t.purpose) for t in before], context
        for got, then in zip(result.trials, before):
            # A trial whose memory check was cut off keeps what the child said; otherwise it is the same trial.
            cut_off = then.reclassified is not None and got.index == n - 1
            assert got.outcome == (Outcome.ERROR if cut_off else then.outcome), context
        # What is reported so far is only ever a batch that fit every time it ran.
        if result.max_batch_size is not None:
            runs = [t for t in result.trials if t.batch_size == result.max_batch_size and t.purpose != "memory_check"]
            assert runs and all(t.outcome is Outcome.FITS for t in runs), context
        assert (result.max_batch_size or 0) <= uninterrupted.result.max_batch_size, context
        assert "stopped by" in result.message, context
        assert Result.model_validate_json(result_json(result)) == result, context  # still one valid document


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_during_a_retry_after_a_crash(signal, reason, code):
    # test_faults' shape: 7 fits, 8 crashes; the signal lands while 8 is retried.
    executor = ScriptedExecutor(lambda call: _raise(signal) if call.number == 3 else
                                (crashed() if call.batch_size >= 8 else linear(GiB, 32 * MiB)(call)))
    probed = probe(faulty_spec(), executor)
    assert [(t.batch_size, t.purpose, t.outcome.value) for t in probed.trials] == [
        (7, "search", "fits"), (8, "search", "crashed")]
    assert probed.result.stop_reason.value == reason and probed.exit_code == code
    assert probed.result.max_batch_size == 7
    # A crash that still has a retry owed is not yet a verdict: 8 is not reported as failing.
    assert probed.result.first_failing_batch_size is None


def _raise(signal):
    raise signal()


class SignalDuringInspect(ScriptedExecutor):
    def __init__(self, signal):
        super().__init__(_script())
        self.signal = signal

    def run(self, request, conditions, *, timeout, name):
        if isinstance(request, InspectRequest):
            raise self.signal()
        return super().run(request, conditions, timeout=timeout, name=name)


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_during_the_environment_check_still_gives_a_result_with_no_trial(signal, reason, code):
    executor = SignalDuringInspect(signal)
    probed = probe(every_purpose_spec(), executor)
    assert probed.result.stop_reason.value == reason and probed.exit_code == code
    assert probed.result.trials == [] and executor.calls == []
    assert "during the environment check" in probed.result.message


class SignalAtPrestart(ScriptedExecutor):
    """A signal held while a spare starts lands as ``prestart`` returns (executors.processes.signals_deferred)."""

    def __init__(self, signal, at: int):
        super().__init__(_script())
        self.signal, self.at = signal, at

    def prestart(self, conditions):
        super().prestart(conditions)
        if len(self.prestarts) == self.at:
            raise self.signal()


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_while_the_first_spare_starts_still_gives_a_result(signal, reason, code):
    executor = SignalAtPrestart(signal, at=1)
    probed = probe(every_purpose_spec(), executor)
    assert probed.result.stop_reason.value == reason and probed.exit_code == code
    assert probed.result.trials == []


@pytest.mark.parametrize(("signal", "reason", "code"), SIGNALS)
def test_a_signal_while_the_spare_is_replaced_after_the_environment_check_still_gives_a_result(signal, reason, code):
    executor = SignalAtPrestart(signal, at=2)
    probed = probe(every_purpose_spec(), executor)  # fails (AssertionError) if the signal escapes; checks the executor is closed
    assert probed.result.stop_reason.value == reason and probed.exit_code == code
    assert probed.result.trials == []


# --------------------------------------------------------------------------- nothing outlives the probe


class Failing(ScriptedExecutor):
    """An executor whose trial raises something that is not a signal (a bug, an OSError starting a process)."""

    def run(self, request, conditions, *, timeout, name):
        if not isinstance(request, InspectRequest):
            raise OSError("cannot start a process")
        return super().run(request, conditions, timeout=timeout, name=name)


def _run(spec: dict, executor) -> None:
    from isoprobe.report.output import Reporter
    from isoprobe.pipeline import run_probe
    from isoprobe.spec.model import Spec

    run_probe(Spec.model_validate(spec), SPEC_PATH, Reporter(lambda line: None), environ={}, executor=executor)


def test_the_executor_is_closed_when_the_environment_check_fails():
    failed = ChildRun(returncode=1, timed_out=False, seconds=1.0, stderr_tail="ImportError: no torch")
    executor = ScriptedExecutor(_script(), inspected=failed)
    with pytest.raises(ProbeError, match="environment check") as raised:
        _run(every_purpose_spec(), executor)
    assert raised.value.evidence == "ImportError: no torch"
    assert executor.closed and executor.calls == []


def test_the_executor_is_closed_when_the_model_cannot_be_built():
    problem = InspectProblem(stage="model", type="AttributeError", message="module has no attribute 'biuld'")
    executor = ScriptedExecutor(_script(), inspected=inspected(problems=[problem]))
    with pytest.raises(SpecError) as raised:
        _run(every_purpose_spec(), executor)
    assert "biuld" in raised.value.render() and "model" in raised.value.render()
    assert executor.closed and executor.calls == []


def test_the_executor_is_closed_when_a_trial_cannot_even_start():
    executor = Failing(_script())
    with pytest.raises(OSError):
        _run(every_purpose_spec(), executor)
    assert executor.closed


def test_the_parent_side_never_imports_torch():
    # In a fresh interpreter: a whole scripted probe (search, retries, memory checks, recommendation) and its JSON.
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]  # scripted_probe, and conftest above it\n"
        "from scripted_probe import every_purpose, every_purpose_spec, probe\n"
        "from isoprobe.executors.scripted import ScriptedExecutor\n"
        "from isoprobe.report.output import result_json\n"
        "probed = probe(every_purpose_spec(), ScriptedExecutor(every_purpose()))\n"
        "result_json(probed.result)\n"
        "assert probed.result.stop_reason.value == 'edge_found', probed.result.stop_reason\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'numpy')))\n"
    )
    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, str(tests / "support"), str(tests)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.replace("'", '"')) == []
