"""Shared helpers: writing specs to a temporary folder and running the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODELS = TESTS / "models.py"


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(*args: str, timeout: float = 600, cwd: Path | None = None) -> CliRun:
    """``python -m isoprobe ARGS`` in a fresh process, as a user (or a Slurm hook) runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "isoprobe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
    )
    return CliRun(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec (a dict) as YAML and return its path."""

    def write(spec: dict, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write


def hog_spec(**search) -> dict:
    """A CPU spec around tests/models.py:memory_hog (~32 MiB of activations per sample)."""
    return {
        "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 524288, "depth": 8}},
        "input": {"shape": [524288]},
        "target": {"classes": 10},
        "optimizer": {"name": "sgd"},
        "search": {"steps": 2, "trial_timeout": 120, **search},
        "device": "cpu",
        "memory_budget": "1.5GiB",
    }
