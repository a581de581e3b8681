"""The contract between parent and child: requests and events round-trip through JSON, and anything
that is not a complete, valid event line is dropped, never guessed at. No process is started here."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

import isoprobe
from isoprobe.protocol import messages as protocol
from isoprobe.protocol.command import CommandSeen
from isoprobe.report.outcomes import Outcome
from isoprobe.report.rank_progress import RankProgress
from isoprobe.protocol.messages import (
    CudaDevice,
    DataScanning,
    Estimate,
    Estimated,
    EvalDone,
    Facts,
    Forwarded,
    Imported,
    InspectProblem,
    InspectRequest,
    Inspected,
    MemoryReading,
    ModelBuilt,
    RequestReceived,
    Started,
    StepDone,
    TrialRequest,
    TrialResult,
    Warm,
    event_line,
    last_of,
    parse_events,
    read_events,
    read_request,
    request_json,
)
from isoprobe.report.trial import Applied, ErrorInfo, Sizes
from isoprobe.spec.model import Spec

GiB = 1024**3


def _spec() -> Spec:
    return Spec.model_validate({
        "model": {"torchvision": "resnet18", "kwargs": {"num_classes": 10}},
        "input": {"shape": [3, 32, 32]},
        "target": {"classes": 10},
        "optimizer": {"name": "adam", "kwargs": {"lr": 0.001}},
        "search": {"steps": 3, "start_batch_size": 4},
        "training": {"precision": "bf16-mixed"},
        "device": "cpu",
        "memory_budget": "2GiB",
    })


_REMOVED = object()


def tampered(original, /, **fields) -> bytes:
    """A line as a broken child might write it: a valid event's JSON with some fields changed or removed."""
    document = json.loads(event_line(original))
    for name, value in fields.items():
        if value is _REMOVED:
            del document[name]
        else:
            document[name] = value
    return json.dumps(document).encode() + b"\n"


#: One of every event, with every nested model filled in.
EVERY_EVENT = [
    Started(pid=4242),
    Warm(modules=["torch", "torch._dynamo"], seconds=2.5, cuda_initialized=False, idle_priority=True),
    RequestReceived(path="/tmp/isoprobe-x/trial001-b4.request.json"),
    Imported(memory=MemoryReading(peak_rss=1, rss=2, data=3, peak_data=4)),
    ModelBuilt(memory=MemoryReading(rss=5)),
    StepDone(step=1, seconds=0.25),
    EvalDone(seconds=0.5),
    TrialResult(
        outcome=Outcome.FITS, phase="done", step_seconds=[0.3, 0.2, 0.21], peak_bytes=3 * GiB,
        peak_allocated_bytes=2 * GiB, budget_peak_bytes=3 * GiB - 1, base_bytes=GiB, total_memory_bytes=16 * GiB,
        sizes=Sizes(parameter_bytes=1, gradient_bytes=2, optimizer_state_bytes=3, cuda_context_bytes=4,
                    reserved_unallocated_bytes=5),
        compile_seconds=1.5, eval_seconds=0.5,
        applied=Applied(mode="train", precision="bf16-mixed", output_dtype="bfloat16", grad_scaler=False,
                        checkpointing="blocks", checkpointed_blocks=4),
    ),
    TrialResult(outcome=Outcome.OUT_OF_MEMORY, phase="step 2",
                error=ErrorInfo(type="torch.OutOfMemoryError", message="CUDA out of memory.", traceback_tail="...")),
    Inspected(
        facts=Facts(
            torch_version="2.5.1", torchvision_version="0.20.1", library_versions={"timm": "1.0"},
            cuda_version="12.4", cuda_available=True,
            cuda_devices=[CudaDevice(name="NVIDIA H100", total_memory_bytes=80 * GiB, free_memory_bytes=79 * GiB)],
            memory_before_import=MemoryReading(data=1), memory_after_import=MemoryReading(data=900 * 1024**2),
            parameter_count=11_000_000, parameter_bytes=44_000_000, checkpointing=("blocks", 4),
            meta_build_warning="w1", meta_forward_warning="w2",
        ),
        problems=[InspectProblem(stage="optimizer", type="TypeError", message="unexpected keyword 'betas_typo'")],
    ),
    Estimated(estimate=Estimate(fixed_bytes=900 * 1024**2, per_sample_bytes=3.5e6, traced_batch_sizes=[64, 128],
                                traced_peak_bytes=[1, 2], parameter_bytes=4, gradient_bytes=4,
                                optimizer_state_bytes=8, buffer_bytes=0, baseline_bytes=5, runtime_bytes=6,
                                seconds=0.4, note="n")),
    Forwarded(step=2),
    DataScanning(stage="scanning", samples=10**9, scanning=1000),
    CommandSeen(processes=[RankProgress(pid=11, rank=0, world_size=2, steps=3, forward="returned"),
                           RankProgress(pid=12, rank=1, world_size=2, steps=2, ended=True)],
                stdout_tail="rank 0 step 3", stderr_tail="rank 1: waiting"),
]


# --------------------------------------------------------------------------- requests


def test_a_trial_request_carries_the_typed_spec_and_equals_itself_after_a_round_trip(tmp_path):
    spec = _spec()
    request = TrialRequest(spec=spec, batch_size=4, device="cpu", memory_budget_bytes=2 * GiB,
                           python_path=["/some/folder"])
    path = tmp_path / "request.json"
    path.write_text(request_json(request))
    back = read_request(path)
    assert isinstance(back, TrialRequest)
    assert back == request
    assert isinstance(back.spec, Spec) and back.spec == spec
    assert back.spec.training.precision == "bf16-mixed"  # the child reads the spec's values, typed
    assert back.memory_budget_bytes == 2 * GiB and back.python_path == ["/some/folder"]


def test_an_inspect_request_round_trips_and_is_told_apart_by_its_mode(tmp_path):
    request = InspectRequest(spec=_spec(), python_path=["/a", "/b"])
    path = tmp_path / "inspect.json"
    path.write_text(request_json(request))
    back = read_request(path)
    assert isinstance(back, InspectRequest) and back == request
    assert json.loads(request_json(request))["mode"] == "inspect"
    trial = TrialRequest(spec=_spec(), batch_size=1, device="cuda:0")
    assert json.loads(request_json(trial))["mode"] == "trial"


@pytest.mark.parametrize(
    "change",
    [
        {"batch_size": 0},                 # at least 1
        {"mode": "train"},                 # no such request
        {"surprise": 1},                   # strict: same-version parent and child only
        {"spec": {"model": {"torchvision": "resnet18"}}},  # the spec is validated again, typed
    ],
)
def test_a_malformed_request_is_refused(tmp_path, change):
    document = json.loads(request_json(TrialRequest(spec=_spec(), batch_size=4, device="cpu")))
    document.update(change)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValidationError):
        read_request(path)


def test_messages_are_frozen():
    request = TrialRequest(spec=_spec(), batch_size=4, device="cpu")
    with pytest.raises(ValidationError):
        request.batch_size = 8
    with pytest.raises(ValidationError):
        Started(pid=1).pid = 2


# --------------------------------------------------------------------------- events


@pytest.mark.parametrize("event", EVERY_EVENT, ids=lambda e: f"{e.event}")
def test_every_event_round_trips_through_one_json_line(event):
    line = event_line(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line, written with one write
    assert parse_events(line) == [event]
    [back] = parse_events(line)
    assert type(back) is type(event)


def test_every_event_kind_is_covered_above():
    union, _ = get_args(protocol.Event)  # Annotated[Union[...], Field(discriminator="event")]
    assert set(get_args(union)) == {type(e) for e in EVERY_EVENT}


def test_events_in_sequence_keep_their_order(tmp_path):
    path = tmp_path / "child001.events.jsonl"
    path.write_bytes(b"".join(event_line(e) for e in EVERY_EVENT))
    assert read_events(path) == EVERY_EVENT
    assert last_of(EVERY_EVENT, TrialResult) == EVERY_EVENT[8]
    assert last_of(EVERY_EVENT, Warm) == EVERY_EVENT[1]
    assert last_of(EVERY_EVENT[:3], TrialResult) is None


def test_read_events_keeps_only_complete_valid_event_lines(tmp_path):
    path = tmp_path / "trial.events.jsonl"
    good = [Started(pid=1), StepDone(step=1, seconds=0.1), TrialResult(outcome=Outcome.FITS, phase="done")]
    cut = event_line(StepDone(step=2, seconds=0.1))
    dying = event_line(TrialResult(outcome=Outcome.OUT_OF_MEMORY, phase="step 2"))
    data = b"".join(
        [
            event_line(good[0]),
            b"this is not json\n",
            b"\xff\xfe\x00\x81binary junk\x00\n",
            event_line(good[1]),
            b"[1, 2, 3]\n",            # JSON, but not an object
            b"42\n",
            b"{}\n",                   # an object, but no event
            b"\n",                     # empty line
            cut[: len(cut) // 2] + b"\n",  # cut in the middle, then more was written
            event_line(good[2]),
            dying[: len(dying) - 10],  # the child died mid-write
        ]
    )
    path.write_bytes(data)
    assert read_events(path) == good


def test_unknown_events_are_dropped():
    data = event_line(Started(pid=1)) + tampered(Started(pid=1), event="note") + event_line(EvalDone(seconds=1.0))
    assert [e.event for e in parse_events(data)] == ["started", "eval"]


@pytest.mark.parametrize(
    "line",
    [
        tampered(StepDone(step=1, seconds=0.1), step="one"),            # a field of the wrong type
        tampered(StepDone(step=1, seconds=0.1), seconds=_REMOVED),      # a required field missing
        tampered(StepDone(step=1, seconds=0.1), extra="surprise"),      # a field no event has (strict)
        tampered(Started(pid=1), event="STARTED"),                      # kinds are exact
        tampered(TrialResult(outcome=Outcome.FITS, phase="done"), outcome="crashed"),  # not a child's verdict
        tampered(TrialResult(outcome=Outcome.FITS, phase="done"), phase=_REMOVED),
        tampered(Imported(memory=MemoryReading()), memory={"rss": "lots"}),  # a nested field
        tampered(Inspected(facts=Facts(torch_version="2.5")), problems=[{"stage": "nowhere", "type": "X",
                                                                         "message": "m"}]),
    ],
    ids=["wrong-type", "missing-field", "unknown-field", "kind-case", "not-a-childs-verdict", "missing-phase",
         "nested-field", "unknown-stage"],  # stable ids: the lines carry the time they were made
)
def test_events_with_invalid_fields_are_dropped(line):
    keep = Started(pid=7)
    assert parse_events(event_line(keep) + line + event_line(keep)) == [keep, keep]


def test_read_events_drops_a_complete_looking_last_line_without_newline(tmp_path):
    path = tmp_path / "e.jsonl"
    started = Started(pid=1)
    path.write_bytes(event_line(started) + event_line(TrialResult(outcome=Outcome.FITS, phase="done"))[:-1])
    assert read_events(path) == [started]


def test_read_events_missing_file_is_empty(tmp_path):
    assert read_events(tmp_path / "never-written.jsonl") == []


def test_read_events_empty_file(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"")
    assert read_events(path) == []


def test_read_events_survives_absurdly_nested_json(tmp_path):
    path = tmp_path / "events.jsonl"
    started = Started(pid=1)
    path.write_bytes(b"[" * 100000 + b"\n" + b'{"event": ' * 100000 + b"\n" + event_line(started))
    assert read_events(path) == [started]


# --------------------------------------------------------------------------- the names


_NAMES = {
    "CHILD_MODULE": "isoprobe.child",
    "WAIT_ARGUMENT": "--wait",
    "EVENTS_ENV": "ISOPROBE_EVENTS",
    "LIFELINE_ENV": "ISOPROBE_LIFELINE_FD",
    "PRELOAD_ENV": "ISOPROBE_PRELOAD",
}


def test_the_names_that_wire_a_child_to_its_parent():
    assert {name: getattr(protocol, name) for name in _NAMES} == _NAMES


def test_the_names_are_defined_once_in_the_wiring():
    """No other module of the package spells them out: both sides import them from isoprobe.protocol.wiring (the child,
    before it imports pydantic) or from isoprobe.protocol.messages, which re-exports them."""
    package = Path(isoprobe.__file__).resolve().parent
    values = set(_NAMES.values())
    spelled = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "protocol" / "wiring.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in values:
                spelled.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r}")
    assert spelled == []


def test_a_childs_crashed_verdict_is_taken_only_for_a_commands_lost_rank():
    """A child never says it crashed (how it ended says so), except a command trial's supervisor, which ran on
    after a rank of the command was lost to a signal and names it (issue 47)."""
    from isoprobe.protocol.messages import RANK_LOST
    from isoprobe.report.trial import ErrorInfo

    lost = ErrorInfo(type=RANK_LOST, message="rank 1 (pid 7) of the command was killed by SIGKILL", traceback_tail="")
    assert TrialResult(outcome=Outcome.CRASHED, phase="step 2", error=lost).outcome is Outcome.CRASHED
    with pytest.raises(ValueError):
        TrialResult(outcome=Outcome.CRASHED, phase="step 2")
    with pytest.raises(ValueError):
        TrialResult(outcome=Outcome.CRASHED, phase="step 2", error=lost.model_copy(update={"type": "ValueError"}))
