"""The command source's spec side (issue 36): what a trial runs, what is refused before any trial, and the key.

Why: a command that cannot work (no placeholder, a program that is not there, a section isoprobe would silently
ignore) must be the user's spec error with the field named, never a trial error repeated at every batch; and
the argv a trial runs, the result and the cache key must name the same command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from isoprobe.cache.store import cache_key, key_material
from isoprobe.cli.main import split_command
from isoprobe.errors import SpecError
from isoprobe.spec.command import argv_for, command_words, shown_command
from isoprobe.spec.load import check_references, load_spec


def problems(spec, folder: Path | None = None):
    with pytest.raises(SpecError) as info:
        loaded = load_spec(spec)
        check_references(loaded, str((folder or Path.cwd()) / "spec.yaml"))
    return [(p.field, p.message) for p in info.value.problems]


def test_the_placeholder_is_replaced_wherever_it_stands_and_nothing_else_is_touched():
    command = ["torchrun", "--nproc-per-node", "2", "train.py", "--batch-size={batch_size}", "--cfg", '{"a": 1}',
               "--global", "{batch_size}x8"]
    assert argv_for(command, False, 12) == ["torchrun", "--nproc-per-node", "2", "train.py", "--batch-size=12",
                                            "--cfg", '{"a": 1}', "--global", "12x8"]
    assert argv_for(command, False, None) == command  # the key's form: as written
    assert argv_for("python train.py -b {batch_size} --name 'my run'", False, 3) == [
        "python", "train.py", "-b", "3", "--name", "my run"]
    assert argv_for("B={batch_size}; python t.py -b $B && echo ok", True, 5) == [
        "/bin/sh", "-c", "B=5; python t.py -b $B && echo ok"]


def test_a_string_command_is_split_as_a_shell_splits_words():
    assert command_words("accelerate launch --num_processes 1 x.py --lr '1e-3 x'", False)[-1] == "1e-3 x"
    with pytest.raises(ValueError, match="cannot split"):
        command_words("python 'train.py", False)
    assert shown_command(["python", "my script.py", "-b", "{batch_size}"]) == "python 'my script.py' -b '{batch_size}'"


@pytest.mark.parametrize("spec, field, words", [
    ({"command": "python train.py --batch-size 8"}, "command", "has no {batch_size}"),
    ({"command": "python train.py {batch_size}", "model": {"torchvision": "resnet18"}}, "model", "ignored"),
    ({"command": "python train.py {batch_size}", "input": {"shape": [3, 8, 8]}}, "input", "ignored"),
    ({"command": "python train.py {batch_size}", "optimizer": {"name": "sgd"}}, "optimizer", "ignored"),
    ({"command": "python train.py {batch_size}", "training": {"precision": "bf16-mixed"}}, "training.precision",
     "script"),
    ({"command": "python train.py {batch_size}", "distributed": {"strategy": "ddp"}}, "distributed.strategy",
     "starts its own ranks"),
    ({"command": "python train.py {batch_size}", "search": {"parallel": 2}}, "search.parallel", "set it to 1"),
    ({"command": ["python", "train.py", "{batch_size}"], "shell": True}, "shell", "as a string"),
    ({"command": "python 'train.py {batch_size}"}, "command", "cannot split"),
    ({"command": "python train.py {batch_size}", "command_env": ["NOT A NAME"]}, "command_env", "not an environment"),
    ({"command": "   "}, "command", "is empty"),
])
def test_a_command_that_cannot_work_is_refused_with_its_field_named(spec, field, words):
    found = problems(spec)
    assert len(found) == 1 and found[0][0] == field and words in found[0][1], found


def test_batch_from_env_needs_no_placeholder():
    spec = load_spec({"command": "python train.py", "batch_from": "env"})
    assert spec.command == "python train.py"


def test_the_program_and_the_python_script_must_exist(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = {"command": "python no_such.py -b {batch_size}", "command_dir": str(tmp_path)}
    [(field, message)] = problems(spec)
    assert field == "command" and "no script 'no_such.py'" in message
    [(field, message)] = problems({"command": "pyhton train.py -b {batch_size}", "command_dir": str(tmp_path)})
    assert field == "command" and "no program 'pyhton' on PATH" in message
    [(field, message)] = problems({"command": "./run.sh {batch_size}", "command_dir": str(tmp_path)})
    assert "no program './run.sh'" in message
    good = load_spec({"command": "python train.py -b {batch_size}", "command_dir": str(tmp_path)})
    check_references(good, str(tmp_path / "spec.yaml"))  # no error


def test_the_command_runs_in_the_current_folder_unless_the_spec_names_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_spec({"command": "python t.py {batch_size}"}).command_dir == str(tmp_path.resolve())
    (tmp_path / "jobs").mkdir()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("command: python t.py {batch_size}\ncommand_dir: jobs\n")
    assert load_spec(spec_file).command_dir == str((tmp_path / "jobs").resolve())
    spec_file.write_text("command: python t.py {batch_size}\ncommand_dir: missing\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec_file)
    assert info.value.problems[0].field == "command_dir" and "no such folder" in info.value.problems[0].message


def test_the_command_line_splits_at_the_first_double_dash():
    assert split_command(["run", "spec.yaml", "--no-cache", "--", "python", "t.py", "--", "-b", "{batch_size}"]) == (
        ["run", "spec.yaml", "--no-cache"], ["python", "t.py", "--", "-b", "{batch_size}"])
    assert split_command(["run", "spec.yaml"]) == (["run", "spec.yaml"], None)
    assert split_command(["validate", "spec.yaml", "--", "x"]) == (["validate", "spec.yaml", "--", "x"], None)


def test_the_key_holds_the_named_variables_and_the_files_the_arguments_name(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = load_spec({"command": f"python train.py --config cfg.yaml -b {{batch_size}}", "command_dir": str(tmp_path),
                      "command_env": ["MY_CONFIG"]})
    (tmp_path / "cfg.yaml").write_text("a: 1\n")

    def key(environ):
        return cache_key(key_material(spec, str(tmp_path / "spec.yaml"), environ, None))

    base = key({"MY_CONFIG": "a"})
    assert key({"MY_CONFIG": "a", "OTHER": "x"}) == base  # only the named variables
    assert key({"MY_CONFIG": "b"}) != base
    script.write_text("print(2)\n")
    edited = key({"MY_CONFIG": "a"})
    assert edited != base
    (tmp_path / "cfg.yaml").write_text("a: 2\n")
    assert key({"MY_CONFIG": "a"}) != edited
    material = key_material(spec, str(tmp_path / "spec.yaml"), {}, None)
    assert set(material["command"]["files"]) == {"train.py", "cfg.yaml"}
    moved = load_spec({"command": spec.command, "command_dir": str(tmp_path / ".."), "command_env": ["MY_CONFIG"]})
    assert cache_key(key_material(moved, "x", {}, None)) != cache_key(key_material(spec, "x", {}, None))
    assert os.path.isabs(spec.command_dir)


@pytest.mark.parametrize("written", ["command: python train.py {batch_size}\n",
                                     "command: python train.py {batch_size}\nshell: true\n",
                                     "command: [python, train.py, '{batch_size}']\n"])
def test_a_spec_with_a_command_and_a_command_after_dashes_is_refused_naming_both(tmp_path, written):
    """issue 47: the command line silently replaced the spec's command (or, with shell: true, said 'give command as
    a string'). One place only: exit 2, the spec and both commands named, nothing run. In a process of its own:
    the CLI installs its signal handling, which a test in this process must not inherit."""
    from conftest import run_cli

    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(written + "memory_budget: 1GiB\n")
    done = run_cli("run", str(spec), "--no-cache", "--", "python", "other.py", "--bs", "{batch_size}", timeout=60)
    err = done.stderr
    assert done.returncode == 2, err
    assert "the spec gives a command" in err and "other.py" in err and "train.py" in err and "Traceback" not in err


@pytest.mark.parametrize("command, flag", [("python -I train.py {batch_size}", "-I"),
                                           ("python -u -E train.py {batch_size}", "-E"),
                                           ("python -BS train.py {batch_size}", "-S"),
                                           ("python3 -I -m mytrain {batch_size}", "-I")])
def test_a_python_that_skips_site_or_pythonpath_is_refused_before_any_trial(tmp_path, command, flag):
    """issue 47: 'python -I' ignores PYTHONPATH, so the shim never loads and every trial timed out saying 'no
    optimizer step seen' after the whole timeout."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    [(field, message)] = problems({"command": command, "command_dir": str(tmp_path)})
    assert field == "command" and f"python runs with {flag}" in message


def test_python_options_that_keep_site_are_fine(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    for command in ("python -u train.py {batch_size}", "python -W ignore::UserWarning train.py {batch_size}",
                    "python -X importtime train.py {batch_size}", "python train.py -I {batch_size}"):
        check_references(load_spec({"command": command, "command_dir": str(tmp_path)}), str(tmp_path / "s.yaml"))
