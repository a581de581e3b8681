"""The result cache under a job array's load: 32 processes at once neither corrupt nor lose entries,
and concurrent runs of one setup probe it once (the lock per key)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


_WRITER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from isoprobe.cache import ResultCache

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
        from isoprobe.cache import ResultCache
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
