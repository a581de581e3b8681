"""Does a command started ahead read what a cold start reads, and how much start-up does it take off? (issue 49, 3)

A command trial whose interpreter is started ahead (``isoprobe.child.command_trial.warm``) runs the shim's runner
(``child/shim/_isoprobe_warm.py``): the command's interpreter starts, waits (since issue 55 it imports nothing of the
script's first), and runs the script as ``__main__`` when handed the batch. This study starts each run as a trial starts it, at one
batch, without the rest of isoprobe, and compares the two starts side by side:

- cold: ``python SCRIPT ARG...``, as ``child.command_trial.start.start_command`` runs it: the shim's folder alone on
  PYTHONPATH, ISOPROBE_SHIM_DIR a fresh folder, ISOPROBE_BATCH_SIZE, the CPU backend's variables
  (OMP_NUM_THREADS=1, MALLOC_MMAP_THRESHOLD_=131072, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED=1,
  PYTHONFAULTHANDLER=1), RLIMIT_DATA soft = hard = the budget, a session of its own, stdin /dev/null, the gate
  opened to ``--steps`` steps before the start;
- ahead: the same command started as ``child.command_trial.warm.start_ahead`` starts it: its placeholders in, no batch
  variable, ``ISOPROBE_WARM_FD`` naming a pipe; once the shim's ``_isoprobe_warm`` wrote ``warm-ready`` and the process idled ``--idle``
  seconds it gets the trial (``go_message``: the batch variable and the arguments), as a trial hands it over.

The runs alternate (the order swapped each round). For each run: seconds to the first step's ``t`` (the shim's
time.time() at the end of step 1) from just before ``Popen`` (cold) or from the hand-over (ahead); per step the
shim's readings (budget_peak_bytes: VmData at the step's end; peak_bytes: VmHWM; held_budget_bytes) and the data
segment sampled every millisecond from this process (/proc/PID/statm's data field, as the supervisor's
``command_tree.Sampler`` reads it), so a step's peak is the most seen until its line came, or the shim's reading if
more. After the allowed steps the process waits at the gate: its session is SIGKILLed and every process whose
environment names the run's folder is killed and counted (DataLoader workers).

    PYTHONPATH=. python benchmarks/studies/command_ahead_readings.py --runs 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from isoprobe.protocol.command import SHIM_FOLDER, ShimException, ShimStep, parse_lines
from isoprobe.protocol.warm_command import go_message
from isoprobe.protocol.wiring import GATE_FILE, SHIM_DIR_ENV
from isoprobe.protocol.wiring import WARM_FD_ENV as FD_ENV
from isoprobe.protocol.wiring import WARM_READY_FILE as READY_FILE
from isoprobe.spec.command import BATCH_ENV

REPO = Path(__file__).resolve().parents[2]
COMMANDS = REPO / "tests" / "commands"
MIB = 1 << 20

#: (name, script, its arguments at the batch, batch, budget bytes): the runs of command_edges.py, one batch each.
CASES = {
    "plain_loop": (COMMANDS / "plain_loop.py", ["--batch-size", "{batch_size}", "--max-steps", "100000"], 50,
                   1 << 30),
    "lightning_cli": (COMMANDS / "lightning_cli.py", ["fit", "--data.batch_size", "{batch_size}", "--trainer.max_steps",
                                                      "100000"], 37, 1085 * MIB),
    "hf_trainer": (COMMANDS / "hf_trainer_script.py",
                   ["--per_device_train_batch_size", "{batch_size}", "--max_steps", "100000", "--output_dir",
                    "/tmp/isoprobe-bench-hf-out", "--report_to", "none", "--save_strategy", "no", "--use_cpu",
                    "--disable_tqdm", "true"], 25, 1152 * MIB),
    # The script whose own margin at 24 under 1 GiB (0.19 MiB) the shim's 0.6 MiB takes away (docs/command.md):
    # the most sensitive to what a start loads into the measured process. Run as `python SCRIPT` (no launcher).
    "accelerate_script": (COMMANDS / "accelerate_script.py", ["--batch-size", "{batch_size}", "--max-steps", "100000"], 23,
                          1 << 30),
}
VARIANTS = ("cold", "ahead")
_OOM_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory", "std::bad_alloc")


def environment(folder: Path, batch: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(SHIM_FOLDER), SHIM_DIR_ENV: str(folder), "ISOPROBE_BATCH_SIZE": str(batch),
                "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
    return env


def open_gate(folder: Path, allowed: int) -> None:
    temporary = folder / f".{GATE_FILE}.{allowed}"
    temporary.write_text(str(allowed))
    os.replace(temporary, folder / GATE_FILE)


class Sampler(threading.Thread):
    """The data segment of one process (/proc/PID/statm's data field, as the supervisor reads it) every ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.page, self.most, self.stop = pid, os.sysconf("SC_PAGE_SIZE"), 0, threading.Event()

    def run(self) -> None:
        path = f"/proc/{self.pid}/statm"
        while not self.stop.is_set():
            try:
                with open(path, "rb") as handle:
                    data = int(handle.read().split()[5]) * self.page
                self.most = max(self.most, data)
            except (OSError, ValueError, IndexError):
                return
            time.sleep(0.001)


def processes_of(folder: Path) -> list[int]:
    marker = f"{SHIM_DIR_ENV}={folder}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if marker in handle.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def end_run(process: subprocess.Popen, folder: Path) -> int:
    """Kill the run's session, reap it, then kill (and count) anything else of the run still there."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(0.2)
    left = processes_of(folder)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def one_run(case: str, variant: str, steps: int, idle: float, timeout: float) -> dict:
    script, args, batch, budget = CASES[case]
    folder = Path(tempfile.mkdtemp(prefix="ahead-measure-"))
    channel = None
    try:
        open_gate(folder, steps)
        env = environment(folder, batch)
        pass_fds = ()
        words = [word.replace("{batch_size}", str(batch)) for word in args]
        if variant == "cold":
            argv = [sys.executable, str(script), *words]
        else:  # as child.command_trial.warm.start_ahead starts it: the placeholders in, the batch on the pipe
            env.pop(BATCH_ENV)
            argv = [sys.executable, str(script), *args]
            read, channel = os.pipe()
            pass_fds = (read,)
            env[FD_ENV] = str(read)

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

        out = open(folder / "stdout", "wb")
        err = open(folder / "stderr", "wb")
        started = time.time()
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True,
                                   preexec_fn=cap, stdin=subprocess.DEVNULL, pass_fds=pass_fds)
        out.close()
        err.close()
        if pass_fds:
            os.close(pass_fds[0])
        sampler = Sampler(process.pid)
        sampler.start()
        result = {"case": case, "variant": variant, "pid": process.pid}
        went = None
        if variant != "cold":
            deadline = time.monotonic() + timeout
            ready = folder / READY_FILE
            while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            result["preload_s"] = round(time.time() - started, 3) if ready.exists() else None
            result["ready"] = ready.read_text().split() if ready.exists() else None
            time.sleep(idle)
            went = time.time()
            os.write(channel, go_message({BATCH_ENV: str(batch)}, words))
            os.close(channel)
            channel = None
        step_lines: list[ShimStep] = []
        sampled_at_step: list[int] = []
        exception = None
        offset = 0
        own = folder / f"p{process.pid}.jsonl"
        deadline = time.monotonic() + timeout
        while len(step_lines) < steps and time.monotonic() < deadline:
            alive = process.poll() is None
            try:
                with open(own, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                data = b""
            complete = data.rfind(b"\n") + 1
            offset += complete
            for line in parse_lines(data[:complete]):
                if isinstance(line, ShimStep):
                    step_lines.append(line)
                    sampled_at_step.append(sampler.most)
                elif isinstance(line, ShimException) and exception is None:
                    exception = line
            if exception is not None or not alive:
                break
            time.sleep(0.01)
        returncode = process.poll()
        sampler.stop.set()
        result["left_running"] = end_run(process, folder)
        origin = started if variant == "cold" else went
        result["first_step_s"] = (round(step_lines[0].t - origin, 3) if step_lines and origin is not None else None)
        result["steps"] = [{"step": s.step, "t": s.t, "shim_data_bytes": s.budget_peak_bytes,
                            "sampled_data_bytes": sampled, "vmhwm_bytes": s.peak_bytes,
                            "held_budget_bytes": s.held_budget_bytes}
                           for s, sampled in zip(step_lines, sampled_at_step)]
        result["peak_bytes"] = (max(max(s.budget_peak_bytes or 0, sampled)
                                    for s, sampled in zip(step_lines, sampled_at_step)) if step_lines else None)
        stderr = (folder / "stderr").read_text(errors="replace")
        if len(step_lines) >= steps:
            outcome = "fits"
        elif exception is not None and ("MemoryError" in exception.types
                                        or any(w in exception.message.lower() for w in _OOM_WORDS)):
            outcome = "oom"
        elif any(w in stderr.lower() for w in _OOM_WORDS):
            outcome = "oom"
        else:
            outcome = "error" if returncode is not None else "timeout"
        result["outcome"] = outcome
        result["returncode"] = returncode
        if outcome != "fits":
            result["stderr_tail"] = stderr[-1500:]
            if exception is not None:
                result["exception"] = f"{exception.type}: {exception.message[:300]}"
        return result
    finally:
        if channel is not None:
            os.close(channel)
        shutil.rmtree(folder, ignore_errors=True)


def _mib(value) -> str:
    return "-" if value is None else f"{value / MIB:.2f}"


def table(runs: list[dict], cases: list[str], variants: list[str]) -> str:
    rows = ["| case | variant | runs | fits / oom / other | median s to 1st step | median peak data MiB (steps 1..N) "
            "| min..max peak MiB | median held MiB (step N) | median VmHWM MiB (step N) | ahead - cold median peak MiB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        cold_peaks = [r["peak_bytes"] for r in runs if r["case"] == case and r["variant"] == "cold"
                      and r["outcome"] == "fits"]
        cold_median = statistics.median(cold_peaks) if cold_peaks else None
        for variant in variants:
            mine = [r for r in runs if r["case"] == case and r["variant"] == variant]
            fit = [r for r in mine if r["outcome"] == "fits"]
            peaks = [r["peak_bytes"] for r in fit]
            firsts = [r["first_step_s"] for r in mine if r["first_step_s"] is not None]
            held = [r["steps"][-1]["held_budget_bytes"] for r in fit if r["steps"][-1]["held_budget_bytes"]]
            hwm = [r["steps"][-1]["vmhwm_bytes"] for r in fit if r["steps"][-1]["vmhwm_bytes"]]
            median_peak = statistics.median(peaks) if peaks else None
            diff = ("-" if variant == "cold" or median_peak is None or cold_median is None
                    else f"{(median_peak - cold_median) / MIB:+.2f}")
            oom = sum(r["outcome"] == "oom" for r in mine)
            first = f"{statistics.median(firsts):.2f}" if firsts else "-"
            spread = f"{_mib(min(peaks))}..{_mib(max(peaks))}" if peaks else "-"
            rows.append(f"| {case} | {variant} | {len(mine)} | {len(fit)} / {oom} / {len(mine) - len(fit) - oom} "
                        f"| {first} | {_mib(median_peak)} | {spread} "
                        f"| {_mib(statistics.median(held) if held else None)} "
                        f"| {_mib(statistics.median(hwm) if hwm else None)} | {diff} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["plain_loop", "lightning_cli", "hf_trainer", "accelerate_script"],
                        choices=sorted(CASES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--runs", type=int, default=4, help="runs of each variant per case (alternating)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps the gate allows each run")
    parser.add_argument("--idle", type=float, default=0.5, help="seconds a runner idles after its imports")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a run may take")
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    options = parser.parse_args()
    began = time.perf_counter()
    runs: list[dict] = []
    for case in options.cases:
        for round_ in range(options.runs):
            order = options.variants[round_ % len(options.variants):] + options.variants[:round_ % len(options.variants)]
            for variant in order:
                result = one_run(case, variant, options.steps, options.idle, options.timeout)
                runs.append(result)
                print(f"{case} {variant} #{round_ + 1}: {result['outcome']} first_step_s={result['first_step_s']} "
                      f"peak={_mib(result['peak_bytes'])} MiB preload_s={result.get('preload_s')} "
                      f"left={result['left_running']}" + (f" {result.get('exception') or result.get('stderr_tail', '')[-300:]}"
                                                          if result["outcome"] != "fits" else ""),
                      file=sys.stderr, flush=True)
    print(table(runs, options.cases, options.variants))
    print(f"\nwall {time.perf_counter() - began:.0f} s; processes left running after the runs: "
          f"{sum(r['left_running'] for r in runs)}")
    if options.json:
        options.json.write_text(json.dumps({"runs": runs}, indent=1))


if __name__ == "__main__":
    main()
