"""``isoprobe sweep``: many specs, on one machine or on several GPU types of a Slurm cluster, in one table.

``run_sweep`` turns the specs and targets into items (one per spec x target),
hands them to an executor (``local``: one after another in this process;
``slurm``: one job array per target through submitit) and gathers one row per
item into a ``SweepReport``. Every probe goes through ``api.answer_for``, as
``isoprobe run`` does, so the answers are cache entries and a sweep run again
answers from the cache. Nothing here imports torch.

    model.py    the sweep's contract: one row per spec x target, as a pydantic model, and its table
    task.py     one probe of a sweep, run as ``isoprobe run`` runs it (here, or as a Slurm array task)
    local.py    the local executor: the specs one after another in this process
    slurm.py    the Slurm executor: one job array per GPU type, through submitit
    records.py  which cache entry answered a spec on a Slurm target (a sweep run again submits nothing)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from isoprobe.sweep.model import LOCAL_TARGET, SweepItem, SweepReport, SweepRow

__all__ = ["SweepItem", "SweepReport", "SweepRow", "make_items", "run_sweep"]


def make_items(
    specs: list[str],
    targets: list[str],
    cache_dir: str,
    *,
    named: dict | None = None,
    sets: tuple[str, ...] = (),
    refresh: bool = False,
    rows_dir: str | None = None,
    over: list[str] | None = None,
) -> list[SweepItem]:
    """One item per spec x value x target, spec-major (the rows of one spec stay together).

    ``over``: ``FIELD=VALUE`` texts (``--over``'s values, one each), applied after ``sets``: each row is
    the probe ``isoprobe run SPEC --set FIELD=VALUE`` runs, so ``isoprobe frontier`` then reads its entry.
    """
    items: list[SweepItem] = []
    points: list[str | None] = list(over) if over else [None]  # without --over: one row, the spec as it is
    for spec in specs:
        for point in points:
            for target in targets:
                items.append(
                    SweepItem(
                        spec=os.path.abspath(spec),
                        shown=spec if point is None else f"{spec} {point}",
                        target=target,
                        cache_dir=cache_dir,
                        index=len(items),
                        named=dict(named or {}),
                        sets=tuple(sets) + ((point,) if point else ()),
                        refresh=refresh,
                        rows_dir=rows_dir,
                    )
                )
    return items


def run_sweep(
    specs: list[str],
    *,
    executor: str,
    say: Callable[[str], None],
    targets: list[str] | None = None,
    named: dict | None = None,
    sets: tuple[str, ...] = (),
    refresh: bool = False,
    slurm_options=None,
    submitter=None,
    over: list[str] | None = None,
) -> SweepReport:
    """Probe every spec on every target; the report (``interrupted`` when a signal stopped it)."""
    from isoprobe.cache.store import cache_directory

    began = time.monotonic()
    cache_dir = str(Path(cache_directory(os.environ)).expanduser().resolve())
    if executor == "local":
        from isoprobe.sweep.local import run_local

        items = make_items(specs, [LOCAL_TARGET], cache_dir, named=named, sets=sets, refresh=refresh, over=over)
        rows, stopped = run_local(items, say)
        submitted, arrays = sum(not row.cached and row.stop_reason is not None for row in rows), []
    else:
        from isoprobe.sweep.slurm import private_folder, run_slurm

        run_folder = private_folder(Path(slurm_options.folder)) / time.strftime(f"%Y%m%d-%H%M%S-{os.getpid()}")
        private_folder(run_folder)
        options = slurm_options.__class__(**{**slurm_options.__dict__, "folder": run_folder})
        items = make_items(
            specs,
            targets or [],
            cache_dir,
            named=named,
            sets=sets,
            refresh=refresh,
            rows_dir=str(run_folder / "rows"),
            over=over,
        )
        rows, submitted, arrays, stopped = run_slurm(items, options, say, submitter)
    return SweepReport(
        executor=executor,
        rows=rows,
        submitted=submitted,
        array_jobs=arrays,
        interrupted=stopped,
        seconds=round(time.monotonic() - began, 2),
    )
