"""The per-problem speedup distribution as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

from statistics import fmean


def check_matplotlib() -> None:
    """Refuse now, not after the runs, an install without matplotlib (the ``quickstart`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError("the quickstart's plot needs matplotlib: pip install matplotlib") from None


def speedup_plot(path: str, tokens: list[float], wall: dict[str, list[float]], reference_label: str) -> None:
    """Two histograms: per-problem token-latency speedup, and per-problem wall-clock speedups by comparison."""
    check_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    _histogram(left, {f"fork-join vs {reference_label}": tokens})
    left.set_title("token latency: critical path vs baseline tokens")
    _histogram(right, wall)
    right.set_title("wall-clock per problem")
    fig.suptitle(f"Per-problem speedup on {len(tokens)} held-out problems")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _histogram(axes, series: dict[str, list[float]]) -> None:
    values = [v for vs in series.values() for v in vs]
    low, high = min(values + [1.0]), max(values + [1.0])
    bins = [low + (high - low) * i / 24 for i in range(25)] if high > low else 10
    colours = ("#4e79a7", "#f28e2b", "#59a14f")
    for (label, vs), colour in zip(series.items(), colours):
        axes.hist(vs, bins=bins, alpha=0.6, color=colour, label=f"{label} (mean {fmean(vs):.2f}x)")
        axes.axvline(fmean(vs), color=colour, linestyle="--", linewidth=1.5)
    axes.axvline(1.0, color="#333", linewidth=1)
    axes.set_xlabel("speedup (x, higher is faster)")
    axes.set_ylabel("problems")
    axes.yaxis.get_major_locator().set_params(integer=True)
    axes.legend(fontsize=8, loc="upper left")
