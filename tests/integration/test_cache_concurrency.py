"""The result cache under a job array's load: 32 processes at once neither corrupt nor lose entries,
and concurrent runs of one setup probe it once (the lock per key), also when nothing fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import FAULTS


REPO = Path(__file__).resolve().parents[2]


_WRITER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from isoprobe.cache.store import ResultCache

    store, key, log = ResultCache(Path(sys.argv[1])), sys.argv[2], Path(sys.argv[3])
    # As isoprobe run does it: look, then take the key's lock, look again, probe only if still missing.
    answer = store.read(key)
    if answer is None:
        with store.lock(key):
            answer = store.read(key)
            if answer is None:
                with open(log, "a") as probes:
                    probes.write(key + "\\n")
                time.sleep(0.3)  # the probe
                store.write(key, json.dumps({{"key": key, "writer": os.getpid(), "pad": "x" * 200000}}))
    json.loads(store.read(key))  # every reader sees a whole entry
    print(json.loads(answer)["writer"] if answer else "probed")
""")


def test_32_concurrent_runs_probe_each_key_once_and_lose_nothing(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(repo=str(REPO)))
    probes = tmp_path / "probes.log"
    keys = [f"key{i % 4}" for i in range(32)]  # a job array: 4 setups, 8 jobs each, all at once
    writers = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), key, str(probes)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for key in keys]
    outputs = [w.communicate(timeout=120) for w in writers]
    assert all(w.returncode == 0 for w in writers), [o[1] for o in outputs if o[1]]
    assert sorted(probes.read_text().split()) == sorted(set(keys))  # each setup probed exactly once
    entries = sorted(p.name for p in (tmp_path / "cache").glob("*.json"))
    assert entries == [f"{k}.json" for k in sorted(set(keys))]
    for key in set(keys):
        assert json.loads((tmp_path / "cache" / f"{key}.json").read_text())["key"] == key
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_32_concurrent_writers_of_distinct_and_shared_keys_leave_only_whole_entries(tmp_path):
    script = tmp_path / "hammer.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from isoprobe.cache.store import ResultCache
        store = ResultCache(Path(sys.argv[1]))
        for round in range(20):
            for key in (f"own{{os.getpid()}}", "shared"):
                store.write(key, json.dumps({{"pid": os.getpid(), "round": round, "pad": "y" * 50000}}))
                text = store.read("shared")
                if text is not None:
                    json.loads(text)
    """))
    writers = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache")], stderr=subprocess.PIPE,
                                text=True) for _ in range(32)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert all(w.returncode == 0 for w in writers), [e for e in errors if e]
    entries = list((tmp_path / "cache").glob("*.json"))
    assert len(entries) == 33  # 32 own keys and the shared one: nothing lost
    for entry in entries:
        assert json.loads(entry.read_text())["round"] == 19 or entry.name == "shared.json"
        json.loads(entry.read_text())
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_concurrent_runs_of_a_spec_that_cannot_fit_probe_it_once_and_all_exit_3(write_spec, tmp_path):
    """A proven "nothing fits" is an answer: the runs that waited for the lock take it from the cache."""
    spec = write_spec({
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": "raise", "at": 1000, "edge": 1}},
        "input": {"shape": [16]}, "target": {"classes": 4}, "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "steps": 2, "trial_timeout": 120},
        "device": "cpu", "memory_budget": "2GiB",
    })  # batch 2 is above the edge 1: the CPU allocator's out-of-memory error at the start batch
    environment = {**os.environ, "ISOPROBE_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.Popen([sys.executable, "-m", "isoprobe", "run", str(spec), "--format", "json"], cwd=REPO,
                             env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [3, 3, 3], [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    assert all(r["stop_reason"] == "start_does_not_fit" for r in results)
    probed = [r for r in results if not r["cache"]["hit"]]
    assert len(probed) == 1, [r["cache"] for r in results]  # exactly one probed; the others read its answer
    assert len(probed[0]["trials"]) == 1
    assert sum(err.count("isoprobe: trial ") for _, err in outputs) == 1  # one trial ran among all three
    assert all(r["trials"] == probed[0]["trials"] for r in results)
