"""``isoprobe.probe()`` from a script, with real children on the CPU backend: the caller never imports torch.

The script runs in a fresh interpreter (``sys.modules`` must start clean to prove
anything): it imports isoprobe, probes a dict spec whose factory is a path
relative to its working folder, then asks for a spec file that ``isoprobe run``
probed just before, and the API answers from the CLI's cache entry: one path.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import MODELS, REPO, hog_spec, run_cli

pytestmark = pytest.mark.integration

SCRIPT = """
import json, sys
import isoprobe
from isoprobe import probe

spec = json.loads(sys.argv[1])
probed = probe(spec, cache=False)                # real children: the trials import torch, this process does not
from_cli = probe(sys.argv[2], quiet=True)        # the spec file the CLI probed: its cache entry
print(json.dumps({
    "torch": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision")),
    "probed": [probed.answered, probed.max_batch_size, probed.spec.model.factory, len(probed.trials)],
    "from_cli": [from_cli.cache.hit, from_cli.max_batch_size, from_cli.cache.key],
}))
"""


def test_probe_from_a_script_never_imports_torch_and_shares_the_clis_cache(tmp_path, isolated_cache):
    spec = hog_spec(start_batch_size=2, max_batch_size=4)
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    cli_run = run_cli("run", str(path), "--format", "json", cache_dir=isolated_cache)
    assert cli_run.returncode == 0, cli_run.stderr
    relative = {**spec, "model": {**spec["model"], "factory": "models.py:memory_hog"}}  # from the script's folder

    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(relative), str(path)], cwd=MODELS.parent,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["torch"] == [], "probe() imported torch in the caller's process"
    answered, maximum, factory, trials = seen["probed"]
    assert answered and maximum == 4 and trials >= 2
    assert factory == f"{MODELS}:memory_hog"
    assert "isoprobe: trial " in done.stderr  # the first probe's progress, on stderr as the CLI's
    assert seen["from_cli"] == [True, 4, cli_run.json["cache"]["key"]]
