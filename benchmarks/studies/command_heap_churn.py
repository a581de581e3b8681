"""How much each of the five scripts' processes grow and shrink glibc's brk heap within a step (issue 36).

Why: the Lightning script's need at a batch depends on the run's address-space layout, because its samples
(108 KiB each, under the mmap threshold) are built on the main process's heap each step and, in some layouts,
the freed blocks stay held for a few steps (docs/results/command-truth.md). A script whose heap does not churn
cannot hold that way. This measures the churn: each script at its own edge, N steps, no cap, the ``[heap]`` line
of ``/proc/PID/maps`` and the data segment sampled every ~2 ms in every process that runs the script, and per
process the heap's range (max - min) over the steps at the run's peak level.

    python benchmarks/studies/command_heap_churn.py lightning 14     # also: plain, ddp, hf, accelerate

Measured 2026-11-27 (the closing note of that day): Lightning 4.08 MiB; torchrun DDP 1.50 and 1.62 (its two
ranks); HF Trainer 1.79; Accelerate 1.18; the plain loop 0.00 (its DataLoader workers build the batches).
isoprobe now measures the churn within each step of every command trial (Trial.heap_churn_bytes) and sets a
command's floor from it (search/margin.py).
"""

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
import command_truth
C = str(Path(__file__).resolve().parents[2] / "tests" / "commands") + "/"
PY = sys.executable
BIN = str(Path(PY).parent)
CASES = {
    "plain": ([PY, C + "plain_loop.py", "--batch-size", "{batch_size}", "--max-steps", "{max_steps}"], 50, "plain_loop.py"),
    "ddp": ([BIN + "/torchrun", "--standalone", "--nproc-per-node", "2", C + "ddp_train.py", "--batch-size", "{batch_size}", "--max-steps", "{max_steps}"], 14, "ddp_train.py"),
    "lightning": ([PY, C + "lightning_cli.py", "fit", "--data.batch_size", "{batch_size}", "--trainer.max_steps", "{max_steps}"], 38, "lightning_cli.py"),
    "hf": ([PY, C + "hf_trainer_script.py", "--per_device_train_batch_size", "{batch_size}", "--max_steps", "{max_steps}", "--output_dir", "/tmp/hfo", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "--disable_tqdm", "true"], 25, "hf_trainer_script.py"),
    "accelerate": ([BIN + "/accelerate", "launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--cpu", C + "accelerate_script.py", "--batch-size", "{batch_size}", "--max-steps", "{max_steps}"], 24, "accelerate_script.py"),
}
name, steps = sys.argv[1], int(sys.argv[2])
tmpl, batch, marker = CASES[name]
samples = {}
stop = threading.Event()
def sample():
    pids = set()
    while not stop.is_set():
        for p in os.listdir("/proc"):
            if p.isdigit() and p not in pids:
                try:
                    cmd = open(f"/proc/{p}/cmdline", "rb").read()
                    if marker.encode() in cmd and b"launch" not in cmd and b"torchrun" not in cmd.split(b"\0")[0] + cmd.split(b"\0")[1]:
                        pids.add(p)
                except (OSError, IndexError):
                    pass
        for p in list(pids):
            try:
                heap = 0
                with open(f"/proc/{p}/maps") as f:
                    for line in f:
                        if line.endswith("[heap]\n"):
                            a, b = line.split()[0].split("-"); heap = int(b, 16) - int(a, 16); break
                data = int(open(f"/proc/{p}/statm").read().split()[5]) * 4096
                samples.setdefault(p, []).append((time.time(), heap, data))
            except (OSError, ValueError):
                pids.discard(p)
        time.sleep(0.002)
t = threading.Thread(target=sample, daemon=True); t.start()
work = Path(tempfile.mkdtemp())
r = command_truth.run_once(tmpl, batch, steps, 4 << 30, 300, work)
stop.set(); t.join()
print(name, batch, r.outcome)
for p, s in samples.items():
    if len(s) < 50: continue
    t0, t1 = s[0][0], s[-1][0]
    # steady part: after the data segment first reached 98 % of its max
    top = max(x[2] for x in s)
    start = next(i for i, x in enumerate(s) if x[2] >= top - 8 * 2**20)
    end = max(i for i, x in enumerate(s) if x[2] >= top - 300 * 2**20)
    steady = [x for x in s[start:end + 1] if x[1] > 0]
    heaps = [x[1] for x in steady]
    print(f"  pid {p}: samples {len(s)}, steady samples {len(steady)}, heap min {min(heaps)/2**20:.2f} max {max(heaps)/2**20:.2f} range {(max(heaps)-min(heaps))/2**20:.2f} MiB; data range {(max(x[2] for x in steady)-min(x[2] for x in steady))/2**20:.1f} MiB")
