"""The result cache: what its key depends on, and that 32 concurrent writers neither corrupt nor lose entries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from isoprobe import cache as cache_module
from isoprobe.cache import ResultCache, cache_directory, cache_key, key_material
from isoprobe.spec import Spec

REPO = Path(__file__).resolve().parents[2]
A100 = [{"nvml_index": 0, "uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB", "total_memory_bytes": 80 * 1024**3,
         "driver_version": "550.54.15"}]


def _spec(**changes) -> Spec:
    raw = {"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 64, 64]}, "target": {"classes": 10}}
    raw.update(changes)
    return Spec.model_validate(raw)


def _key(spec=None, environ=None, gpus=None, spec_path="/specs/s.yaml") -> str:
    return cache_key(key_material(spec or _spec(), spec_path, environ or {}, gpus))


def test_the_key_changes_with_what_changes_the_answer():
    base = _key()
    assert _key(_spec(memory_budget="2GiB")) != base
    assert _key(_spec(optimizer={"name": "sgd"})) != base
    assert _key(_spec(training={"precision": "bf16-mixed"})) != base
    assert _key(_spec(device="cuda"), gpus=A100) != _key(_spec(device="cuda"), gpus=[{**A100[0], "total_memory_bytes": 40 * 1024**3}])
    assert _key(_spec(device="cuda"), gpus=A100) != _key(_spec(device="cuda"), gpus=[{**A100[0], "driver_version": "560.1"}])
    assert _key(_spec(device="cuda"), {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, A100) != _key(
        _spec(device="cuda"), {}, A100)


def test_the_key_ignores_who_asked_and_which_card_of_a_kind():
    base = _key(_spec(device="cuda"), gpus=A100)
    job = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n3", "SLURM_JOB_GPUS": "3", "HOSTNAME": "n3"}
    assert _key(_spec(device="cuda"), job, gpus=[{**A100[0], "uuid": "GPU-z", "nvml_index": 3}]) == base
    assert _key(spec_path="/elsewhere/s.yaml") == _key()  # where the spec lies, when it names no files


def test_the_key_changes_with_the_installed_torch(monkeypatch):
    base = _key()
    real = cache_module._package_versions
    monkeypatch.setattr(cache_module, "_package_versions", lambda spec: {**real(spec), "torch": "9.9.9"})
    assert _key() != base


def test_editing_the_factory_file_is_a_new_key(tmp_path):
    factory = tmp_path / "models.py"
    factory.write_text("def make():\n    return None\n")
    spec = Spec.model_validate({"model": {"factory": f"{factory}:make"}, "input": {"shape": [4]},
                                "target": {"classes": 2}})
    before = _key(spec)
    factory.write_text("def make():\n    return 1\n")
    assert _key(spec) != before
    module_spec = Spec.model_validate({"model": {"factory": "models:make"}, "input": {"shape": [4]},
                                       "target": {"classes": 2}})
    before = _key(module_spec, spec_path=str(tmp_path / "s.yaml"))
    factory.write_text("def make():\n    return 2\n")
    assert _key(module_spec, spec_path=str(tmp_path / "s.yaml")) != before


def test_cache_directory_is_the_variable_or_the_users_cache(tmp_path):
    assert cache_directory({"ISOPROBE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_directory({}).name == "isoprobe"


def test_a_write_replaces_the_entry_whole_and_leaves_no_temporary(tmp_path):
    store = ResultCache(tmp_path / "c")
    store.write("k", "first")
    store.write("k", "second")
    assert store.read("k") == "second" and store.read("other") is None
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["k.json"]


_WRITER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from isoprobe.cache import ResultCache

    store, key, log = ResultCache(Path(sys.argv[1])), sys.argv[2], Path(sys.argv[3])
    # As isoprobe run does it: look, then take the key's lock, look again, probe only if still missing.
    answer = store.read(key)
    if answer is None:
        with store.lock(key):
            answer = store.read(key)
            if answer is None:
                with open(log, "a") as probes:
                    probes.write(key + "\\n")
                time.sleep(0.3)  # the probe
                store.write(key, json.dumps({{"key": key, "writer": os.getpid(), "pad": "x" * 200000}}))
    json.loads(store.read(key))  # every reader sees a whole entry
    print(json.loads(answer)["writer"] if answer else "probed")
""")


@pytest.mark.integration
def test_32_concurrent_runs_probe_each_key_once_and_lose_nothing(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(repo=str(REPO)))
    probes = tmp_path / "probes.log"
    keys = [f"key{i % 4}" for i in range(32)]  # a job array: 4 setups, 8 jobs each, all at once
    writers = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), key, str(probes)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for key in keys]
    outputs = [w.communicate(timeout=120) for w in writers]
    assert all(w.returncode == 0 for w in writers), [o[1] for o in outputs if o[1]]
    assert sorted(probes.read_text().split()) == sorted(set(keys))  # each setup probed exactly once
    entries = sorted(p.name for p in (tmp_path / "cache").glob("*.json"))
    assert entries == [f"{k}.json" for k in sorted(set(keys))]
    for key in set(keys):
        assert json.loads((tmp_path / "cache" / f"{key}.json").read_text())["key"] == key
    assert not list((tmp_path / "cache").glob("*.tmp"))


@pytest.mark.integration
def test_32_concurrent_writers_of_distinct_and_shared_keys_leave_only_whole_entries(tmp_path):
    script = tmp_path / "hammer.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from isoprobe.cache import ResultCache
        store = ResultCache(Path(sys.argv[1]))
        for round in range(20):
            for key in (f"own{{os.getpid()}}", "shared"):
                store.write(key, json.dumps({{"pid": os.getpid(), "round": round, "pad": "y" * 50000}}))
                text = store.read("shared")
                if text is not None:
                    json.loads(text)
    """))
    writers = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache")], stderr=subprocess.PIPE,
                                text=True) for _ in range(32)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert all(w.returncode == 0 for w in writers), [e for e in errors if e]
    entries = list((tmp_path / "cache").glob("*.json"))
    assert len(entries) == 33  # 32 own keys and the shared one: nothing lost
    for entry in entries:
        assert json.loads(entry.read_text())["round"] == 19 or entry.name == "shared.json"
        json.loads(entry.read_text())
    assert not list((tmp_path / "cache").glob("*.tmp"))
