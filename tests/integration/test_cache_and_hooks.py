"""The result cache and hook mode, end to end through the real CLI on the CPU backend.

A hit must answer without any child process: the stored trials come back, no trial
line is printed, and it takes a fraction of a probe's time. A hit is refused once a
source file the trials imported has changed (a helper module the factory imports),
or a file they read (a JSON the factory reads its sizes from).
In hook mode a probe that cannot answer gives the fallback and exit 0, and the log
holds the evidence.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

from conftest import hog_spec, run_cli


TRIAL_LINE = "isoprobe: trial "


def small_hog(cap: int) -> dict:
    """memory_hog up to ``cap``, its maximum not confirmed nor run long (steady_steps 0): what the cache stores
    and gives back is the point here, not how the answer was proven (test_probe_cpu.py, test_real_loop.py)."""
    return hog_spec(max_batch_size=cap, confirmations=0, steady_steps=0)


def _eval_env(lines: str, names: list[str]) -> list[str]:
    shell = shutil.which("dash") or shutil.which("sh")
    script = 'eval "$L"; ' + "; ".join(f'printf "%s\\n" "${n}"' for n in names)
    done = subprocess.run([shell, "-c", script], env={"L": lines}, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_second_run_answers_from_the_cache_without_any_trial_and_an_unreadable_entry_is_probed_again(
        write_spec, tmp_path):
    cache = tmp_path / "cache"
    spec = str(write_spec(small_hog(4)))

    uncached = run_cli("run", spec, "--format", "json", "--no-cache", cache_dir=cache)
    assert uncached.returncode == 0, uncached.stderr
    assert uncached.json["cache"] is None and not cache.exists()  # --no-cache neither reads nor writes

    first = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert first.returncode == 0, first.stderr
    stored = first.json
    assert stored["cache"]["hit"] is False and TRIAL_LINE in first.stderr
    assert json.loads((cache / f"{stored['cache']['key']}.json").read_text())["max_batch_size"] == 4

    started = time.monotonic()
    second = run_cli("run", spec, "--format", "json", cache_dir=cache)
    took = time.monotonic() - started
    assert second.returncode == 0, second.stderr
    hit = second.json
    assert hit["cache"]["hit"] is True and hit["cache"]["key"] == stored["cache"]["key"]
    assert TRIAL_LINE not in second.stderr and "answer from the cache" in second.stderr
    assert hit["trials"] == stored["trials"] and hit["max_batch_size"] == 4
    assert took < 10, second.stderr  # a probe here takes tens of seconds; the hit, under a second (benchmarked)

    env = run_cli("run", spec, "--format", "env", cache_dir=cache)
    assert env.returncode == 0, env.stderr
    assert _eval_env(env.stdout, ["ISOPROBE_MAX_BATCH_SIZE", "ISOPROBE_BATCH_SIZE", "ISOPROBE_CACHE_HIT"]) == [
        "4", str(stored["recommended_batch_size"]), "1"]

    refreshed = run_cli("run", spec, "--format", "json", "--refresh", cache_dir=cache)
    assert refreshed.returncode == 0, refreshed.stderr
    assert refreshed.json["cache"]["hit"] is False and TRIAL_LINE in refreshed.stderr

    # A cache entry that is not a result is probed again (once a test of its own, with a first probe of its
    # own to make the entry: this one's serves).
    entry = cache / f"{stored['cache']['key']}.json"
    entry.write_text('{"truncated": ')
    again = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert again.returncode == 0, again.stderr
    assert "unreadable" in again.stderr and TRIAL_LINE in again.stderr
    assert json.loads(entry.read_text())["max_batch_size"] == 4  # and the entry is whole again


def test_an_unusable_cache_folder_costs_the_cache_not_the_answer(write_spec, tmp_path):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    run = run_cli("run", str(write_spec(small_hog(2))), "--format", "json", cache_dir=not_a_folder)
    assert run.returncode == 0, run.stderr
    assert "cannot be used" in run.stderr and "Traceback" not in run.stderr
    assert run.json["max_batch_size"] == 2 and run.json["cache"] is None


def test_hook_mode_gives_the_fallback_when_nothing_fits_probed_or_cached(write_spec, tmp_path):
    cache, log = tmp_path / "cache", tmp_path / "hook.log"
    spec = str(write_spec(hog_spec(start_batch_size=96)))  # ~3 GiB of activations under a 1.5 GiB cap
    run = run_cli("run", spec, "--format", "env", "--fallback-batch-size", "6", "--log", str(log), cache_dir=cache)
    assert run.returncode == 0, run.stderr
    assert _eval_env(run.stdout, ["ISOPROBE_BATCH_SIZE", "ISOPROBE_FALLBACK", "ISOPROBE_STOP_REASON"]) == [
        "6", "1", "start_does_not_fit"]
    assert "using the fallback batch size 6" in run.stderr
    logged = log.read_text()
    assert TRIAL_LINE in logged and '"stop_reason": "start_does_not_fit"' in logged
    assert len(list(cache.glob("*.json"))) == 1  # "nothing fits" is proven, so it is kept like an answer

    prolog = run_cli("run", spec, "--format", "taskprolog", "--fallback-batch-size", "6", cache_dir=cache)
    assert prolog.returncode == 0
    assert TRIAL_LINE not in prolog.stderr  # from the cache
    assert prolog.stdout.splitlines()[0].startswith("print isoprobe: no probed answer")
    assert "export ISOPROBE_BATCH_SIZE=6" in prolog.stdout.splitlines()


_EDGED_FACTORY = textwrap.dedent("""
    import helper
    from torch import nn

    # What the CPU allocator says when the cap is hit (tests/support/faults.py): a real out-of-memory verdict.
    OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")


    class Edged(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 4)

        def forward(self, x):
            if x.shape[0] > helper.EDGE:
                raise RuntimeError(OOM)
            return self.linear(x)


    def build():
        return Edged()
""")


def _edged_spec(factory: str) -> dict:
    """A spec over ``factory`` (a model whose edge its file decides: 6 fits, 7 does not), searched 3 to 7."""
    return {
        "model": {"factory": factory}, "input": {"shape": [16]}, "target": {"classes": 4},
        "optimizer": {"name": "sgd"}, "device": "cpu", "memory_budget": "2GiB",
        "search": {"start_batch_size": 3, "max_batch_size": 7, "steps": 2, "strategy": "doubling",
                   "confirmations": 0, "steady_steps": 0},
        "recommendation": {"headroom": 0.0, "soak_steps": 0},
    }


def test_editing_a_helper_module_the_factory_imports_makes_the_cached_answer_stale(write_spec, tmp_path):
    """The key covers the factory file only; the helper it imports is in the entry's sources, re-hashed on a hit."""
    cache, helper = tmp_path / "cache", tmp_path / "helper.py"
    (tmp_path / "edged.py").write_text(_EDGED_FACTORY)
    helper.write_text("EDGE = 6\n")
    spec = str(write_spec(_edged_spec("edged.py:build")))
    first = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert first.returncode == 0, first.stderr
    assert first.json["max_batch_size"] == 6 and first.json["first_failing_batch_size"] == 7
    assert first.json["sources"][str(helper.resolve())] == hashlib.sha256(b"EDGE = 6\n").hexdigest()

    helper.write_text("EDGE = 3  # edited\n")
    second = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert second.returncode == 0, second.stderr
    entry = first.json["cache"]["path"]
    assert f"cache entry {entry} is stale: {helper.resolve()} changed since it was probed; probing again" \
        in second.stderr
    assert second.json["cache"]["hit"] is False and TRIAL_LINE in second.stderr
    assert second.json["max_batch_size"] == 3 and second.json["first_failing_batch_size"] == 4
    assert json.loads(Path(entry).read_text())["max_batch_size"] == 3  # the entry was replaced

    third = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert third.returncode == 0 and third.json["cache"]["hit"] is True and third.json["max_batch_size"] == 3


def test_editing_a_config_file_the_factory_reads_makes_the_cached_answer_stale(write_spec, tmp_path):
    """The factory reads its edge from a JSON file: no module changes, the children saw it read (cache_reads)."""
    cache, config = tmp_path / "cache", tmp_path / "edge.json"
    (tmp_path / "configured.py").write_text(_EDGED_FACTORY.replace(
        "import helper\n", "import json\nfrom pathlib import Path\n").replace(
        "helper.EDGE", "self.edge").replace(
        "self.linear = nn.Linear(16, 4)",
        "self.linear = nn.Linear(16, 4)\n        self.edge = json.loads((Path(__file__).parent / 'edge.json')"
        ".read_text())['edge']"))
    config.write_text('{"edge": 6}')
    spec = str(write_spec(_edged_spec("configured.py:build")))
    first = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert first.returncode == 0, first.stderr
    assert first.json["max_batch_size"] == 6
    assert first.json["sources"][str(config.resolve())] == hashlib.sha256(b'{"edge": 6}').hexdigest()
    assert run_cli("run", spec, "--format", "json", cache_dir=cache).json["cache"]["hit"] is True

    config.write_text('{"edge": 3}')
    second = run_cli("run", spec, "--format", "json", cache_dir=cache)
    assert second.returncode == 0, second.stderr
    assert f"is stale: {config.resolve()} changed since it was probed; probing again" in second.stderr
    assert second.json["cache"]["hit"] is False and second.json["max_batch_size"] == 3


def test_hook_mode_survives_a_bad_spec_and_says_why_in_the_log(tmp_path):
    bad, log = tmp_path / "bad.yaml", tmp_path / "hook.log"
    bad.write_text("model: {torchvision: resnet50}\ninput: {shape: [3, 224, 224]}\nbogus_key: 1\n")
    run = run_cli("run", str(bad), "--format", "env", "--fallback-batch-size", "8", "--log", str(log))
    assert run.returncode == 0, run.stderr
    assert _eval_env(run.stdout, ["ISOPROBE_BATCH_SIZE", "ISOPROBE_STOP_REASON"]) == ["8", "bad_spec"]
    assert "bogus_key" in log.read_text()
    without = run_cli("run", str(bad), "--format", "env")
    assert without.returncode == 2  # without a fallback, the job sees the failure: the stop, no batch size
    assert _eval_env(without.stdout, ["ISOPROBE_ANSWERED", "ISOPROBE_STOP_REASON", "ISOPROBE_BATCH_SIZE"]) == [
        "0", "bad_spec", ""]


def test_a_fallback_needs_a_shell_format():
    run = run_cli("run", "specs/resnet50.yaml", "--fallback-batch-size", "8", "--format", "json")
    assert run.returncode == 2 and "--format env" in run.stderr
