"""The GPU check's orchestration end to end on a fake card (issue 57): benchmarks/gpu_check.py's ``main`` with its one
seam to processes (``gpu_check_parts.runner.Runner``) replaced by ``FakeCardRunner``, which answers each command the
check starts (torch's probe, the facts, isoprobe, the plain loop, the ballast, nvidia-smi, pytest) from one model of
a card, on a fake clock. What runs for real: the parts, the deadline, the judging, the page and the archive under a
fake ``$OUT``, the exit codes. The ballast's arithmetic and the real runner's processes are tested here too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MiB, GiB = 1024**2, 1024**3


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gc():
    return _load("gpu_check", ROOT / "benchmarks" / "gpu_check.py")


@pytest.fixture(scope="module")
def ballast():
    return _load("gpu_check_ballast", ROOT / "benchmarks" / "gpu_check_parts" / "ballast.py")


class FakeCardRunner:
    """One card of ``total`` bytes and a fake clock. A training process of batch B at image size S needs
    ``base + B * per_sample * (S/224)^2`` of the card's free memory (the truth); isoprobe answers the truth plus
    ``isoprobe_error``. Each command advances the clock by what it would take on an H200."""

    def __init__(self, total=141 * GiB, base=1536 * MiB, per_sample=83 * MiB, isoprobe_error=0, gpu=True,
                 importable=True, slow_isoprobe=False, stop_at=None):
        self.total, self.free = total, total - 600 * MiB
        self.base, self.per_sample = base, per_sample
        self.isoprobe_error, self.gpu, self.importable = isoprobe_error, gpu, importable
        self.slow_isoprobe, self.stop_at = slow_isoprobe, stop_at
        self.now = 1000.0
        self.log: list[str] = []
        self.held = 0

    def clock(self) -> float:
        return self.now

    def _edge(self, free: int, image: int) -> int:
        return int((free - self.base) // (self.per_sample * (image / 224) ** 2))

    def _took(self, seconds: float, limit_s: float):
        self.now += min(seconds, limit_s)
        return seconds <= limit_s

    def run(self, argv, limit_s, env=None, grace_s=20):
        ran = self._run(argv, limit_s, env or {})
        if self.stop_at and self.stop_at in " ".join(map(str, argv)):
            raise _module_stopped()("SIGTERM")
        return ran

    def _run(self, argv, limit_s, env):
        from gpu_check_parts.runner import Ran

        text = " ".join(map(str, argv))
        if "torch.cuda.is_available" in text:
            self.now += 3
            return Ran(0, f"{self.gpu}\n", "", 3)
        if "get_device_properties" in text:
            self._took(6, limit_s)
            facts = {"name": "NVIDIA H200", "total": self.total, "free": self.free, "capability": "9.0",
                     "torch": "2.11.0", "torchvision": "0.26.0", "cuda": "12.8", "cudnn": 91000, "count": 1,
                     "python": "3.12.3", "isoprobe_import": "ok (pydantic 2.14)" if self.importable else
                     "ModuleNotFoundError: No module named 'pydantic'"}
            return Ran(0, json.dumps(facts) + "\n", "", 6)
        if argv[0] == "nvidia-smi":
            out = "GPU 0: NVIDIA H200 (UUID: GPU-1)" if "-L" in argv else "570.86" if "driver" in text else ""
            return Ran(0, out + "\n", "", 0.1)
        if argv[0] == "git":
            return Ran(0, "abc1234\n", "", 0.1)
        if "-m isoprobe run" in text:
            return self._isoprobe(argv, limit_s)
        if "plain_loop.py" in text:
            return self._plain(argv, limit_s, env)
        if "pytest" in text:
            self.log.append(f"tier {text} now={env.get('ISOPROBE_PRINT_FAILURES_NOW')}")
            self._took(limit_s / 2, limit_s)
            return Ran(0, "tests/gpu/test_cuda.py::test_x PASSED [100%]\n", "", limit_s / 2)
        raise AssertionError(f"the check started a command the fake card does not know: {text}")

    def _isoprobe(self, argv, limit_s):
        from gpu_check_parts.runner import Ran

        spec = json.loads(Path(argv[argv.index("run") + 1]).read_text())
        self.log.append(f"isoprobe {'command' if '--' in argv else 'own'} allocator={spec.get('allocator')}")
        seconds = limit_s - 1 if self.slow_isoprobe else 40
        if not self._took(seconds, limit_s):
            return Ran(None, "", "isoprobe: stopped\n", limit_s)
        image = (spec.get("input") or {}).get("shape", [3, 224, 224])[-1]
        capacity = spec.get("memory_budget") or self.free
        m = self._edge(capacity, image) + self.isoprobe_error
        trial = {"index": 1, "batch_size": m, "purpose": "search", "outcome": "fits", "seconds": 9.0,
                 "step_seconds": [0.5, 0.1], "peak_bytes": capacity - 200 * MiB, "peak_allocated_bytes": capacity - GiB,
                 "budget_peak_bytes": capacity - 100 * MiB, "alloc_retries": 0,
                 "sizes": {"cuda_context_bytes": 500 * MiB, "reserved_unallocated_bytes": 800 * MiB}}
        result = {"max_batch_size": m, "first_failing_batch_size": m + 1, "recommended_batch_size": m - 8,
                  "stop_reason": "edge_found", "message": f"batch {m} fits", "trials": [trial],
                  "device": {"capacity_bytes": capacity, "memory_budget_bytes": spec.get("memory_budget"),
                             "total_memory_bytes": self.total}}
        return Ran(0, json.dumps(result), "", seconds)

    def _plain(self, argv, limit_s, env):
        from gpu_check_parts.runner import Ran

        batch = int(argv[argv.index("--batch-size") + 1])
        image = int(argv[argv.index("--image-size") + 1])
        budget = int(argv[argv.index("--budget") + 1]) if "--budget" in argv else None
        kind = "fraction" if budget else "ballast" if self.held else "card"
        self.log.append(f"plain {kind} {batch} alloc={env.get('PYTORCH_CUDA_ALLOC_CONF')}")
        self._took(40 if self.slow_isoprobe else 12, limit_s)
        fits = batch <= self._edge(min(self.free, budget or self.free), image)
        line = {"outcome": "fits" if fits else "out_of_memory", "batch_size": batch, "reserved_peak_bytes": 7 * GiB,
                "allocated_peak_bytes": 6 * GiB, "outside_end_bytes": 480 * MiB}
        return Ran(0 if fits else 3, json.dumps(line) + "\n", "", 12)

    @contextlib.contextmanager
    def hold(self, argv, ready_s, env=None):
        leave = int(argv[argv.index("--leave") + 1])
        self.now += 6
        before = self.free
        self.held, self.free = before - leave, leave
        self.log.append(f"ballast leaves {leave // GiB} GiB")
        try:
            yield {"ready": True, "free_bytes": leave, "held_bytes": before - leave}
        finally:
            self.free, self.held = before, 0
            self.log.append("ballast released")


def _module_stopped():
    return sys.modules["gpu_check"].Stopped


@pytest.fixture
def out(tmp_path, monkeypatch):
    """The call's ``$OUT``; the temporary folder the check makes its raw folder in is under tmp_path too."""
    folder = tmp_path / "OUT"
    folder.mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return folder


def _scratch_left(tmp_path: Path) -> list[str]:
    """What the check left in the temporary folder: nothing, once its raw files are in $OUT's archive."""
    return sorted(path.name for path in (tmp_path / "tmp").iterdir())


def _main(gc, card, out, tmp_path, *args):
    return gc.main(["--output", str(tmp_path / "page.md"), *args], runner=card, clock=card.clock,
                   environ={"OUT": str(out)})


def _archive(out: Path) -> dict[str, str]:
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        return {member.name: tar.extractfile(member).read().decode() for member in tar.getmembers() if member.isfile()}


def test_a_right_answer_passes_every_part_and_the_page_and_archive_come_back_under_out(gc, out, tmp_path):
    card = FakeCardRunner()
    assert _main(gc, card, out, tmp_path) == 0
    page = (out / "gpu.md").read_text()
    assert page == (tmp_path / "page.md").read_text()
    assert "- verdict: every check passed or was one short" in page
    for name in ("ResNet50 under 8 GiB", "ResNet50 under 8 GiB, expandable segments", "command trial under 8 GiB",
                 "the whole card, no budget"):
        assert f"- **{name}**: pass: exact" in page, name
    assert "2-rank DDP gang: skipped" in page and "GPU test tier: pass" in page
    # the yardstick: the ballast leaves 8 GiB, the loop runs with no fraction, M then M+1; the second reading after
    assert card.log[:7] == ["isoprobe own allocator=None", "ballast leaves 8 GiB", "plain ballast 80 alloc=None",
                            "plain ballast 81 alloc=None", "ballast released", "plain fraction 80 alloc=None",
                            "plain fraction 81 alloc=None"]
    assert "plain ballast 80 alloc=expandable_segments:True" in card.log
    assert "isoprobe own allocator=expandable_segments:True" in card.log
    whole = card._edge(card.free, 448)
    assert f"plain card {whole} alloc=None" in card.log and f"plain card {whole + 1} alloc=None" in card.log
    assert "| 81 | fraction (second reading) loop run 1 |" in page and "| 81 | ballast loop run 1 | out_of_memory" in page
    raw = _archive(out)
    assert {"gpu_check/facts.json", "gpu_check/isoprobe-resnet50_8gib.json",
            "gpu_check/ballast-resnet50-224-8gib-r1-gpu0.json"} <= set(raw)
    assert json.loads(raw["gpu_check/isoprobe-resnet50_8gib.json"])["max_batch_size"] == 80
    assert card.now - 1000 <= 560, "the whole run fits the call's timeout"
    assert _scratch_left(tmp_path) == []


@pytest.mark.parametrize("error, status", [(1, "FAIL"), (-1, "one short"), (-2, "FAIL")])
def test_an_answer_off_the_cards_edge_is_judged_by_the_ballast_loop(gc, out, tmp_path, error, status):
    card = FakeCardRunner(isoprobe_error=error)
    code = _main(gc, card, out, tmp_path, "--skip-tier")
    page = (out / "gpu.md").read_text()
    assert f"- **ResNet50 under 8 GiB**: {status}" in page
    assert code == (1 if status == "FAIL" else 0)


def test_a_missing_dependency_is_named_in_the_set_up_and_fails_the_run(gc, out, tmp_path):
    card = FakeCardRunner(importable=False)
    assert _main(gc, card, out, tmp_path, "--skip-tier") == 1
    page = (out / "gpu.md").read_text()
    assert "isoprobe does not import here (ModuleNotFoundError: No module named 'pydantic'): was .gpu/setup.sh run?" \
        in page


def test_parts_that_take_their_whole_limit_leave_the_rest_skipped_with_the_reason_within_the_deadline(gc, out,
                                                                                                      tmp_path):
    card = FakeCardRunner(slow_isoprobe=True)
    assert _main(gc, card, out, tmp_path) == 0
    page = (out / "gpu.md").read_text()
    assert card.now - 1000 <= gc.judge.DEADLINE_S[False] + 5
    assert "- **tier**: skipped: " in page and "s of the run left, it needs 30 s" in page
    assert "**ResNet50 under 8 GiB**: not judged: 80 trained, but no run at 81 finished with a memory verdict (0 " \
           "tried) (the part's time ran out)" in page


def test_a_stop_mid_run_keeps_what_was_measured_and_exits_2(gc, out, tmp_path):
    """The call's ``timeout`` sends SIGTERM during (b): (a) and (e) stay on the page and in the archive."""
    card = FakeCardRunner(stop_at="--steps 100000")
    assert _main(gc, card, out, tmp_path) == gc.STOPPED_EXIT == 2
    page = (out / "gpu.md").read_text()
    assert "- **ResNet50 under 8 GiB**: pass" in page and "stopped by SIGTERM" in page
    assert "stopped before its end" in page
    assert "gpu_check/isoprobe-expandable_8gib.json" in _archive(out)
    assert _scratch_left(tmp_path) == []


def test_without_a_gpu_nothing_is_written_and_the_exit_is_5(gc, out, tmp_path):
    card = FakeCardRunner(gpu=False)
    assert _main(gc, card, out, tmp_path) == gc.NO_GPU_EXIT
    assert not list(out.iterdir()) and not (tmp_path / "page.md").exists()


def test_a_ballast_that_cannot_hold_leaves_the_part_not_judged(gc, out, tmp_path):
    card = FakeCardRunner()

    @contextlib.contextmanager
    def cannot_hold(argv, ready_s, env=None):
        yield {"ready": False, "error": "the card has 5 GiB free, less than the 8 GiB to leave"}

    card.hold = cannot_hold
    assert _main(gc, card, out, tmp_path, "--skip-tier") == 0
    assert "- **ResNet50 under 8 GiB**: not judged: the ballast could not hold GPU 0: the card has 5 GiB free" in \
        (out / "gpu.md").read_text()


# --------------------------------------------------------------------------- the ballast and the real runner


@pytest.mark.parametrize("free, leave, sizes", [
    (100 * GiB, 8 * GiB, [16 * GiB] * 5 + [12 * GiB]),
    (8 * GiB + 3 * MiB, 8 * GiB, [2 * MiB]),         # rounded down: never below the budget
    (8 * GiB + MiB, 8 * GiB, []),                    # less than one granule to take
    (5 * GiB, 8 * GiB, []),                          # below the budget: nothing to take (the script says so)
])
def test_the_ballast_takes_free_less_the_budget_in_whole_granules(ballast, free, leave, sizes):
    assert ballast.ballast_chunks(free, leave) == sizes
    assert free - sum(sizes) >= min(free, leave)


class _FakeTorchCard:
    """torch for the ballast: each ``empty`` takes its size rounded up to 2 MiB, plus ``overhead`` once per call."""

    uint8 = "uint8"

    def __init__(self, free, overhead=0):
        self._free, self.overhead = free, overhead
        outer = self

        class Cuda:
            init = set_device = synchronize = staticmethod(lambda *a: None)

            @staticmethod
            def mem_get_info(device):
                return outer._free, 141 * GiB

        self.cuda = Cuda

    def empty(self, size, dtype, device):
        self._free -= -(-size // (2 * MiB)) * 2 * MiB + self.overhead

        class Held:
            def numel(self_inner):
                return size
        return Held()


@pytest.mark.parametrize("overhead", [0, 64 * 1024])
def test_the_ballast_leaves_the_budget_free_within_one_granule(ballast, overhead):
    torch = _FakeTorchCard(140 * GiB + 123 * MiB + 4567, overhead)
    line = ballast.hold(torch, 0, 8 * GiB)
    assert line["ready"] and 8 * GiB <= line["free_bytes"] < 8 * GiB + 2 * MiB + overhead
    short = ballast.hold(_FakeTorchCard(5 * GiB), 0, 8 * GiB)
    assert not short["ready"] and "less than" in short["error"]


def test_children_keep_the_interpreters_pythonpath(gc):
    from gpu_check_parts.runner import child_environment

    env = child_environment({"X": "1"}, environ={"PYTHONPATH": "/opt/wheels", "PATH": "/bin"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/opt/wheels"] and env["X"] == "1"
    assert child_environment(environ={})["PYTHONPATH"] == str(ROOT)


def test_the_real_runner_holds_a_process_until_released_and_stops_a_run_at_its_limit(gc):
    from gpu_check_parts.runner import Runner

    runner = Runner()
    code = "import json, sys, os; print(json.dumps({'ready': True, 'pid': os.getpid()}), flush=True); sys.stdin.read()"
    with runner.hold([sys.executable, "-c", code], 30) as ready:
        assert ready["ready"]
        os.kill(ready["pid"], 0)  # alive while held
    with pytest.raises(ProcessLookupError):
        os.kill(ready["pid"], 0)
    with runner.hold([sys.executable, "-c", "import time; time.sleep(30)"], 1) as silent:
        assert not silent["ready"] and "no ready line" in silent["error"]
    ran = runner.run([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(30)"], 1, grace_s=1)
    assert ran.returncode is None and ran.stdout == "x\n" and ran.seconds < 10


def test_the_archive_is_replaced_whole(gc, tmp_path):
    from gpu_check_parts.runner import archive

    folder = tmp_path / "gpu_check"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    target = archive(folder, tmp_path / "raw.tar.gz")
    (folder / "b.json").write_text("{}")
    archive(folder, target)
    with tarfile.open(target) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == ["gpu_check/a.json", "gpu_check/b.json"]
    assert not (tmp_path / "raw.tar.gz.partial").exists()


def test_a_second_call_runs_only_the_parts_it_names_within_its_own_deadline(gc, out, tmp_path):
    """A call with less device time left (the first call's budget spent): --only and --deadline."""
    card = FakeCardRunner()
    code = _main(gc, card, out, tmp_path, "--only", "resnet50_8gib,command_8gib,tier", "--deadline", "280",
                 "--tier-k", "budget")
    assert code == 0
    page = (out / "gpu.md").read_text()
    assert "- **ResNet50 under 8 GiB**: pass: exact" in page and "- **command trial under 8 GiB**: pass" in page
    assert "not asked for (--only command_8gib,resnet50_8gib,tier)" in page
    [tier] = [line for line in card.log if line.startswith("tier ")]
    assert "-m gpu" in tier and tier.endswith("-k budget now=1")  # the tests asked for; failures printed at once
    assert "isoprobe own allocator=expandable_segments:True" not in card.log
    assert card.now - 1000 <= 280
    with pytest.raises(SystemExit):
        _main(gc, card, out, tmp_path, "--only", "no_such_part")
