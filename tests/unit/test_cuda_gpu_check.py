"""The GPU check (benchmarks/gpu_check.py, issue 45 part 3): what it computes and judges, on fake readings.

No GPU here: the parts that judge (gpu_check_parts/judge.py) run on recorded-style result JSON and plain-loop
lines; the orchestration runs with isoprobe and the plain loop replaced by fakes; the plain loop itself
(gpu_check_parts/plain_loop.py, the independent truth) is parsed, checked to import nothing of isoprobe, and
trained for a step on the CPU. The first real run then needs no edits.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
PLAIN = ROOT / "benchmarks" / "gpu_check_parts" / "plain_loop.py"
MiB, GiB = 1024**2, 1024**3


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gc():
    return _module()


@pytest.fixture(scope="module")
def judge(gc):
    return gc.judge


# --------------------------------------------------------------------------- realistic fake readings


def _trial(index, batch, outcome, *, purpose="search", steps=3, reserved=None, allocated=None, budget_peak=None,
           context=420 * MiB, retries=0, steady=False, error=None) -> dict:
    """A CUDA trial as isoprobe/report/result.py's Trial writes it (checked against the model below)."""
    trial = {"index": index, "batch_size": batch, "purpose": purpose, "outcome": outcome, "seconds": 9.5,
             "step_seconds": [1.9] + [0.11] * (steps - 1) if outcome == "fits" else [1.9]}
    if outcome == "fits":
        trial.update({"peak_bytes": reserved, "peak_allocated_bytes": allocated, "budget_peak_bytes": budget_peak,
                      "alloc_retries": retries, "base_bytes": 700 * MiB,
                      "step_peak_bytes": [reserved] * steps, "step_budget_peak_bytes": [budget_peak] * steps,
                      "sizes": {"parameter_bytes": 102 * MiB, "gradient_bytes": 102 * MiB,
                                "optimizer_state_bytes": 204 * MiB, "cuda_context_bytes": context,
                                "reserved_unallocated_bytes": reserved - allocated}})
    else:
        trial["error"] = {"type": error or "torch.OutOfMemoryError", "message": "CUDA out of memory. Tried to "
                          "allocate 98.00 MiB", "traceback_tail": ""}
    if steady:
        trial["steady_rule"] = {"min_steps": 3, "max_steps": 30}
    return trial


def fake_result(maximum=80, first_failing=81, retries=2, margin=True, retries_key="alloc_retries") -> dict:
    """ResNet50 under 8 GiB on an H100 as a result JSON would read: the estimate's 82 runs out, 81 runs out, 80
    steps until steady (its reserved peak at the cap after the allocator's retries, its need below)."""
    capacity = 8 * GiB
    trials = [_trial(1, maximum + 2, "out_of_memory"), _trial(2, maximum + 1, "out_of_memory"),
              _trial(3, maximum, "fits", steps=8, steady=True, reserved=capacity - 430 * MiB,
                     allocated=capacity - 900 * MiB, budget_peak=capacity - 160 * MiB, retries=retries)]
    if retries_key != "alloc_retries":
        trials[2][retries_key] = trials[2].pop("alloc_retries")
    result = {"schema_version": 1, "answered": True, "max_batch_size": maximum,
              "first_failing_batch_size": first_failing, "recommended_batch_size": 72, "stop_reason": "edge_found",
              "message": f"batch {maximum} fits and {maximum + 1} runs out of memory",
              "device": {"backend": "cuda", "requested": "cuda", "name": "NVIDIA H100 80GB HBM3", "index": 0,
                         "total_memory_bytes": 85_029_158_912, "memory_budget_bytes": capacity,
                         "budget_source": "spec", "capacity_bytes": capacity},
              "trials": trials, "total_seconds": 41.0}
    if margin:
        result["edge_margin"] = {"capacity_bytes": capacity, "spread_bytes": 40 * MiB, "floor_bytes": 40 * MiB,
                                 "observed_bytes": None, "max_free_bytes": 160 * MiB, "marginal": []}
    return result


def test_the_fake_readings_are_what_isoprobes_result_model_accepts():
    from isoprobe.report.device import DeviceInfo
    from isoprobe.report.edge import EdgeMargin
    from isoprobe.report.trial import Trial

    result = fake_result()
    for trial in result["trials"]:
        Trial.model_validate(trial)
    EdgeMargin.model_validate(result["edge_margin"])
    DeviceInfo.model_validate(result["device"])


# --------------------------------------------------------------------------- judging the edge


@pytest.mark.parametrize("m, f, runs, status", [
    (80, 81, {80: [True], 81: [False]}, "pass"),                      # exact
    (80, 81, {80: [True], 81: [True, False]}, "pass"),                # M+1 marginal in the yardstick too
    (80, 81, {80: [False]}, "FAIL"),                                  # isoprobe's maximum does not train
    (80, 81, {80: [True, False]}, "FAIL"),
    (80, 81, {80: [True], 81: [True], 82: [False]}, "one short"),     # M+1 trains, M+2 runs out
    (80, 83, {80: [True], 81: [True], 82: [False]}, "one short"),
    (80, 81, {80: [True], 81: [True], 82: [True]}, "FAIL"),           # more than two short
    (80, None, {80: [True], 81: [True], 82: [True]}, "FAIL"),
    (80, 81, {80: [True], 81: [True]}, "not judged"),                 # M+2 never ran
    (80, 81, {80: [True], 81: [True], 82: [None]}, "not judged"),
    (80, 81, {80: [None]}, "not judged"),                             # the loop errored at M
    (80, 81, {80: [True]}, "not judged"),                             # M+1 never ran
    (80, 81, {80: [True], 81: [None, None]}, "not judged"),
    (None, None, {}, "FAIL"),                                         # isoprobe gave no answer
])
def test_judge_edge(judge, m, f, runs, status):
    verdict = judge.judge_edge(m, f, runs)
    assert verdict.status == status, verdict
    assert verdict.failed is (status == "FAIL")


def test_the_articles_figures_are_never_judged(judge):
    """80 under 8 GiB is far outside the recipe's [8, 16): it passes on the plain loop's word alone."""
    assert judge.judge_edge(80, 81, {80: [True], 81: [False]}).status == "pass"
    assert "[8, 16)" in judge.RECIPE[("resnet50", 8)] and "[16, 32)" in judge.RECIPE[("resnet50", 11)]
    assert "515" in judge.RECIPE[("mobilenet_v3_large", 16)]


def _plan_and_judge(judge, m, f, truth_edge):
    """The plain runs next_plain_batch asks for against a card whose true edge is ``truth_edge``."""
    runs: dict[int, list] = {}
    asked = []
    while (batch := judge.next_plain_batch(m, f, runs)) is not None:
        asked.append(batch)
        runs.setdefault(batch, []).append(batch <= truth_edge)
        assert len(asked) < 10
    return asked, judge.judge_edge(m, f, runs)


@pytest.mark.parametrize("m, f, truth, asked, status", [
    (80, 81, 80, [80, 81], "pass"),
    (79, 80, 80, [79, 80, 81], "one short"),
    (78, 79, 80, [78, 79, 80], "FAIL"),      # more than two short
    (81, 82, 80, [81], "FAIL"),              # the maximum does not train: no more runs needed
    (None, None, 80, [], "FAIL"),
])
def test_the_plain_runs_asked_are_the_fewest_that_decide(judge, m, f, truth, asked, status):
    got_asked, verdict = _plan_and_judge(judge, m, f, truth)
    assert got_asked == asked and verdict.status == status


def test_plain_outcome_reads_the_exit_status_and_the_last_json_line(judge):
    line = json.dumps({"outcome": "fits", "batch_size": 80, "reserved_peak_bytes": 7 * GiB})
    assert judge.plain_outcome(0, "warning\n" + line + "\n") == (True, json.loads(line))
    assert judge.plain_outcome(3, json.dumps({"outcome": "out_of_memory"}))[0] is False
    assert judge.plain_outcome(4, json.dumps({"outcome": "error"}))[0] is None
    assert judge.plain_outcome(None, "")[0] is None          # killed at its limit
    assert judge.plain_outcome(0, "no json")[0] is None      # exit 0 without its line is no verdict


# --------------------------------------------------------------------------- the margin's readings


def test_margin_lines_show_the_deciding_trials_readings_and_the_spread(judge):
    lines = "\n".join(judge.margin_lines(fake_result()))
    assert "deciding trial: #3, batch 80" in lines and "steady rule" in lines
    assert f"reserved peak (max_memory_reserved, peak_bytes): {(8 * 1024 - 430):.1f} MiB" in lines
    assert f"allocated peak (max_memory_allocated, peak_allocated_bytes): {(8 * 1024 - 900):.1f} MiB" in lines
    assert "budget_peak_bytes): 8032.0 MiB" in lines
    assert "sizes.cuda_context_bytes): 420.0 MiB" in lines
    assert "allocator retries (num_alloc_retries): 2: the allocator freed its cache" in lines
    assert "160.0 MiB vs the spread 40.0 MiB" in lines and "clears it by 120.0 MiB" in lines
    assert "capacity - budget_peak_bytes = 160.0 MiB" in lines and "capacity - reserved peak = 430.0 MiB" in lines


def test_margin_lines_read_fields_defensively(judge):
    assert "num_alloc_retries): 5" in "\n".join(judge.margin_lines(fake_result(retries=5,
                                                                              retries_key="num_alloc_retries")))
    old = fake_result(margin=False)
    for trial in old["trials"]:
        trial.pop("budget_peak_bytes", None)
        trial.pop("alloc_retries", None)
    text = "\n".join(judge.margin_lines(old))
    assert "not in this result" in text and "edge_margin: none" in text
    squeezed = fake_result()
    squeezed["edge_margin"]["max_free_bytes"] = 30 * MiB
    assert "does NOT clear it" in "\n".join(judge.margin_lines(squeezed))
    assert "no deciding trial" in judge.margin_lines(None)[0]
    assert "no deciding trial" in judge.margin_lines({"max_batch_size": None, "stop_reason": "error"})[0]


def test_the_deciding_trial_is_the_steady_fit_at_the_maximum(judge):
    result = fake_result()
    result["trials"].append(_trial(4, 80, "fits", purpose="confirmation", reserved=GiB, allocated=GiB // 2,
                                   budget_peak=GiB))
    assert judge.deciding_trial(result)["index"] == 3
    assert judge.deciding_trial({"max_batch_size": 5, "trials": []}) is None


def test_readings_table_puts_isoprobe_and_the_plain_loop_side_by_side(judge):
    plain = [("ballast loop run 1", 80, {"outcome": "fits", "reserved_peak_bytes": 7 * GiB,
                                         "allocated_peak_bytes": 6 * GiB, "budget_peak_bytes": 7 * GiB + 400 * MiB,
                                         "outside_end_bytes": 450 * MiB, "outside_growth_bytes": 30 * MiB,
                                         "num_alloc_retries": 1}),
             ("ballast loop run 1", 81, {"outcome": "out_of_memory", "num_alloc_retries": 4}),
             ("fraction (second reading) loop run 1", 81, {"outcome": "fits"})]
    rows = judge.readings_table(fake_result(), plain, [80, 81])
    assert len(rows) == 2 + 5
    assert rows[2].startswith("| 80 | isoprobe trial #3 | fits | 7762.0 | 7292.0 | 8032.0 | 420.0 | 2 |")
    assert rows[3] == "| 80 | ballast loop run 1 | fits | 7168.0 | 6144.0 | 7568.0 | 450.0 (+30.0) | 1 |"
    assert rows[4].startswith("| 81 | isoprobe trial #2 | out_of_memory | - |")
    assert rows[5].startswith("| 81 | ballast loop run 1 | out_of_memory | - |")
    assert rows[6].startswith("| 81 | fraction (second reading) loop run 1 | fits |")


# --------------------------------------------------------------------------- the machine, the tier, the time


SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)
  MIG 3g.40gb     Device  0: (UUID: MIG-5f6a)
"""


@pytest.mark.parametrize("listing, visible, count", [
    (SMI, None, 2), (SMI, "0", 1), (SMI, "0,1", 2), (SMI, "", 0), (SMI, "1,7", 1), (SMI, "MIG-5f6a", 1),
    (SMI.splitlines()[0], None, 1), ("", None, 0), ("(nvidia-smi: not found)", None, 0),
])
def test_visible_gpu_count(judge, listing, visible, count):
    assert judge.visible_gpu_count(listing, visible) == count


PYTEST_OUT = """tests/gpu/test_cuda.py::test_cuda_probe_finds_an_edge_under_a_budget PASSED [  6%]
tests/gpu/test_cuda.py::test_bad_allocator_setting_is_not_an_out_of_memory[x] PASSED [ 12%]
tests/gpu/test_distributed_cuda.py::test_a_nccl_gang[ddp] SKIPPED (needs two GPUs) [ 18%]
"""


def test_tier_summary(judge):
    verdict, lines = judge.tier_summary(PYTEST_OUT + "12.50s call     tests/gpu/test_cuda.py::test_x\n", 0, 80, 120)
    assert verdict.status == "pass" and "2 passed, 1 skipped" in verdict.reason
    assert "12.50s call" in "\n".join(lines)
    verdict, lines = judge.tier_summary(PYTEST_OUT, None, 120, 120)
    assert verdict.status == "not judged" and "stopped at its 120 s limit" in verdict.reason
    failing = PYTEST_OUT + "tests/gpu/test_cuda.py::test_nvml_facts FAILED [ 24%]\n"
    verdict, lines = judge.tier_summary(failing, None, 120, 120)
    assert verdict.failed and "`tests/gpu/test_cuda.py::test_nvml_facts`" in "\n".join(lines)
    assert judge.tier_summary("", 5, 3, 120)[0].status == "not judged"
    assert judge.tier_summary("", 2, 3, 120)[0].failed


@pytest.mark.parametrize("quick", [False, True])
def test_the_run_fits_its_device_call_even_when_every_part_takes_its_whole_limit(judge, quick):
    """Under `timeout 560` after a half-minute set-up, whatever each part takes: a part never gets more than the run
    has left, and the tier takes only what remains."""
    assert judge.DEADLINE_S[False] <= 560 - 40 and judge.DEADLINE_S[True] <= 6 * 60
    left, ran = float(judge.DEADLINE_S[quick]), []
    for plan in judge.PLAN:
        limit = judge.part_limit(plan, quick, left)
        if limit is not None:
            ran.append(plan.key)
            left -= limit
    assert left >= judge.RESERVE_S - 1e-9
    assert ran[:4] == ["facts", "resnet50_8gib", "expandable_8gib", "command_8gib"]
    if quick:
        assert "whole_card" not in ran and "ddp" not in ran


def test_a_part_is_skipped_with_too_little_time_left_and_limited_to_what_is_left(judge):
    plan = {p.key: p for p in judge.PLAN}
    assert judge.part_limit(plan["resnet50_8gib"], False, 1000) == 150
    assert judge.part_limit(plan["resnet50_8gib"], False, 100) == 90
    assert judge.part_limit(plan["resnet50_8gib"], False, 50) is None
    assert judge.part_limit(plan["whole_card"], True, 1000) is None   # left out under --quick
    assert judge.part_limit(plan["tier"], False, 200) == 190          # the tier: what is left
    assert judge.part_limit(plan["tier"], False, 30) is None


# --------------------------------------------------------------------------- the page


def test_the_committed_page_is_a_real_runs_page_with_todays_introduction(gc):
    """docs/gpu.md is what gpu_check wrote on the lent GPU (never edited by hand): its introduction is the one the
    script renders today, and it names the device, the versions and the commit it measured."""
    page = (ROOT / "docs" / "gpu.md").read_text()
    introduction = gc.render(None).split("\n## ")[0]
    assert page.startswith(introduction)
    assert "## The run" in page and "## Not yet run" not in page
    assert "- device: NVIDIA" in page and "isoprobe commit " in page and "- verdict: " in page
    assert "bash .gpu/setup.sh && PYTHONUNBUFFERED=1 timeout 560" in page


def test_render_a_run(gc):
    report = gc.Report(facts=["- device: NVIDIA H100 80GB HBM3"], quick=True, seconds=301, finished=True)
    part = gc.Part("resnet50_8gib", "(a) ResNet50", 200, 95)
    part.judge("ResNet50 under 8 GiB", gc.Verdict("one short", "81 trained in the yardstick"))
    part.lines.append("- isoprobe: max 80")
    failing = gc.Part("command_8gib", "(b) command", 140, 60)
    failing.judge("command trial under 8 GiB", gc.Verdict("FAIL", "isoprobe's maximum 90 ran out of memory"))
    report.parts += [part, failing, gc.Part("ddp", "(c) DDP")]
    page = gc.render(report)
    assert "## Not yet run" not in page and "## The run" in page and "--quick" in page
    assert "| (a) ResNet50 | 200 s | 95 s | ResNet50 under 8 GiB: one short |" in page
    assert "- verdict: FAILED: command trial under 8 GiB" in page
    assert "- **ResNet50 under 8 GiB**: one short: 81 trained in the yardstick" in page
    assert report.failed == ["command trial under 8 GiB"]
    report.finished = False
    assert "stopped before its end" in gc.render(report)


def test_the_specs_the_check_runs_are_valid_isoprobe_specs(gc):
    from isoprobe.spec.model import Spec

    for workload in (gc.RESNET_8, gc.RESNET_8_EXPANDABLE, gc.WHOLE_CARD, gc.Workload(ranks=2)):
        spec = Spec.model_validate(workload.spec())
        assert spec.memory_budget == workload.budget_bytes and spec.allocator == workload.alloc_conf
    Spec.model_validate({"device": "cuda", "memory_budget": 8 * GiB, "recommendation": {"soak_steps": 0},
                         "search": {"start_batch_size": 80, "trial_timeout": 120},
                         "command": gc.RESNET_8.plain_args("{batch_size}", 100000)})


def test_isoprobe_takes_the_command_trial_as_the_check_gives_it(gc):
    """Here without a GPU isoprobe stops at the device (exit 2), after accepting the spec and the command; the stop
    prints its document (issue 56), which the check reads as no answer."""
    spec = {"device": "cuda", "memory_budget": 8 * GiB, "recommendation": {"soak_steps": 0},
            "search": {"start_batch_size": 80, "trial_timeout": 120}}
    ctx = gc.Context(quick=True, deadline=0)
    result, seconds, stderr, returncode = gc.isoprobe_json(ctx, spec, 60, gc.RESNET_8.plain_args("{batch_size}", 9))
    assert returncode == 2 and "sees no GPU" in stderr, stderr
    assert result["stop_reason"] == "bad_spec" and result["max_batch_size"] is None and not result["answered"]


# --------------------------------------------------------------------------- the no-GPU path


def test_without_a_gpu_the_check_says_so_writes_nothing_and_exits_5(tmp_path):
    output = tmp_path / "gpu.md"
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([sys.executable, str(SCRIPT), "--output", str(output)], capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(out)}, timeout=120)
    assert run.returncode == _module().NO_GPU_EXIT == 5
    assert "no CUDA GPU visible" in run.stderr and "nothing measured" in run.stderr
    assert not output.exists() and not list(out.iterdir())


def test_the_no_gpu_exit_code_is_none_of_isoprobes_own(gc):
    from isoprobe.errors import ExitCode

    assert gc.NO_GPU_EXIT not in {int(code) for code in ExitCode}
    assert gc.gpu_present(gc.Runner(), {"CUDA_VISIBLE_DEVICES": ""}) is False


# --------------------------------------------------------------------------- the plain loop, the truth


def _plain_module():
    spec = importlib.util.spec_from_file_location("gpu_check_plain_loop", PLAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plain_loop_imports_nothing_of_isoprobe():
    tree = ast.parse(PLAIN.read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert names and not [name for name in names if name.split(".")[0] == "isoprobe"]


def test_the_plain_loop_parses_its_arguments():
    run = subprocess.run([sys.executable, str(PLAIN), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--batch-size" in run.stdout and "--budget" in run.stdout
    bad = subprocess.run([sys.executable, str(PLAIN), "--batch-size", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    plain = _plain_module()
    args = plain.parse_args(["--batch-size", "80", "--budget", "8GiB"])
    assert args.budget == 8 * GiB and args.steps == 20 and args.model == "resnet50" and args.ranks == 1
    assert plain.byte_count("8589934592") == 8 * GiB and plain.byte_count("16 GB") == 16 * 10**9
    assert plain.byte_count("512MiB") == 512 * MiB
    with pytest.raises(Exception):
        plain.byte_count("eight")


def test_the_plain_loop_tells_an_allocation_failure_from_an_error():
    plain = _plain_module()

    class OutOfMemoryError(RuntimeError):
        pass

    assert plain.is_out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    assert plain.is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert plain.is_out_of_memory(RuntimeError("NCCL error: unhandled cuda error, Cuda failure 2 'out of memory'"))
    assert not plain.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_plain_loop_trains_on_the_cpu_and_prints_its_line():
    run = subprocess.run([sys.executable, str(PLAIN), "--device", "cpu", "--model", "resnet18", "--image-size", "32",
                          "--classes", "10", "--batch-size", "2", "--steps", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = json.loads(run.stdout.strip().splitlines()[-1])
    assert line["outcome"] == "fits" and line["steps_done"] == 2 and line["batch_size"] == 2
    error = subprocess.run([sys.executable, str(PLAIN), "--device", "cpu", "--model", "no_such_model",
                            "--batch-size", "2"], capture_output=True, text=True, timeout=120)
    assert error.returncode == 4 and json.loads(error.stdout.strip().splitlines()[-1])["outcome"] == "error"


def test_the_plain_loop_as_a_gang_of_two_on_the_cpu():
    """--ranks 2: the DDP truth of part (c), spawned as a fresh job's ranks (gloo here, nccl on two GPUs)."""
    run = subprocess.run([sys.executable, str(PLAIN), "--device", "cpu", "--model", "resnet18", "--image-size", "32",
                          "--classes", "10", "--batch-size", "2", "--steps", "1", "--ranks", "2"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    line = json.loads(run.stdout.strip().splitlines()[-1])
    assert line["outcome"] == "fits" and [rank["rank"] for rank in line["ranks"]] == [0, 1]
