"""matplotlib's pyplot for metagen's figures, imported only when a plot is drawn (off-screen, Agg)."""

from __future__ import annotations


def pyplot():
    """`matplotlib.pyplot` on the Agg backend; ImportError naming the extra when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as error:
        from metagen.extras import missing

        raise missing("plot", "plots (matplotlib)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
