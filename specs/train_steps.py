"""A training step of one's own, for model.step (used by specs/resnet18-ema-clip.yaml).

isoprobe calls it as ``ema_clip_step(model, optimizer, batch, device)`` once per
step, with the built model, the optimizer from the spec, and ``batch = (inputs,
targets)``. It does what the real loop does, so that the maximum holds for it:
here gradient clipping and an exponential moving average (EMA) of the weights,
which is a whole second copy of them. State kept between steps (the EMA model)
lives in this module, as it would in a training script.
"""

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

_EMA: dict[int, AveragedModel] = {}


def ema_clip_step(model, optimizer, batch, device):
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=True)
    outputs = model(inputs)
    loss = nn.functional.cross_entropy(outputs, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    ema = _EMA.get(id(model))
    if ema is None:
        ema = _EMA[id(model)] = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999), use_buffers=True)
    ema.update_parameters(model)
