"""Accuracy-vs-compute plots (matplotlib, imported only inside the functions, drawn off-screen)."""

from __future__ import annotations

from pathlib import Path

from metagen.eval.frontier import describe, frontier
from metagen.eval.config import ORACLE, EvalReport
from metagen.eval.points import CurvePoint
from metagen.plotting import pyplot

AXES = (
    ("generated_tokens", "generated tokens per problem", "accuracy_vs_tokens.png"),
    ("flops", "FLOPs per problem (2·params·tokens + attention)", "accuracy_vs_flops.png"),
)


def plot_curves(report: EvalReport, out_dir: str | Path, title: str = "") -> list[Path]:
    """One PNG per compute axis: a line per strategy (accuracy at each n, labelled by n), the
    oracle coverage pass@k dashed gray; with several models a line per (model, strategy), one
    colour per strategy and one line style per model, the legend naming each once (strategies
    by colour, models by line style). The legend sits beside the axes, where it hides no line.
    Returns the files written. An axis whose cost is unknown (None) for any point — FLOPs of a
    generator that cannot count them — is not drawn at all: a partial or zero-filled curve
    would be wrong."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    strategies = list(dict.fromkeys(point.strategy for point in report.points))
    models = list(dict.fromkeys(point.model for point in report.points))
    several = len(models) > 1
    palette = _palette(plt)
    colour = {strategy: palette[i % len(palette)] for i, strategy in enumerate(strategies)}
    line = {model: LINE_STYLES[i % len(LINE_STYLES)] for i, model in enumerate(models)}
    written = []
    for field, label, filename in AXES:
        if any(getattr(point.cost, field) is None for point in report.points):
            continue
        figure, axis = plt.subplots(figsize=(10, 4.5))
        for (model, strategy) in dict.fromkeys((p.model, p.strategy) for p in report.points):
            points = sorted((p for p in report.points if p.strategy == strategy and p.model == model),
                            key=lambda p: p.n)
            xs = [getattr(p.cost, field) for p in points]
            ys = [p.accuracy for p in points]
            oracle = strategy == ORACLE
            style = {"color": "gray" if oracle else colour[strategy],
                     "linestyle": line[model] if several else "--" if oracle else "-"}
            marker = "s" if len(points) == 1 else "o"
            axis.plot(xs, ys, marker=marker, label=strategy + (" (oracle)" if oracle else ""), **style)
            if not oracle:
                for p, x, y in zip(points, xs, ys):
                    axis.annotate(str(p.n), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        axis.set_xscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel("accuracy")
        top = max((p.accuracy for p in report.points), default=1.0)
        axis.set_ylim(0, min(1.0, top * 1.15 + 0.02))  # room for the curves, not the empty top
        axis.grid(True, alpha=0.3)
        if several:
            handles = [Line2D([], [], color="gray" if s == ORACLE else colour[s], marker="o",
                              label=wrapped(s + (" (oracle)" if s == ORACLE else ""), LEGEND_WIDTH)) for s in strategies]
            handles += [Line2D([], [], color="black", linestyle=line[m],
                               label=wrapped(_model_name(m, models), LEGEND_WIDTH)) for m in models]
        else:
            handles, _ = axis.get_legend_handles_labels()
        _legend_beside(axis, handles)
        if title:
            axis.set_title(wrapped(title), fontsize=10)
        path = Path(out_dir) / filename
        figure.tight_layout()
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


FRONTIER_COLOUR = "black"  # no model's colour: the palette holds none of black and gray


def wrapped(title: str, width: int = 90) -> str:
    """`title` on lines of at most `width` characters (a sweep's title lists every model)."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width)) or title


LEGEND_WIDTH = 44  # characters per line of a legend entry (a cascade names two models)


def _legend_beside(axis, handles: list) -> None:
    """The legend to the right of the axes, top-aligned, where it hides no curve or point."""
    axis.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _model_name(model: str, models: list[str]) -> str:
    """The legend's name of a model label: "" is a point spanning the sweep's models (a
    cascade) when others are named, else a run whose model has no label."""
    if model:
        return model
    return "across models (cascades)" if len(models) > 1 else "(unnamed model)"


def _palette(plt) -> list:
    """Up to 18 distinct colours, the saturated shades first, none of them gray (the oracle's)."""
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)]
    return palette[0::2] + palette[1::2]


MARKERS = "os^Dv<>pP*Xh"
LINE_STYLES = ("-", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def plot_frontier(points: list[CurvePoint], path: str | Path, title: str = "") -> Path | None:
    """Accuracy vs FLOPs per problem (log x) of every configuration: one colour per model, one
    marker per strategy (the legend beside the axes), the 95% interval as a vertical bar, and
    the compute-optimal frontier (`frontier.frontier`) drawn as the step function "best
    accuracy within budget C" through its points. Points of unknown FLOPs cannot be placed:
    they are named under the axes, not drawn; nor can points of 0 FLOPs on a log axis (they
    are named too). Returns the file written, or None when no point could be drawn."""
    on = frontier(points)
    placed = [point for point in points if point.cost.flops is not None and point.cost.flops > 0]
    free = [point for point in points if point.cost.flops == 0]
    if not placed:
        return None
    plt = pyplot()
    from matplotlib.lines import Line2D

    models = list(dict.fromkeys(point.model for point in placed))
    strategies = list(dict.fromkeys(point.strategy for point in placed))
    palette = _palette(plt)
    color = {model: palette[i % len(palette)] for i, model in enumerate(models)}
    marker = {strategy: MARKERS[i % len(MARKERS)] for i, strategy in enumerate(strategies)}
    figure, axis = plt.subplots(figsize=(10, 5))
    for point in placed:
        low, high = point.interval if point.interval is not None else (point.accuracy, point.accuracy)
        below, above = max(point.accuracy - low, 0.0), max(high - point.accuracy, 0.0)
        axis.errorbar([point.cost.flops], [point.accuracy], yerr=[[below], [above]],
                      fmt=marker[point.strategy], color=color[point.model], elinewidth=0.8, capsize=2, markersize=6)
        axis.annotate(str(point.n), (point.cost.flops, point.accuracy), textcoords="offset points", xytext=(4, 3),
                      fontsize=7)
    xs = [point.cost.flops for point in on.points if point.cost.flops > 0]
    ys = [point.accuracy for point in on.points if point.cost.flops > 0]
    right = max(point.cost.flops for point in placed)
    axis.step(xs + [right], ys + ys[-1:], where="post", color=FRONTIER_COLOUR, linewidth=2, alpha=0.45, zorder=0)
    handles = [Line2D([], [], color=FRONTIER_COLOUR, linewidth=2, alpha=0.45, label="compute-optimal frontier")]
    handles += [Line2D([], [], color=color[model], marker="o", linestyle="",
                       label=wrapped(_model_name(model, models), LEGEND_WIDTH)) for model in models]
    handles += [Line2D([], [], color="black", marker=marker[strategy], linestyle="",
                       label=wrapped(strategy, LEGEND_WIDTH)) for strategy in strategies]
    _legend_beside(axis, handles)
    axis.set_xscale("log")
    axis.set_xlabel("FLOPs per problem (2·params·tokens + attention)")
    axis.set_ylabel("accuracy (95% bootstrap interval)")
    axis.set_ylim(0, 1.02)
    axis.grid(True, alpha=0.3)
    notes = [f"{label}: {_listed(group)}" for label, group in (("not placed (FLOPs unknown)", on.unplaced),
                                                                 ("not drawn (0 FLOPs)", free)) if group]
    if notes:
        figure.text(0.01, 0.01, "; ".join(notes), fontsize=7)
    if title:
        axis.set_title(wrapped(title), fontsize=10)
    path = Path(path)
    figure.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def _listed(points: list[CurvePoint], shown: int = 6) -> str:
    more = f" and {len(points) - shown} more" if len(points) > shown else ""
    return ", ".join(describe(point) for point in points[:shown]) + more
