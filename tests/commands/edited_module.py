"""The module ``edits_its_module.py`` imports (and edits in its second run)."""

import torch


def build() -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
