"""Did a command trial train at the batch it was asked for (issue 47, 'credited a batch the script did not train
at')? The pure judge, and the shim's record of the model's forwards that it judges, in a real torch process.

Why: a script that ignores ``{batch_size}``, or finds its own batch by catching its out-of-memory error, turned
every trial into a credit for a batch it never ran (16777216 "fits"; 802 "fits" where the script trains at 100).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from isoprobe.child.trained_batch import not_trained_message, step_trained_at, trial_trained_at
from isoprobe.protocol.command import SHIM_DIR_ENV, SHIM_FOLDER, ShimStep, parse_lines


@pytest.mark.parametrize("batch, forwards, world, trained", [
    (64, [[64, 3, 32, 32]], 1, True),                       # the model's input, batch first
    (64, [[128, 64, 512]], 1, True),                        # sequence first (an RNN without batch_first)
    (64, [[24, 3, 32, 32]], 1, False),                      # a fixed batch that ignores the argument
    (802, [[802, 3, 64, 64], [401, 3, 64, 64], [200, 3, 64, 64]], 1, False),  # a finder: the last forward is its
    (64, [[16, 128]] * 4, 1, True),                         # four micro-batches of 16 (gradient accumulation)
    (64, [[32, 128], [16, 128]], 1, False),                 # forwards that do not add up to it
    (4096, [[8, 512]], 1, True),                            # a batch counted in tokens: 8 sequences of 512
    (64, [[32, 3, 32, 32]], 2, True),                       # a global batch split over two ranks
    (64, [[32, 3, 32, 32]], 1, False),                      # ... which one process alone does not train at
    (64, [], 1, None),                                      # no forward seen (not an nn.Module): not judged
])
def test_a_step_trained_at_the_batch_when_its_inputs_show_it(batch, forwards, world, trained):
    assert step_trained_at(batch, forwards, world) is trained


def test_one_step_at_the_batch_is_enough_and_a_trial_without_forwards_is_not_judged():
    # The last batch of an epoch can be short: its step is not the trial's.
    assert trial_trained_at(100, [[[100, 8]], [[100, 8]], [[37, 8]]]) is True
    assert trial_trained_at(100, [[[50, 8]], [[50, 8]]]) is False
    assert trial_trained_at(100, [[], []]) is None


def test_the_message_says_what_the_script_trained_at_and_the_fix():
    text = not_trained_message(802, [[[100, 3, 64, 64]], [[100, 3, 64, 64]]], "{batch_size} = 802")
    assert "[100, 3, 64, 64]" in text and "batch 802" in text and "find_executable_batch_size" in text
    assert "DataLoader's batch_size" in text


SCRIPT = r"""
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Linear(8, 4))
teacher = nn.Linear(8, 4).requires_grad_(False)
loss_module = nn.CrossEntropyLoss()
class Keywords(nn.Module):
    def __init__(self):
        super().__init__(); self.inner = nn.Linear(8, 4)
    def forward(self, input_ids=None):
        return self.inner(input_ids)
kw = Keywords()
class Fails(nn.Module):
    def __init__(self):
        super().__init__(); self.inner = nn.Linear(8, 4)
    def forward(self, x):
        self.inner(x)
        raise MemoryError("no room")
fails = Fails()
opt = torch.optim.SGD([*model.parameters(), *kw.parameters(), *fails.parameters()], lr=0.1)
x = torch.randn(5, 8)
with torch.no_grad():
    model(torch.randn(9, 8))           # evaluation: not a training forward
teacher(torch.randn(11, 8))            # frozen: not the model
try:
    fails(torch.randn(13, 8))          # ran out inside its forward: not completed
except MemoryError:
    pass
loss = loss_module(model(x), torch.zeros(5, dtype=torch.long))  # the loss module has no parameters
loss.backward(); opt.step()
kw(input_ids=torch.randn(6, 8)).sum().backward(); opt.step()   # model(**batch), as HF models are called
opt.step()                                                       # no forward since the step before
"""


def test_the_shim_records_the_models_completed_training_forwards_and_nothing_else(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHIM_DIR_ENV)}
    env.update(PYTHONPATH=str(SHIM_FOLDER), **{SHIM_DIR_ENV: str(tmp_path)})
    (tmp_path / "gate").write_text("100")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    [file] = Path(tmp_path).glob("p*.jsonl")
    steps = [line for line in parse_lines(file.read_bytes()) if isinstance(line, ShimStep)]
    assert [step.forwards for step in steps] == [[[5, 8]], [[6, 8]], []]
