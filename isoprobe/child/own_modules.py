"""isoprobe's own modules in a trial's process: what they take, measured, and credited to the CPU cap.

isoprobe's own modules (pydantic, the protocol, the spec's models, this package) sit in the trial's process but
not in the user's, and would move the edge below a plain process's (figures: docs/measurements.md, "Moved from
code"). ``import_own`` measures them in each process, imported after torch so that only what torch would not have
imported anyway is counted; so is the request it reads (its pydantic spec); ``credit_own`` raises the cap by that
much before the user's code runs (``system.data_cap.credit``), and every reading of ``child.core.memory`` leaves it
out: the cap and the peaks are a plain process's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from isoprobe.system.data_cap import credit
from isoprobe.system.proc_memory import status_bytes


@dataclass(frozen=True)
class Own:
    """What isoprobe's own modules add to this process: data segment (what the cap counts) and resident."""

    data: int = 0
    rss: int = 0


#: This process's own cost, once measured (``import_own``); a fork inherits it with the memory it describes.
_own = Own()


def import_own(load: Callable[[], object]) -> Own:
    """Run ``load`` (imports of isoprobe's own modules), add what it grew this process by to ``own()``; return that.

    Counted only where torch was imported first: before it, the growth would
    include the standard library modules torch imports too (about twice as much:
    docs/measurements.md, "Moved from code"), and crediting that would let a trial
    fit what a plain process cannot. Without torch (a request run by hand with
    no preload) nothing is counted. A negative growth (memory freed) counts 0.
    """
    global _own
    counted = "torch" in sys.modules
    before = status_bytes("VmData", "VmRSS")
    load()
    after = status_bytes("VmData", "VmRSS")
    if counted and None not in (*before.values(), *after.values()):
        _own = Own(
            data=_own.data + max(0, after["VmData"] - before["VmData"]),
            rss=_own.rss + max(0, after["VmRSS"] - before["VmRSS"]),
        )
    return _own


def own() -> Own:
    return _own


def credit_own() -> None:
    """Raise this process's cap (the budget, set by the parent before exec or by ``set_data_cap``) by what isoprobe
    holds of its own, and make it final: called once, with the request read, before any user code.

    The hard limit is ``OWN_ALLOWANCE_BYTES`` above the budget; the new cap is
    the budget plus the measured cost, at most the hard limit, and both limits
    are set to it, so nothing run later (the user's model) can raise it.
    Without a cap there is nothing to credit.
    """
    credit(_own.data)
