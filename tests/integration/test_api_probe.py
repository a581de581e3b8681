"""``isoprobe.probe()`` from a script, with real children on the CPU backend: the caller never imports torch.

The script runs in a fresh interpreter (``sys.modules`` must start clean to prove
anything): it imports isoprobe and probes a dict spec whose factory is a path
relative to its working folder; ``isoprobe run`` then answers the same setup,
written as a spec file, from the API's cache entry: one path.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import MODELS, REPO, hog_spec, run_cli


SCRIPT = """
import json, sys
import isoprobe
from isoprobe import probe

spec = json.loads(sys.argv[1])
probed = probe(spec)                             # real children: the trials import torch, this process does not
print(json.dumps({
    "torch": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision")),
    "probed": [probed.answered, probed.max_batch_size, probed.spec.model.factory, len(probed.trials)],
    "cache": [probed.cache.hit, probed.cache.key],
}))
"""


def test_probe_from_a_script_never_imports_torch_and_shares_the_clis_cache(tmp_path, isolated_cache):
    """One probe, the script's, where there were two (the CLI's, then the script's with cache=False): the CLI then
    answers the same setup, written as a file, from the entry the API stored: one cache, one key for both."""
    # No long run of the maximum (steady_steps 0): the API's path and the shared cache are the point here.
    spec = hog_spec(start_batch_size=2, max_batch_size=4, steady_steps=0)
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    relative = {**spec, "model": {**spec["model"], "factory": "models.py:memory_hog"}}  # from the script's folder

    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(relative)], cwd=MODELS.parent,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO),
                               "ISOPROBE_CACHE_DIR": str(isolated_cache)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["torch"] == [], "probe() imported torch in the caller's process"
    answered, maximum, factory, trials = seen["probed"]
    assert answered and maximum == 4 and trials >= 1  # the estimate starts at the cap (4): one trial can prove it
    assert factory == f"{MODELS}:memory_hog"
    assert "isoprobe: trial " in done.stderr  # the probe's progress, on stderr as the CLI's
    assert seen["cache"][0] is False  # it probed (and stored its answer)

    from_api = run_cli("run", str(path), "--format", "json", cache_dir=isolated_cache)
    assert from_api.returncode == 0, from_api.stderr
    assert "isoprobe: trial " not in from_api.stderr
    assert [from_api.json["cache"]["hit"], from_api.json["max_batch_size"], from_api.json["cache"]["key"]] == [
        True, 4, seen["cache"][1]]
