"""``isoprobe sweep`` without a cluster: the report model and table, rows from results, and cache-first
submission with a scripted Slurm submitter whose "tasks" probe with scripted trials (no process, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from isoprobe.executors.scripted import ScriptedExecutor, error, linear
from isoprobe.report.output import Reporter
from isoprobe.pipeline.answer import answer
from isoprobe.sweep import make_items
from isoprobe.sweep.local import run_local
from isoprobe.sweep.model import SweepReport, SweepRow, failed_row, render_sweep_table, row_from_result
from isoprobe.sweep.records import record_path, recorded_result, write_record
from isoprobe.sweep.slurm import SlurmOptions, run_slurm
from isoprobe.sweep.task import row_path, write_row
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, hog_spec

TARGET = "partition=gpu-a"


@pytest.fixture
def specs(tmp_path):
    """Two valid specs (caps 12 and 40: one capped, one at the edge) and one that raises in every trial."""
    paths = {}
    for name, cap in (("capped.yaml", 12), ("edge.yaml", 40), ("broken.yaml", 40)):
        spec = hog_spec(max_batch_size=cap)
        paths[name] = tmp_path / name
        paths[name].write_text(json.dumps(spec))
    return paths


class ScriptedSlurm:
    """A Submitter whose array tasks run at submit time: the task's steps (answer -> record -> row) with scripted
    trials; ``lost`` names specs whose task dies without a row; ``interrupt_after`` raises Ctrl-C in the wait."""

    def __init__(self, cache: Path, lost: tuple[str, ...] = (), interrupt: bool = False):
        self.cache, self.lost, self.interrupt = cache, lost, interrupt
        self.submitted: list[tuple[str, list[str]]] = []
        self.cancelled: list[tuple[list[str], bool]] = []
        self.running: set[str] = set()

    def submit(self, target, items):
        array = str(100 + len(self.submitted))
        self.submitted.append((target, [item.shown for item in items]))
        tasks = [f"{array}_{n}" for n in range(len(items))]
        for item, task in zip(items, tasks):
            if self.interrupt:
                self.running.add(task)
                continue
            if item.shown in self.lost:
                continue
            spec = item.load()
            scripted = (lambda call: error("deliberate bug", "RuntimeError")) if "broken" in item.shown else linear(HOG_FIXED, HOG_PER_SAMPLE)
            result = answer(spec, item.spec, Reporter(lambda line: None),
                            environ={"ISOPROBE_CACHE_DIR": str(self.cache)}, executor=ScriptedExecutor(scripted))
            if result.cache is not None:
                write_record(item, spec, result.cache.key)
            write_row(Path(item.rows_dir), item.index, row_from_result(item.shown, item.target, result, task).model_dump_json())
        return array, tasks

    def active(self):
        if self.interrupt and not self.cancelled:
            raise KeyboardInterrupt
        return set(self.running)

    def cancel(self, array_ids, kill=False):
        self.cancelled.append((array_ids, kill))
        self.running.clear()

    def why_failed(self, task_id):
        return "slurmstepd: error: *** JOB CANCELLED DUE TO TIME LIMIT ***"


def slurm_sweep(specs: dict, names, tmp_path, submitter, monkeypatch, *, refresh=False, targets=(TARGET,)):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ISOPROBE_CACHE_DIR", str(cache))
    run = tmp_path / "run"
    items = make_items([str(specs[name]) if name in specs else str(tmp_path / name) for name in names],
                       list(targets), str(cache), refresh=refresh, rows_dir=str(run / "rows"))
    lines: list[str] = []
    return run_slurm(items, SlurmOptions(folder=run), lines.append, submitter), lines


def test_the_report_is_strict_and_its_table_has_one_line_per_row():
    rows = [SweepRow(spec="a.yaml", target="partition=a100", answered=True, max_batch_size=24,
                     recommended_batch_size=16, stop_reason="edge_found", trials=7, seconds=81.5,
                     cache_path="/c/k.json", job_id="12_0", node="gpu07"),
            failed_row("b.yaml", "partition=a100", "bad spec: b.yaml: search.steps: too small\n    fix: at least 2")]
    report = SweepReport(executor="slurm", rows=rows, submitted=2, array_jobs=["12"], seconds=90.0)
    assert SweepReport.model_validate_json(report.model_dump_json()) == report
    with pytest.raises(ValidationError):
        SweepRow.model_validate({**rows[0].model_dump(), "surprise": 1})
    lines = render_sweep_table(report).splitlines()
    assert len(lines) == 4 and lines[0].split()[:4] == ["spec", "target", "node", "max"]
    assert lines[1].split()[:7] == ["a.yaml", "partition=a100", "gpu07", "24", "16", "7", "81.5"]
    assert "/c/k.json" in lines[1]
    assert "bad spec" in lines[2] and "fix: at least 2" in lines[2]  # a multi-line error stays on its row
    assert lines[3].startswith("1/2 answered, 0 from the cache, 2 probed in 12")
    assert not report.all_answered


def test_a_row_from_a_result_points_at_its_cache_entry(specs, tmp_path):
    item = make_items([str(specs["edge.yaml"])], ["local"], str(tmp_path / "cache"))[0]
    result = answer(item.load(), item.spec, Reporter(lambda line: None),
                    environ={"ISOPROBE_CACHE_DIR": item.cache_dir}, executor=ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    row = row_from_result(item.shown, item.target, result)
    assert row.answered and row.max_batch_size == HOG_MAX == result.max_batch_size
    assert row.recommended_batch_size == result.recommended_batch_size and row.trials == len(result.trials)
    assert row.cache_path == result.cache.path and Path(row.cache_path).is_file() and not row.cached
    assert row.stop_reason == "edge_found" and row.error is None and row.device == result.device.name


def test_a_slurm_sweep_submits_once_and_then_answers_from_the_records(specs, tmp_path, monkeypatch):
    first = ScriptedSlurm(tmp_path / "cache")
    (rows, submitted, arrays, stopped), _ = slurm_sweep(specs, ["capped.yaml", "edge.yaml"], tmp_path, first,
                                                         monkeypatch, targets=(TARGET, "constraint=h100"))
    assert stopped is None and submitted == 4 and arrays == ["100", "101"]
    assert [target for target, _ in first.submitted] == [TARGET, "constraint=h100"]  # one array per GPU type
    assert [(r.spec.endswith("capped.yaml"), r.target, r.max_batch_size) for r in rows] == [
        (True, TARGET, 12), (True, "constraint=h100", 12), (False, TARGET, HOG_MAX), (False, "constraint=h100", HOG_MAX)]
    assert all(r.answered and r.job_id for r in rows) and not rows[0].cached and not rows[2].cached
    # (the scripted "nodes" of both targets are this machine: the second target's task is a hit on the first's key)

    refuses = ScriptedSlurm(tmp_path / "cache")
    refuses.submit = lambda target, items: pytest.fail("a sweep whose answers are recorded submitted a job")
    (again, submitted, arrays, stopped), _ = slurm_sweep(specs, ["capped.yaml", "edge.yaml"], tmp_path, refuses,
                                                         monkeypatch, targets=(TARGET, "constraint=h100"))
    assert submitted == 0 and arrays == [] and stopped is None
    assert [(r.max_batch_size, r.cache_path, r.cached) for r in again] == [(r.max_batch_size, r.cache_path, True)
                                                                          for r in rows]

    refreshed = ScriptedSlurm(tmp_path / "cache")
    (_, submitted, _, _), _ = slurm_sweep(specs, ["capped.yaml"], tmp_path, refreshed, monkeypatch, refresh=True)
    assert submitted == 1 and refreshed.submitted == [(TARGET, [str(specs["capped.yaml"])])]


def test_a_record_is_believed_only_as_a_cache_hit_would_be(specs, tmp_path, monkeypatch):
    (rows, *_), _ = slurm_sweep(specs, ["edge.yaml"], tmp_path, ScriptedSlurm(tmp_path / "cache"), monkeypatch)
    item = make_items([str(specs["edge.yaml"])], [TARGET], str(tmp_path / "cache"))[0]
    entry = Path(rows[0].cache_path)
    stored = json.loads(entry.read_text())
    entry.write_text(json.dumps({**stored, "max_batch_size": 999}))  # an entry that lies about its trials
    result, why = recorded_result(item, item.load())
    assert result is None and "not used" in why
    entry.unlink()
    assert recorded_result(item, item.load())[0] is None
    other_target = make_items([str(specs["edge.yaml"])], ["partition=gpu-b"], str(tmp_path / "cache"))[0]
    assert recorded_result(other_target, other_target.load()) == (None, None)  # another GPU type: no record
    assert record_path(item.cache_dir, "k").parent.name == "sweep-records"


def test_a_failed_task_and_a_bad_spec_get_their_reasons_and_the_others_answer(specs, tmp_path, monkeypatch):
    monkeypatch.setattr("isoprobe.sweep.slurm.ROW_GRACE_SECONDS", 0.0)
    monkeypatch.setattr("isoprobe.sweep.slurm.POLL_SECONDS", 0.01)
    lost = ScriptedSlurm(tmp_path / "cache", lost=(str(specs["capped.yaml"]),))
    (rows, submitted, _, stopped), _ = slurm_sweep(
        specs, ["capped.yaml", "broken.yaml", "nowhere.yaml", "edge.yaml"], tmp_path, lost, monkeypatch)
    assert stopped is None and submitted == 3  # the missing file is refused before submitting
    capped, broken, nowhere, edge = rows
    assert not capped.answered and "100_0 ended without an answer" in capped.error and "TIME LIMIT" in capped.error
    assert not broken.answered and broken.stop_reason == "error" and "deliberate" in broken.error
    assert nowhere.error.startswith("bad spec") and nowhere.job_id is None
    assert edge.answered and edge.max_batch_size == HOG_MAX


def test_ctrl_c_cancels_the_arrays_and_waits_until_nothing_is_queued(specs, tmp_path, monkeypatch):
    waiting = ScriptedSlurm(tmp_path / "cache", interrupt=True)
    (rows, submitted, arrays, stopped), lines = slurm_sweep(specs, ["capped.yaml", "edge.yaml"], tmp_path, waiting,
                                                            monkeypatch)
    assert stopped == "interrupted" and submitted == 2 and waiting.cancelled == [(["100"], False)]
    assert waiting.running == set()
    assert all(row.error == "cancelled: the sweep was interrupted" and row.job_id for row in rows)
    assert any("cancelling job arrays 100" in line for line in lines)


def test_the_local_executor_goes_on_after_a_failure_and_stops_at_a_signal(tmp_path):
    items = make_items(["a.yaml", "b.yaml", "c.yaml"], ["local"], str(tmp_path))
    outcomes = iter([failed_row("a.yaml", "local", "boom").model_dump_json(), KeyboardInterrupt])

    def run(item):
        outcome = next(outcomes)
        if outcome is KeyboardInterrupt:
            raise KeyboardInterrupt
        return outcome

    rows, stopped = run_local(items, lambda line: None, run=run)
    assert stopped == "interrupted"
    assert [row.error for row in rows] == ["boom", "interrupted before its first trial",
                                            "not probed: the sweep was interrupted"]


def test_a_row_file_is_whole_or_absent(tmp_path):
    path = write_row(tmp_path / "rows", 3, '{"x": 1}')
    assert path == row_path(tmp_path / "rows", 3) and path.read_text() == '{"x": 1}'
    assert [p.name for p in (tmp_path / "rows").iterdir()] == ["row-3.json"]


def test_the_task_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, isoprobe.sweep.task, isoprobe.sweep.slurm, isoprobe.sweep.local, isoprobe.sweep.records; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("argv, message", [
    (["--executor", "slurm"], "needs at least one --partition or --constraint"),
    (["--partition", "a100"], "are for --executor slurm"),
    (["--executor", "slurm", "--partition", "a100", "--sbatch", "exclusive"], "give KEY=VALUE"),
])
def test_sweep_usage_errors_exit_2_before_anything_runs(argv, message, capsys):
    from isoprobe.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["sweep", "spec.yaml", *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_an_array_sbatch_refuses_fails_its_rows_and_the_other_targets_still_run(specs, tmp_path, monkeypatch):
    """sbatch's refusal (a partition that does not exist) was submitit's exception as a traceback."""

    class Refusing(ScriptedSlurm):
        def submit(self, target, items):
            if target == "partition=nope":
                raise RuntimeError("sbatch: error: invalid partition specified: nope")
            return super().submit(target, items)

    (rows, submitted, arrays, stopped), lines = slurm_sweep(
        specs, ["capped.yaml"], tmp_path, Refusing(tmp_path / "cache"), monkeypatch,
        targets=("partition=nope", TARGET))
    refused, answered = rows
    assert not refused.answered and refused.error == ("the job array was not submitted: sbatch: error: invalid "
                                                      "partition specified: nope")
    assert answered.answered and arrays == ["100"] and stopped is None
    assert any("submitting 1 probes on partition=nope failed" in line for line in lines)


def test_over_makes_one_row_per_value_each_the_probe_a_frontier_point_is(specs, tmp_path):
    """``isoprobe sweep --over``: a frontier's points as rows, each loaded as ``isoprobe frontier`` loads it."""
    from isoprobe.spec.load import load_spec
    from isoprobe.spec.overrides import Override

    path = str(specs["edge.yaml"])
    items = make_items([path], ["local"], str(tmp_path / "cache"), sets=("search.retries=2",),
                       over=["search.steps=4", "search.steps=5"])
    assert [item.shown for item in items] == [f"{path} search.steps=4", f"{path} search.steps=5"]
    for item, steps in zip(items, (4, 5)):
        frontier_point = load_spec(path, [Override("search.steps", steps, "--over")], sets=["search.retries=2"])
        assert item.load() == frontier_point  # the same spec, hence the same cache key
        assert item.load().search.steps == steps
