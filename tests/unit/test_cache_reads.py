"""A cached answer is only as current as the files its children read (isoprobe.child.reads).

Which opens count (a file read, not one written, outside the installed
environment and the kernel's folders), seen by the audit hook in a fresh
interpreter (a hook cannot be removed, so not in this one); and the cache flow
over scripted children that report their reads as real children do: a config
file edited or deleted after the probe makes the entry stale, and it is probed
again. tests/integration/test_cache_and_hooks.py has the same with real children.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

from test_orchestration_cache import TRIAL_LINE, Recording, Untouchable, ask

from isoprobe.child.reads import access
from isoprobe.protocol.messages import Inspected, TrialResult
from scripted_probe import HOG_MAX, hog_spec

ROOT = Path(__file__).resolve().parents[2]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_open_reads_or_writes_by_its_mode_or_flags():
    assert access("r", 0) == (True, False) and access("rb", 0) == (True, False)
    assert access("w", 0) == (False, True) and access("a", 0) == (False, True) and access("xb", 0) == (False, True)
    assert access("r+", 0) == (True, True)
    assert access(None, os.O_RDONLY) == (True, False)
    assert access(None, os.O_WRONLY | os.O_CREAT) == (False, True)
    assert access(None, os.O_RDWR) == (True, True)
    assert access(None, os.O_RDONLY | os.O_CREAT) == (True, True)


_CHILD = textwrap.dedent("""
    import json, os, pathlib
    from isoprobe.child.reads import files_read, watch_reads

    watch_reads()
    json.load(open("layers.json"))                       # relative, read: counts
    pathlib.Path("vocab.txt").read_text()                # through pathlib
    os.close(os.open("raw.bin", os.O_RDONLY))            # os.open
    open("alias.json").read()                            # a link: its target, and its own path
    pathlib.Path("log.txt").write_text("written")        # written: output
    open("log.txt").read()                               # ... even when read back
    with open("state.txt", "r+") as f: f.read()          # read and written: output
    open("/proc/self/status").read()                     # the kernel's
    open(json.__file__).read()                           # the standard library's
    os.close(os.open(".", os.O_RDONLY))                  # a folder
    try:
        open("missing.json")
    except OSError:
        pass
    open("gone.txt").read(); os.unlink("gone.txt")       # gone by the end
    print(json.dumps(files_read()))
""")


def test_the_hook_reports_the_users_files_opened_for_reading_only(tmp_path):
    for name in ("layers.json", "alias-target.json"):
        (tmp_path / name).write_text('{"width": 8}')
    (tmp_path / "alias.json").symlink_to(tmp_path / "alias-target.json")
    (tmp_path / "vocab.txt").write_text("a b c")
    (tmp_path / "raw.bin").write_bytes(b"\0" * 16)
    (tmp_path / "state.txt").write_text("0")
    (tmp_path / "gone.txt").write_text("x")
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    real = os.path.realpath(tmp_path)
    assert json.loads(done.stdout) == sorted(os.path.join(real, name) for name in (
        "layers.json", "vocab.txt", "raw.bin", "alias-target.json", "alias.json"))


class Reading(Recording):
    """Scripted children that report ``files`` as read, as real ones do (the parent hashes them)."""

    def __init__(self, files: list[Path]):
        super().__init__()
        self.files = files

    def run(self, request, conditions, *, timeout, name):
        run = super().run(request, conditions, timeout=timeout, name=name)
        reads = [str(f) for f in self.files]
        return replace(run, events=[e.model_copy(update={"reads": reads}) if isinstance(e, (Inspected, TrialResult))
                                    else e for e in run.events])


def test_a_config_file_the_factory_read_that_then_changes_is_probed_again(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    config = tmp_path / "layers.json"
    config.write_text('{"width": 8}')
    first, _ = ask(spec, cache, Reading([config]))
    entry = Path(first.cache.path)
    assert json.loads(entry.read_text())["sources"] == {str(config): sha(config)}
    assert ask(spec, cache, Untouchable())[0].cache.hit is True  # unchanged: answered without a child

    config.write_text('{"width": 16}')
    again, lines = ask(spec, cache, (executor := Reading([config])))
    assert executor.calls and TRIAL_LINE in lines
    assert f"cache entry {entry} is stale: {config} changed since it was probed; probing again" in lines
    assert again.cache.hit is False and json.loads(entry.read_text())["sources"][str(config)] == sha(config)
    assert ask(spec, cache, Untouchable())[0].cache.hit is True

    config.unlink()
    _, lines = ask(spec, cache, (executor := Reading([])))
    assert executor.calls and f"is stale: {config} changed since it was probed (it no longer exists)" in lines


def test_a_read_that_is_no_regular_file_by_the_parents_turn_is_left_out_and_never_hangs(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    result, lines = ask(spec, cache, Reading([fifo, folder, tmp_path / "missing.json", Path("relative.json")]))
    assert result.max_batch_size == HOG_MAX and "answer cached in" in lines
    assert json.loads(Path(result.cache.path).read_text())["sources"] == {}


def test_a_file_edited_while_it_was_probed_is_not_cached(tmp_path):
    cache, spec = tmp_path / "cache", hog_spec()
    config = tmp_path / "layers.json"

    class Editing(Reading):
        def run(self, request, conditions, *, timeout, name):
            config.write_text(f'{{"width": {len(self.calls)}}}')  # every child reads another version
            return super().run(request, conditions, timeout=timeout, name=name)

    result, lines = ask(spec, cache, Editing([config]))
    assert f"{config} changed while it was probed, so the answer is not cached" in lines
    assert result.max_batch_size == HOG_MAX and result.cache is None and not list(cache.glob("*.json"))
