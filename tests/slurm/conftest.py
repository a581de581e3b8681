"""A real single-node Slurm cluster for the tests in this folder, started once per session.

``slurm_cluster`` writes a slurm.conf (and gres.conf with two fake GPUs) into a temporary
folder, starts slurmctld and slurmd in the foreground (``-D``) as children of this pytest
process, waits until the node is idle and stops exactly those two processes at the end.
Nothing in /etc is read or changed: daemons get ``-f CONF`` and clients ``SLURM_CONF``.

Requirements: the slurmctld, slurmd and slurm-client packages (Debian 12 ships Slurm 22.05)
and root. No munged: ``AuthType=auth/none`` with ``CredType=cred/none``. No cgroups:
``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``.

Without them the tests skip, with the reason; with ``ISOPROBE_REQUIRE_SLURM=1`` (set by
.ci/run) they fail instead, so CI cannot pass without having run them.

The leftover-process check in tests/conftest.py compares each test's descendants with those
alive when the test started. pytest sets up session fixtures before function fixtures, so the
two daemons are already in that "before" set; a test's jobs must be over when it ends, and
``wait`` also waits for the job's slurmstepd processes to exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import _descendants  # tests/conftest.py: live descendants, by ancestry (/proc)

REQUIRE = os.environ.get("ISOPROBE_REQUIRE_SLURM") == "1"
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
TERMINAL = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
}
NODE = "isonode"
PARTITION = "debug"
FAKE_GPUS = 2
BRING_UP_TIMEOUT = 30.0
_PR_SET_PDEATHSIG = 1


def unavailable(reason: str):
    """Skip with the reason, or fail with it where Slurm is required (CI)."""
    if REQUIRE:
        pytest.fail(f"ISOPROBE_REQUIRE_SLURM=1 but the Slurm cluster is unavailable: {reason}", pytrace=False)
    pytest.skip(f"no Slurm cluster: {reason}")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _state(pid: int) -> str | None:
    """The process state letter from /proc, None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class JobRun:
    """A finished job: its state, exit code ("0:0"), output files' text and the wall time seen."""

    job_id: str
    state: str
    exit_code: str
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return f"job {self.job_id} {self.state} exit {self.exit_code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class SlurmCluster:
    """The running cluster: its files, the environment for clients, and helpers to run jobs."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.gres_conf = root / "gres.conf"
        self.jobs = root / "jobs"
        self.logs = root / "log"
        self.task_prolog_path = root / "taskprolog"
        self.task_prolog_hook = root / "taskprolog.d" / "current"
        self.node = NODE
        self.partition = PARTITION
        self.gpus = 0
        self.procs: dict[str, subprocess.Popen] = {}
        self._scripts = 0
        self._submitted: dict[str, float] = {}
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "GPU_DEVICE_ORDINAL"):
            keep.pop(name, None)
        bin_dirs = [str(Path(sys.executable).parent), *keep.get("PATH", "").split(os.pathsep), "/usr/bin", "/bin", *SBIN]
        keep["PATH"] = os.pathsep.join(dict.fromkeys(d for d in bin_dirs if d))
        keep["SLURM_CONF"] = str(self.conf)
        self.env = keep

    # --- clients -------------------------------------------------------------------------------------

    def command(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client (sbatch, squeue, ...) against this cluster."""
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.jobs)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def submit(self, script: str, **sbatch_options) -> str:
        """sbatch ``script`` (text; '#!/bin/bash' added when it has no '#!'); returns the job id.

        Keyword options become sbatch options: ``gres="gpu:fake:1"`` -> ``--gres=gpu:fake:1``,
        ``export="ALL,X=1"``, a True value -> the bare flag. Output goes to jobs/JOBID.out and
        .err unless ``output``/``error`` are given.
        """
        if not script.startswith("#!"):
            script = "#!/bin/bash\n" + script
        self._scripts += 1
        path = self.jobs / f"script-{self._scripts}.sh"
        path.write_text(script)
        path.chmod(0o755)
        sbatch_options.setdefault("output", str(self.jobs / "%j.out"))
        sbatch_options.setdefault("error", str(self.jobs / "%j.err"))
        args = ["sbatch", "--parsable"]
        for key, value in sbatch_options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value not in (None, False):
                args.append(f"{flag}={value}")
        done = self.command(*args, str(path))
        job_id = done.stdout.strip().split(";")[0]
        assert job_id.isdigit(), done.stdout
        self._submitted[job_id] = time.monotonic()
        return job_id

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict ({} when Slurm no longer knows the job); an array's first task."""
        records = self.job_records(job_id)
        return records[0] if records else {}

    def job_records(self, job_id: str) -> list[dict[str, str]]:
        """One dict per line of ``scontrol show job -o``: one for a job, one per task for an array."""
        done = self.command("scontrol", "show", "job", "-o", job_id, check=False)
        if done.returncode != 0:
            return []
        return [
            dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", line)) for line in done.stdout.splitlines() if line.strip()
        ]

    def wait(self, job_id: str, timeout: float = 120) -> str:
        """Poll until the job (every task of an array) has ended; its final state (COMPLETED, FAILED, ...).

        Polls scontrol every 0.1 s (``sbatch --wait`` polls every few seconds). Then waits up to
        5 s for the job's slurmstepd processes to exit, so none outlives the test. For an array the
        state is COMPLETED only when every task completed, else the first other state. On timeout
        the job is cancelled and AssertionError raised.
        """
        deadline = time.monotonic() + timeout
        states = ["UNKNOWN"]
        while time.monotonic() < deadline:
            records = self.job_records(job_id)
            states = [r.get("JobState", "UNKNOWN") for r in records] or ["UNKNOWN"]
            if all(state in TERMINAL for state in states):
                for record in records:
                    self.settle(record.get("JobId", job_id))
                return next((state for state in states if state != "COMPLETED"), "COMPLETED")
            time.sleep(0.1)
        self.command("scancel", job_id, check=False)
        self.settle(timeout=10)
        raise AssertionError(f"job {job_id} still {states} after {timeout} s; cancelled\n{self._job_logs(job_id)}")

    def run(self, script: str, timeout: float = 120, **sbatch_options) -> JobRun:
        """submit + wait + the output files."""
        job_id = self.submit(script, **sbatch_options)
        state = self.wait(job_id, timeout)
        seconds = time.monotonic() - self._submitted[job_id]
        info = self.job_info(job_id)
        return JobRun(job_id, state, info.get("ExitCode", "?"), self.output(job_id), self.output(job_id, "err"), seconds)

    def output(self, job_id: str, kind: str = "out") -> str:
        path = self.jobs / f"{job_id}.{kind}"
        return path.read_text(errors="replace") if path.exists() else ""

    def steps_alive(self, job_id: str | None = None) -> list[int]:
        """PIDs of this session's live slurmstepd processes (all jobs, or one)."""
        marker = f"[{job_id}." if job_id else "["
        found = []
        for pid in _descendants(os.getpid()):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm == "slurmstepd" and marker in _cmdline(pid):
                found.append(pid)
        return found

    def settle(self, job_id: str | None = None, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while self.steps_alive(job_id) and time.monotonic() < deadline:
            time.sleep(0.05)

    @contextlib.contextmanager
    def task_prolog(self, script: str):
        """Install ``script`` as the TaskProlog for the jobs started inside the ``with`` block.

        slurm.conf names a fixed TaskProlog (``self.task_prolog_path``) that execs
        taskprolog.d/current when it exists; this writes that file and removes it afterwards.
        """
        if not script.startswith("#!"):
            script = "#!/bin/sh\n" + script
        tmp = self.task_prolog_hook.with_suffix(".tmp")
        tmp.write_text(script)
        tmp.chmod(0o755)
        tmp.replace(self.task_prolog_hook)
        try:
            yield self.task_prolog_hook
        finally:
            self.task_prolog_hook.unlink(missing_ok=True)

    def _job_logs(self, job_id: str) -> str:
        return (
            f"--- {job_id}.out\n{self.output(job_id)}\n--- {job_id}.err\n{self.output(job_id, 'err')}\n"
            f"--- slurmd.log\n{_tail(self.logs / 'slurmd.log')}"
        )

    # --- life cycle ----------------------------------------------------------------------------------

    def write_config(self) -> None:
        for folder in ("state", "spool", "log", "jobs", "gpu", "taskprolog.d"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.gpus = self._make_fake_gpus()
        host = socket.gethostname().split(".")[0]
        cpus = min(os.cpu_count() or 1, len(os.sched_getaffinity(0)))
        mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        gres = f" Gres=gpu:fake:{self.gpus}" if self.gpus else ""
        r = self.root
        self.task_prolog_path.write_text(
            "#!/bin/sh\n"
            "# This cluster's TaskProlog: runs the hook a test installed with task_prolog(), if any.\n"
            f"hook='{self.task_prolog_hook}'\n"
            'if [ -x "$hook" ]; then exec "$hook"; fi\n'
            "exit 0\n"
        )
        self.task_prolog_path.chmod(0o755)
        lines = [
            "ClusterName=isoprobe-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=batch_sched_delay=0",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=600",
            f"TaskProlog={self.task_prolog_path}",
            *(["GresTypes=gpu"] if self.gpus else []),
            f"NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} "
            f"RealMemory={int(mem_mib * 0.9)}{gres} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        if self.gpus:
            self.gres_conf.write_text(
                "AutoDetect=off\n"
                f"NodeName={self.node} Name=gpu Type=fake File={r}/gpu/nvidia[0-{self.gpus - 1}]\n"
            )

    def _make_fake_gpus(self) -> int:
        """Character devices like NVIDIA's (major 195) for the fake GRES; 0 when mknod is not allowed."""
        try:
            for index in range(FAKE_GPUS):
                path = self.root / "gpu" / f"nvidia{index}"
                if not path.exists():
                    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, index))
        except OSError:
            return 0
        return FAKE_GPUS

    def start(self) -> None:
        for name in DAEMONS:
            exe = _which(name)
            args = [exe, "-D", "-f", str(self.conf)]
            if name == "slurmctld":
                args.append("-i")  # a cold start: ignore missing state files
            else:
                args += ["-N", self.node]
            with open(self.logs / f"{name}.stderr", "wb") as err:
                self.procs[name] = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.root,
                    start_new_session=True,  # a terminal's Ctrl-C reaches pytest, which stops them in order
                    preexec_fn=_die_with_parent,  # and they do not outlive a killed pytest
                )

    def wait_idle(self, timeout: float) -> str | None:
        """None once the node is idle; else why not."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    return f"{name} exited with {proc.returncode}:\n{self.daemon_logs(name)}"
            done = self.command("sinfo", "-h", "-N", "-n", self.node, "-o", "%T %E", check=False, timeout=10)
            last = (done.stdout or done.stderr).strip()
            if done.returncode == 0 and last.split(" ")[0] == "idle":
                return None
            time.sleep(0.05)
        return f"node not idle after {timeout} s (sinfo: {last!r})\n" + "\n".join(self.daemon_logs(n) for n in DAEMONS)

    def daemon_logs(self, name: str) -> str:
        return f"--- {name}.log\n{_tail(self.logs / f'{name}.log')}\n--- {name} stderr\n{_tail(self.logs / f'{name}.stderr')}"

    def stop(self) -> None:
        """Cancel what is left, stop slurmd then slurmctld (only our two PIDs), then stray slurmstepds."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            left = self.command("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if left:
                self.command("scancel", *left, check=False, timeout=10)
                self.settle(timeout=5)
        for name in sorted(self.procs, key=lambda n: n == "slurmctld"):  # the node daemons first, the controller last
            proc = self.procs[name]
            if proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self.steps_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 3
        while any(_alive(pid) for pid in self.steps_alive()) and time.monotonic() < deadline:
            time.sleep(0.05)


def bring_up(root: Path, kind: type[SlurmCluster] | None = None, needs: tuple[str, ...] = ()
             ) -> tuple[SlurmCluster | None, str | None, float]:
    """Start a cluster of ``kind`` (SlurmCluster by default) in ``root``: (cluster, None, seconds) or (None, reason,
    seconds). ``needs``: programs it needs beyond Slurm's."""
    began = time.monotonic()
    missing = [name for name in (*DAEMONS, *CLIENTS, *needs) if _which(name) is None]
    if missing:
        return None, f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client)", 0.0
    if os.geteuid() != 0:
        return None, "slurmd must run as root to start jobs; these tests need root", 0.0
    cluster = (kind or SlurmCluster)(root)
    try:
        cluster.write_config()
        cluster.start()
        why = cluster.wait_idle(BRING_UP_TIMEOUT)
    except BaseException:
        cluster.stop()
        raise
    if why is not None:
        cluster.stop()
        return None, why, time.monotonic() - began
    return cluster, None, time.monotonic() - began


def running(root: Path, kind: type[SlurmCluster] | None = None, needs: tuple[str, ...] = ()):
    """A session fixture's body: the cluster up (or the tier skipped or failed, with the reason), stopped after."""
    cluster, why, seconds = bring_up(root, kind, needs)
    if cluster is None:
        unavailable(why)
    cluster.bring_up_seconds = seconds
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running single-node cluster (node 'isonode', 2 fake GPUs when mknod works); stopped at the end."""
    yield from running(tmp_path_factory.mktemp("slurm"))


# ----------------------------------------------------------------------------------------- two nodes on one machine

#: The two-node cluster's node names: each node daemon runs in a UTS namespace of its own with that hostname, so
#: the stock slurmd takes that node's line of slurm.conf (../shared/notes/slurm.md, "Several nodes on one machine").
NODES = ("n1", "n2")
TWO_NODE_PARTITION = "nodes"
#: CPUs each node declares: two, so that a gang of four ranks has two tasks on each node (the machine has two
#: cores in all: the nodes share them, as two nodes' ranks would share nothing on a real cluster but time).
NODE_CPUS = 2


class TwoNodeCluster(SlurmCluster):
    """slurmctld and two slurmd daemons (n1, n2) on this machine, every cross-node path real: a step's tasks on n2
    are children of n2's slurmd and slurmstepd, see hostname n2, and are ended by Slurm there.

    n2 can also be given a private folder: ``private`` (a path) is mounted over with an empty tmpfs in n2's own
    mount namespace, so what a process on n1 writes there is invisible to n2's processes, as a node-local TMPDIR
    is on a real cluster. The filesystem is otherwise the machine's, which every node sees.
    """

    def __init__(self, root: Path, nodes: tuple[str, ...] = NODES):
        super().__init__(root)
        self.nodes = list(nodes)
        self.node = self.nodes[0]  # where a batch script runs
        self.partition = TWO_NODE_PARTITION
        self.private = root / "node-local"  # n2 sees its own empty tmpfs here

    def write_config(self) -> None:
        for folder in ("state", "spool", "log", "jobs", "taskprolog.d", "node-local"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        r = self.root
        self.task_prolog_path.write_text(
            "#!/bin/sh\n"
            f"hook='{self.task_prolog_hook}'\n"
            'if [ -x "$hook" ]; then exec "$hook"; fi\n'
            "exit 0\n"
        )
        self.task_prolog_path.chmod(0o755)
        lines = [
            "ClusterName=isoprobe-two",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=batch_sched_delay=0",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=600",
            # A node whose slurmd stopped answering is DOWN after this many seconds (default 300).
            "SlurmdTimeout=10",
            f"TaskProlog={self.task_prolog_path}",
            *(f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={NODE_CPUS} "
              f"RealMemory={int(mem_mib * 0.4)} State=UNKNOWN" for node in self.nodes),
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        exe = _which("slurmctld")
        self._spawn("slurmctld", [exe, "-D", "-f", str(self.conf), "-i"])
        for node in self.nodes:
            self.start_node(node)

    def start_node(self, node: str) -> None:
        """slurmd of ``node`` in a UTS namespace whose hostname is the node's (and, for the last node, a mount
        namespace with its private folder)."""
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        setup = f"hostname {node}"
        namespaces = ["-u"]
        if node == self.nodes[-1]:
            namespaces += ["-m", "--propagation", "private"]
            setup += f" && mount -t tmpfs -o size=64m isoprobe-node-local '{self.private}'"
        self._spawn(f"slurmd-{node}", ["unshare", *namespaces, "sh", "-c", f'{setup} && exec "$0" "$@"',
                                       _which("slurmd"), "-D", "-f", str(self.conf)])

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.logs / f"{name}.stderr", "wb") as err:
            self.procs[name] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                                                env=self.env, cwd=self.root, start_new_session=True,
                                                preexec_fn=_die_with_parent)

    def node_states(self) -> dict[str, str]:
        done = self.command("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout: float, nodes: list[str] | None = None) -> str | None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    return f"{name} exited with {proc.returncode}:\n{self.daemon_logs(name)}"
            states = self.node_states()
            if all(states.get(node) == "idle" for node in (nodes or self.nodes)):
                return None
            time.sleep(0.1)
        return f"nodes not idle after {timeout} s (sinfo: {states})\n" + "\n".join(
            self.daemon_logs(name) for name in self.procs)

    def daemon_logs(self, name: str) -> str:
        log = name.replace("slurmd-", "slurmd.")
        return f"--- {log}.log\n{_tail(self.logs / f'{log}.log')}\n--- {name} stderr\n{_tail(self.logs / f'{name}.stderr')}"

    def _job_logs(self, job_id: str) -> str:
        return (f"--- {job_id}.out\n{self.output(job_id)}\n--- {job_id}.err\n{self.output(job_id, 'err')}\n"
                + "\n".join(self.daemon_logs(name) for name in ("slurmctld", *(f"slurmd-{n}" for n in self.nodes))))


@pytest.fixture(scope="session")
def two_node_cluster(tmp_path_factory):
    """A running cluster of two nodes, n1 and n2 (NODE_CPUS each); stopped at the end (``unshare`` from util-linux
    is needed too, for the nodes' namespaces)."""
    yield from running(tmp_path_factory.mktemp("slurm2"), TwoNodeCluster, needs=("unshare",))
