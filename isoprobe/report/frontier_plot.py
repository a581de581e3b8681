"""The picture of a frontier: ``isoprobe plot FRONTIER.json``, the maximum batch over the field's values.

The maximum and the recommended batch at each value (and the evaluation maximum
where ``training.eval_pass`` found one), with the tokens per batch on a second
axis when the field is an element of ``input.shape``. Drawn from the document
alone, as ``report.plot`` draws a run; matplotlib only inside ``render_frontier``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from isoprobe.report.plot import _figure_class


def render_frontier(frontier: Any, output: str | Path) -> Path:
    """Draw ``frontier`` (a ``FrontierResult`` or its JSON as a dict) to a PNG at ``output``; return its path."""
    if hasattr(frontier, "model_dump"):
        frontier = frontier.model_dump(mode="json")
    Figure, FigureCanvasAgg = _figure_class()
    points = frontier["points"]
    values = [p["value"] for p in points]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    xs = values if numeric else list(range(len(values)))

    fig = Figure(figsize=(10, 6.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    handles = []

    def series(key: str, label: str, **style):
        known = [(x, p[key]) for x, p in zip(xs, points, strict=True) if p.get(key) is not None]
        if known:
            handles.append(ax.plot([x for x, _ in known], [y for _, y in known], label=label, **style)[0])

    series("max_batch_size", "largest batch that fits (run at each value)", color="tab:blue", marker="o")
    series("recommended_batch_size", "recommended batch", color="tab:green", marker="s", linestyle="--")
    evals = [
        (x, (p.get("result") or {}).get("eval_max_batch_size")) for x, p in zip(xs, points, strict=True)
    ]  # no result: none
    if any(y is not None for _, y in evals):
        known = [(x, y) for x, y in evals if y is not None]
        handles.append(
            ax.plot(
                [x for x, _ in known],
                [y for _, y in known],
                color="tab:purple",
                marker="^",
                linestyle=":",
                label="largest evaluation batch (training.eval_pass)",
            )[0]
        )
    _annotate_maxima(ax, xs, points)
    if numeric and len(set(values)) > 1 and min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(v) for v in values])
    ax.set_xlabel(frontier["field"])
    ax.set_ylabel("batch size")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _draw_tokens(ax, xs, points, handles)

    fig.suptitle(
        f"isoprobe frontier: {Path(frontier['spec_path']).name} over {frontier['field']}",
        fontsize=13,
        fontweight="bold",
    )
    ax.set_title(
        f"{frontier['total_trials']} trials in {frontier['total_seconds']:.0f} s; direction {frontier['direction']}",
        fontsize=10,
    )
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=9, frameon=False)
    output = Path(output)
    fig.savefig(output, format="png")
    return output


def _annotate_maxima(ax: Any, xs: list, points: list[dict]) -> None:
    """Each point's maximum written above it: the numbers a reader compares, not only the line's height."""
    for x, p in zip(xs, points, strict=True):
        if p.get("max_batch_size") is not None:
            ax.annotate(
                str(p["max_batch_size"]),
                (x, p["max_batch_size"]),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=9,
                color="tab:blue",
            )


def _draw_tokens(ax: Any, xs: list, points: list[dict], handles: list) -> None:
    """Tokens per batch on a second axis, for a token search's points (the batch's size in the unit it was
    searched in); nothing where no point has them."""
    tokens = [
        (x, p["tokens_per_batch"]) for x, p in zip(xs, points, strict=True) if p.get("tokens_per_batch") is not None
    ]
    if not tokens:
        return
    right = ax.twinx()
    handles.append(
        right.plot(
            [x for x, _ in tokens],
            [t for _, t in tokens],
            color="tab:orange",
            alpha=0.6,
            marker="d",
            label="tokens per batch (max x value)",
        )[0]
    )
    right.set_ylabel("tokens per batch", color="tab:orange")
    right.tick_params(axis="y", colors="tab:orange")
    right.set_ylim(0, max(t for _, t in tokens) * 1.15)
