"""Gang trials as Slurm job steps, without Slurm: the launcher rule, the srun command, refusals, one rank's GPU.

The pure parts of ``executors.srun_plan`` and ``child.srun_rank`` (what a step
runs, decided from an allocation's environment alone), the size and the key of
a probe that runs its gangs as steps, and the result's per-rank node. The steps
themselves run on a real cluster in tests/slurm/test_srun_gangs.py.
"""

from __future__ import annotations

import pytest

from isoprobe.cache.store import key_material
from isoprobe.child.srun_rank import one_gpu, rank_files
from isoprobe.executors import ChildRun
from isoprobe.executors.gang import first_failure
from isoprobe.executors.ranks import resolve_launcher, resolve_world_size, with_world_size
from isoprobe.executors.srun_plan import (Allocation, LauncherError, advice, choose_launcher, loss, refusal,
                                         srun_command)
from isoprobe.pipeline.trial_record import trial_from_run
from isoprobe.protocol.messages import TrialResult
from isoprobe.report.outcomes import Outcome
from isoprobe.spec.model import Spec

from conftest import refused_by_stand_in_srun
from scripted_probe import GiB, hog_spec

RAM = 24 * GiB
TWO_NODES = {"SLURM_JOB_ID": "41", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "8"}
ONE_NODE = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "2"}


def _spec(**distributed) -> Spec:
    raw = hog_spec()
    raw["distributed"] = {"strategy": "ddp", **distributed}
    return Spec.model_validate(raw)


# --------------------------------------------------------------------------- the launcher


@pytest.mark.parametrize("asked, environ, wanted, node, expected", [
    ("auto", {}, 2, 2, "local"),                    # no allocation: never a step
    ("auto", ONE_NODE, 2, 8, "local"),              # one node that runs the ranks: no step's start-up
    ("auto", TWO_NODES, 8, 8, "srun"),              # the job's tasks span two nodes
    ("auto", ONE_NODE, 16, 8, "srun"),              # more ranks than this node runs
    ("local", TWO_NODES, 8, 4, "local"),            # asked for: kept, even where auto would step
    ("srun", ONE_NODE, 2, 8, "srun"),
])
def test_the_launcher_rule(asked, environ, wanted, node, expected):
    choice = choose_launcher(asked, Allocation.from_environment(environ), wanted, node)
    assert choice.launcher == expected, choice


def test_srun_outside_an_allocation_says_what_to_do():
    with pytest.raises(LauncherError, match="SLURM_JOB_ID is not set") as refused:
        choose_launcher("srun", Allocation.from_environment({"SLURM_NTASKS": "4"}), 4, 2)
    assert "salloc" in refused.value.fix and "launcher: local" in refused.value.fix


@pytest.mark.parametrize("asked, environ, wanted", [("srun", ONE_NODE, 2), ("auto", TWO_NODES, 8),
                                                ("auto", ONE_NODE, 16)])
def test_a_step_launcher_without_slurms_clients_is_refused_where_it_would_step(asked, environ, wanted):
    """Issue 34: the clients are looked up in the parent (answer._resolve_ranks), so a missing srun is a spec error
    before the environment check, not exit 4 at the first trial."""
    with pytest.raises(LauncherError, match="squeue is not on PATH here") as refused:
        choose_launcher(asked, Allocation.from_environment(environ), wanted, 8, ("squeue",))
    assert "launcher: local" in refused.value.fix


@pytest.mark.parametrize("asked, environ", [("local", TWO_NODES), ("auto", ONE_NODE), ("auto", {})])
def test_a_local_gang_needs_no_slurm_clients(asked, environ):
    choice = choose_launcher(asked, Allocation.from_environment(environ), 2, 8, ("srun", "scancel", "squeue"))
    assert choice.launcher == "local"


def test_auto_steps_on_the_jobs_size_not_the_nodes_cap():
    """In a two-node job of 8 tasks on a CPU node that runs 2 ranks: srun, 8 ranks (not capped to the node)."""
    spec = _spec()
    launcher = resolve_launcher(spec, TWO_NODES, 0, ram_bytes=RAM, cpu_budget=10 * GiB)
    assert launcher.launcher == "srun"
    world = resolve_world_size(spec, TWO_NODES, 0, ram_bytes=RAM, cpu_budget=10 * GiB, across_nodes=True)
    assert (world.size, world.source, world.note) == (8, "SLURM_NTASKS", None)
    local = resolve_world_size(spec, TWO_NODES, 0, ram_bytes=RAM, cpu_budget=10 * GiB)
    assert local.size == 2 and local.note  # the local gang is capped to the node, with a note


def test_the_launcher_is_not_in_the_cache_key_but_the_world_size_is():
    """An allocation's answer serves the next job of the same shape, however its ranks were started."""
    spec = _spec(world_size=4)
    local = key_material(with_world_size(spec, resolve_world_size(spec, {}, 0, ram_bytes=RAM, cpu_budget=GiB),
                                         launcher="local"), "spec.yaml", {}, None)
    stepped = key_material(with_world_size(spec, resolve_world_size(spec, {}, 0, ram_bytes=RAM, cpu_budget=GiB),
                                           launcher="srun"), "spec.yaml", {}, None)
    assert local == stepped
    assert "launcher" not in local["spec"]["distributed"]
    other = key_material(_spec(world_size=8), "spec.yaml", {}, None)
    assert other["spec"]["distributed"]["world_size"] == 8 != local["spec"]["distributed"]["world_size"]


def test_a_launcher_needs_a_strategy():
    with pytest.raises(ValueError, match="launcher: needs a strategy"):
        Spec.model_validate({**hog_spec(), "distributed": {"launcher": "srun"}})


def test_steps_ahead_are_opt_in_need_a_strategy_and_stay_out_of_the_cache_key():
    """How the steps were started is not what they ran: the same key with steps started ahead or not."""
    from isoprobe.executors.srun_gang import SrunGangExecutor
    from isoprobe.pipeline.pipeline import local_executor

    with pytest.raises(ValueError, match="steps_ahead: needs a strategy"):
        Spec.model_validate({**hog_spec(), "distributed": {"steps_ahead": True}})
    with pytest.raises(ValueError, match="launcher local starts none"):
        Spec.model_validate({**hog_spec(), "distributed": {"strategy": "ddp", "world_size": 2, "launcher": "local",
                                                           "steps_ahead": True}})
    raw = {**hog_spec(), "distributed": {"strategy": "ddp", "world_size": 2, "launcher": "srun"}}
    plain = key_material(Spec.model_validate(raw), "spec.yaml", {}, None)
    raw["distributed"]["steps_ahead"] = True
    assert key_material(Spec.model_validate(raw), "spec.yaml", {}, None) == plain
    assert "steps_ahead" not in plain["spec"]["distributed"]
    executors = {ahead: local_executor(Spec.model_validate({**raw, "distributed": {**raw["distributed"],
                                                                                    "steps_ahead": ahead}}))
                 for ahead in (False, True)}
    # Asked for by name, steps ahead do not hang on search.warm_start (a local spare's switch).
    executors["cold"] = local_executor(Spec.model_validate({**raw, "search": {**raw.get("search", {}),
                                                                              "warm_start": False}}))
    try:
        assert all(isinstance(e, SrunGangExecutor) for e in executors.values())
        assert (executors[False].ahead, executors[True].ahead, executors[True].world) == (False, True, 2)
        assert executors["cold"].ahead
    finally:
        for executor in executors.values():
            executor.close()


# --------------------------------------------------------------------------- the step's command


def test_the_srun_command_runs_one_capped_rank_per_task():
    argv = srun_command(world_size=8, nodes=2, step_dir="/shared/t1.step", python="/venv/bin/python",
                        rank_entry="/pkg/isoprobe/system/standalone.py", data_limits=(1536 * 2**20, 1600 * 2**20),
                        cuda=False)
    assert argv[:2] == ["srun", "--ntasks=8"]
    assert {"--kill-on-bad-exit=1", "--job-name=isoprobe-trial", "--nodes=2", "--export=ALL"} <= set(argv)
    assert "--output=/shared/t1.step/rank%t.stdout" in argv and "--error=/shared/t1.step/rank%t.stderr" in argv
    assert not any(a.startswith("--gpus") for a in argv)
    # Each task: the isolated wrapper, the step's folder, RLIMIT_DATA's soft and hard limits.
    assert argv[-8:] == ["/venv/bin/python", "-I", "-S", "/pkg/isoprobe/system/standalone.py", "child/srun_rank",
                         "/shared/t1.step", str(1536 * 2**20), str(1600 * 2**20)]


def test_a_step_started_ahead_shares_the_running_steps_cpus_and_waits_for_a_line_on_stdin():
    """The next trial's step (search.warm_start): --overlap (beside the running step), srun's stdin forwarded to every
    rank (their turn), and the wrapper told so; the trial's own step takes no input and overlaps nothing."""
    ahead = srun_command(world_size=2, nodes=2, step_dir="/shared/a1.step", python="/venv/bin/python",
                         rank_entry="/pkg/isoprobe/system/standalone.py", data_limits=(2**30, 2**30 + 2**26), cuda=False,
                         ahead=True)
    assert {"--overlap", "--input=all"} <= set(ahead) and "--input=none" not in ahead
    assert ahead[-6:] == ["/pkg/isoprobe/system/standalone.py", "child/srun_rank", "--ahead", "/shared/a1.step", str(2**30),
                          str(2**30 + 2**26)]
    due = srun_command(world_size=2, nodes=2, step_dir="/shared/t1.step", python="/venv/bin/python",
                       rank_entry="/pkg/isoprobe/system/standalone.py", data_limits=None, cuda=False)
    assert "--overlap" not in due and "--input=none" in due and "--ahead" not in due


def test_the_srun_command_on_cuda_binds_one_gpu_a_task_and_never_more_nodes_than_ranks():
    argv = srun_command(world_size=2, nodes=4, step_dir="/s", python="p", rank_entry="r", data_limits=None,
                        cuda=True)
    assert "--gpus-per-task=1" in argv and "--nodes=2" in argv
    assert argv[-6:] == ["p", "-I", "-S", "r", "child/srun_rank", "/s"]  # no cap on CUDA: the budget is the GPU's


@pytest.mark.parametrize("stderr, refused", [
    ("srun: error: Unable to create step for job 7: More processors requested than permitted\n", True),
    ("srun: error: Unable to create step for job 7: Requested node configuration is not available", True),
    ("srun: error: isonode: task 1: Killed\nsrun: launch/slurm: _step_signal: Terminating StepId=7.2\n", False),
    ("", False),
])
def test_slurms_refusals_are_told_from_a_ranks_end(stderr, refused):
    assert (refusal(stderr) is not None) is refused


#: srun's words, measured on the two-node test cluster (Slurm 22.05), for a step it lost after starting it.
NODE_FAILURE = "srun: error: Node failure on n2\nsrun: error: n1: task 0: Killed\n"
LAUNCH_FAILURE = "srun: error: task 1 launch failed: Slurmd could not connect IO\nsrun: forcing job termination\n"


@pytest.mark.parametrize("stderr, lost", [
    (NODE_FAILURE, "srun: error: Node failure on n2"),
    (LAUNCH_FAILURE, "srun: error: task 1 launch failed: Slurmd could not connect IO"),
    ("srun: error: isonode: task 1: Killed\nsrun: launch/slurm: _step_signal: Terminating StepId=7.2\n", None),
    ("srun: error: n2: task 1: Out Of Memory\n", None),
])
def test_a_step_slurm_lost_is_told_from_a_rank_that_failed(stderr, lost):
    """A node that failed under the step, or a task that could not be launched, is Slurm's doing, whatever the ranks
    show then (killed, never started); a rank killed or out of memory on its own is the batch's."""
    assert loss(stderr) == lost


@pytest.mark.parametrize("body, says, advised, tries", [
    (f"printf '{NODE_FAILURE}' >&2\nexit 137", "Node failure on n2", "failed or was set down", 1),
    (f"printf '{LAUNCH_FAILURE}' >&2\nexit 1", "could not connect IO", "TMPDIR must be a folder every node", 2),
])
def test_a_step_slurm_lost_stops_the_probe_with_slurms_words_and_what_to_do(tmp_path, body, says, advised, tries):
    """Through a real executor (a stand-in srun): not a trial's outcome but exit 4's ProbeError with Slurm's line and
    the advice for it. A failed node is out of the job for good, so the step is not asked for again; a launch
    failure is asked for once more, and names TMPDIR and where the trial folders are."""
    calls = tmp_path / "srun.calls"
    error = refused_by_stand_in_srun(tmp_path, f"echo called >> '{calls}'\n{body}")
    assert says in error.message and advised in error.message, error.message
    assert "That is the allocation, not the batch" in error.message
    assert len(calls.read_text().split()) == tries


def test_advice_for_a_plain_refusal_is_the_allocations():
    assert "SLURM_NTASKS" in advice("srun: error: Unable to create step for job 7: More processors requested", "/t")


# --------------------------------------------------------------------------- one rank


@pytest.mark.parametrize("visible, local_rank, expected", [
    (None, 1, None),          # the CPU backend: nothing to choose
    ("3", 1, "3"),            # Slurm bound one GPU to the task: that one
    ("0,1,2,3", 2, "2"),      # the task sees the node's GPUs: the one at its local rank
    ("GPU-a,GPU-b", 1, "GPU-b"),
])
def test_each_rank_takes_one_gpu(visible, local_rank, expected):
    assert one_gpu(visible, local_rank) == expected


def test_a_ranks_files_are_named_as_the_executor_reads_them(tmp_path):
    from isoprobe.executors.srun_gang import _Step

    step = _Step(tmp_path, 2, process=None, lifeline_write=-1, began=0.0)
    for name, path in rank_files(str(tmp_path), 1).items():
        assert str(step.files(1)[name]) == path


# --------------------------------------------------------------------------- judging the step


def _verdict(outcome: Outcome, t: float) -> TrialResult:
    return TrialResult(t=t, outcome=outcome, phase="done" if outcome is Outcome.FITS else "step")


@pytest.mark.parametrize("states, expected", [
    ([(None, False, None), (None, False, None)], (False, None)),                      # both running
    ([(_verdict(Outcome.FITS, 1), True, 0), (None, False, None)], (False, None)),     # one done, one running
    ([(_verdict(Outcome.FITS, 1), True, 0), (_verdict(Outcome.FITS, 2), True, 0)], (True, None)),
    ([(None, False, None), (_verdict(Outcome.OUT_OF_MEMORY, 2), False, None)], (True, 1)),  # at once, not at exit
    ([(_verdict(Outcome.ERROR, 3), True, 1), (None, True, -9)], (True, 1)),          # killed without a verdict first
    ([(_verdict(Outcome.FITS, 1), True, 1), (None, False, None)], (True, 0)),        # 'fits', then a bad exit
])
def test_the_first_rank_that_fails_ends_the_gang(states, expected):
    assert first_failure(states) == expected


def test_a_rank_that_crashed_is_blamed_not_the_peer_slurm_killed_for_it():
    """Rank 1 crashed (its exit recorded, no verdict); --kill-on-bad-exit then killed rank 0, which left no exit."""
    from isoprobe.executors.srun_gang import step_states

    states = step_states([[], []], [None, -11], srun_ended=True)
    assert first_failure(states) == (True, 1)
    # Both gone without an end of their own (the step cancelled from outside): ended, the first one named.
    assert first_failure(step_states([[], []], [None, None], srun_ended=True)) == (True, 0)
    # srun still running: a rank without an exit is still running.
    assert first_failure(step_states([[], []], [None, None], srun_ended=False)) == (False, None)


def test_a_step_ranks_node_reaches_the_result():
    from isoprobe.executors.scripted import fits, out_of_memory

    ranks = (replace_node(fits(900), "n1"), replace_node(out_of_memory(), "n2"))
    run = ChildRun(returncode=0, timed_out=False, seconds=1.0, ranks=ranks, failed_rank=1)
    trial = trial_from_run(run, 1, 8, "search")
    assert [rank.node for rank in trial.ranks] == ["n1", "n2"]
    assert trial.failed_rank == 1


def replace_node(run: ChildRun, node: str) -> ChildRun:
    from dataclasses import replace

    return replace(run, node=node)


def _stand_in_slurm(tmp_path, squeue_body: str):
    """Stand-ins for scancel (each call appended to ``scancel.log``), squeue (``squeue_body``) and scontrol."""
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.executors.srun_gang import SrunGangExecutor

    slurm = tmp_path / "bin"
    slurm.mkdir()
    bodies = {"scancel": f'echo "$*" >> {tmp_path}/scancel.log', "squeue": squeue_body,
              "scontrol": 'echo "StepId=$4 State=COMPLETING NodeList=n1,n2"'}
    for name, body in bodies.items():
        (slurm / name).write_text(f"#!/bin/sh\n{body}\n")
        (slurm / name).chmod(0o755)
    return SrunGangExecutor(LocalExecutor(warm=False), nodes=2, **{name: str(slurm / name) for name in bodies})


def test_a_step_slurm_is_slow_to_drop_is_cancelled_again_and_waited_for(tmp_path, monkeypatch):
    """A step still listed after its end (its tasks killed, Slurm's bookkeeping held up on a loaded machine) is
    killed and cancelled again, and the trial goes on once ``squeue -s`` drops it: the listing here lasts until
    the second request."""
    from isoprobe.executors import srun_gang

    monkeypatch.setattr(srun_gang, "STEP_RECANCEL_SECONDS", 0.2)
    executor = _stand_in_slurm(tmp_path, f'[ -s {tmp_path}/scancel.log ] || echo 7.3')
    executor._wait_step_gone("7.3")
    assert (tmp_path / "scancel.log").read_text().splitlines() == ["--ctld --signal=KILL 7.3", "7.3"]


def test_a_step_slurm_never_drops_stops_the_probe_with_what_slurm_says_of_it(tmp_path, monkeypatch):
    """Never a step beside one still listed: after STEP_GONE_SECONDS the probe stops, quoting scontrol's record."""
    from isoprobe.errors import ProbeError
    from isoprobe.executors import srun_gang

    monkeypatch.setattr(srun_gang, "STEP_RECANCEL_SECONDS", 0.2)
    monkeypatch.setattr(srun_gang, "STEP_GONE_SECONDS", 1.0)
    executor = _stand_in_slurm(tmp_path, "echo 7.3")
    with pytest.raises(ProbeError) as stopped:
        executor._wait_step_gone("7.3")
    assert "squeue -s still lists it 1 s later" in str(stopped.value)
    assert "StepId=7.3 State=COMPLETING NodeList=n1,n2" in str(stopped.value)
    asked = (tmp_path / "scancel.log").read_text().splitlines()
    assert len(asked) >= 4 and set(asked) == {"--ctld --signal=KILL 7.3", "7.3"}, asked
