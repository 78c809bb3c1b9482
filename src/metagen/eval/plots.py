"""Accuracy-vs-compute plots (matplotlib, imported only here, drawn off-screen)."""

from __future__ import annotations

from pathlib import Path

from metagen.eval.harness import ORACLE, EvalReport

AXES = (
    ("generated_tokens", "generated tokens per problem", "accuracy_vs_tokens.png"),
    ("flops", "FLOPs per problem (2·params·tokens + attention)", "accuracy_vs_flops.png"),
)


def plot_curves(report: EvalReport, out_dir: str | Path, title: str = "") -> list[Path]:
    """One PNG per compute axis: a line per strategy (accuracy at each n, labelled by n), the
    oracle coverage pass@k dashed. Returns the files written. An axis whose cost is unknown
    (None) for any point — FLOPs of a generator that cannot count them — is not drawn at all:
    a partial or zero-filled curve would be wrong."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install 'metagen[plot]'") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(point.strategy for point in report.points))
    # up to 18 distinct colours, none of them gray: gray is the oracle's
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)]
    palette = palette[0::2] + palette[1::2]  # the saturated shades first
    written = []
    for field, label, filename in AXES:
        if any(getattr(point.cost, field) is None for point in report.points):
            continue
        figure, axis = plt.subplots(figsize=(7, 4.5))
        for strategy in strategies:
            points = sorted((p for p in report.points if p.strategy == strategy), key=lambda p: p.n)
            xs = [getattr(p.cost, field) for p in points]
            ys = [p.accuracy for p in points]
            color = palette[strategies.index(strategy) % len(palette)]
            style = {"linestyle": "--", "color": "gray"} if strategy == ORACLE else {"color": color}
            marker = "s" if len(points) == 1 else "o"
            axis.plot(xs, ys, marker=marker, label=strategy + (" (oracle)" if strategy == ORACLE else ""), **style)
            if strategy != ORACLE:
                for p, x, y in zip(points, xs, ys):
                    axis.annotate(str(p.n), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        axis.set_xscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel("accuracy")
        top = max((p.accuracy for p in report.points), default=1.0)
        axis.set_ylim(0, min(1.0, top * 1.15 + 0.02))  # room for the curves, not the empty top
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
        if title:
            axis.set_title(title)
        path = Path(out_dir) / filename
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)
        written.append(path)
    return written
