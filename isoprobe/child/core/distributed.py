"""A rank of a distributed trial: join the gang, then wrap the model and optimizer as the real job does.

Child-side only (imports torch). ``join`` meets the other ranks through the
trial's FileStore (``protocol.RankAssignment``). The wrapping is what the
strategy puts in memory, and so what the per-rank peak measures:

- ``ddp``: ``DistributedDataParallel`` (its gradient buckets; ``bucket_cap_mb``,
  ``gradient_as_bucket_view``, ``static_graph`` as the spec says).
- ``zero1``: the same DDP, with ``ZeroRedundancyOptimizer`` over the spec's
  optimizer, which keeps each parameter's state on one rank only.
- ``fsdp``: FSDP2 ``fully_shard`` on each block (``fsdp_wrap: blocks``) and on
  the root, ``reshard_after_forward`` as the spec says, and for a mixed
  precision a ``MixedPrecisionPolicy`` in that dtype with fp32 reductions.

The process group's own timeout is far beyond the trial's: a rank stuck in a
collective is the supervisor's to end (``executors.gang``), at the trial's
timeout or as soon as another rank fails, so that the verdict is the failing
rank's and not a peer's collective error.
"""

from __future__ import annotations

import datetime

from isoprobe.protocol.messages import RankAssignment
from isoprobe.spec.model import Spec

#: The process group's timeout: longer than any trial (search.trial_timeout is at most a day).
_GROUP_TIMEOUT = datetime.timedelta(days=2)
_MIXED_DTYPES = {"fp16-mixed": "float16", "bf16-mixed": "bfloat16"}


def join(rank: RankAssignment, device) -> None:
    """Initialise the default process group for this rank (nccl binds it to ``device``)."""
    import torch
    import torch.distributed as dist

    store = dist.FileStore(rank.store_path, rank.world_size)
    options = {"device_id": device} if device.type == "cuda" else {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        rank.backend, store=store, rank=rank.rank, world_size=rank.world_size, timeout=_GROUP_TIMEOUT, **options
    )


def wrap_model(model, spec: Spec, device):
    """The model as the strategy trains it (already on ``device``)."""
    import torch

    options = spec.distributed
    if options.strategy in ("ddp", "zero1"):
        device_ids = [device] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=options.bucket_cap_mb,
            gradient_as_bucket_view=bool(options.gradient_as_bucket_view),
            static_graph=bool(options.static_graph),
        )
    if options.strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = _MIXED_DTYPES.get(spec.training.precision)
        policy = (
            MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
            if dtype
            else MixedPrecisionPolicy()
        )
        reshard = True if options.reshard_after_forward is None else options.reshard_after_forward
        if (options.fsdp_wrap or "blocks") == "blocks":
            for block in shardable_blocks(model):
                fully_shard(block, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, reshard_after_forward=reshard, mp_policy=policy)
        return model
    return model


def shardable_blocks(model) -> list:
    """The blocks FSDP shards one by one: the children of the model's sequential stages and lists of blocks.

    The same blocks gradient checkpointing wraps (``training._wrap_blocks``):
    the units a real job shards (transformer layers, ResNet bottlenecks). A
    stage of plain layers (a deep MLP) has each layer as a block. The root is
    sharded after them, and holds whatever is left (embeddings, heads).
    """
    import torch

    blocks: list[torch.nn.Module] = []

    def visit(module) -> None:
        for child in module.children():
            if isinstance(child, (torch.nn.Sequential, torch.nn.ModuleList)) and len(child) >= 2:
                blocks.extend(layer for layer in child if any(p.requires_grad for p in layer.parameters()))
                continue
            visit(child)

    visit(model)
    return blocks


def build_optimizer(spec: Spec, model, build_one):
    """The spec's optimizer over ``model``; under zero1 sharded over the ranks (``ZeroRedundancyOptimizer``)."""
    if spec.distributed.strategy != "zero1":
        return build_one(spec, model.parameters())
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    local = build_one(spec, [torch.nn.Parameter(torch.zeros(1))])  # its class and settings, resolved once
    defaults = {key: value for key, value in local.defaults.items() if key in _constructor_keys(type(local))}
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(local), **defaults)


def _constructor_keys(optimizer_class) -> set[str]:
    import inspect

    return set(inspect.signature(optimizer_class.__init__).parameters) - {"self", "params"}


def grad_scaler(spec: Spec, device):
    """fp16 loss scaling: FSDP's sharded gradients need the sharded scaler (it agrees on inf/NaN across ranks)."""
    if spec.distributed.strategy == "fsdp":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    import torch

    return torch.amp.GradScaler(device.type)


def local_optimizer(optimizer):
    """The optimizer whose ``state`` this rank holds (ZeroRedundancyOptimizer keeps it in ``optim``)."""
    return getattr(optimizer, "optim", optimizer)


def local_bytes(tensor) -> int:
    """Bytes this rank holds of ``tensor``: its local shard, for FSDP's DTensors."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()
