"""The shim sees the script's later phases (issue 55): evaluation forwards and checkpoint writes between two
optimizer steps, in a real interpreter with torch, as a command trial's process runs it."""

from __future__ import annotations

from isoprobe.protocol.command import ShimStep
from shim_run import shim_lines

SCRIPT = """\
import io
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
teacher = torch.nn.Linear(4, 2).eval()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 7):
    with torch.no_grad():
        teacher(torch.randn(3, 4))  # a frozen model in every step: part of the step
    optimizer.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    if step == 2:
        torch.save(model.state_dict(), io.BytesIO())
    if step == 4:
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(6, 4))
        with torch.inference_mode():
            model(torch.randn(6, 4))
        model.train()
"""


def test_evaluation_forwards_and_torch_save_calls_are_counted_in_the_step_after_them(tmp_path):
    steps = shim_lines(tmp_path, SCRIPT, ShimStep)
    assert [s.eval_forwards for s in steps] == [1, 1, 1, 1, 5, 1]  # the teacher each step; 3 + 1 more in step 5
    assert [s.saves for s in steps] == [0, 0, 1, 0, 0, 0]  # saved after step 2: counted with step 3
    assert all(s.forwards == [[3, 4]] for s in steps)  # the trained batch is judged as before
