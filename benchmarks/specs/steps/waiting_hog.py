"""memory_hog (tests/support/models.py) whose forward pass waits with the CPU idle, as a rank waits on its GPU.

Why it exists: on the CPU backend a trial's ranks keep every core of this
project's 2-core machine busy, so nothing started beside them (the next
trial's step, ``search.warm_start``) can run until they end. A rank of a GPU
trial mostly waits on its device, and its node's other cores are free. This
model keeps the memory of memory_hog and spends ``seconds`` of each forward
pass asleep, so that ``benchmarks/studies/step_trial_time.py`` can show where the
next step's start-up goes when the node has CPU to spare.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class WaitingHog(nn.Module):
    def __init__(self, features: int, depth: int, classes: int, seconds: float):
        super().__init__()
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(features)) for _ in range(depth)])
        self.head = nn.Linear(features, classes)
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)  # the device's time: the CPU is idle
        for scale in self.scales:
            x = torch.tanh(x * scale)
        return self.head(x)


def waiting_hog(features: int = 262144, depth: int = 4, classes: int = 10, seconds: float = 0.5) -> nn.Module:
    return WaitingHog(features, depth, classes, seconds)
