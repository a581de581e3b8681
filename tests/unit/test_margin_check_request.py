"""The parent asks a CUDA trial of isoprobe's own loop to test its margin (``TrialRequest.margin_check_bytes``,
``child.core.cuda.squeeze``) at the capacity less the spread; a CPU trial never (its reading is the cap's own, the
data segment), nor a command's (its shim has no squeeze)."""

from __future__ import annotations

from isoprobe.executors.scripted import Call, ScriptedExecutor, fits
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.device import DeviceInfo
from isoprobe.search import margin
from isoprobe.spec.model import Spec

GiB = 1024**3


class _Quiet:
    def note(self, text):
        pass

    def trial(self, trial):
        pass


def _run(backend: str, **spec_extra) -> Call:
    spec = Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, **spec_extra})
    info = DeviceInfo(backend=backend, requested=backend, name="fake", total_memory_bytes=16 * GiB,
                      capacity_bytes=16 * GiB)
    target = Target(backend=backend, device="cuda:0" if backend == "cuda" else "cpu", info=info)
    executor = ScriptedExecutor(lambda call: fits(2 * GiB, base_bytes=GiB))
    runner = TrialRunner(spec, target, executor, python_path=[], reporter=_Quiet())
    runner.observe(8)
    return executor.calls[0]


def test_a_cuda_trial_is_asked_to_test_a_reading_within_the_spread():
    call = _run("cuda")
    assert call.request.margin_check_bytes == 16 * GiB - margin.FLOOR_BYTES["cuda"]


def test_a_cpu_trial_is_not():
    assert _run("cpu").request.margin_check_bytes is None
