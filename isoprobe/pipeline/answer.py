"""The result for a spec: from the cache when it holds a trusted answer, else from a probe that is then stored.

cache -> lock -> (cache again) -> probe -> store. Concurrent runs of one setup
probe once: the first holds the key's lock and the others wait for its answer,
which may be "nothing fits" (exit 3) as much as a maximum. An entry answers
only if it is a regular file that says something coherent (``cache.trust``)
about the same code (``cache.sources``); anything else is noted and probed
again, and the new answer replaces it. A cache that cannot be used costs the
cache, never the answer. Nothing here imports torch; a cache hit starts no
child at all.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from isoprobe.errors import ProbeError
from isoprobe.executors import Executor
from isoprobe.report.output import Reporter
from isoprobe.spec.model import Spec

if TYPE_CHECKING:
    from isoprobe.search.history import Borrowed


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
    borrowed: Borrowed | None = None,
):
    """The ``Result`` for ``spec``: cached (``cache.hit``) or probed, with this run's environment and plan.

    ``borrowed`` (a ``search.history.Borrowed``, from a frontier): bounds that only narrow where a probe looks;
    the answer is the same exact edge, so it is cached under the same key as ``isoprobe run``'s.
    """
    from isoprobe.cache.store import ResultCache, cache_directory, cache_key, key_material, uncacheable_gpu_probe
    from isoprobe.system.hardware import nvml_gpus, run_environment, visible_devices

    environ = dict(os.environ if environ is None else environ)
    gpus = nvml_gpus(visible_devices(environ))
    spec, world = _resolve_ranks(spec, spec_path, environ, gpus, reporter)
    context = _Context(spec, spec_path, reporter, budget_source, environ, run_environment(environ, gpus), executor)
    context.world_size_source = world.source
    context.borrowed = borrowed
    if not use_cache:
        return context.probe(cache=None)
    if reason := uncacheable_gpu_probe(spec, gpus, environ):
        reporter.note(reason)
        return context.probe(cache=None)
    cache = ResultCache(cache_directory(environ))
    material = key_material(spec, spec_path, environ, gpus)
    key = cache_key(material)
    context.expected_threads = material["device"].get("threads", {}).get("intra_op")
    try:
        if not refresh and (hit := context.cached(cache, key)):
            return hit
        lock = cache.lock(key)
        busy = not lock.try_acquire()
        for note in lock.notes:  # a trap under the lock's name, removed
            reporter.note(note)
        if busy:
            reporter.note(f"another isoprobe is probing this setup (lock {lock.path}); waiting for its answer")
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


def _resolve_ranks(spec: Spec, spec_path: str, environ: dict[str, str], gpus, reporter: Reporter):
    """The spec with its gang's launcher, size and threads per rank written in (``ranks``), before the key is made.

    What the parent can refuse without torch is refused here, before the environment check (seconds to minutes):
    srun outside an allocation or without Slurm's clients on PATH, and a CPU gang whose budgets the RAM cannot hold.
    """
    import shutil

    from isoprobe.errors import Problem, SpecError
    from isoprobe.executors.ranks import (
        resolve_launcher,
        resolve_threads_per_rank,
        resolve_world_size,
        with_world_size,
    )
    from isoprobe.executors.srun_plan import SLURM_CLIENTS, LauncherError
    from isoprobe.pipeline.environment import DEFAULT_CPU_BUDGET, check_gang_fits_node
    from isoprobe.system.hardware import ram_bytes

    gpu_count = len(gpus or []) if spec.device != "cpu" else 0
    budget = spec.memory_budget or DEFAULT_CPU_BUDGET
    missing = tuple(c for c in SLURM_CLIENTS if shutil.which(c, path=environ.get("PATH")) is None)
    try:
        launcher = resolve_launcher(
            spec,
            environ,
            gpu_count,
            ram_bytes=ram_bytes(),
            cpu_budget=budget,
            missing_clients=missing if spec.distributed.gang else (),
        )
    except LauncherError as exc:
        raise SpecError(spec_path, [Problem("distributed.launcher", str(exc), exc.fix)]) from None
    srun = launcher if launcher is not None and launcher.launcher == "srun" else None
    world = resolve_world_size(
        spec, environ, gpu_count, ram_bytes=ram_bytes(), cpu_budget=budget, across_nodes=srun is not None
    )
    if world.note:
        reporter.note(world.note)
    if srun is not None:
        reporter.note(f"distributed: every trial one Slurm job step ({srun.reason})")
    resolved = with_world_size(
        spec,
        world,
        resolve_threads_per_rank(spec, environ, world.size),
        launcher.launcher if launcher is not None else None,
    )
    if resolved.device == "cpu":  # the backend is known without torch: the gang's budgets against this node's RAM
        check_gang_fits_node(resolved, spec_path, budget=budget)
    return resolved, world


class _Context:
    """One invocation's facts, shared by its cache read and its probe."""

    def __init__(
        self,
        spec: Spec,
        spec_path: str,
        reporter: Reporter,
        budget_source: str,
        environ: dict[str, str],
        environment: dict,
        executor: Executor | None,
    ) -> None:
        self.spec, self.spec_path, self.reporter = spec, spec_path, reporter
        self.budget_source, self.environ, self.environment = budget_source, environ, environment
        self.executor = executor
        self.refused: set[str] = set()
        self.world_size_source = "spec"
        # The key's intra-op threads (cache_threads), checked against the trials'.
        self.expected_threads: int | None = None
        self.borrowed: Borrowed | None = None  # a frontier's bounds from its other points (search.frontier_bounds)

    def probe(self, cache):
        from isoprobe.cache.sources import SourceRecorder, SourcesChanged, unseen_reads
        from isoprobe.cache.store import now_utc
        from isoprobe.cache.trust import CACHEABLE, distrust
        from isoprobe.pipeline.pipeline import local_executor, run_probe
        from isoprobe.report.device import RunEnvironment
        from isoprobe.report.output import result_json
        from isoprobe.report.result import CacheInfo

        recorder, result = self._probe_one_version(SourceRecorder, SourcesChanged, local_executor, run_probe)
        result = result.model_copy(
            update={"environment": RunEnvironment.model_validate(self.environment), "sources": recorder.sources}
        )
        if cache is None or result.stop_reason not in CACHEABLE:  # only proven answers are kept
            return result
        if result.device.backend == "cuda" and not self.environment.get("gpus"):  # its key would be a CPU key
            self.reporter.note("the answer is not cached: the GPU's facts for its key could not be read through NVML")
            return result
        store, key = cache
        if reason := recorder.unsettled():
            self.reporter.note(f"{reason}, so the answer is not cached")
            return result
        info = CacheInfo(hit=False, key=key, path=str(store.entry(key)), stored_at=now_utc())
        stored = result.model_copy(update={"cache": info})
        if reason := distrust(stored, key=key, spec=self.spec):  # never write what a read would refuse
            self.reporter.note(f"the answer is not cached: {reason}")
            return result
        try:
            store.write(key, result_json(stored))
            unseen = unseen_reads(recorder.sources)
            self.reporter.note(f"answer cached in {info.path}" + (f"; {unseen}" if unseen else ""))
        except OSError as exc:  # a read-only or full cache folder costs the next run a probe, not this one its answer
            self.reporter.note(f"could not write the cache entry {info.path}: {exc.strerror or exc}")
            return result
        return stored

    #: How many times a probe whose files changed while it ran starts again from the start (then it stops).
    SOURCE_RESTARTS = 1

    def _probe_one_version(self, recorder_type, changed_type, local_executor, run_probe):
        """Probe; where a file the trials ran or read changed while they ran (an edited script, a config rewritten),
        their verdicts are of two versions: start again from the start, with fresh processes, up to
        ``SOURCE_RESTARTS`` times, then stop (``ProbeError``). Never an answer mixed from two versions (issue 55)."""
        for attempt in range(self.SOURCE_RESTARTS + 1):
            recorder = recorder_type(
                self.executor if self.executor is not None else local_executor(self.spec), self.expected_threads
            )
            try:
                result = run_probe(
                    self.spec,
                    self.spec_path,
                    self.reporter,
                    budget_source=self.budget_source,
                    environ=self.environ,
                    executor=recorder,
                    world_size_source=self.world_size_source,
                    borrowed=self.borrowed,
                )
                changed = recorder.changed() if result.trials else None
            except changed_type as error:
                changed = error.message
            if changed is None:
                return recorder, result
            if attempt < self.SOURCE_RESTARTS and self.executor is None:
                self.reporter.note(
                    f"{changed}: its trials ran two versions, so no answer comes from them; probing "
                    "again from the start"
                )
                continue
            again = ", and again after the probe started over" if attempt else ""
            raise ProbeError(
                f"{changed}{again}: no answer is of one version. Run isoprobe when the script and its "
                "modules are no longer being edited"
            )
        raise AssertionError("unreachable")

    def cached(self, cache, key):
        """The stored answer, re-planned and re-labelled for this invocation, or None (missing, refused, stale)."""
        from pydantic import ValidationError

        from isoprobe.cache.sources import changed_source, unseen_reads
        from isoprobe.cache.trust import distrust
        from isoprobe.report.device import RunEnvironment
        from isoprobe.report.result import CacheInfo, Result
        from isoprobe.search.plan import accumulation_plan, micro_batch_ceiling
        from isoprobe.system.files import UntrustedFile

        entry = cache.entry(key)
        try:
            text = cache.read(key)
            if text is None:
                return None
            stored = Result.model_validate_json(text)
        except UntrustedFile as exc:
            return self._refuse(f"cache entry {entry} is not trusted: {exc}; probing again")
        except (ValidationError, ValueError) as exc:
            return self._refuse(f"cache entry {entry} is unreadable ({type(exc).__name__}); probing again")
        except NotADirectoryError:  # the folder is not one: taking the lock says so, and probes without the cache
            return None
        except OSError as exc:  # a permission, say: the probe's write replaces the entry if the folder allows
            return self._refuse(f"cache entry {entry} cannot be read ({exc.strerror or exc}); probing again")
        if stored.spec is None:  # a stop's document (bad_spec) is never stored: an entry without a spec is not one
            return self._refuse(f"cache entry {entry} is not trusted: it holds no spec; probing again")
        if reason := distrust(stored, key=key, spec=self.spec):
            return self._refuse(f"cache entry {entry} is not trusted: {reason}; probing again")
        if reason := changed_source(stored.sources):
            return self._refuse(f"cache entry {entry} is stale: {reason}; probing again")
        stored_at = stored.cache.stored_at
        unseen = unseen_reads(stored.sources)  # where its sources are known to end: said with the answer
        self.reporter.note(
            f"answer from the cache ({entry}, stored {stored_at or '?'}); no trial ran"
            + (f"; {unseen}" if unseen else " (--refresh probes again)")
        )
        return stored.model_copy(
            update={
                "spec_path": self.spec_path,
                "environment": RunEnvironment.model_validate(self.environment),
                "accumulation": accumulation_plan(
                    self.spec,
                    micro_batch_ceiling(
                        stored.recommended_batch_size,
                        stored.max_batch_size,
                        bool(stored.recommendation and stored.recommendation.soaks),
                    ),
                    self.environ,
                ),
                "cache": CacheInfo(hit=True, key=key, path=str(entry), stored_at=stored_at),
            }
        )

    def _refuse(self, note: str) -> None:
        """Say once why an entry is not used (the cache is read again under the lock)."""
        if note not in self.refused:
            self.refused.add(note)
            self.reporter.note(note)
        return None
