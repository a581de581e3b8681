"""What a command's words name in its cache key (isoprobe.cache.arguments), and the bounds a hit pays for.

The integration tests (tests/integration/test_command_cache.py) probe real commands; these check the key's
material directly: which words are keyed (a launcher run as the command, the words of a shell line, a folder), which
are not (installed programs, output folders), and that a huge folder or file costs the key a bounded amount.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from isoprobe.cache import arguments
from isoprobe.cache.sources import READ_FILES, READ_FOLDERS, SourceRecorder, changed_source
from isoprobe.cache.store import cache_key, command_material
from isoprobe.child.command_trial.supervisor import _reads
from isoprobe.spec.model import Spec


def material(folder: Path, command, shell: bool = False, **environ) -> dict:
    spec = Spec.model_validate({"command": command, "shell": shell, "command_dir": str(folder)})
    return command_material(spec, {"PATH": os.environ.get("PATH", ""), **environ})


def test_a_launcher_run_as_the_command_is_keyed_and_an_installed_program_is_not(tmp_path):
    (tmp_path / "wrapper.sh").write_text("#!/bin/sh\npython train.py \"$1\"\n")
    keyed = material(tmp_path, ["./wrapper.sh", "{batch_size}"])["files"]
    assert list(keyed) == ["./wrapper.sh"]
    (tmp_path / "train.py").write_text("pass\n")
    installed = material(tmp_path, [sys.executable, "train.py", "{batch_size}"])["files"]
    assert list(installed) == ["train.py"]  # the interpreter is the environment's, not the user's
    assert material(tmp_path, ["sh", "wrapper.sh", "{batch_size}"])["files"] == {"wrapper.sh": keyed["./wrapper.sh"]}


def test_the_words_of_a_shell_line_are_keyed(tmp_path):
    """``shell: true`` keeps the line whole for ``sh -c``: its words are split as a shell would, and the files
    among them (a sourced environment file, the script, a ``--config=`` value) are keyed."""
    for name in ("env.sh", "train.py", "c.yaml"):
        (tmp_path / name).write_text(name)
    line = ". ./env.sh && python train.py --config=c.yaml --batch-size {batch_size} | tee log.txt"
    before = material(tmp_path, line, shell=True)
    assert set(before["files"]) == {"./env.sh", "train.py", "c.yaml"}
    (tmp_path / "env.sh").write_text("export WIDTH=4096\n")
    assert cache_key(material(tmp_path, line, shell=True)) != cache_key(before)


def test_a_folder_is_keyed_by_its_listing_and_an_output_folder_not_at_all(tmp_path):
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    (data / "a.txt").write_text("32\n")
    (tmp_path / "out").mkdir()
    command = ["python", "train.py", "--data", "data", "--output_dir", "out", "--log-dir=out", "{batch_size}"]
    before = material(tmp_path, command)
    assert list(before["folders"]) == ["data"] and before["folders"]["data"]["complete"] is True
    (tmp_path / "out" / "checkpoint.pt").write_text("written by every run")
    assert material(tmp_path, command) == before  # what the command writes never changes its key
    (data / "a.txt").write_text("4096\n")  # rewritten in place, one level down
    assert material(tmp_path, command)["folders"] != before["folders"]


def test_a_huge_folder_costs_the_key_a_bounded_listing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(arguments, "FOLDER_ENTRIES", 300)
    monkeypatch.setattr(arguments, "FOLDER_STATS", 100)
    for d in range(5):
        (tmp_path / "data" / f"c{d}").mkdir(parents=True)
        for i in range(100):
            (tmp_path / "data" / f"c{d}" / f"{i:03d}.bin").write_text("x")
    listing = material(tmp_path, ["python", "t.py", "data", "{batch_size}"])["folders"]["data"]
    assert listing["entries"] == 300 and listing["sized"] == 100 and listing["complete"] is False
    assert arguments.FOLDER_STATS <= arguments.FOLDER_ENTRIES


def test_a_large_file_is_keyed_by_its_size_and_time_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(arguments, "LARGE_FILE", 10)
    big = tmp_path / "train.bin"
    big.write_bytes(b"x" * 100)
    first = arguments.file_digest(big)
    os.utime(big, ns=(1, 1))
    assert arguments.file_digest(big) != first


def test_a_dataset_read_by_workers_is_reported_as_its_folder_and_a_hit_lists_it(tmp_path):
    """Many files read in one folder are named as the folder: a hit lists it (bounded) instead of hashing each."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(40):
        (data / f"{i}.txt").write_text("32\n")
    (tmp_path / "config.json").write_text("{}")
    reads = {str(data / f"{i}.txt") for i in range(40)} | {str(tmp_path / "config.json")}
    reported = _reads(reads, set())
    assert reported == [f"{data}/", str(tmp_path / "config.json")]

    class Run:
        events = [type("Event", (), {"reads": reported, "sources": {}, "threads": None})()]

    recorder = SourceRecorder(inner=None)
    recorder.record(Run())
    assert set(recorder.sources) == {f"{data}/", str(tmp_path / "config.json")}
    assert changed_source(recorder.sources) is None
    (data / "7.txt").write_text("4096\n")
    assert changed_source(recorder.sources) == f"{data}/ changed since it was probed"
    assert READ_FOLDERS >= 1 and READ_FILES >= 1
