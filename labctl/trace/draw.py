"""The timeline PNG: one or more Pictures (picture.py), side by side on one time scale, drawn with
matplotlib (the `plot` extra, imported through labctl.core.plotting when a picture is drawn)."""

from __future__ import annotations

from pathlib import Path

from labctl.core.plotting import pyplot
from labctl.trace.picture import LEGEND, Picture

# Three colours (compute, overlapped, waiting); the exposed all-reduce is waiting too, hatched.
COLOURS = {"compute": "#4C72B0", "overlap": "#55A868", "waiting": "#C44E52", "exposed": "#C44E52",
           "forward": "#4C72B0", "backward": "#8172B3", "bubble": "#DD8452"}
HATCH = {"exposed": "////"}
LANE_HEIGHT = 0.7
MARKS_FIT = 48  # numbers a lane can show side by side (2 steps of 12 micro-batches' forwards and backwards)


def draw(path: Path, pictures: list[Picture], title: str | None = None) -> Path:
    """Write `pictures` side by side into the PNG at `path` (one time scale for all)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    lanes = max(len(p.lanes) for p in pictures)
    fig, axes = plt.subplots(1, len(pictures), figsize=(7.5 * len(pictures) + 2.5, 1.6 + 0.75 * lanes),
                             sharex=True, squeeze=False)
    span = max(p.span_ms for p in pictures) or 1.0
    for ax, picture in zip(axes[0], pictures):
        draw_one(ax, picture, span)
    shown = {kind for p in pictures for lane in p.lanes for kind, bars in lane.bars.items() if bars}
    handles = [Patch(facecolor=bar_colour(kind), edgecolor=COLOURS[kind], hatch=HATCH.get(kind), label=label)
               for kind, label in LEGEND.items() if kind in shown]
    columns = len(handles) if len(handles) <= 4 else 3  # a pipeline's five kinds: two rows
    fig.legend(handles=handles, loc="lower center", ncol=columns, frameon=False, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.07 * -(-len(handles) // columns), 1, 0.95 if title else 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_colour(kind: str) -> str:
    """The exposed all-reduce: the waiting colour, paler under its hatching."""
    return "#F2C4C5" if kind == "exposed" else COLOURS[kind]


def draw_one(ax, picture: Picture, span_ms: float) -> None:
    """One picture's lanes: rank 0 at the top, the rank the others waited for in bold and marked."""
    count = len(picture.lanes)
    for i, lane in enumerate(picture.lanes):
        y = count - 1 - i
        for kind, bars in lane.bars.items():
            if bars:
                ax.broken_barh(bars, (y - LANE_HEIGHT / 2, LANE_HEIGHT), facecolors=bar_colour(kind),
                               edgecolor=COLOURS[kind], hatch=HATCH.get(kind), linewidth=0)
        for x, text in lane.marks if len(lane.marks) <= MARKS_FIT else ():  # a pipeline's micro-batch numbers
            ax.text(x, y, text, fontsize=6, color="white", ha="center", va="center")
        if lane.waited_for:
            ax.annotate("waited for", xy=(span_ms, y), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=8, fontweight="bold", color=COLOURS["waiting"], annotation_clip=False)
    ax.set_yticks(range(count))
    labels = ax.set_yticklabels([f"{lane.label}\n{lane.note}" for lane in reversed(picture.lanes)], fontsize=8)
    for label, lane in zip(labels, reversed(picture.lanes)):
        if lane.waited_for:
            label.set_fontweight("bold")
    last = None
    for x, text in picture.ticks:
        ax.axvline(x, color="0.6", linewidth=0.6, linestyle=":")
        if last is None or x - last > span_ms / 12:  # labels that would run into each other: every other
            ax.text(x, 1.0, f" {text}", fontsize=7, color="0.35", va="bottom", transform=ax.get_xaxis_transform())
            last = x
    ax.set_ylim(-0.6, count - 0.1)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_xlabel("ms (all ranks on the aligned clock)", fontsize=9)
    ax.set_title(picture.title, fontsize=9, loc="left", pad=14)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
