"""Inputs that must never hang, eat memory or trace back, and outputs whose failure must be said (issue 14).

Three classes, each fixed where it arises, each tested here:

- **Special files** (class 8): a spec, a result or a factory "file" that is
  ``/dev/zero``, ``/dev/urandom`` or a FIFO is refused before it is read
  (``isoprobe.spec.safe_read``), with exit 2 and one message. These run the real
  command with a timeout and a memory cap, so that a regression fails instead
  of hanging the suite or filling the machine's memory.
- **Numbers and shapes no loader can take** (class 9): integers past Python's
  4300-digit conversion limit, sizes that overflow a float, infinities and NaN,
  a factory file too deep for Python's parser, YAML nested past any spec:
  each is a spec error that names the field (``isoprobe.spec.yaml_file``), in process.
- **Outputs that fail** (class 10): a log that stops taking writes, an OSError
  out of the probe (no space in TMPDIR), stdout on a full device. The run's
  answer is never lost to the log; the probe's failure is one line and exit 4,
  or in hook mode the fallback; stdout that cannot be written is exit 74.
  The end-to-end cases with real trials are in tests/integration/test_hooks_hostile.py.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, TESTS, cli
from isoprobe.spec.yaml_file import MAX_SPEC_DEPTH

SMALL_CNN = REPO / "specs" / "small-cnn.yaml"
RESULT = TESTS / "data" / "result-small-cnn.json"
VALID = {"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 8, 8]}, "target": {"classes": 2}}
MEMORY_CAP = 2 << 30  # bytes of address space for a command under test: /dev/zero read whole would pass it


def _isoprobe(*args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout: float = 60,
              ) -> subprocess.CompletedProcess:
    """The real ``python -m isoprobe ARGS``: with a timeout and a memory cap, so a regression fails, not hangs."""

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    return subprocess.run([sys.executable, "-m", "isoprobe", *args], stdout=stdout, stderr=stderr,
                          text=True, timeout=timeout, cwd=REPO, preexec_fn=cap_memory)


def _refused(returncode: int, stderr: str, path, message: str, fix: str | None = None) -> None:
    """Exit 2, no traceback, exactly one message for ``path``, starting with ``message``, then its fix."""
    assert returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith(f"isoprobe: {path}: ")]
    assert lines[at].startswith(f"isoprobe: {path}: {message}"), lines[at]
    if fix is not None:
        assert lines[at + 1].strip().startswith(f"fix: {fix}"), lines


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "spec.yaml"
    os.mkfifo(path)
    return path


# --------------------------------------------------------------------------- class 8: special files

PIPE_FIX = "a pipe or a device is refused (it may never end)"


@pytest.mark.parametrize(("command", "path", "what"), [
    ("validate", "/dev/zero", "is a character device, not a spec file"),
    ("validate", "/dev/urandom", "is a character device, not a spec file"),
    ("run", "/dev/zero", "is a character device, not a spec file"),
    ("show", "/dev/zero", "is a character device, not a result file"),
    ("plot", "/dev/urandom", "is a character device, not a result file"),
])
def test_a_device_is_refused_before_a_byte_is_read(command, path, what):
    done = _isoprobe(command, path)
    _refused(done.returncode, done.stderr, path, what, PIPE_FIX)
    if command == "run":  # every stop of run prints its document (issue 56): the bad spec's, no byte of the device
        assert json.loads(done.stdout)["stop_reason"] == "bad_spec" and what in json.loads(done.stdout)["message"]
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("command", ["validate", "run", "show", "plot"])
def test_a_fifo_with_no_writer_is_refused_instead_of_blocking(command, fifo):
    done = _isoprobe(command, str(fifo), timeout=30)
    what = "a result file" if command in ("show", "plot") else "a spec file"
    _refused(done.returncode, done.stderr, fifo, f"is a FIFO (named pipe), not {what}", PIPE_FIX)


def test_hook_mode_answers_a_fifo_spec_with_the_fallback(fifo):
    done = _isoprobe("run", str(fifo), "--format", "env", "--fallback-batch-size", "8", timeout=30)
    assert done.returncode == 0, done.stderr
    assert "export ISOPROBE_BATCH_SIZE=8" in done.stdout.splitlines()
    assert "is a FIFO (named pipe)" in done.stderr and "Traceback" not in done.stderr


def test_a_factory_file_that_is_a_fifo_is_refused_by_the_reference_check(tmp_path):
    """check_references reads the file itself (a path can change after the spec was loaded): never blocking."""
    os.mkfifo(tmp_path / "models.py")
    code = ("from pathlib import Path\n"
            "from isoprobe.spec.load import _factory_problems\n"
            f"[p] = _factory_problems({str(tmp_path / 'models.py') + ':build'!r}, Path('.'))\n"
            "print(p.field, '|', p.message, '|', p.fix)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"model.factory | {tmp_path / 'models.py'} is a FIFO (named pipe), not a Python "
                                   f"file | {PIPE_FIX}; write the content to a file and give its path")


def test_a_factory_reference_to_a_fifo_is_named_as_such(tmp_path, write_spec):
    os.mkfifo(tmp_path / "models.py")
    path = write_spec({**VALID, "model": {"factory": "models.py:build"}})
    _refused(*_codes(cli("validate", str(path))), path, f"model.factory: {tmp_path / 'models.py'} is a FIFO (named "
             "pipe), not a Python file", PIPE_FIX)


def _codes(run) -> tuple[int, str]:
    return run.returncode, run.stderr


def test_a_spec_larger_than_the_limit_is_refused_after_reading_one_byte_more(tmp_path):
    from isoprobe.spec.safe_read import Refused, read_regular_file

    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * 2_000_000)
    _refused(*_codes(cli("validate", str(path))), path, "larger than 1000000 bytes: not a spec file")
    path.write_bytes(b"x" * 10)
    assert read_regular_file(path, 10, what="a file") == b"x" * 10
    with pytest.raises(Refused, match="larger than 9 bytes: not a file"):
        read_regular_file(path, 9, what="a file")


# --------------------------------------------------------------------------- class 9: numbers, depth, values

HUGE = "9" * 5000
ZEROS = "1" + "0" * 400
DIGITS_FIX = "a spec's numbers are batch sizes, steps"


@pytest.mark.parametrize(("extra", "token", "message"), [
    ({"search": {"steps": "RAW"}}, HUGE,
     "search.steps: a number with 5000 digits is far beyond any value a spec takes"),
    ({"search": {"max_batch_size": "RAW"}}, HUGE, "search.max_batch_size: a number with 5000 digits"),
    ({"model": {"torchvision": "resnet18", "kwargs": {"num_classes": "RAW"}}}, HUGE,
     "model.kwargs.num_classes: a number with 5000 digits"),
    ({"input": {"shape": [3, "RAW", 8]}}, HUGE, "input.shape.1: a number with 5000 digits"),
    ({"recommendation": {"headroom": "RAW"}}, ZEROS, "recommendation.headroom: a number with 401 digits"),
    ({"recommendation": {"headroom": "RAW"}}, "0x" + "f" * 5000, "recommendation.headroom: a number with 5002 digits"),
    ({"memory_budget": "RAW"}, ":".join(["1"] * 2000), "memory_budget: a number with 2000 digits"),  # base 60
    ({"search": {"trial_timeout": "RAW"}}, "1.0e+400", "search.trial_timeout: '1.0e+400' is not a finite number"),
    ({"search": {"trial_timeout": "RAW"}}, ".inf", "search.trial_timeout: '.inf' is not a finite number"),
    ({"recommendation": {"headroom": "RAW"}}, "-.inf", "recommendation.headroom: '-.inf' is not a finite number"),
    ({"memory_budget": "RAW"}, ".NaN", "memory_budget: '.NaN' is not a finite number"),
    ({"recommendation": {"throughput_tolerance": "RAW"}}, ".nan",
     "recommendation.throughput_tolerance: '.nan' is not a"),
    ({"optimizer": {"kwargs": {"betas": [0.9, "RAW"]}}}, ".inf",
     "optimizer.kwargs.betas.1: '.inf' is not a finite number"),
])
def test_a_number_no_field_can_take_is_refused_with_its_field(tmp_path, extra, token, message):
    """``token`` is written into the YAML as it is: yaml.safe_dump itself cannot write an integer of 5000 digits."""
    text = yaml.safe_dump({**VALID, **extra}).replace("RAW", token)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    _refused(*_codes(cli("validate", str(path))), path, message, DIGITS_FIX)


def test_a_mapping_key_of_5000_digits_is_named_shortly(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(VALID) + f"? {HUGE}\n: 1\n")  # an explicit key: a plain one ends at 1024 characters
    run = cli("validate", str(path))
    _refused(*_codes(run), path, "99999999999999999999...(5000 characters): a number with 5000 digits", DIGITS_FIX)
    assert len(run.stderr) < 500


@pytest.mark.parametrize(("value", "message"), [
    (f'"{ZEROS}GiB"', "memory_budget: '10000000000000000000000000000... (406 characters) is more than 1 PiB"),
    (f'"{HUGE}"', "memory_budget: '99999999999999999999999999999... (5002 characters) is more than 1 PiB"),
    ("1000000000000000000000", "memory_budget: 1000000000000000000000 is more than 1 PiB: not a memory size"),
    ("'2000 TiB'", "memory_budget: '2000 TiB' is more than 1 PiB: not a memory size"),
])
def test_a_size_that_overflows_a_float_is_more_than_a_pib(tmp_path, value, message):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(VALID) + f"memory_budget: {value}\n")
    _refused(*_codes(cli("validate", str(path))), path, message, "Memory the trial may use")


@pytest.mark.parametrize("value", [f'"{ZEROS}GiB"', "1000000000000000000000000"])
def test_a_headroom_beyond_any_memory_is_refused(tmp_path, value):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(VALID) + f"recommendation: {{headroom: {value}}}\n")
    run = cli("validate", str(path))
    _refused(*_codes(run), path, "recommendation.headroom: ", "Memory to keep free below the capacity")
    assert "is more than 1 PiB: not a memory size" in run.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--memory-budget", f"{ZEROS}GiB"], "memory_budget (from --memory-budget): '10000000000000000000000000000..."),
    (["--memory-budget", HUGE], "memory_budget (from --memory-budget): '99999999999999999999999999999..."),
    (["--max-batch-size", HUGE], "search.max_batch_size (from --max-batch-size): Input should be a valid integer"),
    (["--max-batch-size", "lots"], "search.max_batch_size (from --max-batch-size): Input should be a valid integer"),
])
def test_an_absurd_override_is_a_spec_error_naming_its_flag(write_spec, flags, message):
    path = write_spec(VALID)
    run = cli("validate", str(path), *flags)
    _refused(*_codes(run), path, message)
    assert len(run.stderr) < 500  # the value is shown shortened, not 5000 digits long


def test_an_absurd_fallback_batch_size_is_a_short_usage_error():
    run = cli("run", str(SMALL_CNN), "--format", "env", "--fallback-batch-size", HUGE)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "is not a batch size; give a whole number such as 8" in run.stderr
    assert len(run.stderr) < 1000


def test_the_max_batch_size_flag_still_takes_a_number(write_spec):
    from isoprobe.spec.load import load_spec

    assert load_spec(write_spec(VALID), {"--max-batch-size": "64"}).search.max_batch_size == 64
    assert cli("validate", str(write_spec(VALID)), "--max-batch-size", "64").returncode == 0


@pytest.mark.parametrize(("terms", "error"), [(200_000, "RecursionError")])
def test_a_factory_too_deep_for_pythons_parser_is_a_spec_error(tmp_path, write_spec, terms, error):
    (tmp_path / "models.py").write_text("x = " + "+".join(["1"] * terms) + "\n\ndef build():\n    return x\n")
    path = write_spec({**VALID, "model": {"factory": "models.py:build"}})
    _refused(*_codes(cli("validate", str(path))), path,
             f"model.factory: {tmp_path / 'models.py'} is nested too deeply for Python's parser ({error})",
             "split the long expression")


def test_a_factory_with_a_nul_byte_is_a_spec_error(tmp_path, write_spec):
    (tmp_path / "models.py").write_bytes(b"def build():\n    return 1\x00\n")
    path = write_spec({**VALID, "model": {"factory": "models.py:build"}})
    _refused(*_codes(cli("validate", str(path))), path, "model.factory: ")


@pytest.mark.parametrize(("text", "message"), [
    ("!!float abc", "model.kwargs.x: cannot read 'abc': could not convert string to float: 'abc'"),
    ("!!set {a, b}", "model.kwargs.x: YAML's !!set makes a value that a spec cannot hold"),
    ("!!omap [{a: 1}]", "model.kwargs.x: YAML's !!omap makes a value that a spec cannot hold"),
])
def test_a_value_yaml_cannot_build_or_json_cannot_carry_is_named(tmp_path, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(f"model: {{torchvision: resnet18, kwargs: {{x: {text}}}}}\ninput: {{shape: [3]}}\n"
                    "target: {classes: 2}\n")
    _refused(*_codes(cli("validate", str(path))), path, message, "write plain values")


def test_an_impossible_date_stays_text(tmp_path):
    """YAML reads 2001-13-45 as a timestamp, and datetime raised ValueError: a date is kept as the text written."""
    from isoprobe.spec.load import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text("model: {torchvision: resnet18, kwargs: {a: 2001-13-45, b: 2024-01-31}}\ninput: {shape: [3]}\n"
                    "target: {classes: 2}\n")
    assert load_spec(path).model.kwargs == {"a": "2001-13-45", "b": "2024-01-31"}


def _nested(depth: int) -> str:
    """A spec whose deepest value sits ``depth`` collections down: the top mapping, model, kwargs, then lists."""
    inner = "[" * (depth - 3) + "1" + "]" * (depth - 3)  # the lists start at column 44
    return f"model: {{torchvision: resnet18, kwargs: {{x: {inner}}}}}\ninput: {{shape: [3]}}\ntarget: {{classes: 2}}\n"


def test_nesting_is_bounded_exactly_at_the_limit(tmp_path):
    from isoprobe.spec.load import load_spec
    from isoprobe.spec.yaml_file import MAX_SPEC_DEPTH

    path = tmp_path / "spec.yaml"
    path.write_text(_nested(MAX_SPEC_DEPTH))
    assert load_spec(path).model.kwargs["x"] is not None
    path.write_text(_nested(MAX_SPEC_DEPTH + 1))
    _refused(*_codes(cli("validate", str(path))), path,
             f"line 1, column {44 + MAX_SPEC_DEPTH - 3}: nested too deeply to be a spec "
             f"(more than {MAX_SPEC_DEPTH} levels)")


@pytest.mark.parametrize(("text", "where"), [
    ("[" * 500_000, "line 1, column 33"),                 # half a megabyte of '[': refused at the 33rd
    ("a:\n" + "- " * 100_000 + "x\n", "line 2, column 65"),  # block sequences, one inside the next: the 32nd
    ("".join(f"{' ' * i}k{i}:\n" for i in range(60)), "line 33, column 36"),  # block mappings by indentation: k32
])
def test_deep_nesting_is_refused_where_it_passes_the_limit(tmp_path, text, where):
    """The refusal comes where the 33rd level opens, whatever follows: not after scanning (and recursing) it all."""
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    _refused(*_codes(cli("validate", str(path))), path, f"{where}: nested too deeply to be a spec")


def _deep(levels: int, key: str = "a") -> dict:
    """A dict ``levels`` mappings deep (built iteratively: no recursion limit stops it)."""
    top = node = {}
    for _ in range(levels - 1):
        node[key] = {}
        node = node[key]
    return top


def _self_containing() -> dict:
    loop: dict = {}
    loop["again"] = loop
    return loop


DEEP_SET = "model.kwargs." + ".".join(["a"] * 300) + "=1"


@pytest.mark.parametrize("command", ["validate", "run", "estimate"])
def test_a_set_path_hundreds_of_levels_deep_is_exit_2_before_anything_runs(command):
    """It passed validation ('valid') and then crashed serializing the spec: the file's nesting rule now holds."""
    code, stderr = _codes(cli(command, str(SMALL_CNN), "--set", DEEP_SET))
    _refused(code, stderr, SMALL_CNN, "model.kwargs.a.a.a.a... (from --set model.kwargs.a.a.a.a",
             "a spec needs a few levels")
    assert f"more than {MAX_SPEC_DEPTH} levels" in stderr


@pytest.mark.parametrize("value", [_deep(40), _deep(200_000), _self_containing()], ids=["40", "200000", "itself"])
@pytest.mark.parametrize("source", ["probe(spec)", "probe(overrides)", "probe(max_batch_size)", "load_spec(sets)"])
def test_deep_data_from_every_source_is_a_spec_error_naming_where_it_came_from(source, value):
    from isoprobe import probe
    from isoprobe.errors import SpecError
    from isoprobe.spec.load import load_spec

    spec = yaml.safe_load(SMALL_CNN.read_text())
    spec["model"]["factory"] = str(REPO / "specs" / "tiny_models.py:small_cnn")
    call = {
        "probe(spec)": lambda: probe({**spec, "model": {**spec["model"], "kwargs": {"deep": value}}}, quiet=True),
        "probe(overrides)": lambda: probe(SMALL_CNN, overrides={"model.kwargs.deep": value}, quiet=True),
        "probe(max_batch_size)": lambda: probe(SMALL_CNN, max_batch_size=value, quiet=True),
        "load_spec(sets)": lambda: load_spec(SMALL_CNN, {"model.kwargs.deep": value}, sets=["search.steps=3"]),
    }[source]
    with pytest.raises(SpecError) as info:
        call()
    [problem] = info.value.problems
    assert problem.message == f"nested too deeply to be a spec (more than {MAX_SPEC_DEPTH} levels)"
    named = {"probe(spec)": "model.kwargs.deep.", "probe(max_batch_size)": "search.max_batch_size."}
    assert problem.field.startswith(named.get(source, "model.kwargs.deep.")), problem.field
    if source != "probe(spec)":  # an override: named by where it came from
        assert "(from " in problem.field


def test_data_is_bounded_exactly_where_the_file_is():
    """The same depth passes from a dict as from the YAML file (test_nesting_is_bounded_exactly_at_the_limit)."""
    from isoprobe.errors import SpecError
    from isoprobe.spec.load import load_spec

    # The top mapping, model and kwargs are three levels: kwargs.x is the fourth.
    assert load_spec(SMALL_CNN, {"model.kwargs.x": _deep(MAX_SPEC_DEPTH - 3)}).model.kwargs["x"]
    with pytest.raises(SpecError):
        load_spec(SMALL_CNN, {"model.kwargs.x": _deep(MAX_SPEC_DEPTH - 2)})


@pytest.mark.parametrize(("value", "message"), [
    (object(), "a value of type object is not one a spec can hold"),
    ({1, 2}, "a value of type set is not one a spec can hold"),
    (b"bytes", "a value of type bytes is not one a spec can hold"),
    (float("inf"), "inf is not a finite number"),
    (10**5000, "a number with 5001 digits is far beyond any value a spec takes"),
], ids=["object", "set", "bytes", "inf", "5001-digits"])
def test_a_python_value_json_cannot_carry_is_refused_as_the_file_refuses_it(value, message):
    """They passed validation (kwargs takes anything) and crashed serializing the spec, or reached the child."""
    from isoprobe.errors import SpecError
    from isoprobe.spec.load import load_spec

    with pytest.raises(SpecError) as info:
        load_spec(SMALL_CNN, {"model.kwargs.x": value})
    [problem] = info.value.problems
    assert problem.field == "model.kwargs.x (from overrides['model.kwargs.x'])" and problem.message.startswith(message)


def test_a_tuple_from_python_is_read_as_the_list_json_makes_of_it():
    from isoprobe.spec.load import load_spec

    assert load_spec(SMALL_CNN, {"input.shape": (3, 32, 32), "model.kwargs.pair": (1, 2)}).input.shape == [3, 32, 32]


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.integers(min_value=-(10**600), max_value=10**600),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet="0123456789.eE+- kKmMgGiIbBtT", max_size=50),
    st.integers(0, 5000).map(lambda n: "1" + "0" * n + "GiB"),
    st.booleans(),
))
def test_parse_bytes_gives_a_size_or_a_value_error_for_anything(value):
    from isoprobe.spec.units import parse_bytes

    try:
        size = parse_bytes(value)
    except ValueError as error:
        assert len(str(error)) < 300
        return
    assert isinstance(size, int) and size >= 1


# --------------------------------------------------------------------------- class 10: outputs that fail


def _fake_answer(monkeypatch, *, fail: OSError | None = None, progress: int = 3):
    """Stand in for the probe (``isoprobe.pipeline.answer.answer``): say some progress, then answer or raise."""
    import isoprobe.pipeline.answer
    from isoprobe.report.result import Result

    def answer(spec, spec_path, reporter, **options):
        for index in range(progress):
            reporter.note(f"progress {index}")
        if fail is not None:
            raise fail
        return Result.model_validate_json(RESULT.read_text())

    monkeypatch.setattr(isoprobe.pipeline.answer, "answer", answer)


NO_SPACE = OSError(errno.ENOSPC, "No space left on device", "/tmp/isoprobe-x/trial-2.request.json")


def test_a_log_on_a_full_device_costs_the_log_not_the_answer(monkeypatch):
    _fake_answer(monkeypatch)
    run = cli("run", str(SMALL_CNN), "--format", "json", "--log", "/dev/full")
    assert run.returncode == 0, run.stderr
    assert run.json["max_batch_size"] == json.loads(RESULT.read_text())["max_batch_size"]  # the answer came through
    assert "Traceback" not in run.stderr
    warnings = [line for line in run.stderr.splitlines() if "--log /dev/full" in line]
    assert warnings == ["isoprobe: --log /dev/full: cannot write (No space left on device); the log stops here, "
                        "the run goes on"]
    assert "isoprobe: progress 2" in run.stderr  # stderr keeps getting the progress


def test_hook_mode_gives_the_fallback_when_the_probe_and_the_log_both_fail(monkeypatch):
    _fake_answer(monkeypatch, fail=NO_SPACE)
    run = cli("run", str(SMALL_CNN), "--format", "env", "--fallback-batch-size", "8", "--log", "/dev/full")
    assert run.returncode == 0, run.stderr
    assert "export ISOPROBE_BATCH_SIZE=8" in run.stdout.splitlines()
    assert "export ISOPROBE_FALLBACK=1" in run.stdout.splitlines()
    assert "No space left on device" in run.stdout  # the warning the job's stderr gets, through eval
    assert "Traceback" not in run.stderr


def test_hook_mode_runs_without_a_log_it_cannot_open(monkeypatch, tmp_path):
    _fake_answer(monkeypatch)
    log = tmp_path / "no-such-folder" / "probe.log"
    run = cli("run", str(SMALL_CNN), "--format", "env", "--fallback-batch-size", "8", "--log", str(log))
    assert run.returncode == 0, run.stderr
    assert "export ISOPROBE_FALLBACK=1" not in run.stdout  # the probe's answer, not the fallback
    assert f"isoprobe: --log {log}: cannot open (No such file or directory); running without the log" in run.stderr
    without_hook = cli("run", str(SMALL_CNN), "--format", "env", "--log", str(log))
    assert without_hook.returncode == 2 and f"--log {log}: No such file or directory" in without_hook.stderr


def test_a_log_that_is_a_fifo_with_no_reader_does_not_block(tmp_path):
    """A real process: opening a FIFO for writing blocks until a reader comes (it did, for ever)."""
    os.mkfifo(tmp_path / "log")
    (tmp_path / "bad.yaml").write_text("model: [\n")
    done = _isoprobe("run", str(tmp_path / "bad.yaml"), "--format", "env", "--fallback-batch-size", "8",
                     "--log", str(tmp_path / "log"), timeout=30)
    assert done.returncode == 0, done.stderr
    assert "export ISOPROBE_BATCH_SIZE=8" in done.stdout.splitlines()
    assert f"--log {tmp_path / 'log'}: cannot open (No such device or address); running without the log" in done.stderr


def test_an_os_error_out_of_the_probe_is_one_line_and_exit_4(monkeypatch):
    _fake_answer(monkeypatch, fail=NO_SPACE)
    run = cli("run", str(SMALL_CNN), "--format", "json")
    assert run.returncode == 4, run.stderr
    assert "Traceback" not in run.stderr
    said = ("the probe stopped: No space left on device (/tmp/isoprobe-x/trial-2.request.json); a trial keeps its "
            "files in TMPDIR: free space there or point TMPDIR at a folder with room")
    assert run.stderr.splitlines()[-1] == f"isoprobe: {said}"
    stopped = json.loads(run.stdout)  # and the stop's document (issue 56), which said nothing before
    assert stopped["stop_reason"] == "error" and stopped["message"] == said


@pytest.mark.parametrize("args", [
    ["validate", "specs/small-cnn.yaml"],
    ["schema"],
    ["show", str(RESULT)],
    ["show", str(RESULT), "--format", "env"],
])
def test_stdout_on_a_full_device_is_one_line_and_exit_74(args):
    with open("/dev/full", "w") as full:
        done = _isoprobe(*args, stdout=full)
    assert done.returncode == 74, done.stderr
    assert done.stderr == "isoprobe: cannot write the result to stdout: No space left on device\n"


def test_hook_mode_cannot_hide_that_the_fallback_did_not_reach_the_job(tmp_path):
    """With stdout gone, a job would go on without ISOPROBE_BATCH_SIZE: exit 74 tells it, and so does the log."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    log = tmp_path / "probe.log"
    with open("/dev/full", "w") as full:
        done = _isoprobe("run", str(bad), "--format", "env", "--fallback-batch-size", "8", "--log", str(log),
                         stdout=full)
    assert done.returncode == 74, done.stderr
    assert "Traceback" not in done.stderr
    last = ("isoprobe: cannot write the fallback batch size to stdout (the job gets no ISOPROBE_BATCH_SIZE): "
            "No space left on device")
    assert done.stderr.splitlines()[-1] == last
    assert log.read_text().splitlines()[-1] == last


def test_hook_mode_with_stderr_on_a_full_device_still_gives_the_fallback(tmp_path):
    """stderr is for people; when it cannot be written there is nobody to tell, and the job still gets its lines."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    with open("/dev/full", "w") as full:
        done = _isoprobe("run", str(bad), "--format", "env", "--fallback-batch-size", "8", stderr=full)
    assert done.returncode == 0
    assert "export ISOPROBE_BATCH_SIZE=8" in done.stdout.splitlines()


def test_plot_to_a_full_device_is_exit_74():
    pytest.importorskip("matplotlib")
    done = _isoprobe("plot", str(RESULT), "-o", "/dev/full")
    assert done.returncode == 74, done.stderr
    assert done.stderr.splitlines()[-1].startswith("isoprobe: cannot write the plot /dev/full: ")
    assert "Traceback" not in done.stderr
