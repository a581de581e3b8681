"""The Python API: ``probe()``, what ``isoprobe run`` does, for a training script that asks before it builds its loader.

    from isoprobe import probe

    result = probe("specs/small-cnn.yaml", memory_budget="8GiB")
    batch = result.recommended_batch_size

``probe`` goes through the same code as the command line: the spec loaded and
checked as ``isoprobe validate`` checks it (``spec.load.load_spec``,
``spec.load.check_references``), then ``answer_for``, which the CLI's ``run`` calls
too: the cache, its lock, the probe in fresh child processes, the store
(``pipeline.answer``). So an answer the CLI cached is a cache hit here, and the
other way round.

Nothing here, nor anything it imports, imports torch: the trials run in child
processes, and the caller's process stays free of torch and of any CUDA context
(a training script can import torch *after* asking, and the GPU is untouched
until then).

Errors are the typed exceptions of ``isoprobe.errors``: a bad spec raises
``SpecError`` listing every problem; a probe that cannot start raises
``ProbeError``. The probe's other outcomes (the start batch does not fit, a
trial failed) are answers: a ``Result`` whose ``answered`` is false and whose
``stop_reason`` and ``message`` say why, as the CLI prints it with exit 3 or 4.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: importing the result model costs time, and ``isoprobe`` is imported lazily
    from isoprobe.report.result import Result
    from isoprobe.spec.model import Spec


def probe(
    spec: str | os.PathLike | Mapping[str, Any] | Spec,
    *,
    device: str | None = None,
    memory_budget: str | int | None = None,
    max_batch_size: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    cache: bool = True,
    refresh: bool = False,
    quiet: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """Find the largest batch that fits, as ``isoprobe run`` does, and return the typed ``Result``.

    ``spec``: a YAML file's path; or the same data as a dict (relative paths in
    it, such as ``model.factory: models.py:build``, resolve against the current
    directory, and errors and ``Result.spec_path`` name it ``<dict spec>`` there);
    or a ``Spec`` (from ``load_spec``; treated as a dict).

    ``device``, ``memory_budget`` (``"8GiB"``, ``"16 GB"`` or bytes) and
    ``max_batch_size`` override the spec's fields, as ``--device``,
    ``--memory-budget`` and ``--max-batch-size`` do; ``overrides`` sets any field
    by its dotted path, ``{"training.precision": "bf16-mixed"}``, as ``--set``
    does, with Python values. The three named arguments win over ``overrides``
    for their fields. Every override is validated as if written in the spec, and
    is part of the cache key.

    ``cache=False`` neither reads nor writes the result cache (``--no-cache``);
    ``refresh=True`` probes again and replaces the cached answer (``--refresh``).
    The cache folder is ``ISOPROBE_CACHE_DIR`` or the user's cache folder.

    Progress lines go to stderr, as the CLI's do; ``progress`` takes them instead
    (a callable given each line, e.g. ``logging.info``), and ``quiet=True`` drops them.

    Raises ``SpecError`` (every problem of the spec and the overrides, each
    naming where it came from), ``ProbeError`` (the probe could not start, or the
    system refused what a trial needs, such as space in TMPDIR), and
    ``KeyboardInterrupt`` when Ctrl-C stops the probe (after its children are
    stopped; the partial answer is not returned, so a script does not go on to
    train with it). No signal handler is installed: SIGTERM ends the caller as it
    would anyway, and the trials end with it.
    """
    from isoprobe.errors import shown
    from isoprobe.report.outcomes import StopReason
    from isoprobe.spec.load import DATA_SPEC_NAME, check_references, load_spec
    from isoprobe.spec.overrides import Override, from_mapping

    if quiet and progress is not None:
        raise ValueError("give progress (where the lines go) or quiet=True (no lines), not both")
    given = from_mapping(overrides or {})
    named = {
        "device": ("device", device),
        "memory_budget": ("memory_budget", memory_budget),
        "max_batch_size": ("search.max_batch_size", max_batch_size),
    }
    given += [
        Override(field, value, f"probe({name}={shown(value)})")
        for name, (field, value) in named.items()
        if value is not None
    ]
    # A spec given as data has no file: its name is as if it were a file in the current folder.
    spec_path = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else os.path.join(os.getcwd(), DATA_SPEC_NAME)
    loaded = load_spec(spec, given)
    check_references(loaded, spec_path)
    say: Callable[[str], None]
    if quiet:
        say = _silent
    elif progress is not None:
        say = progress
    else:
        from isoprobe.report.streams import tell

        say = tell
    set_budget = any(override.field == "memory_budget" for override in given)
    result = answer_for(
        loaded, spec_path, say, use_cache=cache, refresh=refresh, budget_source="command line" if set_budget else "spec"
    )
    if result.stop_reason is StopReason.INTERRUPTED:
        raise KeyboardInterrupt
    return result


def _silent(line: str) -> None:
    """``quiet=True``: the progress lines go nowhere."""


def answer_for(
    spec: Spec,
    spec_path: str,
    say: Callable[[str], None],
    *,
    use_cache: bool,
    refresh: bool,
    budget_source: str,
    borrowed=None,
) -> Result:
    """The result for a valid spec: from the cache when it holds the answer, else from a probe (then stored).

    The one path from a valid spec to a ``Result``, for ``isoprobe run`` and
    ``probe()`` alike (``pipeline.answer`` does the work). An ``OSError`` out of the
    probe is the system refusing what a trial needs (no space left in TMPDIR for
    its files, too many open files): not the user's spec and not a bug, so one
    line (``ProbeError``, exit 4 from the CLI), never a traceback. A ``ProbeError`` carries the trials run
    before it (``ProbeError.trials``), which the command prints as the stop's evidence. ``borrowed``: a
    frontier's bounds from its other points (``search.frontier_bounds``), which only steer the search.
    """
    from isoprobe.errors import ProbeError
    from isoprobe.pipeline.answer import answer
    from isoprobe.report.output import Reporter

    reporter = Reporter(say)
    try:
        return answer(
            spec,
            spec_path,
            reporter,
            use_cache=use_cache,
            refresh=refresh,
            budget_source=budget_source,
            borrowed=borrowed,
        )
    except ProbeError as error:
        error.trials = error.trials or list(reporter.trials)  # the evidence: the trials run before it
        raise
    except OSError as exc:
        raise ProbeError(system_refused(exc), trials=reporter.trials) from None


def system_refused(exc: OSError) -> str:
    """An OSError from the probe in one line: what, where, and what to do about it."""
    import errno

    where = f" ({exc.filename})" if exc.filename else ""
    what = f"the probe stopped: {exc.strerror or exc}{where}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return what + "; a trial keeps its files in TMPDIR: free space there or point TMPDIR at a folder with room"
    return what
