"""The environment check that gives no answer: how long it may take, and what the error tells people.

No process: the check's child is a literal ``ChildRun``, answered by a
``ScriptedExecutor`` that records the timeout it was given.
"""

from __future__ import annotations

import signal

import pytest

from isoprobe.errors import ProbeError
from isoprobe.executors import ChildRun
from isoprobe.executors.scripted import IMPORT_BASELINE_BYTES, ScriptedExecutor, fits, inspected
from isoprobe.pipeline.environment import inspect_conditions, inspect_environment, preload, resolve_target
from isoprobe.protocol.messages import Facts, Imported, MemoryReading, ModelBuilt, RequestReceived, Started, Warm
from isoprobe.spec.model import Spec
from scripted_probe import SPEC_PATH, SUPPORT, faulty_spec

HOSTILE = SUPPORT / "hostile.py"


def _spec(trial_timeout: float = 10) -> Spec:
    spec = faulty_spec(timeout=trial_timeout)
    spec["model"] = {"factory": f"{HOSTILE}:slow_to_build"}
    return Spec.model_validate(spec)


class Recording(ScriptedExecutor):
    """Answers the environment check with ``inspected`` and remembers how it was asked to run it."""

    asked: list

    def run(self, request, conditions, *, timeout, name):
        self.asked.append((conditions, timeout))
        return super().run(request, conditions, timeout=timeout, name=name)


def _check(run: ChildRun, spec: Spec):
    executor = Recording(lambda call: fits(2**30), inspected=run)
    executor.asked = []
    with pytest.raises(ProbeError) as raised:
        inspect_environment(spec, SPEC_PATH, executor, [])
    [(conditions, timeout)] = executor.asked
    return raised.value, conditions, timeout


WARM = Warm(modules=["torch", "torch._dynamo"], seconds=4.0, cuda_initialized=False, idle_priority=False)


def _hung(events: list, seconds: float = 10.0) -> ChildRun:
    """The check's child, stopped at its timeout after writing ``events``."""
    return ChildRun(returncode=-signal.SIGKILL, timed_out=True, seconds=seconds, events=events,
                    stderr_tail="Thread 0x7f (most recent call first):\n  File \"hostile.py\", in slow_to_build\n")


def test_the_check_imports_ahead_and_then_gets_the_specs_trial_timeout():
    # The executor bounds a child's imports before delivering its request and runs the timeout from delivery:
    # the check imports what a trial imports, then has what the spec gives a trial, not a fixed 300 s.
    error, conditions, timeout = _check(_hung([Started(pid=3), WARM, RequestReceived(path="r.json")]), _spec(10))
    assert timeout == 10
    assert conditions == inspect_conditions(_spec(10)) and conditions.preload == preload(_spec(10))
    assert conditions.preload[:2] == ("torch", "torch._dynamo") and conditions.memory_limit is None
    assert error.evidence.startswith("Thread")  # the child's stack, for the person who reads it


def test_a_check_stopped_after_its_imports_names_what_it_was_doing():
    error, _, _ = _check(_hung([Started(pid=3), WARM, RequestReceived(path="r.json")]), _spec(10))
    assert error.message == (
        "the environment check (a child process) was stopped after search.trial_timeout (10 s). It had imported "
        "torch, torch._dynamo; after that it looks at the GPUs, builds the model "
        f"(factory: {HOSTILE}:slow_to_build) on the meta device and checks the spec's options, and reports nothing "
        "until its answer. If the model is this slow to build, raise search.trial_timeout."
    )
    assert "importing torch" not in error.message  # what the old message blamed, whatever the phase


def test_a_check_stopped_in_its_imports_says_so():
    error, _, _ = _check(_hung([Started(pid=3)], seconds=300.4), _spec(10))
    assert error.message == (
        "the environment check (a child process) was stopped after 300 s. Its last report was 'started': it was "
        "importing torch and the model library. Importing should take seconds: check the Python environment and "
        "its filesystem."
    )


def test_the_phase_narrows_down_with_each_event_the_check_reports():
    memory = MemoryReading(data=IMPORT_BASELINE_BYTES)
    imported, _, _ = _check(_hung([Started(pid=3), WARM, Imported(memory=memory)]), _spec())
    assert "Its last report was 'imported': it was building the model (factory: " in imported.message
    built, _, _ = _check(_hung([Started(pid=3), WARM, Imported(memory=memory), ModelBuilt(memory=memory)]), _spec())
    assert "it had built the model (factory: " in built.message and "checking the optimizer" in built.message
    nothing, _, _ = _check(_hung([], seconds=300.0), _spec())
    assert "It reported nothing: it did not get past starting Python." in nothing.message


def test_a_check_that_died_says_how_without_blaming_a_timeout():
    killed, _, _ = _check(ChildRun(returncode=-signal.SIGKILL, timed_out=False, seconds=2.0,
                                   events=[Started(pid=3), WARM]), _spec())
    assert killed.message.startswith("the environment check (a child process) was killed by SIGKILL without an "
                                     "answer. It had imported torch, torch._dynamo;")
    assert "trial_timeout" not in killed.message
    exited, _, _ = _check(ChildRun(returncode=1, timed_out=False, seconds=2.0, stderr_tail="ImportError: no torch"),
                          _spec())
    assert exited.message == ("the environment check (a child process) exited with status 1 without an answer. "
                              "It reported nothing: it did not get past starting Python.")
    assert exited.evidence == "ImportError: no torch"


def test_the_cpu_target_keeps_the_import_readings_for_vetting_trials():
    after = MemoryReading(data=800 * 2**20, rss=650 * 2**20, peak_rss=650 * 2**20)
    facts = Facts(torch_version="2.0", memory_after_import=after)
    target = resolve_target(_spec(), facts, None)
    assert target.import_memory == after and target.info.import_baseline_bytes == after.data
    assert inspected().events[-1].facts.memory_after_import.data == IMPORT_BASELINE_BYTES
