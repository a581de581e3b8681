"""The local executor: the sweep's specs one after another in this process, as ``isoprobe run`` would probe each.

Each item goes through ``task.run_item``, the same function a Slurm task runs,
so a local row and a cluster row come from the same code (``api.answer_for``),
and every answer lands in the cache: a sweep run again is answered from it.
Ctrl-C or SIGTERM stops the probe that is running (its children first) and the
sweep with it; the rows not probed say so.
"""

from __future__ import annotations

from collections.abc import Callable

from isoprobe.sweep.model import SweepItem, SweepRow, failed_row
from isoprobe.sweep.task import run_item

#: Stop reasons of a probe that a signal ended.
_STOPPED = ("interrupted", "terminated")


def run_local(
    items: list[SweepItem], say: Callable[[str], None], run: Callable[[SweepItem], str] = run_item
) -> tuple[list[SweepRow], str | None]:
    """The rows, in order, and None, or 'interrupted'/'terminated' when a signal stopped the sweep."""
    from isoprobe.errors import Terminated
    from isoprobe.system.stops import installed

    rows: list[SweepRow] = []
    stopped: str | None = None
    stops = installed()  # the command's (system.stops): each probe holds it when its trials end
    for number, item in enumerate(items, 1):
        if stops is not None and not stopped:
            stopped = stops.reason  # a signal noted while no probe ran stops the sweep before this row
        if stopped:
            rows.append(failed_row(item.shown, item.target, f"not probed: the sweep was {stopped}"))
            continue
        say(f"isoprobe: sweep {number}/{len(items)}: {item.shown}")
        try:
            if stops is not None:
                stops.arm()  # this row's probe may be stopped
            row = SweepRow.model_validate_json(run(item))
        except KeyboardInterrupt:
            stopped, row = "interrupted", failed_row(item.shown, item.target, "interrupted before its first trial")
        except Terminated:
            stopped, row = "terminated", failed_row(item.shown, item.target, "terminated before its first trial")
        finally:
            if stops is not None:
                stops.hold()
        if row.stop_reason in _STOPPED:
            stopped = row.stop_reason
        rows.append(row)
    return rows, stopped
