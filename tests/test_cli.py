"""The command line as a user meets it: validate, schema, help, and mistakes without tracebacks.

Fast: nothing here runs a trial.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, run_cli


def test_parent_modules_never_import_torch():
    code = (
        "import sys\n"
        "import isoprobe.cli, isoprobe.probe, isoprobe.supervisor, isoprobe.search, isoprobe.spec, "
        "isoprobe.result, isoprobe.output, isoprobe.recommend, isoprobe.catalog\n"
        "from isoprobe.cli import main\n"
        "main(['validate', 'specs/resnet50.yaml'])\n"
        "assert 'torch' not in sys.modules, 'the parent imported torch'\n"
        "assert 'torchvision' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _modules_loaded_by(*argv: str) -> set[str]:
    """Every module in ``sys.modules`` after ``isoprobe ARGV`` ran in a fresh interpreter (exit included)."""
    code = (
        "import sys\n"
        "from isoprobe.cli import main\n"
        "try:\n"
        f"    code = main({list(argv)!r})\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "assert code == 0, code\n"
        "print('--- modules ---')\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split("--- modules ---\n", 1)[1].split())


def test_each_command_imports_only_what_it_needs():
    """Start-up time is mostly imports (see benchmarks/cli_startup.py): no command loads what it does not use.

    --help needs neither pydantic nor YAML; validate needs the spec model but
    not the result model, the output or the probe; schema reads no YAML, and
    ``schema --spec`` does not build the result model.
    """
    help_ = _modules_loaded_by("--help")
    assert not {"pydantic", "yaml", "isoprobe.spec", "isoprobe.errors"} & help_

    validate = _modules_loaded_by("validate", "specs/resnet50.yaml")
    assert {"pydantic", "yaml", "isoprobe.spec"} <= validate
    assert not {"isoprobe.result", "isoprobe.output", "isoprobe.probe", "isoprobe.supervisor", "torch"} & validate

    schema = _modules_loaded_by("schema")
    assert {"pydantic", "isoprobe.result"} <= schema
    assert "yaml" not in schema

    spec_schema = _modules_loaded_by("schema", "--spec")
    assert "isoprobe.spec" in spec_schema
    assert not {"yaml", "isoprobe.result"} & spec_schema


def test_validate_accepts_the_shipped_specs():
    for spec in sorted((REPO / "specs").glob("*.yaml")):
        run = run_cli("validate", str(spec))
        assert run.returncode == 0, (spec, run.stderr)
        assert "valid" in run.stdout


def test_bad_spec_is_exit_2_naming_file_field_and_fix_without_traceback(write_spec):
    path = write_spec(
        {
            "model": {"torchvision": "resnet5O"},
            "input": {"shape": [3, 224, 224]},
            "target": {"classes": 10},
            "optimzer": {"name": "adam"},
            "search": {"steps": 1},
        }
    )
    for command in ("validate", "run"):
        run = run_cli(command, str(path))
        assert run.returncode == 2
        assert run.stdout == ""
        assert "Traceback" not in run.stderr
        assert str(path) in run.stderr
        assert "optimzer" in run.stderr and "did you mean 'optimizer'" in run.stderr
        assert "search.steps" in run.stderr


def test_unknown_model_name_is_exit_2_with_a_suggestion(write_spec):
    path = write_spec({"model": {"torchvision": "resnet5O"}, "input": {"shape": [3, 8, 8]}, "target": {"classes": 2}})
    run = run_cli("validate", str(path))
    assert run.returncode == 2
    assert "model.torchvision" in run.stderr and "resnet50" in run.stderr


def test_invalid_yaml_names_the_line(write_spec, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  torchvision: [resnet50\ninput: {shape: [3]}\n")
    run = run_cli("validate", str(path))
    assert run.returncode == 2
    assert "line" in run.stderr and "YAML" in run.stderr
    assert "Traceback" not in run.stderr


def test_command_line_overrides_are_validated_and_named(write_spec):
    path = write_spec({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 8, 8]}, "target": {"classes": 2}})
    run = run_cli("validate", str(path), "--memory-budget", "lots", "--device", "gpu")
    assert run.returncode == 2
    assert "--memory-budget" in run.stderr and "--device" in run.stderr


def test_missing_spec_file_is_exit_2():
    run = run_cli("run", "does/not/exist.yaml")
    assert run.returncode == 2
    assert "no such file" in run.stderr


def test_usage_error_is_exit_2():
    assert run_cli("frobnicate").returncode == 2


def test_schema_is_json_schema_of_the_result_and_of_the_spec():
    result_schema = json.loads(run_cli("schema").stdout)
    assert result_schema["title"] == "Result"
    assert {"max_batch_size", "first_failing_batch_size", "recommended_batch_size", "trials"} <= set(
        result_schema["properties"]
    )
    spec_schema = json.loads(run_cli("schema", "--spec").stdout)
    assert spec_schema["title"] == "Spec"
    assert spec_schema["additionalProperties"] is False


def test_help_documents_the_exit_codes():
    run = run_cli("--help")
    assert run.returncode == 0
    for code in ("0", "2", "3", "4", "130"):
        assert f"\n  {code} " in run.stdout


def test_a_reader_that_stops_early_gets_no_traceback():
    # `isoprobe schema | true`: the reader is gone before isoprobe (0.1 s to start) writes a byte.
    reader_gone = subprocess.run(
        f"{sys.executable} -m isoprobe schema | true; echo \"${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert "Traceback" not in reader_gone.stderr and "BrokenPipe" not in reader_gone.stderr, reader_gone.stderr
    assert reader_gone.stdout.strip() == "141"
