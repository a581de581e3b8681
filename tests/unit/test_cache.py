"""The result cache: what its key depends on, and whole-file writes (tests/integration/test_cache_concurrency.py
has the 32 concurrent writers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from isoprobe.cache import store as cache_module
from isoprobe.cache.store import ResultCache, cache_directory, cache_key, key_material
from isoprobe.spec.model import Spec

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


def test_editing_a_file_named_in_depends_on_is_a_new_key(tmp_path):
    """Files read by C code (a tokenizer's own reader) are invisible to the children's audit hook: the spec names them."""
    from isoprobe.errors import SpecError
    from isoprobe.spec.load import load_spec

    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"vocab": 100}')
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("model: {torchvision: resnet18, depends_on: [tokenizer.json]}\n"
                         "input: {shape: [3, 64, 64]}\ntarget: {classes: 10}\n")
    spec = load_spec(str(spec_file))
    assert spec.model.depends_on == [str(tokenizer.resolve())]
    before = _key(spec, spec_path=str(spec_file))
    assert before == _key(spec, spec_path=str(spec_file))
    tokenizer.write_text('{"vocab": 200}')
    assert _key(spec, spec_path=str(spec_file)) != before

    tokenizer.unlink()
    with pytest.raises(SpecError, match="model.depends_on"):
        load_spec(str(spec_file))
    tokenizer.mkdir()
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(str(spec_file))
