"""One probe of a sweep, run the way ``isoprobe run`` runs it: in the sweep's process, or as a Slurm array task.

``run_item`` is the function submitit pickles (by reference: a top-level
function of an importable module) and calls on the node, in a process of its
own. This module imports neither torch nor the probe at import time: the task
reaches torch only through the probe's child processes, as the CLI does.

The task loads the spec, then calls ``api.answer_for`` (cache -> lock -> probe
-> store), so its answer lands in the shared cache under the node's own key (its
GPU's facts from NVML, or its CPU's). Next to the entry it records which entry
answered this spec on this target (``records``), so that a login node, which
cannot compute a GPU node's key, can find the answer without submitting. Its
row goes to the sweep's own folder as JSON (never read back as a pickle).
"""

from __future__ import annotations

import os
from pathlib import Path

from isoprobe.sweep.model import SweepItem


def run_item(item: SweepItem) -> str:
    """Probe (or read from the cache) one spec; the row as JSON, also written to ``item.rows_dir`` when set.

    Never raises for a probe's own failure: a bad spec, a trial that failed, a
    refused cache or a bug in isoprobe all become the row's ``error``, so one
    failing spec leaves the other tasks of the array alone. Ctrl-C and SIGTERM
    do propagate (the probe stopped its children first).
    """
    import traceback

    from isoprobe.api import answer_for
    from isoprobe.cache.store import CACHE_DIR_VARIABLE
    from isoprobe.errors import ProbeError, SpecError
    from isoprobe.report.streams import tell
    from isoprobe.sweep.model import failed_row, row_from_result

    os.environ[CACHE_DIR_VARIABLE] = item.cache_dir  # the tasks answer into the sweep's (shared) cache
    job_id = _array_task_id()
    say = (lambda line: tell(f"[{item.shown}] {line}")) if item.rows_dir is None else tell
    try:
        spec = item.load()
        result = answer_for(
            spec, item.spec, say, use_cache=True, refresh=item.refresh, budget_source=item.budget_source()
        )
    except SpecError as error:
        row = failed_row(item.shown, item.target, f"bad spec: {error.render()}", job_id)
    except ProbeError as error:
        row = failed_row(item.shown, item.target, error.message, job_id)
    except Exception as error:  # a bug in isoprobe: this row says so, the others still answer
        tell(traceback.format_exc())
        row = failed_row(item.shown, item.target, f"internal error: {type(error).__name__}: {error}", job_id)
    else:
        row = row_from_result(item.shown, item.target, result, job_id)
        if result.cache is not None:  # an entry was written or read: the next sweep can find it
            from isoprobe.sweep.records import write_record

            try:
                write_record(item, spec, result.cache.key)
            except OSError as exc:  # the answer is in the cache; only the next sweep's shortcut is lost
                say(f"isoprobe: could not record the sweep's entry: {exc.strerror or exc}")
    if item.target != "local":  # where on the cluster it ran, for people reading the report
        row = row.model_copy(update={"node": os.environ.get("SLURMD_NODENAME")})
    text = row.model_dump_json()
    if item.rows_dir is not None:
        write_row(Path(item.rows_dir), item.index, text)
    return text


def write_row(folder: Path, index: int, text: str) -> Path:
    """The row's JSON, written to a temporary name and renamed: the sweep sees a whole row or none."""
    folder.mkdir(parents=True, exist_ok=True)
    path = row_path(folder, index)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def row_path(folder: Path, index: int) -> Path:
    return folder / f"row-{index}.json"


def _array_task_id() -> str | None:
    """``ARRAYJOB_TASK`` inside a Slurm array task, the job id in a plain job, None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")
