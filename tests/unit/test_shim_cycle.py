"""The shim sees the script's later phases (issue 55): evaluation forwards and checkpoint writes between two
optimizer steps, in a real interpreter with torch, as a command trial's process runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from isoprobe.protocol.command import GATE_FILE, SHIM_DIR_ENV, SHIM_FOLDER, ShimStep, parse_lines

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
    (tmp_path / GATE_FILE).write_text("100")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHIM_DIR_ENV)}
    env.update(PYTHONPATH=str(SHIM_FOLDER), **{SHIM_DIR_ENV: str(tmp_path)})
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    [file] = tmp_path.glob("p*.jsonl")
    steps = [line for line in parse_lines(file.read_bytes()) if isinstance(line, ShimStep)]
    assert [s.eval_forwards for s in steps] == [1, 1, 1, 1, 5, 1]  # the teacher each step; 3 + 1 more in step 5
    assert [s.saves for s in steps] == [0, 0, 1, 0, 0, 0]  # saved after step 2: counted with step 3
    assert all(s.forwards == [[3, 4]] for s in steps)  # the trained batch is judged as before
