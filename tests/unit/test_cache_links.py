"""A cached answer is only as current as the files its trials read, also where they reach one through a symbolic link
or read it from native code (issue 56, item 5).

The recording (``isoprobe.child.native_reads``, in the shim and in isoprobe's own children): a path opened through a
link is reported as opened, beside its real path; ``torch.from_file`` and the other native readers' entry points
are noted; what the process holds mapped or open is found. The key check (``isoprobe.cache.sources``): a linked path
is keyed with where it leads, so a link moved to another target, even one of the same bytes, is stale, and the line
says where it led and leads. And the cache flow over scripted children that report such reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

from test_orchestration_cache import TRIAL_LINE, Recording, Untouchable, ask

from isoprobe.cache.sources import changed_source, source_digest
from isoprobe.child import native_reads
from isoprobe.protocol.command import SHIM_FOLDER, parse_lines
from isoprobe.protocol.wiring import GATE_FILE, SHIM_DIR_ENV
from isoprobe.protocol.messages import Inspected, TrialResult
from scripted_probe import HOG_MAX, hog_spec

ROOT = Path(__file__).resolve().parents[2]


def configs(tmp_path: Path) -> Path:
    """configs/v1/a.yaml and configs/v2/a.yaml of the same bytes, configs/current -> v1, configs/a.yaml -> v1/a.yaml."""
    folder = tmp_path / "configs"
    for version in ("v1", "v2"):
        (folder / version).mkdir(parents=True)
        (folder / version / "a.yaml").write_text("width: 8\n")
    (folder / "current").symlink_to("v1")
    (folder / "a.yaml").symlink_to("v1/a.yaml")
    return folder


def recorded(*paths: Path) -> dict[str, str]:
    return {str(path): source_digest(str(path)) for path in paths}


def test_a_link_moved_to_a_file_of_the_same_bytes_is_a_change_and_the_line_says_where_it_led(tmp_path):
    folder = configs(tmp_path)
    link, old, new = folder / "a.yaml", folder / "v1" / "a.yaml", folder / "v2" / "a.yaml"
    sources = recorded(old, link)
    assert changed_source(sources) is None
    assert sources[str(link)] != sources[str(old)]  # the same bytes, but keyed with where the link leads

    link.unlink()
    link.symlink_to("v2/a.yaml")
    assert changed_source(sources) == (f"{link} changed since it was probed (a symbolic link on its path leads to "
                                       f"{new} now, not to {old})")


def test_a_link_in_a_parent_folder_moved_elsewhere_is_a_change(tmp_path):
    folder = configs(tmp_path)
    through, old, new = folder / "current" / "a.yaml", folder / "v1" / "a.yaml", folder / "v2" / "a.yaml"
    sources = recorded(old, through)
    (folder / "current").unlink()
    (folder / "current").symlink_to("v2")
    assert changed_source(sources) == (f"{through} changed since it was probed (a symbolic link on its path leads "
                                       f"to {new} now, not to {old})")
    (folder / "current").unlink()
    (folder / "current").symlink_to("v1")  # back where it was: as probed
    assert changed_source(sources) is None


def test_an_edit_behind_an_unmoved_link_is_a_change_of_the_file_and_a_dangling_link_is_gone(tmp_path):
    folder = configs(tmp_path)
    link = folder / "current" / "a.yaml"
    sources = recorded(link)  # without its target's own entry: where it led is not known, where it leads is
    (folder / "v1" / "a.yaml").write_text("width: 4096\n")
    assert changed_source(sources) == (f"{link} changed since it was probed (through a symbolic link it leads to "
                                       f"{folder / 'v1' / 'a.yaml'})")
    (folder / "v1" / "a.yaml").unlink()
    assert changed_source(sources) == f"{link} changed since it was probed (it no longer exists)"


def test_a_folder_read_through_a_link_is_keyed_with_its_target(tmp_path):
    folder = configs(tmp_path)
    sources = {f"{folder / 'current'}/": source_digest(f"{folder / 'current'}/")}
    assert sources[f"{folder / 'current'}/"] != source_digest(f"{folder / 'v1'}/")
    (folder / "current").unlink()
    (folder / "current").symlink_to("v2")  # a listing of the same names and sizes, elsewhere
    assert "changed since it was probed" in changed_source(sources)


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


def test_a_config_read_through_a_link_that_is_then_moved_is_probed_again(tmp_path):
    cache, spec, folder = tmp_path / "cache", hog_spec(), configs(tmp_path)
    through, old, new = folder / "current" / "a.yaml", folder / "v1" / "a.yaml", folder / "v2" / "a.yaml"
    first, _ = ask(spec, cache, Reading([old, through]))  # what a child reports: the real path and the path opened
    entry = Path(first.cache.path)
    assert set(json.loads(entry.read_text())["sources"]) == {str(old), str(through)}
    assert ask(spec, cache, Untouchable())[0].cache.hit is True

    (folder / "current").unlink()
    (folder / "current").symlink_to("v2")
    again, lines = ask(spec, cache, (executor := Reading([new, through])))
    assert executor.calls and TRIAL_LINE in lines and again.cache.hit is False
    assert (f"cache entry {entry} is stale: {through} changed since it was probed (a symbolic link on its path "
            f"leads to {new} now, not to {old}); probing again") in lines
    assert ask(spec, cache, Untouchable())[0].cache.hit is True and again.max_batch_size == HOG_MAX


def test_isoprobes_own_child_reports_a_path_through_a_parent_link_and_what_native_code_read(tmp_path):
    folder = configs(tmp_path)
    (tmp_path / "raw.bin").write_bytes(b"\0" * 64)
    child = textwrap.dedent("""
        import json
        from isoprobe.child.reads import files_read, watch_reads

        watch_reads()
        import torch                                   # after the hook, as in a cold child: wrapped when imported
        open("configs/current/a.yaml").read()
        mapped = torch.from_file("raw.bin", size=16, dtype=torch.float32)
        print(json.dumps(files_read()))
    """)
    done = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    real = os.path.realpath(tmp_path)
    assert {os.path.join(real, p) for p in ("configs/current/a.yaml", "configs/v1/a.yaml", "raw.bin")} <= set(
        json.loads(done.stdout.splitlines()[-1])), folder


def test_a_read_is_reported_as_its_real_path_and_as_opened_through_a_link_never_the_trials_own(tmp_path):
    folder = configs(tmp_path)
    trial, installed = tmp_path / "trial", tmp_path / "site-packages"
    trial.mkdir()
    installed.mkdir()
    (installed / "data.json").write_text("{}")
    (folder / "installed.json").symlink_to(installed / "data.json")
    (tmp_path / "trial-link").symlink_to(trial)
    (trial / "gate").write_text("1")

    def outside(path):
        return not path.startswith(str(installed) + "/")

    def paths(path):
        return native_reads.read_paths(str(path), outside, str(tmp_path / "trial-link"))

    assert paths(folder / "current" / "a.yaml") == {str(folder / "current" / "a.yaml"), str(folder / "v1" / "a.yaml")}
    assert paths(folder / "v1" / "a.yaml") == {str(folder / "v1" / "a.yaml")}
    assert paths(folder / "installed.json") == set()  # it leads into the installed environment: not the user's
    assert paths(tmp_path / "trial-link" / "gate") == set() and paths(trial / "gate") == set()


def test_what_native_code_holds_mapped_or_open_for_reading_is_found_and_code_and_output_are_not(tmp_path):
    for name in ("mapped.bin", "private.bin", "open.bin", "shared.bin", "written.bin"):
        (tmp_path / name).write_bytes(b"\1" * 4096)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "hidden.bin").write_bytes(b"\1" * 4096)
    script = textwrap.dedent("""
        import json, mmap, os, sys
        from isoprobe.child import native_reads

        def mapped(name, access, flags=os.O_RDONLY):
            descriptor = os.open(name, flags)
            kept.append(mmap.mmap(descriptor, 4096, access=access))
            os.close(descriptor)

        kept = []
        mapped("mapped.bin", mmap.ACCESS_READ)
        mapped("private.bin", mmap.ACCESS_COPY)                     # as torch.from_file(shared=False) maps
        mapped("shared.bin", mmap.ACCESS_WRITE, os.O_RDWR)          # written back: the process's output
        mapped(".cache/hidden.bin", mmap.ACCESS_READ)               # a tool's cache
        held = [os.open("open.bin", os.O_RDONLY), os.open("written.bin", os.O_WRONLY)]
        print(json.dumps(sorted(native_reads.held_files(lambda path: path.startswith(os.getcwd())))))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    real = os.path.realpath(tmp_path)
    assert json.loads(done.stdout) == [os.path.join(real, n) for n in ("mapped.bin", "open.bin", "private.bin")]


_NATIVE = """
import json, os, sys
sys.path.insert(0, {root!r})
from isoprobe.child import native_reads

noted = []
native_reads.watch(lambda event, args: noted.append((event, os.path.basename(args[0]), args[1])))
import torch, tokenizers
from safetensors.torch import load_file, save_file
save_file({{"x": torch.zeros(4)}}, "w.safetensors")
torch.zeros(16).numpy().tofile("raw.bin")
open("tok.json", "w").write(json.dumps({{"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
    "model": {{"type": "WordLevel", "vocab": {{"a": 0, "[UNK]": 1}}, "unk_token": "[UNK]"}}}}))
calls = [lambda: torch.from_file("raw.bin", size=16, dtype=torch.float32),
         lambda: torch.UntypedStorage.from_file("raw.bin", False, 64),
         lambda: torch.FloatStorage.from_file("raw.bin", False, 16),
         lambda: load_file("w.safetensors"),             # safe_open (it maps through UntypedStorage.from_file too)
         lambda: tokenizers.Tokenizer.from_file("tok.json"),
         lambda: torch.from_file("shared.bin", shared=True, size=4, dtype=torch.float32)]
each = []
for call in calls:
    noted.clear()
    call()
    each.append(sorted(set(noted)))
print(json.dumps(each))
print(torch.from_file.__name__, torch.from_file.__doc__ is not None)
"""


def test_the_native_readers_python_entry_points_note_their_files_as_opens(tmp_path):
    """Each of these reads with no ``open`` audit event (checked: torch 2.14, safetensors 0.8, tokenizers 0.23);
    wrapped, each call is noted. torch is imported after the wrappers' finder, safetensors and tokenizers too."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _NATIVE.format(root=str(ROOT))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    noted, names = done.stdout.splitlines()[-2:]
    assert json.loads(noted) == [[["open", "raw.bin", "rb"]]] * 3 + [
        [["open", "w.safetensors", "rb"]], [["open", "tok.json", "rb"]], [["open", "shared.bin", "r+b"]]]
    assert names == "from_file True"  # torch's own name and documentation


_SHIMMED = """
import torch
open("configs/current/a.yaml").read()                          # through a link in a parent folder
weights = torch.from_file("raw.bin", size=16, dtype=torch.float32)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
"""


def test_a_command_process_reports_the_link_it_read_through_and_the_file_torch_from_file_mapped(tmp_path):
    configs(tmp_path)
    (tmp_path / "raw.bin").write_bytes(b"\0" * 64)
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / GATE_FILE).write_text("100")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHIM_DIR_ENV)}
    env.update(PYTHONPATH=str(SHIM_FOLDER), **{SHIM_DIR_ENV: str(trial)})
    done = subprocess.run([sys.executable, "-c", _SHIMMED], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    [file] = trial.glob("p*.jsonl")
    reads = {path for line in parse_lines(file.read_bytes()) if line.kind == "files" for path in line.reads}
    real = os.path.realpath(tmp_path)
    assert {os.path.join(real, p) for p in ("configs/current/a.yaml", "configs/v1/a.yaml", "raw.bin")} <= reads
    assert not any(path.startswith(os.path.join(real, "trial")) for path in reads)


def test_an_entry_whose_trials_ran_native_code_of_the_users_says_where_its_sources_end(tmp_path):
    """What a C extension of the user's reads itself may be seen by no hook: the entry answers, and says so."""
    cache, spec = tmp_path / "cache", hog_spec()
    extension = tmp_path / "fastdata.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"\x7fELF native")

    class Native(Recording):
        def run(self, request, conditions, *, timeout, name):
            run = super().run(request, conditions, timeout=timeout, name=name)
            sources = {str(extension): source_digest(str(extension))}
            return replace(run, events=[e.model_copy(update={"sources": sources})
                                        if isinstance(e, (Inspected, TrialResult)) else e for e in run.events])

    said = (f"its trials ran native code of yours ({extension}), and a file it reads itself may not be among its "
            "sources: after editing one, --refresh")
    first, lines = ask(spec, cache, Native())
    assert f"answer cached in {first.cache.path}; {said}" in lines
    hit, lines = ask(spec, cache, Untouchable())
    assert hit.cache.hit is True and f"no trial ran; {said}" in lines
    plain, lines = ask(hog_spec(max_batch_size=2), cache, Recording())  # no native code: the line as it was
    assert f"answer cached in {plain.cache.path}\n" in lines + "\n" and "native code" not in lines
