"""Each training script of tests/commands/ parses its flags: its ``--help`` names the batch flag and the max-steps flag
the tests substitute (a script that cannot even parse its flags would make every later integration test fail for
the wrong reason). Each run imports torch (and Lightning or transformers) in a fresh process: ~5 s. That the scripts
import nothing of isoprobe is tests/unit/test_command_scripts.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "tests" / "commands"

#: script -> (argv before --help, the batch flag and the max-steps flag its help must name)
SCRIPTS = {
    "plain_loop.py": ([], ["--batch-size", "--max-steps"]),
    "ddp_train.py": ([], ["--batch-size", "--max-steps"]),
    "lightning_cli.py": (["fit"], ["--data.batch_size", "--trainer.max_steps"]),
    "hf_trainer_script.py": ([], ["--per_device_train_batch_size", "--max_steps"]),
    "accelerate_script.py": ([], ["--batch-size", "--max-steps", "--cpu"]),
    "raises_before_step.py": ([], ["--batch-size", "--max-steps"]),
    "exits_early.py": ([], ["--batch-size", "--max-steps"]),
    "never_steps.py": ([], ["--batch-size", "--max-steps"]),
    "leaves_daemon.py": ([], ["--batch-size", "--max-steps"]),
    "not_its_batch.py": ([], ["--mode", "--batch-size", "--max-steps"]),
    "batch_shapes.py": ([], ["--mode", "--batch-size", "--max-steps"]),
    "sanity_check_first.py": ([], ["--batch-size", "--max-steps", "--sanity"]),
    "forges_steps.py": ([], ["--batch-size", "--forge", "--max-steps"]),
    "killed_rank.py": ([], ["--batch-size", "--kill-with", "--at-step", "--max-steps"]),
    "validates_every_k.py": ([], ["--batch-size", "--max-steps", "--eval-every", "--eval-factor"]),
    "edits_its_module.py": ([], ["--batch-size", "--max-steps"]),
    "edited_module.py": ([], []),  # the module edits_its_module.py imports (and edits)
    "threads_first.py": ([], ["--batch-size", "--max-steps"]),
    "vendored_first.py": ([], ["--batch-size", "--max-steps"]),
    "batch_at_import.py": ([], ["--max-steps"]),
    "batch_env_module.py": ([], []),  # the module batch_at_import.py imports: it reads the batch at import
    "reexec_self.py": ([], ["--batch-size", "--max-steps"]),
    "mentions_oom.py": ([], ["--batch-size", "--fail-at-step", "--silent", "--max-steps"]),
    "ranks_apart.py": ([], ["--batch-size", "--mode", "--rank", "--at-step", "--max-steps"]),
}


def test_every_script_in_the_folder_is_listed():
    assert sorted(p.name for p in COMMANDS.glob("*.py")) == sorted(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_works_and_names_the_flags(name):
    before, flags = SCRIPTS[name]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(COMMANDS / name), *before, "--help"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in flags:
        assert flag in proc.stdout, f"{name} --help does not name {flag}"
