"""A cache entry answers only if it can be true (isoprobe.cache.trust), and only if it is a regular file.

Through the real cache flow (``pipeline.answer``) over scripted trials: a probe
stores an entry, the test edits or replaces the entry's file, and the next run
must say why it does not trust it, probe again, and replace it. The other way
round, every result a probe can store must pass the same checks (else caching
would silently stop): many scripted probes, flaky and faulty ones included.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from test_cache_files import data_capped, finishes, unblock
from test_orchestration_cache import TRIAL_LINE, Recording, Untouchable, ask

from isoprobe.cache.trust import CACHEABLE, distrust
from isoprobe.executors.scripted import (
    CPU_OOM_MESSAGE,
    Call,
    ScriptedExecutor,
    crashed,
    fits,
    inspected,
    linear,
    out_of_memory,
    timed_out,
)
from isoprobe.protocol.messages import CudaDevice, Facts
from isoprobe.report.result import CacheInfo, exit_code_for
from isoprobe.spec.model import Spec
from scripted_probe import HOG_MAX, GiB, KiB, every_purpose, every_purpose_spec, faulty_spec, hog_spec, probe

NOTHING_FITS = hog_spec(start_batch_size=96)  # ~3 GiB of activations under a 1.5 GiB cap


def stored(tmp_path, spec: dict | None = None):
    """(cache folder, the entry's path, its JSON) after one scripted probe of ``spec`` (hog_spec: edge 25/26)."""
    cache = tmp_path / "cache"
    result, _ = ask(spec or hog_spec(), cache, Recording())
    entry = cache / f"{result.cache.key}.json"
    return cache, entry, json.loads(entry.read_text())


def _never_run(document: dict) -> int:
    ran = {t["batch_size"] for t in document["trials"]}
    return next(b for b in range(3, HOG_MAX) if b not in ran)


def _flip(batch: int, outcome: str):
    def edit(d):
        for trial in d["trials"]:
            if trial["batch_size"] == batch:
                trial["outcome"] = outcome
    return edit


# (name, the edit, what the refusal says): each a way an entry cannot be true.
EDITS = [
    ("edited maximum", lambda d: d.update(max_batch_size=999), "no trial in it ran its maximum 999"),
    ("maximum that ran out of memory", lambda d: d.update(max_batch_size=26, first_failing_batch_size=27),
     "its maximum 26 did not fit in every trial of it that ran 26"),
    ("maximum that failed one of its runs", _flip(25, "out_of_memory"), "its maximum 25 did not fit in every trial"),
    ("answered with an error", lambda d: d.update(answered=True, stop_reason="error"),
     "its stop reason error is not an answer"),
    ("unanswered edge", lambda d: d.update(answered=False), "it says answered: false with the stop reason edge_found"),
    ("recommended above the maximum", lambda d: d.update(recommended_batch_size=30),
     "its recommended batch 30 is above its maximum 25"),
    ("recommended never run", lambda d: d.update(recommended_batch_size=_never_run(d)) or d["recommendation"].update(
        soak_steps=6),  # with soak_steps 0 no trial runs for the recommendation: never run is all it can say
     "no trial in it ran its recommended batch"),
    ("first failing never run", lambda d: d.update(first_failing_batch_size=27),
     "no trial in it failed at its first failing batch 27"),
    ("first failing outcome not seen", lambda d: d.update(first_failing_outcome="timed_out"),
     "no trial in it ended timed_out at its first failing batch 26"),
    ("first failing at the maximum", lambda d: d.update(first_failing_batch_size=25),
     "its first failing batch is 25"),
    ("wrong key inside", lambda d: d["cache"].update(key="0" * 64), f"the key inside it ({'0' * 64})"),
    ("no cache section", lambda d: d.update(cache=None), "the key inside it (None)"),
    ("other isoprobe version", lambda d: d.update(isoprobe_version="0.0.1"), "written by isoprobe 0.0.1"),
    ("other spec", lambda d: d["spec"]["search"].update(steps=5), "its spec is not the one asked for"),
    ("no sources", lambda d: d.update(sources=None), "it does not record the source files"),
    ("relative source", lambda d: d.update(sources={"helper.py": "0" * 64}), "'helper.py' is not an absolute path"),
    ("renumbered trials", lambda d: d["trials"][0].update(index=7), "not numbered 1, 2, 3"),
]


@pytest.mark.parametrize("edit, says", [pytest.param(e, s, id=n) for n, e, s in EDITS])
def test_an_entry_that_cannot_be_true_is_not_trusted_and_is_replaced(tmp_path, edit, says):
    cache, entry, document = stored(tmp_path)
    edit(document)
    entry.write_text(json.dumps(document))
    again, lines = ask(hog_spec(), cache, (executor := Recording()))
    assert executor.calls, "an untrusted entry was used as the answer"
    assert f"cache entry {entry} is not trusted: " in lines and says in lines and "; probing again" in lines
    assert lines.count("is not trusted") == 1  # read twice (before and under the lock), said once
    assert again.cache.hit is False and again.max_batch_size == HOG_MAX
    assert json.loads(entry.read_text())["max_batch_size"] == HOG_MAX  # replaced by the new answer
    hit, _ = ask(hog_spec(), cache, Untouchable())
    assert hit.cache.hit is True


NOTHING_FITS_EDITS = [
    ("nothing fits but answered", lambda d: d.update(answered=True), "answered: true with the stop reason"),
    ("nothing fits but a batch fit", _flip(96, "fits"), "it says nothing fits, but batch 96 fit in it"),
    ("nothing fits with a maximum", lambda d: d.update(max_batch_size=96), "names a batch that fits"),
    ("nothing fits from a crash", lambda d: d.update(first_failing_outcome="crashed"),
     "does not say that the start batch 96 ran out of memory"),
    ("nothing fits at a batch never run", lambda d: d.update(first_failing_batch_size=97),
     "does not say that the start batch 96 ran out of memory"),
]


@pytest.mark.parametrize("edit, says", [pytest.param(e, s, id=n) for n, e, s in NOTHING_FITS_EDITS])
def test_a_nothing_fits_entry_that_cannot_be_true_is_not_trusted(tmp_path, edit, says):
    cache, entry, document = stored(tmp_path, NOTHING_FITS)
    edit(document)
    entry.write_text(json.dumps(document))
    again, lines = ask(NOTHING_FITS, cache, (executor := Recording()))
    assert executor.calls and says in lines and "is not trusted" in lines
    assert again.stop_reason.value == "start_does_not_fit" and again.cache.hit is False


def _replace_with_fifo(entry):
    entry.unlink()
    os.mkfifo(entry)


def _replace_with_link_to_dev_zero(entry):
    entry.unlink()
    entry.symlink_to("/dev/zero")


def _replace_with_folder(entry):
    entry.unlink()
    entry.mkdir()


def _grow(entry):
    with open(entry, "ab") as grown:
        grown.truncate(17 * 1024**2)  # sparse, past the 16 MiB bound


@pytest.mark.parametrize("replace, says", [
    (_replace_with_fifo, "it is a FIFO, not a regular file"),
    (_replace_with_link_to_dev_zero, "it is a symbolic link"),
    (_replace_with_folder, "it is a folder, not a regular file"),
    (_grow, "it is larger than 16777216 bytes"),
], ids=["fifo", "link to /dev/zero", "folder", "oversized"])
def test_an_entry_that_is_not_a_regular_file_of_bounded_size_is_never_read(tmp_path, replace, says):
    cache, entry, _ = stored(tmp_path)
    replace(entry)
    executor = Recording()
    try:
        with data_capped():  # the old code read /dev/zero until memory ran out: here, MemoryError at once
            again, lines = finishes(lambda: ask(hog_spec(), cache, executor))
    finally:
        unblock(entry)
    assert f"cache entry {entry} is not trusted: {says}; probing again" in lines
    assert executor.calls and again.max_batch_size == HOG_MAX
    if replace is _replace_with_folder:  # a folder cannot be renamed over: the answer stands, unstored
        assert "could not write the cache entry" in lines and again.cache is None
    else:
        assert entry.is_file() and not entry.is_symlink() and json.loads(entry.read_text())["max_batch_size"] == 25


def test_a_lock_that_links_to_a_victims_file_is_replaced_and_the_file_left_whole(tmp_path):
    cache = tmp_path / "cache"
    probed, _ = ask(hog_spec(), tmp_path / "elsewhere", Recording())  # only to learn the key
    cache.mkdir()
    victim = tmp_path / "thesis.tex"
    victim.write_text("four years of work")
    lock = cache / f"{probed.cache.key}.lock"
    lock.symlink_to(victim)
    result, lines = ask(hog_spec(), cache, Recording())
    assert victim.read_text() == "four years of work"  # the old lock opened it with O_TRUNC
    assert f"removed {lock}: it was a symbolic link, not a regular lock file" in lines
    assert lock.is_file() and not lock.is_symlink() and result.max_batch_size == HOG_MAX


def test_a_lock_that_is_a_folder_costs_the_cache_not_the_answer(tmp_path):
    cache = tmp_path / "cache"
    probed, _ = ask(hog_spec(), tmp_path / "elsewhere", Recording())
    (cache / f"{probed.cache.key}.lock").mkdir(parents=True)
    result, lines = ask(hog_spec(), cache, Recording())
    assert "cannot be used (the lock file" in lines and "is a folder); probing without it" in lines
    assert result.max_batch_size == HOG_MAX and result.cache is None


def test_nothing_fits_is_cached_and_answered_from_the_cache_with_exit_3(tmp_path):
    cache = tmp_path / "cache"
    first, lines = ask(NOTHING_FITS, cache, Recording())
    assert first.stop_reason.value == "start_does_not_fit" and "answer cached in" in lines
    hit, lines = ask(NOTHING_FITS, cache, Untouchable())
    assert hit.cache.hit is True and TRIAL_LINE not in lines
    assert hit.stop_reason.value == "start_does_not_fit" and int(exit_code_for(hit.stop_reason)) == 3
    assert hit.trials == first.trials and hit.suggestions == first.suggestions


# --------------------------------------------------------------------------- no false refusals


def _check_every_cacheable(results) -> int:
    """Every result a probe could store passes the checks it will be read back with; returns how many were checked."""
    checked = 0
    for spec, result in results:
        if result.stop_reason not in CACHEABLE:
            continue
        entry = result.model_copy(update={"sources": {}, "cache": CacheInfo(hit=False, key="k", path="k.json")})
        assert distrust(entry, key="k", spec=spec) is None, [(t.batch_size, t.purpose, t.outcome) for t in
                                                             result.trials]
        checked += 1
    return checked


def _flaky(seed: int, at: int = 9, edge: int = 12):
    rng = random.Random(seed)

    def faults(call: Call):
        if call.batch_size > edge or (call.batch_size >= at and rng.random() < 0.5):
            return out_of_memory(CPU_OOM_MESSAGE)
        if call.batch_size == 10 and rng.random() < 0.2:
            return crashed() if rng.random() < 0.5 else timed_out()
        return None

    return faults


def test_every_answer_a_probe_stores_passes_the_checks_it_is_read_back_with():
    results = []
    for seed in range(60):
        for strategy in ("guided", "doubling"):
            spec = Spec.model_validate(faulty_spec("flaky_oom", at=9, edge=12, start=2 + seed % 7, cap=None,
                                                   strategy=strategy, confirmations=seed % 3))
            probed = probe(spec, ScriptedExecutor(linear(GiB, KiB, faults=_flaky(seed))))
            results.append((spec, probed.result))
    for spec in (every_purpose_spec(), hog_spec(max_batch_size=4), hog_spec(dataset_size=7), NOTHING_FITS,
                 {**hog_spec(), "recommendation": {"objective": "throughput"}}):
        spec = Spec.model_validate(spec)
        executor = ScriptedExecutor(every_purpose() if spec.search.start_batch_size == 16 else
                                    linear(720 * 1024**2, 32 * 1024**2))
        results.append((spec, probe(spec, executor).result))
    stops = {result.stop_reason.value for _, result in results}
    assert {"edge_found", "capped", "start_does_not_fit"} <= stops
    assert _check_every_cacheable(results) >= 100


def test_an_allocator_comparison_on_cuda_passes_the_checks():
    """The answer is about the first setting; later settings' trials of the same batches do not count against it."""
    edges = {"": 8, "expandable_segments:True": 10}

    def device(call: Call):
        if call.batch_size <= edges[call.conditions.allocator or ""]:
            return fits(GiB + call.batch_size * 100 * 1024**2)
        return out_of_memory("CUDA out of memory. Tried to allocate 100.00 MiB", "torch.OutOfMemoryError")

    facts = Facts(torch_version="2.0.0+scripted", cuda_available=True,
                  cuda_devices=[CudaDevice(name="fake", total_memory_bytes=16 * GiB, free_memory_bytes=16 * GiB)])
    spec = Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, "device": "cuda",
                                "allocators": ["default", "expandable_segments:True"]})
    result = probe(spec, ScriptedExecutor(device, inspected=inspected(facts))).result
    assert result.device.backend == "cuda" and result.max_batch_size == 8
    assert {t.allocator for t in result.trials} == {"default", "expandable_segments:True"}
    assert _check_every_cacheable([(spec, result)]) == 1

