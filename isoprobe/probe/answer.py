"""The result for a spec: from the cache when it holds a proven answer, else from a probe that is then stored.

cache -> lock -> (cache again) -> probe -> store. Concurrent runs of one setup
probe once: the first holds the key's lock and the others wait for its answer.
A cache that cannot be used costs the cache, never the answer. Nothing here
imports torch; a cache hit starts no child at all.
"""

from __future__ import annotations

import os

from isoprobe.executors import Executor
from isoprobe.output import Reporter
from isoprobe.spec import Spec


def answer(
    spec: Spec,
    spec_path: str,
    reporter: Reporter,
    *,
    use_cache: bool = True,
    refresh: bool = False,
    budget_source: str = "spec",
    environ: dict[str, str] | None = None,
    executor: Executor | None = None,
):
    """The ``Result`` for ``spec``: cached (``cache.hit``) or probed, with this run's environment and plan."""
    from isoprobe.cache import ResultCache, cache_directory, cache_key, key_material
    from isoprobe.hardware import nvml_gpus, run_environment, visible_devices

    environ = dict(os.environ if environ is None else environ)
    gpus = nvml_gpus(visible_devices(environ))
    context = _Context(spec, spec_path, reporter, budget_source, environ, run_environment(environ, gpus), executor)
    if not use_cache:
        return context.probe(cache=None)
    cache = ResultCache(cache_directory(environ))
    key = cache_key(key_material(spec, spec_path, environ, gpus))
    from filelock import Timeout

    try:
        if not refresh and (hit := context.cached(cache, key)):
            return hit
        lock = cache.lock(key)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            reporter.note(f"another isoprobe is probing this setup (lock {lock.lock_file}); waiting for its answer")
            lock.acquire()
    except OSError as exc:  # an unusable cache folder (read-only, not a folder) costs the cache, not the answer
        reporter.note(f"the cache folder {cache.directory} cannot be used ({exc.strerror or exc}); probing without it")
        return context.probe(cache=None)
    try:
        if not refresh and (hit := context.cached(cache, key)):
            return hit
        return context.probe(cache=(cache, key))
    finally:
        lock.release()


class _Context:
    """One invocation's facts, shared by its cache read and its probe."""

    def __init__(self, spec, spec_path, reporter, budget_source, environ, environment, executor):
        self.spec, self.spec_path, self.reporter = spec, spec_path, reporter
        self.budget_source, self.environ, self.environment = budget_source, environ, environment
        self.executor = executor

    def probe(self, cache):
        from isoprobe.cache import now_utc
        from isoprobe.output import result_json
        from isoprobe.probe.pipeline import run_probe
        from isoprobe.result import CacheInfo, RunEnvironment

        result = run_probe(self.spec, self.spec_path, self.reporter, budget_source=self.budget_source,
                           environ=self.environ, executor=self.executor)
        result = result.model_copy(update={"environment": RunEnvironment.model_validate(self.environment)})
        if cache is None or not result.answered:  # only proven answers are kept; a failure is probed again
            return result
        store, key = cache
        info = CacheInfo(hit=False, key=key, path=str(store.entry(key)), stored_at=now_utc())
        result = result.model_copy(update={"cache": info})
        try:
            store.write(key, result_json(result))
            self.reporter.note(f"answer cached in {info.path}")
        except OSError as exc:  # a read-only or full cache folder costs the next run a probe, not this one its answer
            self.reporter.note(f"could not write the cache entry {info.path}: {exc.strerror or exc}")
            result = result.model_copy(update={"cache": None})
        return result

    def cached(self, cache, key):
        """The stored answer, re-planned and re-labelled for this invocation, or None (missing or unreadable)."""
        from pydantic import ValidationError

        from isoprobe.plan import accumulation_plan
        from isoprobe.result import CacheInfo, Result, RunEnvironment

        text = cache.read(key)
        if text is None:
            return None
        try:
            stored = Result.model_validate_json(text)
        except (ValidationError, ValueError) as exc:
            self.reporter.note(f"cache entry {cache.entry(key)} is unreadable ({type(exc).__name__}); probing again")
            return None
        stored_at = stored.cache.stored_at if stored.cache else None
        self.reporter.note(f"answer from the cache ({cache.entry(key)}, stored {stored_at or '?'}); "
                           "no trial ran (--refresh probes again)")
        return stored.model_copy(update={
            "spec_path": self.spec_path,
            "environment": RunEnvironment.model_validate(self.environment),
            "accumulation": accumulation_plan(self.spec, stored.recommended_batch_size or stored.max_batch_size,
                                              self.environ),
            "cache": CacheInfo(hit=True, key=key, path=str(cache.entry(key)), stored_at=stored_at),
        })
