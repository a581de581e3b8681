"""The local executor's process primitives that need no child: a child's environment, the request file,
its stderr's tail, and the cgroup's OOM-kill counter. No process is started here."""

from __future__ import annotations

import os
from pathlib import Path

from isoprobe.executors.processes import MALLOC_MMAP_THRESHOLD, child_environment, stderr_tail, write_atomically
from isoprobe.protocol.messages import EVENTS_ENV

# --------------------------------------------------------------------------- child_environment


def test_child_environment_cpu_with_allocator(tmp_path):
    events = tmp_path / "t.events.jsonl"
    base = {"PATH": "/usr/bin", "HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "0,1"}
    env = child_environment(base, backend="cpu", allocator="expandable_segments:True", events_path=events)
    assert env[EVENTS_ENV] == str(events)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(MALLOC_MMAP_THRESHOLD)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/u"
    # The base mapping is not modified.
    assert base == {"PATH": "/usr/bin", "HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_child_environment_allocator_overrides_an_inherited_one(tmp_path):
    base = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    env = child_environment(base, backend="cuda", allocator="expandable_segments:True", events_path=tmp_path / "e")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


def test_child_environment_without_allocator_leaves_the_inherited_one(tmp_path):
    base = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env = child_environment(base, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in env


def test_child_environment_without_allocator_sets_none(tmp_path):
    env = child_environment({}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert "PYTORCH_ALLOC_CONF" not in env


def test_child_environment_empty_allocator_removes_inherited_ones(tmp_path):
    # '' is torch's default allocator ('default' in the spec's allocators): nothing of isoprobe's own may leak in.
    base = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    env = child_environment(base, backend="cuda", allocator="", events_path=tmp_path / "e")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert "PYTORCH_ALLOC_CONF" not in env
    assert base["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # the base is not modified


def test_child_environment_cuda_keeps_the_gpus_and_malloc(tmp_path):
    base = {"CUDA_VISIBLE_DEVICES": "1"}
    env = child_environment(base, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    no_gpu_var = child_environment({}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert "CUDA_VISIBLE_DEVICES" not in no_gpu_var


def test_child_environment_makes_the_package_importable_and_keeps_pythonpath(tmp_path):
    import isoprobe

    package_root = str(Path(isoprobe.__file__).resolve().parent.parent)
    env = child_environment({"PYTHONPATH": "/user/lib"}, backend="cpu", allocator=None, events_path=tmp_path / "e")
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == package_root
    assert "/user/lib" in parts
    bare = child_environment({}, backend="cpu", allocator=None, events_path=tmp_path / "e")
    assert bare["PYTHONPATH"] == package_root  # no empty entry (which would mean the working directory)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONFAULTHANDLER"] == "1"


def test_child_environment_accepts_os_environ(tmp_path):
    env = child_environment(os.environ, backend="cpu", allocator=None, events_path=tmp_path / "e")
    assert isinstance(env, dict)
    assert env[EVENTS_ENV] == str(tmp_path / "e")
    assert EVENTS_ENV not in os.environ or os.environ[EVENTS_ENV] != env[EVENTS_ENV]


# --------------------------------------------------------------------------- files


def test_write_atomically_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "request.json"
    target.write_text("old")
    write_atomically(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["request.json"]


def test_stderr_tail_keeps_faulthandlers_headline_behind_a_long_dump(tmp_path):
    stderr = tmp_path / "stderr"
    dump = "Fatal Python error: Segmentation fault\n\n" + "".join(
        f'  File "/some/long/path/module{i}.py", line {i} in function_{i}\n' for i in range(400)
    )
    stderr.write_text("model output\n" * 50 + dump)
    tail = stderr_tail(stderr)
    assert tail.startswith("Fatal Python error: Segmentation fault\n[...]\n")
    assert tail.endswith("line 399 in function_399\n")
    short = tmp_path / "short"
    short.write_text("Fatal Python error: Aborted\n\nCurrent thread 0x1\n")
    assert stderr_tail(short) == "Fatal Python error: Aborted\n\nCurrent thread 0x1\n"


def test_stderr_tail_of_a_missing_file_is_empty(tmp_path):
    assert stderr_tail(tmp_path / "never-written") == ""


# --------------------------------------------------------------------------- the kernel's evidence


def test_oom_kill_counter_parsing_v1_and_v2(tmp_path):
    from isoprobe.system.oomkill import oom_kill_count

    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 5\noom_group_kill 0\n")
    assert oom_kill_count(v1) == 3
    assert oom_kill_count(v2) == 5
    assert oom_kill_count(tmp_path / "missing") is None
    assert oom_kill_count(None) is None


# --------------------------------------------------------------------------- deadlines and the keeper


def test_the_import_has_its_own_bound_never_shorter_than_the_trials():
    from isoprobe.executors.processes import IMPORT_TIMEOUT_SECONDS, import_timeout

    assert IMPORT_TIMEOUT_SECONDS == 300
    assert import_timeout(7) == 300  # a tight trial timeout does not starve the import
    assert import_timeout(3600) == 3600  # who allows a trial an hour allows its import as long


def test_the_keeper_command_runs_it_isolated_with_the_lifeline_and_the_childs_argv():
    import sys

    from isoprobe.system import keeper, standalone

    argv = keeper.command(7, ["python", "-m", "isoprobe.child", "--wait"])
    assert argv[:3] == [sys.executable, "-I", "-S"]  # no PYTHON* variables, no site-packages
    assert (Path(argv[3]), argv[4]) == (Path(standalone.__file__).resolve(), "system/keeper")  # the one loader
    assert argv[5:] == ["7", "--", "python", "-m", "isoprobe.child", "--wait"]


def test_the_keeper_runs_isolated_through_the_loader_and_its_primitives_are_the_packages_when_imported(tmp_path):
    """Run as the executor runs it (``python -I -S standalone.py system/keeper``): no isoprobe on its path, its
    primitives loaded by their file; imported by name (the parent), they are the package's one module."""
    import subprocess
    import sys

    from isoprobe.system import keeper, primitives

    assert keeper.primitives is primitives
    read, write = os.pipe()
    process = subprocess.run(keeper.command(read, [sys.executable, "-c", "print('ran')"]), pass_fds=(read,),
                             capture_output=True, text=True, timeout=30)
    os.close(read)
    os.close(write)
    assert (process.returncode, process.stdout, process.stderr) == (0, "ran\n", "")


def test_a_stopped_keeper_runs_its_on_stop_commands_before_the_kill_and_a_finished_one_does_not(tmp_path):
    """What srun's keeper relies on when isoprobe dies mid-step: the commands in the --on-stop file (there,
    ``scancel`` of the step, whose tasks are no descendants of the keeper) run when the lifeline closes while
    the child runs; a child that ended on its own needs none, and none runs."""
    import json
    import subprocess
    import sys
    import time

    from isoprobe.system import keeper

    def started(child: list[str], name: str):
        on_stop = tmp_path / f"{name}.on-stop.json"
        on_stop.write_text(json.dumps([[sys.executable, "-c", f"open({str(tmp_path / name)!r}, 'w').write('ran')"]]))
        read, write = os.pipe()
        process = subprocess.Popen(keeper.command(read, child, on_stop=str(on_stop)), pass_fds=(read,))
        os.close(read)
        return process, write

    process, lifeline = started([sys.executable, "-c", "import time; time.sleep(60)"], "stopped")
    time.sleep(0.3)
    os.close(lifeline)  # as when isoprobe dies
    assert process.wait(timeout=20) == -9  # the child was killed: the keeper ends as its child did
    assert (tmp_path / "stopped").read_text() == "ran"

    process, lifeline = started([sys.executable, "-c", "pass"], "finished")
    assert process.wait(timeout=20) == 0
    os.close(lifeline)
    assert not (tmp_path / "finished").exists()
    assert keeper.command(7, ["x"], on_stop="/f")[5:] == ["7", "--on-stop", "/f", "--", "x"]


def test_a_stopped_keeper_cancels_the_job_steps_an_srun_in_its_tree_started(tmp_path):
    """``isoprobe run -- srun python train.py`` with isoprobe SIGKILLed mid-trial: the command's srun started a
    job step whose tasks run under each node's slurmstepd, out of the keeper's reach, and outlive a killed srun.
    The stopped keeper finds that srun in its tree, asks ``scontrol show step`` which step it started, and has
    Slurm kill the step's tasks and cancel it, before it kills the tree. Stand-ins for srun (a process of that
    name), scontrol (the listing Slurm 22.05 prints, with a step of another srun beside it) and scancel."""
    import socket
    import subprocess
    import sys
    import time

    from isoprobe.system import keeper, primitives

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": "sleep 60",  # no exec: the shell stays, named srun
        "scontrol": (f"exec {sys.executable} -c \"import os\n"
                     "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                     "    try: comm = open('/proc/%s/comm' % pid).read().strip()\n"
                     "    except OSError: continue\n"
                     f"    if comm == 'srun': print('StepId=9.0 State=RUNNING SrunHost:Pid={socket.gethostname()}:%s' % pid)\n"
                     "print('StepId=9.1 State=RUNNING SrunHost:Pid=elsewhere:1')\""),
        "scancel": f'echo "$*" >> {tmp_path}/scancel.log',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    read, write = os.pipe()
    process = subprocess.Popen(keeper.command(read, [sys.executable, "-c", "import subprocess; subprocess.run(['srun'])"]),
                               pass_fds=(read,), env=env)
    os.close(read)
    deadline = time.monotonic() + 20
    while not primitives.srun_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert primitives.srun_processes(process.pid), "the stand-in srun never started"
    os.close(write)  # as when isoprobe dies
    assert process.wait(timeout=30) == -9
    assert (tmp_path / "scancel.log").read_text().splitlines() == ["--ctld --signal=KILL 9.0", "9.0"]


def test_a_keeper_whose_child_ended_leaving_an_srun_behind_cancels_its_steps_before_the_kill(tmp_path):
    """When isoprobe dies, the fork server (its keeper's child) reads EOF and exits in the same instant as the
    lifeline closes; the keeper may reap it first and see a child that *ended*, with a trial's srun still running
    below it. Its sweep then killed that srun (and the trial's own keeper, mid-cancel) without asking Slurm, and
    the step's tasks ran on (measured on the two-node test cluster under CPU load, 2 runs in 7). Whatever ended
    the child, a keeper about to kill an srun cancels its steps first. Stand-ins as in the test above; the child
    starts srun in a session of its own and exits at once, leaving it to the keeper (a subreaper)."""
    import socket
    import subprocess
    import sys
    import time

    from isoprobe.system import keeper

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": f"touch {tmp_path}/srun-started; sleep 60",
        "scontrol": (f"exec {sys.executable} -c \"import os\n"
                     "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                     "    try: comm = open('/proc/%s/comm' % pid).read().strip()\n"
                     "    except OSError: continue\n"
                     f"    if comm == 'srun': print('StepId=4.0 State=RUNNING SrunHost:Pid={socket.gethostname()}:%s' % pid)\""),
        "scancel": f'echo "$*" >> {tmp_path}/scancel.log',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    child = ("import os, subprocess, time\n"
             "subprocess.Popen(['srun'], start_new_session=True)\n"
             f"while not os.path.exists({str(tmp_path / 'srun-started')!r}): time.sleep(0.01)\n")
    read, write = os.pipe()
    process = subprocess.Popen(keeper.command(read, [sys.executable, "-c", child]), pass_fds=(read,), env=env)
    os.close(read)
    try:
        assert process.wait(timeout=30) == 0  # the keeper ends as its child did: it ended on its own
    finally:
        os.close(write)
    assert (tmp_path / "scancel.log").read_text().splitlines() == ["--ctld --signal=KILL 4.0", "4.0"]
