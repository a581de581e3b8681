"""Whether a cache entry can be the truth: its answer must follow from its own trials.

An entry is a file anyone who can write the cache folder can edit, and a hook
exports what it says (``ISOPROBE_MAX_BATCH_SIZE=999``) into a training job.
So an entry is accepted only if it is coherent: it belongs to this key,
version and spec; its stop reason is one that is kept and agrees with
``answered``; the maximum ran in its trials and fit every time; the
recommended batch fit in them; the first failing batch failed in them; a
"nothing fits" really ran out of memory at the start batch. ``distrust``
returns the first reason it is not, in words, or None. The same check runs on
a fresh result before it is stored, so the cache never writes what it would
refuse to read.

This cannot tell forged trials from real ones: within what these rules allow,
whoever can write the folder can still change the answer (README: "A shared
cache folder"). Entries are only parsed, never executed.
"""

from __future__ import annotations

import os
import re

from isoprobe import __version__
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.result import Result
from isoprobe.spec.model import Spec

#: What a probe can prove, and so what is kept: the edge, a cap that fits, or that not even the start fits.
CACHEABLE = (StopReason.EDGE_FOUND, StopReason.CAPPED, StopReason.START_DOES_NOT_FIT)
_ANSWERED = (StopReason.EDGE_FOUND, StopReason.CAPPED)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def distrust(result: Result, *, key: str, spec: Spec) -> str | None:
    """Why ``result`` cannot be the stored answer for ``key`` and ``spec``, or None when it is coherent."""
    for check in (_identity, _stop, _sources, _numbering):
        if reason := check(result, key, spec):
            return reason
    return _answer(result) if result.answered else _nothing_fits(result)


def _identity(result: Result, key: str, spec: Spec) -> str | None:
    inside = result.cache.key if result.cache else None
    if inside != key:
        return f"the key inside it ({inside}) is not the one in its name"
    if result.isoprobe_version != __version__:
        return f"it was written by isoprobe {result.isoprobe_version}, and this is {__version__}"
    if result.spec is None:  # the readers refuse such an entry first; kept here so the rules below can rely on it
        return "it holds no spec"
    if result.spec.model_dump(mode="json") != spec.model_dump(mode="json"):
        return "its spec is not the one asked for"
    if result.device is None:
        return "it names no device"
    return None


def _stop(result: Result, key: str, spec: Spec) -> str | None:
    stop = result.stop_reason
    if stop not in CACHEABLE:
        return f"its stop reason {stop.value} is not an answer, and only answers are kept"
    if result.answered != (stop in _ANSWERED):
        return f"it says answered: {str(result.answered).lower()} with the stop reason {stop.value}"
    return None


def _sources(result: Result, key: str, spec: Spec) -> str | None:
    if result.sources is None:
        return "it does not record the source files its trials ran"
    for path, digest in result.sources.items():
        if not os.path.isabs(path) or not _SHA256.fullmatch(digest):
            return f"its sources entry {path!r} is not an absolute path with a SHA-256 digest"
    return None


def _numbering(result: Result, key: str, spec: Spec) -> str | None:
    if [t.index for t in result.trials] != list(range(1, len(result.trials) + 1)):
        return "its trials are not numbered 1, 2, 3, ... in order"
    return None


def _spec(result: Result) -> Spec:
    """The entry's spec, which ``_identity`` has made sure of before any later rule reads it."""
    if result.spec is None:
        raise ValueError("a cache entry without a spec reached a rule past _identity")
    return result.spec


def _runs(result: Result, batch: int, purposes: tuple[str, ...] | None = None) -> list[Outcome]:
    """Every run of ``batch`` under the budget and the first allocator setting (what the answer is about).

    Soaks are left out unless ``purposes`` names them: the maximum is about
    search.steps steps, and a soak that failed there moved the recommendation, not the edge.
    """
    allocators, device = _spec(result).allocators, result.device
    first = allocators[0] if allocators and device is not None and device.backend == "cuda" else None
    return [
        t.outcome
        for t in result.trials
        if t.batch_size == batch
        and t.allocator == first
        and t.training_batch_size is None  # not an eval trial
        and (t.purpose in purposes if purposes else t.purpose not in ("memory_check", "soak"))
    ]


def _answer(result: Result) -> str | None:
    best, first_failing = result.max_batch_size, result.first_failing_batch_size
    if best is None:
        return "it is answered but names no maximum"
    runs = _runs(result, best)
    if not runs:
        return f"no trial in it ran its maximum {best}"
    if any(outcome is not Outcome.FITS for outcome in runs):
        return f"its maximum {best} did not fit in every trial of it that ran {best}"
    cap = _spec(result).search.cap
    if cap is not None and best > cap:
        return f"its maximum {best} is above the spec's cap {cap}"
    recommended = result.recommended_batch_size
    if recommended is not None:
        if recommended > best:
            return f"its recommended batch {recommended} is above its maximum {best}"
        soaks = result.recommendation.soaks if result.recommendation else []
        unsoaked = result.recommendation is not None and result.recommendation.soak_steps == 0 and not soaks
        if not unsoaked and Outcome.FITS not in _runs(result, recommended) + _runs(result, recommended, ("soak",)):
            # (with soak_steps 0 no trial runs for the recommendation: at or below the maximum is all it claims)
            return f"no trial in it ran its recommended batch {recommended} successfully"
        if soaks and not (
            soaks[-1].survived
            and soaks[-1].batch_size == recommended
            and _runs(result, recommended, ("soak",))[-1:] == [Outcome.FITS]
        ):
            return f"its recommended batch {recommended} is not the one its last soak ran and survived"
    if (evaluation := result.eval_max_batch_size) is not None:
        runs = [t.outcome for t in result.trials if t.training_batch_size is not None and t.batch_size == evaluation]
        if not runs or any(outcome is not Outcome.FITS for outcome in runs):
            return f"its evaluation maximum {evaluation} did not fit in every evaluation trial of it"
    if result.stop_reason is StopReason.CAPPED:
        return None if first_failing is None else "it says capped but names a first failing batch"
    marginal = [m.batch_size for m in result.edge_margin.marginal] if result.edge_margin else []
    if any(b <= best or Outcome.FITS not in _runs(result, b) for b in marginal):
        return f"its marginal batches {marginal} are not batches above its maximum {best} that fit"
    if first_failing is None and marginal:
        return None  # only marginal batches above the maximum (the spread rule), none failing: nothing to check
    if first_failing is None or first_failing <= best:
        return f"it says the edge was found, but its first failing batch is {first_failing}"
    return _failed(result, first_failing)


def _nothing_fits(result: Result) -> str | None:
    if result.max_batch_size is not None or result.recommended_batch_size is not None:
        return "it says nothing fits, but names a batch that fits"
    fitting = sorted({t.batch_size for t in result.trials if Outcome.FITS in _runs(result, t.batch_size)})
    if fitting:
        return f"it says nothing fits, but batch {fitting[0]} fit in it"
    start = _spec(result).search.start_batch_size
    if result.first_failing_batch_size != start or result.first_failing_outcome is not Outcome.OUT_OF_MEMORY:
        return f"it says nothing fits, but does not say that the start batch {start} ran out of memory"
    return _failed(result, start)


def _failed(result: Result, batch: int) -> str | None:
    runs = _runs(result, batch)
    if all(outcome is Outcome.FITS for outcome in runs):  # also when no trial ran it
        return f"no trial in it failed at its first failing batch {batch}"
    if result.first_failing_outcome not in runs:
        outcome = result.first_failing_outcome.value if result.first_failing_outcome else None
        return f"no trial in it ended {outcome} at its first failing batch {batch}"
    return None
