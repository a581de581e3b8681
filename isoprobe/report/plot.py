"""The picture of a probe: ``isoprobe plot RESULT.json -o probe.png`` (optional extra: ``isoprobe[plot]``).

Peak memory over the batch size, with the fitted memory line, the capacity,
the trials that failed, the maximum and the recommended batch, and (on a second
axis) the samples per second of the trials that fit. Like every other view, it
is drawn from the result alone: nothing is re-measured or re-fitted here.

matplotlib is imported inside :func:`render`, so importing this module costs
nothing and does not need the extra. The figure is a bare
``matplotlib.figure.Figure`` rendered by the Agg canvas: no pyplot, no GUI
backend and no global state, so it also works headless and inside a notebook
without switching the notebook's backend.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from isoprobe.report.outcomes import MEANINGS, Outcome, PlotStyle
from isoprobe.spec.units import format_bytes

GIB = 1024**3

INSTALL_HINT = "pip install 'isoprobe[plot]'"


class PlotUnavailable(Exception):
    """matplotlib (the ``plot`` extra) is not installed; the message says how to install it."""


def _figure_class():
    try:
        import matplotlib  # noqa: F401  (the package first: a clear error if it is missing)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise PlotUnavailable(
            f"isoprobe plot needs matplotlib, which is not installed ({error}); install the extra: {INSTALL_HINT}"
        ) from error
    return Figure, FigureCanvasAgg


# --------------------------------------------------------------------------- what is drawn, as data


def _failure_styles() -> dict[str, PlotStyle]:
    """outcome value -> how its trials are drawn, for every outcome that is not a fit, from the one declaration
    (``report.outcomes.MEANINGS``): drawn at the capacity level, since a failure has no peak to show. Keyed by the
    JSON's strings, and never a list of its own: one kept here once left ``still_rising`` trials undrawn."""
    return {outcome.value: meaning.plot for outcome, meaning in MEANINGS.items() if not meaning.fits}


def _fitted(trial: dict) -> bool:
    """A trial that fit: its outcome (the JSON's string) read through the outcome's declaration."""
    outcome = trial.get("outcome")
    return outcome in _FITTING


_FITTING = {outcome.value for outcome, meaning in MEANINGS.items() if meaning.fits}


def _peak(trial: dict) -> int | None:
    """The peak in the capacity's units (``budget_peak_bytes``), else the raw peak."""
    budget = trial.get("budget_peak_bytes")
    return budget if budget is not None else trial.get("peak_bytes")


def _model_name(result: dict) -> str:
    model = (result.get("spec") or {}).get("model") or {}
    from isoprobe.spec.model_section import MODEL_SOURCES

    for source in MODEL_SOURCES:
        value = model.get(source)
        if value:
            if source == "factory" and "/" in value:  # 'path/to/file.py:function' -> 'file.py:function'
                value = value.rsplit("/", 1)[1]
            return f"{value} ({source})"
    return "unknown model"


def _memory_line(result: dict) -> tuple[float, float, str] | None:
    """(intercept, slope, legend label) of the line the result reports, or None.

    ``memory_breakdown`` is fitted to the peaks in the capacity's units; the
    recommendation's ``memory_model`` is the fallback. The latter is fitted to
    ``peak_bytes``, which on the CPU backend is the resident set, not the data
    segment the budget counts: the label says so when the two differ here.
    """
    breakdown = result.get("memory_breakdown") or {}
    if breakdown.get("fixed_bytes") is not None and breakdown.get("activation_bytes_per_sample") is not None:
        intercept, slope = float(breakdown["fixed_bytes"]), float(breakdown["activation_bytes_per_sample"])
        return intercept, slope, f"memory line: {format_bytes(intercept)} + {format_bytes(slope)}/sample"
    model = (result.get("recommendation") or {}).get("memory_model") or {}
    if model.get("intercept_bytes") is not None and model.get("per_sample_bytes") is not None:
        intercept, slope = float(model["intercept_bytes"]), float(model["per_sample_bytes"])
        label = f"recommendation's line: {format_bytes(intercept)} + {format_bytes(slope)}/sample"
        units_differ = any(
            t.get("budget_peak_bytes") is not None and t.get("budget_peak_bytes") != t.get("peak_bytes")
            for t in result.get("trials", [])
            if _fitted(t) and t.get("purpose") != "memory_check"
        )
        if units_differ:
            label += "\n(fitted to peak_bytes, not to the budget's units)"
        return intercept, slope, label
    return None


def _capacity_label(device: dict) -> str:
    capacity = format_bytes(device["capacity_bytes"])
    if device.get("memory_budget_bytes") is not None:
        source = device.get("budget_source")
        return f"capacity {capacity} (memory budget{', ' + source if source else ''})"
    return f"capacity {capacity} (total memory)"


# --------------------------------------------------------------------------- the figure


def render(result: Any, output: str | Path) -> Path:
    """Draw ``result`` (the result JSON as a dict, or a ``Result``) to a PNG at ``output``; return its path."""
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    Figure, FigureCanvasAgg = _figure_class()

    trials: list[dict] = list(result.get("trials") or [])
    device: dict | None = result.get("device")
    capacity: int | None = device.get("capacity_bytes") if device else None

    fig = Figure(figsize=(10, 6.6), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    handles: list = []

    peaks = _draw_trials(ax, trials, capacity, handles)
    _draw_line_and_capacity(ax, result, trials, device, handles)
    _draw_answers(ax, result, handles)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory (GiB)")
    tops = [p / GIB for p in peaks] + ([capacity / GIB] if capacity else [])
    ax.set_ylim(0, (max(tops) if tops else 1) * 1.12)
    batches_seen = [t["batch_size"] for t in trials]
    ax.set_xlim(0, max([*batches_seen, result.get("first_failing_batch_size") or 0, 1]) * 1.05)
    ax.grid(True, alpha=0.3)
    _draw_speeds(ax, result, trials, handles)

    backend = device.get("backend", "?") if device else "no device"
    where = f"{backend} ({device['name']})" if device and device.get("name") else backend
    subtitle = f"{where}, capacity {format_bytes(capacity)}" if capacity else where
    fig.suptitle(f"isoprobe: {_model_name(result)}", fontsize=13, fontweight="bold")
    if result.get("message"):
        subtitle += "\n" + textwrap.shorten(result["message"], width=150, placeholder=" ...")
    ax.set_title(subtitle, fontsize=10)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=9, frameon=False)

    output = Path(output)
    fig.savefig(output, format="png")
    return output


def _draw_trials(ax: Any, trials: list[dict], capacity: int | None, handles: list) -> list[int]:
    """The trials as points: each fit at its peak, each memory check as a ring, each failure at the capacity line
    (or the top of the measured peaks without a device) in its outcome's declared style. Returns the peaks drawn,
    which set the height of the axis."""
    fits = [t for t in trials if _fitted(t) and t.get("purpose") != "memory_check" and _peak(t)]
    checks = [t for t in trials if _fitted(t) and t.get("purpose") == "memory_check" and _peak(t)]
    failed = [t for t in trials if not _fitted(t)]
    peaks = [p for t in fits + checks if (p := _peak(t)) is not None]
    fail_level = capacity if capacity else (max(peaks) if peaks else 0)

    if fits:
        style = MEANINGS[Outcome.FITS].plot
        budget_units = any(t.get("budget_peak_bytes") not in (None, t.get("peak_bytes")) for t in fits)
        handles.append(
            ax.scatter(
                [t["batch_size"] for t in fits],
                [_gib(_peak(t)) for t in fits],
                marker=style.marker,
                s=42,
                color=style.colour,
                zorder=4,
                label=style.label + (" (budget_peak_bytes)" if budget_units else ""),
            )
        )
    if checks:
        handles.append(
            ax.scatter(
                [t["batch_size"] for t in checks],
                [_gib(_peak(t)) for t in checks],
                marker="o",
                s=150,
                facecolors="none",
                edgecolors="tab:blue",
                linewidths=1.4,
                zorder=6,
                label="memory check: fits with more memory\n(never counts as fitting)",
            )
        )
    for outcome, style in _failure_styles().items():
        batches = sorted({t["batch_size"] for t in failed if t.get("outcome") == outcome})
        if batches:
            handles.append(
                ax.scatter(
                    batches,
                    [fail_level / GIB] * len(batches),
                    marker=style.marker,
                    s=70,
                    color=style.colour,
                    linewidths=2,
                    zorder=5,
                    label=f"{style.label}: {_batch_list(batches)}",
                )
            )
    return peaks


def _gib(value: int | None) -> float:
    """Bytes as GiB for an axis; only called on trials filtered to have a peak."""
    return (value or 0) / GIB


def _draw_line_and_capacity(ax: Any, result: dict, trials: list[dict], device: dict | None, handles: list) -> None:
    """The memory line the result reports, across the batches tried (to the first failure), and the capacity."""
    batches_seen = [t["batch_size"] for t in trials]
    first_failing = result.get("first_failing_batch_size")
    line = _memory_line(result)
    if line is not None and batches_seen:
        intercept, slope, label = line
        low = min(batches_seen)
        high = max(batches_seen + ([first_failing] if first_failing else []))
        (handle,) = ax.plot(
            [low, high],
            [(intercept + slope * low) / GIB, (intercept + slope * high) / GIB],
            color="tab:blue",
            alpha=0.55,
            linewidth=1.5,
            zorder=3,
            label=label,
        )
        handles.append(handle)
    if device and device.get("capacity_bytes"):
        handles.append(
            ax.axhline(device["capacity_bytes"] / GIB, color="tab:red", linewidth=1.5, label=_capacity_label(device))
        )


def _draw_answers(ax: Any, result: dict, handles: list) -> None:
    """The maximum (or the largest that fit, where it is no proven maximum) and the recommended batch, as verticals."""
    max_batch = result.get("max_batch_size")
    first_failing = result.get("first_failing_batch_size")
    recommended = result.get("recommended_batch_size")
    if max_batch is not None:
        label = (
            f"maximum: {max_batch}"
            if result.get("answered")
            else (f"largest that fit: {max_batch}, not a proven maximum (stopped: {result.get('stop_reason')})")
        )
        if first_failing is not None:
            label += f" (first failing: {first_failing}, {result.get('first_failing_outcome') or 'failed'})"
        elif result.get("limited_by"):
            label += f" (capped by {result['limited_by']})"
        handles.append(ax.axvline(max_batch, color="tab:green", linestyle=":", linewidth=2, label=label))
    if recommended is not None:
        handles.append(
            ax.axvline(
                recommended, color="tab:olive", linestyle="-.", linewidth=1.5, label=f"recommended: {recommended}"
            )
        )


def _draw_speeds(ax: Any, result: dict, trials: list[dict], handles: list) -> None:
    """Samples per second of the trials that fit, on a second axis: the best per batch as a line, each trial a
    point (memory checks ran with more memory than the answer has, so they are left out)."""
    speeds = [
        t
        for t in trials
        if _fitted(t) and t.get("purpose") != "memory_check" and t.get("samples_per_second") is not None
    ]
    if not speeds:
        return
    right = ax.twinx()
    best: dict[int, float] = {}
    for t in speeds:
        best[t["batch_size"]] = max(best.get(t["batch_size"], 0.0), t["samples_per_second"])
    xs = sorted(best)
    right.plot(xs, [best[x] for x in xs], color="tab:orange", alpha=0.5, linewidth=1, zorder=2)
    label = "samples per second (fits)"
    fastest = (result.get("throughput") or {}).get("fastest_batch_size")
    if fastest is not None:
        label += f"; fastest batch: {fastest}"
    handles.append(
        right.scatter(
            [t["batch_size"] for t in speeds],
            [t["samples_per_second"] for t in speeds],
            marker="s",
            s=34,
            color="tab:orange",
            zorder=4,
            label=label,
        )
    )
    right.set_ylabel("samples per second", color="tab:orange")
    right.tick_params(axis="y", colors="tab:orange")
    right.set_ylim(0, max(best.values()) * 1.15)


def _batch_list(batches: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(b) for b in batches[:limit])
    return shown + (f", ... ({len(batches)} in all)" if len(batches) > limit else "")


# --------------------------------------------------------------------------- the command


def default_output(result_path: str | Path) -> Path:
    """``RESULT.json`` -> ``RESULT.png`` next to it (never the input itself)."""
    path = Path(result_path)
    output = path.with_name(path.stem + ".png")
    return output if output != path else path.with_name(path.name + ".png")


def main_plot(result_path: str, output: str | None, result: Any = None) -> int:
    """Draw a result (``result``, or the one read from ``result_path``); return the exit code (0).

    Raises PlotUnavailable without matplotlib (before reading anything),
    OSError when the file cannot be read (``spec.safe_read``: a regular file, so a
    FIFO or /dev/zero is refused instead of hanging) or the PNG cannot be
    written, pydantic's ValidationError when it is not a result.
    """
    _figure_class()
    from isoprobe.report.result import MAX_RESULT_BYTES, Result

    if result is None:
        from isoprobe.spec.safe_read import read_regular_file

        result = Result.model_validate_json(read_regular_file(result_path, MAX_RESULT_BYTES, what="a result file"))
    written = render(result.model_dump(mode="json"), output if output else default_output(result_path))
    print(f"isoprobe: wrote {written}", file=sys.stderr)
    return 0
