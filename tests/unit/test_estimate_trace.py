"""The memory estimate: the traced line of tiny models, clean fallbacks, and the parent's pure reading of it.

The trace runs in-process here (fake tensors: no memory, about a second for the
first trace's imports); the real children's estimate is in
tests/integration/test_estimate.py.
"""

from __future__ import annotations

import pytest

from isoprobe.pipeline.prediction import predicted_max, prediction, prior_of
from isoprobe.protocol.messages import Estimate, Facts
from isoprobe.spec.model import Spec

torch = pytest.importorskip("torch")

from isoprobe.child.core import estimate as child_estimate  # noqa: E402


def _spec(factory: str, tmp_path, **extra) -> Spec:
    fields = {"model": {"factory": factory}, "input": {"shape": [16]}, "target": {"classes": 4},
              "optimizer": {"name": "adam"}, "device": "cpu"}
    fields.update(extra)
    return Spec.model_validate(fields)


MODELS = '''
import torch
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 4))

class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(16, 4)

    def forward(self, x):
        keep = int((x > 0).sum().item())  # a value read back: fake tensors have none
        return self.layer(x)[: max(keep, 1)]

def data_dependent():
    return DataDependent()

class Cloned(nn.Module):
    """Three deep copies of one layer, as nn.TransformerEncoder builds its depth; truncated-normal init."""
    def __init__(self):
        super().__init__()
        import copy
        layer = nn.Linear(16, 16)
        nn.init.trunc_normal_(layer.weight, std=0.02)  # samples by rejection: reads values back
        self.blocks = nn.ModuleList([copy.deepcopy(layer) for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        if not hasattr(self, "shadow"):  # an EMA-like copy of the whole model, taken mid-step
            import copy
            object.__setattr__(self, "shadow", copy.deepcopy(self.blocks))
        return self.head(x)

def cloned():
    return Cloned()

class Drawn(torch.utils.data.Dataset):
    """A dataset as users write one: each sample drawn from a generator seeded by its index."""
    def __len__(self):
        return 1000
    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=g), int(torch.randint(0, 4, (1,), generator=g))  # a value read back

def drawn_batch(batch_size, device):
    data = Drawn()
    images, labels = torch.utils.data.default_collate([data[i] for i in range(batch_size)])
    return (images.to(device), {"scale": torch.ones(1)}), labels.to(device)

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()
    def forward(self, x, extra):
        return self.net(x * extra["scale"])

def scaled():
    return Scaled()
'''


@pytest.fixture
def models(tmp_path):
    (tmp_path / "est_models.py").write_text(MODELS)
    return tmp_path


def test_an_mlp_traces_to_its_known_line(models):
    spec = _spec(str(models / "est_models.py") + ":mlp", models)
    found = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=None)
    assert found.note is None and found.per_sample_bytes is not None
    parameters = (16 * 256 + 256 + 256 * 4 + 4) * 4
    assert found.parameter_bytes == found.gradient_bytes == parameters
    assert found.optimizer_state_bytes == 2 * parameters  # Adam: two moments per parameter
    # Per sample the step keeps at least the hidden layer's output and its ReLU (2 x 256 floats).
    assert 2 * 256 * 4 <= found.per_sample_bytes <= 16 * 256 * 4
    # At the activations' peak (the backward) the parameters and Adam's state are alive, and some of the
    # gradients: the line's intercept holds at least the first two (no baseline on this call).
    assert 3 * parameters <= found.fixed_bytes <= 12 * parameters
    assert found.traced_batch_sizes == list(child_estimate.FIRST_BATCHES)


def test_a_batch_maker_that_draws_real_data_is_traced_at_the_batch_sizes_the_line_needs(models):
    """Issue 35: model.batch ran inside the fake mode, so a maker that reads a value back (a seeded dataset's
    int label, a file) failed the trace ('DataDependentOutputException'), and the search started at the start
    batch. The maker now runs for real at 2 and 3 samples; the tensors that grow with the batch are traced at
    the trace's sizes, the others keep their shape (here a 1-element scale)."""
    spec = _spec(str(models / "est_models.py") + ":scaled", models,
                 model={"factory": str(models / "est_models.py") + ":scaled",
                        "batch": str(models / "est_models.py") + ":drawn_batch"})
    found = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=None)
    assert found.note is None and found.per_sample_bytes is not None
    plain = child_estimate.estimate(torch, _spec(str(models / "est_models.py") + ":mlp", models), [str(models)],
                                    torch.device("cpu"), baseline_bytes=None)
    # The same network on the same input size: the same cost per sample, within the scale's product.
    assert plain.per_sample_bytes <= found.per_sample_bytes <= plain.per_sample_bytes + 2 * 16 * 4


def test_deep_copies_and_initialisers_that_read_values_are_traced_and_the_copies_counted(models):
    """A deep copy of a fake tensor lands in a fresh fake mode (then "Mixing fake modes"), and trunc_normal_
    reads values back: measured, custom-factory, resnet18-ema-clip and vit_b_16 could not be traced. The
    copies are clones in the trace's own mode: new storage, counted as the real copies are."""
    spec = _spec(str(models / "est_models.py") + ":cloned", models)
    found = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=None)
    assert found.note is None and found.per_sample_bytes is not None, found.note
    layer, head = (16 * 16 + 16) * 4, (16 * 4 + 4) * 4
    assert found.parameter_bytes == 3 * layer + head  # three storages, not one shared
    # The shadow copy (three more layers, taken in the first forward) is live through the step: the fixed
    # part holds it on top of what the mlp's holds at the backward's peak (at least parameters and Adam's
    # state: three times the parameters; see the test above).
    assert found.fixed_bytes >= 3 * found.parameter_bytes + 3 * layer


def test_the_baseline_is_added_on_the_cpu(models):
    spec = _spec(str(models / "est_models.py") + ":mlp", models)
    without = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=None)
    with_baseline = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=10**9)
    assert with_baseline.baseline_bytes == 10**9 and with_baseline.runtime_bytes is not None
    assert with_baseline.fixed_bytes == without.fixed_bytes + 10**9 + with_baseline.runtime_bytes


def test_a_model_that_cannot_be_traced_falls_back_with_a_note(models):
    spec = _spec(str(models / "est_models.py") + ":data_dependent", models)
    found = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), baseline_bytes=None)
    assert found.per_sample_bytes is None and found.fixed_bytes is None
    assert "could not be traced" in found.note
    assert prior_of(found) is None and predicted_max(found, 10**9) is None


def test_the_trace_is_bounded_in_time(models, monkeypatch):
    spec = _spec(str(models / "est_models.py") + ":mlp", models)
    found = child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), None, time_limit=1e-4)
    assert found.per_sample_bytes is None and "took more than" in found.note


@pytest.mark.parametrize("extra, words", [
    ({"training": {"compile": True}}, "training.compile"),
    ({"training": {"precision": "fp16-mixed"}}, "fp16-mixed"),
])
def test_what_the_trace_cannot_take_is_skipped_with_a_reason(models, extra, words):
    spec = _spec(str(models / "est_models.py") + ":mlp", models, **extra)
    assert words in child_estimate.skip_reason(spec, 1000)


def test_the_prediction_reads_the_estimate():
    estimate = Estimate(fixed_bytes=1000, per_sample_bytes=10.0)
    assert predicted_max(estimate, 2000) == 100
    assert predicted_max(estimate, 500) == 0
    reported = prediction(estimate, 2000, 80)
    assert reported.predicted_max == 100 and reported.error == 0.25
    assert prediction(None, 2000, 80) is None
    missing = prediction(Estimate(note="skipped"), 2000, 80)
    assert missing.predicted_max is None and missing.error is None and missing.note == "skipped"


def test_facts_carry_the_estimate_across_the_boundary():
    facts = Facts(torch_version="2", estimate=Estimate(fixed_bytes=5, per_sample_bytes=1.5, traced_batch_sizes=[64, 128]))
    assert Facts.model_validate_json(facts.model_dump_json()) == facts


def test_the_check_stands_whatever_the_models_code_does_during_the_trace():
    """The trace runs the user's step at real batch sizes after the check's verdict: a trace that never
    reports (the model hung, exited or crashed there) costs only the estimate, and lines the model appends
    to the channel afterwards (a second 'inspected', a second estimate) are not read."""
    from isoprobe.executors import ChildRun
    from isoprobe.executors.scripted import ScriptedExecutor
    from isoprobe.protocol.messages import Estimate, Estimated, Facts, Inspected, MemoryReading, Started
    from isoprobe.pipeline.environment import inspect_environment
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, "device": "cpu"})
    honest = Facts(torch_version="2.x", memory_after_import=MemoryReading(data=800 << 20))
    forged = Facts(torch_version="forged", memory_after_import=MemoryReading(data=1))
    estimate = Estimate(fixed_bytes=900 << 20, per_sample_bytes=1e6)

    def check(*events, returncode=0):
        run = ChildRun(returncode=returncode, timed_out=False, seconds=1.0, events=[Started(pid=1), *events])
        return inspect_environment(spec, "spec.yaml", ScriptedExecutor(lambda call: None, inspected=run), [])

    died = check(Inspected(facts=honest), returncode=-9)  # killed in the trace, after its verdict
    assert died.torch_version == "2.x" and died.estimate.per_sample_bytes is None
    assert "ended the check's process (SIGKILL)" in died.estimate.note and "without one" not in died.estimate.note
    kept = check(Inspected(facts=honest), Estimated(estimate=estimate), Inspected(facts=forged),
                 Estimated(estimate=Estimate(fixed_bytes=1, per_sample_bytes=1.0)))
    assert kept.torch_version == "2.x" and kept.estimate == estimate


def test_search_estimate_false_skips_the_trace_and_says_why():
    from isoprobe.child.core.estimate import skip_reason
    from isoprobe.spec.model import Spec

    raw = {"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]}, "target": {"classes": 10}}
    assert skip_reason(Spec.model_validate(raw), 1000) is None
    off = Spec.model_validate({**raw, "search": {"estimate": False}})
    assert "search.estimate is false" in skip_reason(off, 1000)


def _reasons_for_no_estimate(models) -> list[str]:
    """Every producer of Estimate.note, each with a reason it gives (issue 34's 'no estimate: not estimated:')."""
    from isoprobe.executors import ChildRun
    from isoprobe.pipeline.inspect_failure import unfinished_trace

    raw = {"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]}, "target": {"classes": 10}}
    skipped = [child_estimate.skip_reason(Spec.model_validate({**raw, **extra}), count) for extra, count in (
        ({"search": {"estimate": False}}, 1000), ({"training": {"compile": True}}, 1000),
        ({"training": {"precision": "fp16-mixed"}, "device": "cuda"}, 1000), ({}, 10**12),
        ({"distributed": {"strategy": "ddp"}}, 1000))]
    spec = _spec(str(models / "est_models.py") + ":mlp", models)
    killed = ChildRun(returncode=-9, timed_out=False, seconds=1.0, events=[])
    late = ChildRun(returncode=-9, timed_out=True, seconds=40.0, events=[])
    traced = [child_estimate.estimate(torch, spec, [str(models)], torch.device("cpu"), None, time_limit=1e-4).note,
              child_estimate.estimate(torch, _spec(str(models / "est_models.py") + ":data_dependent", models),
                                      [str(models)], torch.device("cpu"), None).note]
    return [*skipped, unfinished_trace(killed, spec), unfinished_trace(late, spec), *traced]


def test_each_reason_for_no_estimate_is_said_once_wherever_it_is_shown(models, monkeypatch, capsys):
    """Issue 34: 'isoprobe estimate: no estimate: not estimated: ...': the reasons carried their own prefix (and
    'the search starts as without one') and every place that shows one added its own. Now a reason is the reason
    alone (Estimate.note), and each place says 'no estimate' once (pipeline.prediction.no_estimate): the
    estimate command's line, the run's progress line and the estimate table."""
    import argparse

    from isoprobe.cli.spec import cmd_estimate
    from isoprobe.pipeline.environment import Target
    from isoprobe.pipeline.notes import describe_estimate as _describe_estimate
    from isoprobe.pipeline.prediction import EstimateReport, render_report
    from isoprobe.report.output import Reporter
    from isoprobe.report.device import DeviceInfo

    device = DeviceInfo(backend="cpu", requested="cpu", name="a CPU", total_memory_bytes=8 << 30,
                        capacity_bytes=1 << 30)
    reasons = [*_reasons_for_no_estimate(models), None]  # None: no estimate came back at all
    assert all(reasons[:-1])
    for reason in reasons:
        report = EstimateReport(spec_path="s.yaml", torch_version="2", device=device, seconds=1.0, note="a prediction",
                                estimate=Estimate(note=reason))
        monkeypatch.setattr("isoprobe.pipeline.estimate.estimate_spec", lambda *args, **kwargs: report)
        monkeypatch.setattr("isoprobe.cli.spec.load", lambda args: None)
        monkeypatch.setattr("isoprobe.cli.spec.budget_overridden", lambda args: False)
        assert cmd_estimate(argparse.Namespace(spec="s.yaml", format="json")) == 4
        told = capsys.readouterr().err.strip()
        lines: list[str] = []
        _describe_estimate(Estimate(note=reason or "the environment check sent none back"),
                           Target("cpu", "cpu", device), Reporter(lines.append))
        table = [row for row in render_report(report).splitlines() if row.startswith("estimate")]
        for shown in (told, *lines, *table):
            assert "not estimated" not in shown and shown.count("no estimate") == 1, shown
            assert shown.count("without one") + shown.count("the search starts") <= 1, shown
