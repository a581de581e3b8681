"""The cache flow of ``isoprobe.pipeline.answer``: cache -> lock -> probe -> store, with scripted trials.

The scenarios of tests/integration/test_cache_and_hooks.py that are about the
flow (a hit starts nothing, --refresh and --no-cache, an unreadable entry or an
unusable folder, a failure is never stored, a run that waited for the lock takes
the holder's answer), with an executor that records
every request instead of real children. What the integration file keeps: the
real CLI end to end, the env output evaluated by a shell, hook mode.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from isoprobe.cache.store import ResultCache
from isoprobe.executors.scripted import ScriptedExecutor, error, linear
from isoprobe.report.output import Reporter
from isoprobe.pipeline.answer import answer
from isoprobe.protocol.messages import InspectRequest
from isoprobe.report.result import exit_code_for
from isoprobe.spec.model import Spec
from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, SPEC_PATH, hog_spec


class Recording(ScriptedExecutor):
    """A scripted executor that also counts the environment checks (a hit must start no child at all)."""

    def __init__(self):
        super().__init__(linear(HOG_FIXED, HOG_PER_SAMPLE))
        self.inspections = 0

    def run(self, request, conditions, *, timeout, name):
        if isinstance(request, InspectRequest):
            self.inspections += 1
        return super().run(request, conditions, timeout=timeout, name=name)

    @property
    def used(self) -> bool:
        return bool(self.inspections or self.calls or self.prestarts)


class Untouchable:
    """An executor that must not be used: a cache hit answers without any child."""

    def prestart(self, conditions):
        raise AssertionError("a cache hit started a process")

    def run(self, request, conditions, *, timeout, name):
        raise AssertionError("a cache hit ran a child")

    def close(self):
        pass


def ask(spec: dict, cache, executor, *, use_cache=True, refresh=False, environ=None):
    lines: list[str] = []
    environ = {"ISOPROBE_CACHE_DIR": str(cache), **(environ or {})}
    result = answer(Spec.model_validate(spec), SPEC_PATH, Reporter(lines.append), use_cache=use_cache,
                    refresh=refresh, environ=environ, executor=executor)
    return result, "\n".join(lines)


TRIAL_LINE = "isoprobe: trial "


def test_a_second_run_answers_from_the_cache_without_any_trial(tmp_path):
    cache = tmp_path / "cache"
    spec = hog_spec(max_batch_size=4)

    uncached, _ = ask(spec, cache, (executor := Recording()), use_cache=False)
    assert executor.used and executor.closed
    assert uncached.cache is None and not cache.exists()  # --no-cache neither reads nor writes

    stored, lines = ask(spec, cache, (executor := Recording()))
    assert executor.used and executor.closed
    assert stored.cache.hit is False and TRIAL_LINE in lines and "answer cached in" in lines
    assert stored.max_batch_size == 4 and stored.answered
    assert json.loads((cache / f"{stored.cache.key}.json").read_text())["max_batch_size"] == 4

    hit, lines = ask(spec, cache, Untouchable())
    assert hit.cache.hit is True and hit.cache.key == stored.cache.key
    assert hit.cache.stored_at == stored.cache.stored_at
    assert TRIAL_LINE not in lines and "answer from the cache" in lines
    assert hit.trials == stored.trials and hit.max_batch_size == 4
    assert hit.recommended_batch_size == stored.recommended_batch_size

    refreshed, lines = ask(spec, cache, (executor := Recording()), refresh=True)
    assert executor.calls and executor.closed
    assert refreshed.cache.hit is False and TRIAL_LINE in lines


def test_a_hit_plans_the_accumulation_for_the_job_that_asks(tmp_path):
    cache = tmp_path / "cache"
    spec = hog_spec(max_batch_size=4)
    spec["plan"] = {"target_global_batch": 64}
    first, _ = ask(spec, cache, Recording(), environ={"WORLD_SIZE": "2"})
    assert first.accumulation.world_size == 2 and first.accumulation.world_size_source == "WORLD_SIZE"
    hit, _ = ask(spec, cache, Untouchable(), environ={"WORLD_SIZE": "8"})
    assert hit.cache.hit is True
    assert hit.accumulation.world_size == 8
    assert hit.accumulation.global_batch_size == \
        hit.accumulation.micro_batch_size * hit.accumulation.accumulation_steps * 8


def test_a_cache_entry_that_is_not_a_result_is_probed_again(tmp_path):
    cache = tmp_path / "cache"
    spec = hog_spec(max_batch_size=2)
    first, _ = ask(spec, cache, Recording())
    entry = cache / f"{first.cache.key}.json"
    entry.write_text('{"truncated": ')
    again, lines = ask(spec, cache, (executor := Recording()))
    assert executor.calls
    assert "unreadable" in lines and TRIAL_LINE in lines
    assert again.cache.hit is False
    assert json.loads(entry.read_text())["max_batch_size"] == 2  # and the entry is whole again


def test_an_unusable_cache_folder_costs_the_cache_not_the_answer(tmp_path):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    result, lines = ask(hog_spec(max_batch_size=2), not_a_folder, Recording())
    assert "cannot be used" in lines
    assert result.max_batch_size == 2 and result.cache is None
    assert not_a_folder.read_text() == "a file where the cache folder should be"


def test_a_failure_is_never_cached(tmp_path):
    cache = tmp_path / "cache"
    spec = hog_spec()
    result, lines = ask(spec, cache, ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, faults=lambda call: error())))
    assert result.stop_reason.value == "error" and result.cache is None and "answer cached" not in lines
    assert not list(cache.glob("*.json"))
    again, _ = ask(spec, cache, (executor := Recording()))
    assert executor.calls  # probed again: nothing was stored


def test_runs_that_wait_for_the_lock_take_the_holders_answer_even_when_nothing_fits(tmp_path):
    """The lock's holder stores "nothing fits"; a run that waited for it answers from the cache (exit 3)."""
    cache, spec = tmp_path / "cache", hog_spec(start_batch_size=96)
    elsewhere, _ = ask(spec, tmp_path / "elsewhere", Recording())  # the holder's probe, made beforehand
    store, key = ResultCache(cache), elsewhere.cache.key
    holder = store.lock(key)
    assert holder.try_acquire()
    lines: list[str] = []
    waiting = {}
    waiter = threading.Thread(target=lambda: waiting.update(result=answer(
        Spec.model_validate(spec), SPEC_PATH, Reporter(lines.append), environ={"ISOPROBE_CACHE_DIR": str(cache)},
        executor=Untouchable())))
    waiter.start()
    try:
        deadline = time.monotonic() + 10
        while not any("waiting for its answer" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any("waiting for its answer" in line for line in lines), lines
        store.write(key, Path(elsewhere.cache.path).read_text())
    finally:
        holder.release()
        waiter.join(10)
    assert not waiter.is_alive()
    result = waiting["result"]
    assert result.cache.hit is True and result.stop_reason.value == "start_does_not_fit"
    assert int(exit_code_for(result.stop_reason)) == 3
