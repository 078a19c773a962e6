"""An HTML page of fork-join timelines: one bar per engine request, the critical path marked.

Pure functions over trajectory rows as ``threadweaver generate`` and the lm-eval model
write them (``requests`` with thread paths and start/end seconds, ``tree``, ``stats``).
The page is static HTML with inline SVG: it needs no script and no network.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

from threadweaver.layout import thread_name

_WIDTH, _LANE, _LABEL = 760, 22, 90
_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f")


def _paths(requests: list[dict]) -> list[tuple]:
    return [tuple(tuple(step) for step in r["thread_path"]) for r in requests]


def critical_requests(requests: list[dict]) -> tuple[int, set[int]]:
    """(tokens, request indices) of the critical path: each sequence's own requests plus, per
    block, the thread with the longest critical path (the first of equals)."""
    paths = _paths(requests)
    children: dict[tuple, dict[int, list[tuple]]] = defaultdict(lambda: defaultdict(list))
    for path in dict.fromkeys(paths):
        for depth in range(1, len(path) + 1):
            parent, child = path[: depth - 1], path[:depth]
            if child not in children[parent][child[-1][0]]:
                children[parent][child[-1][0]].append(child)

    def walk(path: tuple) -> tuple[int, set[int]]:
        own = {i for i, p in enumerate(paths) if p == path}
        tokens = sum(requests[i]["completion_tokens"] for i in own)
        for block in sorted(children[path]):
            best = max((walk(child) for child in sorted(children[path][block])), key=lambda c: c[0])
            tokens += best[0]
            own |= best[1]
        return tokens, own

    return walk(())


@dataclass(frozen=True)
class Timeline:
    title: str
    row: dict
    """A trajectory row (``requests``, ``stats``, ``wall_s``, ``tree``)."""
    concurrent: bool = True
    """False: the threads ran one after another, so every request is on the critical path."""


def svg(timeline: Timeline, scale_s: float) -> str:
    """One timeline as an SVG: lanes per sequence, x in seconds on a scale of ``scale_s``."""
    requests = timeline.row["requests"]
    paths = _paths(requests)
    lanes = sorted(set(paths))
    marked = critical_requests(requests)[1] if timeline.concurrent else set(range(len(requests)))
    height = _LANE * len(lanes) + 28

    def x(seconds: float) -> float:
        return _LABEL + seconds / scale_s * _WIDTH

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{_LABEL + _WIDTH + 10}" '
        f'height="{height}" role="img" aria-label="{html.escape(timeline.title)}">'
    ]
    for lane, path in enumerate(lanes):
        y = lane * _LANE + 4
        parts.append(
            f'<text class="lane" x="{_LABEL - 6}" y="{y + 14}" text-anchor="end">{thread_name(path, "main")}</text>'
        )
    for i, (request, path) in enumerate(zip(requests, paths)):
        lane = lanes.index(path)
        x0, x1 = x(request["started"]), x(request["ended"])
        colour = _COLOURS[(path[-1][1] if path else 0) % len(_COLOURS)] if path else "#777"
        critical = i in marked
        tip = (
            f"{thread_name(path, 'main')}: {request['completion_tokens']} tokens, "
            f"{request['started'] * 1000:.0f}-{request['ended'] * 1000:.0f} ms"
            + (", on the critical path" if critical else "")
        )
        parts.append(
            f'<rect class="request{" critical" if critical else ""}" x="{x0:.1f}" y="{lane * _LANE + 4}" '
            f'width="{max(x1 - x0, 1.5):.1f}" height="{_LANE - 6}" fill="{colour}" rx="3">'
            f"<title>{html.escape(tip)}</title></rect>"
        )
        if x1 - x0 > 30:
            parts.append(
                f'<text class="tokens" x="{(x0 + x1) / 2:.1f}" y="{lane * _LANE + 17}" '
                f'text-anchor="middle">{request["completion_tokens"]}</text>'
            )
    axis_y = _LANE * len(lanes) + 8
    parts.append(f'<line x1="{_LABEL}" y1="{axis_y}" x2="{_LABEL + _WIDTH}" y2="{axis_y}" stroke="#999"/>')
    step = _tick(scale_s)
    tick = 0.0
    while tick <= scale_s + 1e-9:
        parts.append(
            f'<text class="tick" x="{x(tick):.1f}" y="{axis_y + 14}" text-anchor="middle">{tick * 1000:.0f} ms</text>'
        )
        tick += step
    parts.append("</svg>")
    return "".join(parts)


def _tick(span_s: float) -> float:
    for step in (0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300):
        if span_s / step <= 8:
            return step
    return span_s / 8


def _tree_html(nodes: list[dict]) -> str:
    out = []
    for node in nodes:
        if "text" in node:
            out.append(f'<span class="text">{html.escape(node["text"])}</span>')
            continue
        threads = "".join(
            f'<div class="thread"><b>thread {t["number"]}</b>{_tree_html(t["body"])}</div>' for t in node["threads"]
        )
        outlines = ", ".join(html.escape(o) for o in node["outlines"])
        out.append(
            f'<div class="block"><div class="outlines">outlines: {outlines}</div>'
            f'<div class="threads">{threads}</div></div>'
        )
    return "".join(out)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 900px; }
h2 { margin-top: 2em; border-top: 1px solid #ddd; padding-top: 1em; }
.caption { color: #555; margin: 0.2em 0 0.6em; }
svg text { font-size: 11px; fill: #333; }
svg text.tokens { fill: #fff; font-weight: 600; }
rect.request { opacity: 0.55; }
rect.request.critical { opacity: 1; stroke: #c0392b; stroke-width: 2.5; }
.legend span { display: inline-block; margin-right: 1.5em; }
.swatch { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; }
pre, .tree { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
.block { border-left: 3px solid #4e79a7; padding-left: 6px; margin: 4px 0; }
.threads { display: flex; gap: 6px; }
.thread { flex: 1; background: #f4f6f9; padding: 4px; border-radius: 4px; }
.outlines { color: #555; }
"""


def page(examples: list[tuple[str, list[Timeline]]], heading: str, intro: str) -> str:
    """A whole page: per example a heading and its timelines on one time scale."""
    body = [
        f"<h1>{html.escape(heading)}</h1>",
        f"<p>{html.escape(intro)}</p>",
        '<p class="legend"><span><span class="swatch" style="background:#777"></span>main sequence</span>'
        '<span><span class="swatch" style="background:#4e79a7"></span>threads</span>'
        '<span><span class="swatch" style="border:2.5px solid #c0392b"></span>critical path</span></p>',
    ]
    for title, timelines in examples:
        scale = max(max(r["ended"] for r in t.row["requests"]) for t in timelines) or 1.0
        body.append(f'<section class="example"><h2>{html.escape(title)}</h2>')
        for timeline in timelines:
            stats, row = timeline.row["stats"], timeline.row
            critical = stats["critical_path_tokens"]
            body.append(
                f'<h3>{html.escape(timeline.title)}</h3><p class="caption">{row["wall_s"] * 1000:.0f} ms; '
                f"{stats['total_tokens']} generated tokens, {critical} on the critical path; "
                f"{len(row['requests'])} request{'s' if len(row['requests']) > 1 else ''}</p>"
            )
            body.append(svg(timeline, scale))
        first = timelines[0].row
        body.append(
            f'<details><summary>the trajectory</summary><div class="tree">{_tree_html(first["tree"])}'
            "</div></details></section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(heading)}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
