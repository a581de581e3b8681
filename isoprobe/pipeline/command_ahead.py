"""Whether a command probe starts each trial's command ahead of the trial, and the plan it is started from.

The parent's half of ``protocol.warm_command``: with ``search.command_ahead`` (off by default since issue 55: on a
busy node it made probes slower, see the field) and ``search.warm_start``, and a command of a shape an interpreter
can be started ahead for (``python SCRIPT ...``, ``python -m MODULE ...``), each trial's process is started ahead as
a warm spare, not forked (a fork is made when its trial is due: nothing can be started ahead in it), and is given
the plan: it starts the command, whose interpreter waits for the batch while the trial before runs.
``search.fork_server: true`` keeps forking, and the command starts cold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from isoprobe.protocol.warm_command import WarmPlan, warm_shape
from isoprobe.spec.command import argv_for

if TYPE_CHECKING:
    from isoprobe.spec.model import Spec


def starts_ahead(spec: Spec) -> bool:
    """Whether this spec's trials start their command ahead (see the module's docstring)."""
    return (
        spec.command is not None
        and spec.search.command_ahead
        and spec.search.warm_start
        and spec.search.fork_server is not True
        and not spec.distributed.gang
        and warm_shape(argv_for(spec.command, spec.shell, None)) is not None
    )


def command_plan(
    spec: Spec, device: str, memory_budget_bytes: int | None, cuda_outside_bytes: float | None
) -> str | None:
    """The plan a trial process started ahead starts the command from (JSON, for ``Conditions.command_plan``);
    None when the command starts when its trial is due. Only what the command's environment depends on is in it
    (the budget and the memory outside the allocator on CUDA alone), so that on the CPU backend the plan is known
    before the environment check and the first trial's command imports beside it."""
    if not starts_ahead(spec) or spec.command is None:
        return None
    cuda = device.startswith("cuda")
    return WarmPlan(
        argv=argv_for(spec.command, spec.shell, None),
        cwd=spec.command_dir,
        device=device,
        memory_budget_bytes=memory_budget_bytes if cuda else None,
        cuda_outside_bytes=cuda_outside_bytes if cuda else None,
    ).model_dump_json()
