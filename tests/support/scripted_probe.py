"""Shared by the orchestration unit tests: the integration tiers' spec shapes, and a probe over a scripted executor.

``run_probe`` with an ``isoprobe.executors.scripted.ScriptedExecutor`` runs the
real search, classification, retries, confirmations, reclassification and
recommendation, with canned child runs instead of processes: no torch, no
waiting. Not a test module (no ``test_`` prefix); the unit tests import it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from isoprobe.errors import Terminated
from isoprobe.executors.scripted import Call, ScriptedExecutor, crashed, error, fits, linear
from isoprobe.report.outcomes import StopReason
from isoprobe.report.output import Reporter
from isoprobe.pipeline import run_probe
from isoprobe.report.result import Result, exit_code_for
from isoprobe.report.trial import Sizes
from isoprobe.spec.model import Spec

from conftest import fault_spec, hog_spec  # noqa: F401 (hog_spec: re-exported for the unit tests)

SUPPORT = Path(__file__).resolve().parent
FAULTS = SUPPORT / "faults.py"
MODELS = SUPPORT / "models.py"
#: Where the specs "are": only its folder is used (the trials' python_path); nothing reads it.
SPEC_PATH = str(SUPPORT / "spec.yaml")

KiB, MiB, GiB = 1024, 1024**2, 1024**3


def faulty_spec(fault: str = "segfault", **options) -> dict:
    """tests/integration/test_faults.py's shape (conftest.fault_spec): start 7, cap 8, fault at 8."""
    return fault_spec(fault, **options)


def with_model(spec: dict, factory: str, **kwargs) -> dict:
    """``spec`` with another factory of tests/support/models.py and the tiny input and target they take."""
    spec = copy.deepcopy(spec)
    spec["model"] = {"factory": f"{MODELS}:{factory}", **({"kwargs": kwargs} if kwargs else {})}
    spec["input"] = {"shape": [16]}
    spec["target"] = {"classes": 4}
    return spec


#: A device like the one memory_hog meets under the 1.5 GiB cap: the peak is 720 MiB + 32 MiB per sample,
#: so batch 25 (1520 MiB) fits and 26 (1552 MiB) runs out of memory.
HOG_FIXED, HOG_PER_SAMPLE, HOG_MAX = 720 * MiB, 32 * MiB, 25


@dataclass
class Probed:
    """One scripted probe: its result, the executor (every call it got), and the progress lines."""

    result: Result
    executor: ScriptedExecutor
    lines: list[str]

    @property
    def exit_code(self) -> int:
        return int(exit_code_for(self.result.stop_reason))

    @property
    def trials(self) -> list:
        return self.result.trials

    def at(self, batch: int) -> list:
        return [t for t in self.result.trials if t.batch_size == batch]

    def sequence(self) -> list[tuple]:
        """(batch, purpose, outcome) of every trial, in order."""
        return [(t.batch_size, t.purpose, t.outcome.value) for t in self.result.trials]


def probe(spec: dict | Spec, executor: ScriptedExecutor, *, environ: dict | None = None) -> Probed:
    """``run_probe`` over ``executor``; nothing it used may be left open (every test checks that)."""
    spec = spec if isinstance(spec, Spec) else Spec.model_validate(spec)
    lines: list[str] = []
    try:
        result = run_probe(spec, SPEC_PATH, Reporter(lines.append), environ={} if environ is None else environ,
                           executor=executor)
    except (KeyboardInterrupt, Terminated) as escaped:  # a KeyboardInterrupt would stop pytest itself
        raise AssertionError(f"{type(escaped).__name__} escaped run_probe: no result document") from None
    finally:
        assert executor.closed, "run_probe ended with its executor still open"
    # Every trial in the result is one executor run, in order. Only a signal may have cut one more run short.
    ran = [(t.batch_size, t.index) for t in result.trials]
    calls = [(c.batch_size, c.number) for c in executor.calls]
    if result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
        assert calls[: len(ran)] == ran and len(calls) <= len(ran) + 1, (calls, ran)
    else:
        assert calls == ran, (calls, ran)
    return Probed(result, executor, lines)


def fits_timed(peak: int, step_seconds: list[float], *, base_bytes: int | None = None,
               sizes: Sizes | None = None):
    """A fit whose steps took ``step_seconds`` each (``scripted.fits`` times every step alike)."""
    return fits(peak, base_bytes=base_bytes, step_seconds=list(step_seconds), sizes=sizes)


def fault_at(batch: int, fault, *, attempt: int | None = None):
    """A ``linear(faults=...)`` hook: ``fault`` (a ChildRun) at batches >= ``batch``, on one attempt or all."""

    def faults(call: Call):
        if call.batch_size >= batch and (attempt is None or call.attempt == attempt):
            return fault
        return None

    return faults


def every_purpose():
    """memory_hog's device, except: 26 crashes on its first run, and past the edge oneDNN's ambiguous error.

    With ``every_purpose_spec`` a probe runs a trial of every purpose: search,
    retry, memory check, confirmation and soak.
    """

    def faults(call: Call):
        if call.batch_size == 26 and call.attempt == 1:
            return crashed()
        if HOG_FIXED + HOG_PER_SAMPLE * call.batch_size > call.conditions.memory_limit:
            return error("could not create a primitive", "RuntimeError")
        return None

    return linear(HOG_FIXED, HOG_PER_SAMPLE, faults=faults)


def every_purpose_spec() -> dict:
    """From 12 the guided search never runs the recommended 20; a short soak runs it (soak_steps 0 runs no trial
    for the recommendation since issue 34; the soak's own tests are test_orchestration_soak.py)."""
    spec = hog_spec(start_batch_size=12, confirmations=1)  # a confirmation asked: every purpose runs
    spec["recommendation"] |= {"headroom": 0.1, "multiple_of": 4, "soak_steps": 3}
    return spec
