"""What the parent sends down: a trial's or the environment check's request, and the fork server's channel.

- **Requests** (parent to child, a JSON file whose path is on the child's
  command line or, for a warm child, on its stdin): ``TrialRequest`` runs
  training steps at one batch size, ``InspectRequest`` checks the environment
  once per probe. The spec travels typed, so the child reads its defaults from
  the same model the parent validated, never restated by hand.
- **The fork server's channel** (``child.server``): the parent's orders (``ForkOrder``, ``ImportOrder``) and the
  server's replies (``Forked``, ``Ended``, ``Extended``), one SOCK_SEQPACKET message each.

Apart from the events (``protocol.messages``, which re-exports every name here) because these are written by
the parent and read once, while the events are the children's stream, read again and again. ``Message``, the
strict base of every model of the protocol, is here, the first module of the two. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from isoprobe.report.cycle import CycleRule
from isoprobe.report.steady import SteadyRule
from isoprobe.spec.model import Spec


class Message(BaseModel):
    """The base of every model that crosses a process boundary: strict (only same-version parents and children
    talk, so an unknown field is a bug) and frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- requests


class RankAssignment(Message):
    """One rank of a gang (``spec.distributed``): which rank this child is, and where the gang meets.

    The rendezvous is a ``torch.distributed.FileStore`` on a file in the trial's
    own folder, not a TCP port: two probes (or two trials) on one node cannot
    meet each other's ranks, and there is no port to find free and race for.
    The collectives' own connections (gloo, nccl) use ports the kernel assigns.
    """

    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    store_path: str = Field(description="The gang's FileStore file, one per trial.")
    backend: Literal["gloo", "nccl"] = Field(description="gloo on the CPU backend, nccl on CUDA.")


class TrialRequest(Message):
    """Run the spec's training steps at one batch size and report the peak memory."""

    mode: Literal["trial"] = "trial"
    spec: Spec
    batch_size: int = Field(ge=1)
    device: str = Field(description="torch device string the trial runs on: 'cpu' or 'cuda:N'.")
    memory_budget_bytes: int | None = Field(
        None, description="CUDA: applied as the per-process memory fraction. CPU: the rlimit (set by the executor)."
    )
    cuda_outside_bytes: int | None = Field(
        None,
        ge=0,
        description="CUDA, a command trial: what the environment check saw in use on the card outside "
        "an allocator (its context, other processes), taken off the budget where the command's shim caps the "
        "allocator at CUDA's initialisation, before the command's own first step has measured it.",
    )
    python_path: list[str] = Field(default_factory=list, description="Folders put in front of sys.path (the spec's).")
    steps: int | None = Field(
        None, ge=1, description="Training steps to run instead of search.steps (the recommendation's soak)."
    )
    steady: SteadyRule | None = Field(
        None,
        description="Set for a trial that decides the edge: after its steps it keeps stepping until its "
        "peak is steady or the rule's cap (isoprobe.report.steady); None: exactly its steps.",
    )
    cycle: CycleRule | None = Field(
        None,
        description="A deciding trial (or a soak) steps on until it has seen the "
        "script's first evaluation pass, or the rule's bound (report.cycle). None: no wait.",
    )
    rank: RankAssignment | None = Field(
        None, description="Set for each rank of a distributed trial (the gang executor's fan-out); None: one process."
    )
    data_indices: list[int] | None = Field(
        None,
        description="With spec.data: the batch's dataset indices, longest first, when there are at most "
        "spec.data.INDICES_IN_REQUEST of them; else that many, and the trial rebuilds the rest with the same rule "
        "(spec.data.scanned_indices, worst_first) and checks that it starts with these.",
    )
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="Set for an evaluation trial (training.eval_pass): batch_size's training steps run "
        "first, then the training batch is dropped and one evaluation pass runs at this batch; "
        "the trial's verdict is the evaluation's. None: a training trial (no evaluation pass).",
    )
    margin_check_bytes: int | None = Field(
        None,
        ge=0,
        description="CUDA, a training trial of isoprobe's own loop in one process: the capacity less the spread, "
        "in the budget's units. A trial whose peak reads at or above it runs its steps again under a cap that "
        "leaves its reading below it (child.core.cuda.squeeze): fitting there, those steps are its readings. "
        "None: no check.",
    )


class InspectRequest(Message):
    """Report versions and devices, and check that the model, optimizer and options can be set up."""

    mode: Literal["inspect"] = "inspect"
    spec: Spec
    python_path: list[str] = Field(default_factory=list)


Request = Annotated[TrialRequest | InspectRequest, Field(discriminator="mode")]
_REQUEST = TypeAdapter(Request)


def request_json(request: TrialRequest | InspectRequest) -> str:
    return request.model_dump_json()


def read_request(path: str | Path) -> TrialRequest | InspectRequest:
    """The child's side: its request file, typed (a malformed one raises ValidationError)."""
    return _REQUEST.validate_json(Path(path).read_bytes())


# --------------------------------------------------------------------------- the fork server's channel


class ForkOrder(Message):
    """Parent to fork server (``child.server``): fork one child for one request.

    One SOCK_SEQPACKET message each, with the child's lifeline (the read end of
    a pipe only the parent writes) beside it as SCM_RIGHTS.
    """

    request: str = Field(description="The request's path, as a spawned child reads it from stdin.")
    events: str = Field(description="The file the forked child appends its events to.")
    stdout: str
    stderr: str
    memory_limit: int | None = Field(None, description="RLIMIT_DATA for the forked child (the CPU cap); None: none.")


class ImportOrder(Message):
    """Parent to fork server: import these modules too (the model's, known after the environment check), then
    prove again that a fork can run a parallel torch operation, before the next ``ForkOrder``.

    So the trials' process imports what a server started with the longer preload would have, without
    a second server importing torch again while the first trial waits (``executors.fork_server_choice``).
    """

    order: Literal["import"] = "import"
    modules_file: str = Field(
        description="A file naming the modules, one a line: up to ``MAX_MODEL_IMPORTS`` of "
        "them, more than one message may hold."
    )


class Forked(Message):
    """Fork server to parent: the order's process (the keeper of the forked child) runs with this PID."""

    reply: Literal["forked"] = "forked"
    pid: int


class Ended(Message):
    """Fork server to parent: that process ended with this raw wait status (its child's, as a keeper's is)."""

    reply: Literal["ended"] = "ended"
    pid: int
    status: int


class Extended(Message):
    """Fork server to parent, for an ``ImportOrder``: how many of the modules it imported (up to the first that
    failed, as a spawned child's preload), and whether its forks are still safe (no CUDA context, the canary
    fork ran)."""

    reply: Literal["extended"] = "extended"
    imported: int
    safe: bool


ServerReply = Annotated[Forked | Ended | Extended, Field(discriminator="reply")]
SERVER_REPLY = TypeAdapter(ServerReply)
#: What the fork server reads from its channel: an order to import more, or one to fork (``ForkOrder``).
SERVER_ORDER: TypeAdapter[ImportOrder | ForkOrder] = TypeAdapter(ImportOrder | ForkOrder)
