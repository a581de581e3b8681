"""The command line as a user meets it: validate, schema, help, and mistakes without tracebacks.

Fast: nothing here runs a trial. Most tests call the CLI in this process (``cli``); the ones
about the process itself (what a fresh interpreter imports, a closed pipe at exit) and one
end-to-end refusal run the real ``python -m isoprobe`` (``run_cli``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, cli, refused_by_stand_in_srun, run_cli


def test_parent_modules_never_import_torch():
    """Every module of the package but the child's (found by walking it, so a new module is covered too), and
    not Lightning either: only the trial and the callback that runs in the user's own trainer
    (isoprobe.lightning, left out of the walk) import it."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import isoprobe\n"
        "names = [m.name for m in pkgutil.walk_packages(isoprobe.__path__, 'isoprobe.')\n"
        "         if not m.name.startswith('isoprobe.child') and m.name not in ('isoprobe.__main__', 'isoprobe.lightning')]\n"
        "assert {'isoprobe.pipeline.pipeline', 'isoprobe.executors.local', 'isoprobe.protocol.messages'} <= set(names), names\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "from isoprobe.cli.main import main\n"
        "main(['validate', 'specs/resnet50.yaml'])\n"
        "assert 'torch' not in sys.modules, 'the parent imported torch'\n"
        "assert 'torchvision' not in sys.modules\n"
        "assert 'lightning' not in sys.modules and 'pytorch_lightning' not in sys.modules, 'the parent imported lightning'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _modules_loaded_by(*argv: str) -> set[str]:
    """Every module in ``sys.modules`` after ``isoprobe ARGV`` ran in a fresh interpreter (exit included)."""
    code = (
        "import sys\n"
        "from isoprobe.cli.main import main\n"
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
    """Start-up time is mostly imports (see benchmarks/studies/cli_startup.py): no command loads what it does not use.

    --help needs neither pydantic nor YAML; validate needs the spec model and its
    loader but not the result model, the output or the probe; schema reads no
    YAML, and ``schema --spec`` neither loads a spec nor builds the result model.
    """
    help_ = _modules_loaded_by("--help")
    assert not {"pydantic", "yaml", "isoprobe.spec.model", "isoprobe.spec.load", "isoprobe.errors"} & help_

    validate = _modules_loaded_by("validate", "specs/resnet50.yaml")
    assert {"pydantic", "yaml", "isoprobe.spec.model", "isoprobe.spec.load"} <= validate
    assert not {"isoprobe.report.result", "isoprobe.report.output", "isoprobe.probe", "isoprobe.executors", "isoprobe.protocol.messages",
                "torch"} & validate

    schema = _modules_loaded_by("schema")
    assert {"pydantic", "isoprobe.report.result"} <= schema
    assert "yaml" not in schema

    spec_schema = _modules_loaded_by("schema", "--spec")
    assert "isoprobe.spec.model" in spec_schema
    assert not {"yaml", "isoprobe.spec.load", "isoprobe.report.result"} & spec_schema


def test_validate_accepts_the_shipped_specs():
    for spec in sorted((REPO / "specs").glob("*.yaml")):
        run = cli("validate", str(spec))
        assert run.returncode == 0, (spec, run.stderr)
        assert "valid" in run.stdout


BAD_SPEC = {
    "model": {"torchvision": "resnet5O"},
    "input": {"shape": [3, 224, 224]},
    "target": {"classes": 10},
    "optimzer": {"name": "adam"},
    "search": {"steps": 1},
}


def _assert_bad_spec_refused(run, path) -> None:
    """Exit 2, every problem named on stderr; on stdout nothing (validate) or the bad_spec document (run, issue 56)."""
    assert run.returncode == 2
    assert run.stdout == "" or json.loads(run.stdout)["stop_reason"] == "bad_spec"
    assert "Traceback" not in run.stderr
    assert str(path) in run.stderr
    assert "optimzer" in run.stderr and "did you mean 'optimizer'" in run.stderr
    assert "search.steps" in run.stderr


def test_bad_spec_is_exit_2_naming_file_field_and_fix_without_traceback(write_spec):
    path = write_spec(BAD_SPEC)
    for command in ("validate", "run"):
        _assert_bad_spec_refused(cli(command, str(path)), path)
    assert cli("validate", str(path)).stdout == ""


def test_a_real_process_refuses_a_bad_spec_as_the_in_process_cli_does(write_spec):
    """End to end, as a user runs it: a fresh ``python -m isoprobe run``, its exit path included.

    The tests above call ``main`` in this process; this one checks that the real command gives
    the same refusal, byte for byte (status, stdout, stderr), so that they test what users meet.
    """
    path = write_spec(BAD_SPEC)
    real = run_cli("run", str(path))
    _assert_bad_spec_refused(real, path)
    assert real == cli("run", str(path))


def test_the_in_process_cli_behaves_like_a_process_and_puts_everything_back(
    write_spec, tmp_path, monkeypatch, isolated_cache,
):
    """``cli``, which most tests here use instead of a fresh interpreter, is faithful and leaves no trace.

    It applies ``cwd``, ``env`` and an empty cache folder of its own; ``isoprobe run`` installs a
    SIGTERM handler and ``main`` sets PYDANTIC_DISABLE_PLUGINS, and neither may leak into the next
    test; an exception that escapes ``main`` must look as it does to a user (a traceback on
    stderr, status 1), so that the "no traceback" assertions here can fail.
    """
    import os
    import signal

    import isoprobe.cli.main

    def mine(signum, frame):
        pass

    def show_the_process(args):
        print(json.dumps({"cwd": os.getcwd(), "marker": os.environ.get("ISOPROBE_TEST_MARKER"),
                          "cache": os.environ["ISOPROBE_CACHE_DIR"]}))
        return 0

    monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        environ, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
        write_spec(BAD_SPEC, name="relative.yaml")
        run = cli("run", "relative.yaml", cwd=tmp_path, env={"ISOPROBE_TEST_MARKER": "1"})
        _assert_bad_spec_refused(run, "relative.yaml")  # found relative to cwd
        assert signal.getsignal(signal.SIGTERM) is mine
        assert dict(os.environ) == environ and os.getcwd() == cwd and sys.path == path
    finally:
        signal.signal(signal.SIGTERM, previous)

    monkeypatch.setitem(isoprobe.cli.main._COMMANDS, "schema", show_the_process)
    seen = cli("schema", cwd=tmp_path, env={"ISOPROBE_TEST_MARKER": "1"}).json
    assert seen["cwd"] == str(tmp_path) and seen["marker"] == "1"
    assert seen["cache"] != str(isolated_cache) and seen["cache"] != cli("schema").json["cache"]
    assert cli("schema").json["cwd"] == str(REPO)  # as run_cli, the repository by default

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setitem(isoprobe.cli.main._COMMANDS, "schema", broken)
    run = cli("schema")
    assert run.returncode == 1
    assert "Traceback" in run.stderr and "RuntimeError: a bug" in run.stderr

def test_unknown_model_name_is_exit_2_with_a_suggestion(write_spec):
    path = write_spec({"model": {"torchvision": "resnet5O"}, "input": {"shape": [3, 8, 8]}, "target": {"classes": 2}})
    run = cli("validate", str(path))
    assert run.returncode == 2
    assert "model.torchvision" in run.stderr and "resnet50" in run.stderr


def test_invalid_yaml_names_the_line(write_spec, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  torchvision: [resnet50\ninput: {shape: [3]}\n")
    run = cli("validate", str(path))
    assert run.returncode == 2
    assert "line" in run.stderr and "YAML" in run.stderr
    assert "Traceback" not in run.stderr


def test_command_line_overrides_are_validated_and_named(write_spec):
    path = write_spec({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 8, 8]}, "target": {"classes": 2}})
    run = cli("validate", str(path), "--memory-budget", "lots", "--device", "gpu")
    assert run.returncode == 2
    assert "--memory-budget" in run.stderr and "--device" in run.stderr


def test_missing_spec_file_is_exit_2():
    run = cli("run", "does/not/exist.yaml")
    assert run.returncode == 2
    assert "no such file" in run.stderr


def test_usage_error_is_exit_2():
    assert cli("frobnicate").returncode == 2


def test_schema_is_json_schema_of_the_result_and_of_the_spec():
    result_schema = json.loads(cli("schema").stdout)
    assert result_schema["title"] == "Result"
    assert {"max_batch_size", "first_failing_batch_size", "recommended_batch_size", "trials"} <= set(
        result_schema["properties"]
    )
    spec_schema = json.loads(cli("schema", "--spec").stdout)
    assert spec_schema["title"] == "Spec"
    assert spec_schema["additionalProperties"] is False


@pytest.mark.parametrize("argv, published", [(("schema",), "result.schema.json"),
                                             (("schema", "--spec"), "spec.schema.json")])
def test_the_published_schemas_are_what_the_command_prints(argv, published):
    """docs/*.schema.json are the contract as published: a change to a model that changes them must update
    them in the same commit (issue 26 moved every module and checked that the result's schema stayed the same)."""
    printed = cli(*argv).stdout
    assert printed == (REPO / "docs" / published).read_text(encoding="utf-8"), \
        f"the schema changed: regenerate with `isoprobe {' '.join(argv)} > docs/{published}` if that is intended"


def test_help_documents_the_exit_codes():
    run = cli("--help")
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


# --------------------------------------------------------------------------- every command that cannot do its job


def _no_estimate(monkeypatch):
    """The environment check came back without an estimate (an untraceable model, a trace out of time)."""
    from isoprobe.pipeline.prediction import EstimateReport
    from isoprobe.protocol.messages import Estimate
    from isoprobe.report.device import DeviceInfo

    device = DeviceInfo(backend="cpu", requested="cpu", name="a CPU", total_memory_bytes=8 << 30,
                        capacity_bytes=1 << 30)
    report = EstimateReport(spec_path="s.yaml", torch_version="2", device=device, seconds=1.0, note="a prediction",
                            estimate=Estimate(note="the model could not be traced: it reads a value back"))
    monkeypatch.setattr("isoprobe.pipeline.estimate.estimate_spec", lambda *args, **kwargs: report)


def _answered_sweep(monkeypatch):
    """A sweep whose every row answered, so that only its --output can fail."""
    from isoprobe.sweep.model import SweepReport, SweepRow

    row = SweepRow(spec="s.yaml", target="local", answered=True, max_batch_size=8, stop_reason="edge_found")
    monkeypatch.setattr("isoprobe.sweep.run_sweep",
                        lambda *args, **kwargs: SweepReport(executor="local", rows=[row], submitted=1, seconds=1.0))


def _no_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without Slurm's clients (submitit's RuntimeError before)


SMALL = str(REPO / "specs" / "small-cnn.yaml")
SAVED = str(REPO / "tests" / "data" / "result-small-cnn.json")
DEEP = "model.kwargs." + ".".join(["a"] * 300) + "=1"

#: (command line, setup, exit code, what stderr must say). Each row is a command that cannot do its job.
CANNOT = [
    (["run", "no/such/spec.yaml"], None, 2, "no such file"),
    (["run", SMALL, "--set", DEEP], None, 2, "nested too deeply to be a spec"),
    (["validate", SMALL, "--set", DEEP], None, 2, "nested too deeply to be a spec"),
    (["validate", SMALL, "--set", "distributed.world_size=true", "--set", "distributed.strategy=ddp"], None, 2,
     "distributed.world_size (from --set distributed.world_size=true): Input should be a valid integer"),
    (["estimate", SMALL, "--set", DEEP], None, 2, "nested too deeply to be a spec"),
    (["estimate", SMALL, "--format", "json"], _no_estimate, 4, "no estimate: the model could not be traced"),
    (["show", SMALL], None, 2, "not an isoprobe result"),
    (["plot", SAVED, "-o", "/dev/full"], None, 74, "cannot write the plot /dev/full"),
    (["sweep", SMALL, "--format", "json", "--output", "/dev/full"], _answered_sweep, 74,
     "cannot write the report --output /dev/full: No space left on device"),
    (["sweep", SMALL, "--executor", "slurm", "--partition", "gpu"], _no_slurm, 2,
     "needs Slurm's client commands on PATH, and sbatch, srun, squeue, scancel are not there"),
    (["sweep", "no/such/spec.yaml", "--format", "json"], None, 4, ""),
]


@pytest.mark.parametrize(("args", "setup", "code", "said"), CANNOT, ids=[" ".join(row[0])[:60] for row in CANNOT])
def test_every_command_that_cannot_do_its_job_says_why_with_its_documented_code(
        monkeypatch, tmp_path, args, setup, code, said):
    if setup is _no_slurm:
        setup(monkeypatch, tmp_path)
    elif setup is not None:
        setup(monkeypatch)
    if args[0] == "plot":
        pytest.importorskip("matplotlib")
    run = cli(*args)
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr
    assert said in " ".join(run.stderr.split()), run.stderr


SLURM_SAYS = "srun: error: Unable to create step for job 77: Requested node configuration is not available"


@pytest.mark.parametrize("hook", [False, True])
def test_slurms_refusal_is_said_once(monkeypatch, tmp_path, hook):
    """Issue 34: 'srun's refusal printed twice' (three times: in the message, then the evidence, one line per
    refusal). The evidence under a ProbeError's message now leaves out what the message says and a line that
    repeats the one before (errors.ProbeError.unsaid_evidence): on stderr, and in hook mode's log."""
    refused = refused_by_stand_in_srun(tmp_path, f"echo '{SLURM_SAYS}' >&2\nexit 1")
    assert SLURM_SAYS in refused.message and refused.evidence.count(SLURM_SAYS) == 2  # what the executor raises

    def raise_it(args, log):
        raise refused

    monkeypatch.setattr("isoprobe.cli.run._result_for", raise_it)
    log = tmp_path / "isoprobe.log"
    hooked = ("--format", "env", "--fallback-batch-size", "4") if hook else ()
    run = cli("run", SMALL, "--log", str(log), *hooked)
    assert run.returncode == (0 if hook else 4), run.stderr
    assert run.stderr.count(SLURM_SAYS) == 1, run.stderr
    if hook:  # the lines for people say it once; the stop's document (issue 56) holds it as its message
        logged = log.read_text()
        start = logged.index("{\n")
        end = logged.index("\n}\n", start) + 3
        assert json.loads(logged[start:end])["message"] == refused.message
        assert (logged[:start] + logged[end:]).count(SLURM_SAYS) == 1, logged


def test_evidence_the_message_does_not_say_is_kept_whole():
    """The other side of the rule: a traceback's lines (short ones such as 'raise' included) stay as they are."""
    from isoprobe.errors import ProbeError

    tail = "Traceback (most recent call last):\n  File \"m.py\", line 3, in f\n    raise\nKeyError: 'x'"
    assert ProbeError("the environment check exited with status 1 without an answer (raise)", tail
                      ).unsaid_evidence() == tail
