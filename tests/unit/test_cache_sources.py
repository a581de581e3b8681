"""A cached answer is only as current as the user's code it ran (isoprobe.cache.sources).

Which module files count (the user's, not the installed environment's), and the
cache flow over scripted children that report the files as real children do:
an edited, deleted or replaced helper module makes the entry stale, and it is
probed again and replaced. tests/integration/test_cache_and_hooks.py has the
same with real children and a real helper module.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import types
from dataclasses import replace
from pathlib import Path

import pydantic
import pytest
from test_cache_files import finishes, unblock
from test_orchestration_cache import TRIAL_LINE, Recording, Untouchable, ask

from isoprobe.cache import store as cache_module
from isoprobe.errors import ProbeError
from isoprobe.child.sources import environment_roots, imported_sources
from isoprobe.protocol.messages import Inspected, TrialResult
from scripted_probe import HOG_MAX, hog_spec


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def module(name: str, file: Path | str | None) -> types.ModuleType:
    made = types.ModuleType(name)
    if file is not None:
        made.__file__ = str(file)
    return made


def test_only_the_users_module_files_count(tmp_path):
    project, environment, generated = tmp_path / "project", tmp_path / "env", tmp_path / "generated"
    for folder in (project, environment, generated):
        folder.mkdir()
    helper = project / "helper.py"
    helper.write_text("EDGE = 6\n")
    (project / "alias.py").symlink_to(helper)
    (environment / "lib.py").write_text("x = 1\n")
    (generated / "kernel.py").write_text("y = 2\n")
    modules = {
        "helper": module("helper", helper),
        "alias": module("alias", project / "alias.py"),        # the same file by another name: once, by real path
        "lib": module("lib", environment / "lib.py"),           # installed
        "torch": module("torch", environment / "torch" / "__init__.py"),
        "torch._inductor.abc": module("torch._inductor.abc", generated / "kernel.py"),  # generated, under torch's name
        "builtin": module("builtin", None),                     # no file
        "gone": module("gone", project / "deleted.py"),         # cannot be read now
    }
    roots = (os.path.join(os.path.realpath(environment), ""),)
    assert imported_sources(modules, roots) == {os.path.realpath(helper): sha(helper)}


def test_the_environment_is_the_standard_library_site_packages_and_isoprobe(tmp_path):
    helper = tmp_path / "helper.py"
    helper.write_text("EDGE = 6\n")
    roots = environment_roots()
    assert os.path.join(os.path.realpath(sysconfig.get_paths()["stdlib"]), "") in roots
    modules = {"json": sys.modules["json"], "pydantic": pydantic, "isoprobe.cache.store": cache_module,
               "helper": module("helper", helper)}
    assert imported_sources(modules) == {os.path.realpath(helper): sha(helper)}


class Reporting(Recording):
    """Scripted children that report ``files`` as real ones do: hashed when each child ends.

    The environment check reports ``files``; each trial reports ``files`` and ``lazy`` (imported in forward).
    """

    def __init__(self, files: list[Path], lazy: list[Path] = ()):
        super().__init__()
        self.files, self.lazy = files, list(lazy)

    def run(self, request, conditions, *, timeout, name):
        run = super().run(request, conditions, timeout=timeout, name=name)
        events = []
        for event in run.events:
            if isinstance(event, (Inspected, TrialResult)):
                files = self.files + (self.lazy if isinstance(event, TrialResult) else [])
                event = event.model_copy(update={"sources": {str(f): sha(f) for f in files if f.exists()}})
            events.append(event)
        return replace(run, events=events)


def _project(tmp_path) -> tuple[Path, Path]:
    helper, lazy = tmp_path / "project" / "helper.py", tmp_path / "project" / "lazy.py"
    helper.parent.mkdir()
    helper.write_text("EDGE = 6\n")
    lazy.write_text("def forward(x):\n    return x\n")
    return helper, lazy


def test_an_edited_helper_module_makes_the_entry_stale_and_it_is_probed_again(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    helper, lazy = _project(tmp_path)
    first, _ = ask(spec, cache, Reporting([helper], [lazy]))
    entry = Path(first.cache.path)
    assert json.loads(entry.read_text())["sources"] == {str(helper): sha(helper), str(lazy): sha(lazy)}
    assert ask(spec, cache, Untouchable())[0].cache.hit is True  # unchanged: answered without a child

    helper.write_text("EDGE = 3\n")
    again, lines = ask(spec, cache, (executor := Reporting([helper], [lazy])))
    assert executor.calls and TRIAL_LINE in lines
    assert f"cache entry {entry} is stale: {helper} changed since it was probed; probing again" in lines
    assert lines.count("is stale") == 1
    assert again.cache.hit is False and json.loads(entry.read_text())["sources"][str(helper)] == sha(helper)
    assert ask(spec, cache, Untouchable())[0].cache.hit is True  # the new entry holds

    lazy.write_text("def forward(x):\n    return x * 2\n")  # imported only inside forward: the trials told
    _, lines = ask(spec, cache, Reporting([helper], [lazy]))
    assert f"is stale: {lazy} changed since it was probed" in lines


def test_a_deleted_or_replaced_source_is_stale_and_never_hangs(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    helper, _ = _project(tmp_path)
    ask(spec, cache, Reporting([helper]))
    helper.unlink()
    _, lines = ask(spec, cache, (executor := Reporting([helper])))
    assert executor.calls and f"is stale: {helper} changed since it was probed (it no longer exists)" in lines

    helper.write_text("EDGE = 6\n")
    ask(spec, cache, Reporting([helper]), refresh=True)  # the entry above was probed without it
    helper.unlink()
    os.mkfifo(helper)  # re-hashing must not wait for a writer
    executor = Reporting([])
    try:
        result, lines = finishes(lambda: ask(spec, cache, executor))
    finally:
        unblock(helper)
    assert f"is stale: {helper} changed since it was probed (it is a FIFO, not a regular file)" in lines
    assert executor.calls and result.max_batch_size == HOG_MAX


def test_code_edited_while_it_was_probed_stops_the_probe_with_no_answer_and_nothing_cached(tmp_path):
    """Issue 55: trials of two versions of the code give no answer of either (before: exit 0, an answer mixed
    from both, only kept out of the cache). The probe stops at the trial that ran the second version."""
    cache, spec = tmp_path / "cache", hog_spec()
    helper, _ = _project(tmp_path)

    class Editing(Reporting):
        def run(self, request, conditions, *, timeout, name):
            helper.write_text(f"EDGE = {len(self.calls)}\n")  # every child sees another version
            return super().run(request, conditions, timeout=timeout, name=name)

    executor = Editing([helper])
    with pytest.raises(ProbeError, match=f"{helper} changed while the probe ran"):
        ask(spec, cache, executor)
    assert len(executor.calls) == 2 and not list(cache.glob("*.json"))
