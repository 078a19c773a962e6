"""``threadweaver view``: one self-contained page to read trajectories and inspect the tree mask.

Python reads the rows into one JSON payload and the page renders it with its own inline
script: no server, no CDN, no network. The files can be ``generate`` output or the lm-eval
model's ``trajectories=`` (read as the orchestrator decoded them: its injected positions,
request timings and degradations), or training data in any shape :mod:`threadweaver.rows`
reads, with an optional drop reason. The page shows:

* a table of every row, sortable, filterable and searchable, rendered lazily as it scrolls;
* one row at a time: its fork-join timeline (request timings where recorded, otherwise a
  schedule in generated tokens), its tree, its tokens (tags coloured, injected ones marked,
  every fault at its position) and the mask inspector over its token trie (the SFT row, or
  the P-GRPO row of a decoded trajectory): pointing at a token lights exactly the tokens it
  may attend to, by the rule the attention hook applies;
* with two files, the rows they share by (id, sample) side by side, with the differences;
* groups of timelines on one time axis (the quickstart's page).

A row's details travel gzip-compressed and are unpacked only when it is opened.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib.resources import files

from threadweaver.cli_args import is_number
from threadweaver.decoded import read_decoded
from threadweaver.jsonl import FieldError, RowError, prefixed, read_jsonl, row_name, row_sample
from threadweaver.layout import spans
from threadweaver.reward import grade
from threadweaver.rows import RowReader
from threadweaver.tree import Node, tree_json
from threadweaver.trie import trajectory_trie


@dataclass(frozen=True)
class Timeline:
    """One trajectory row drawn as a timeline in a group that shares a time axis."""

    label: str
    row: dict
    """A trajectory row as ``threadweaver generate`` writes it."""


def critical_requests(requests: list[dict], stats: dict) -> list[int]:
    """The indices of the requests on the critical path: those of the sequences the latency
    stats put on it (:attr:`threadweaver.stats.LatencyStats.critical_sequences`)."""
    sequences = {tuple(map(tuple, path)) for path in stats["critical_sequences"]}
    return [i for i, r in enumerate(requests) if tuple(map(tuple, r["thread_path"])) in sequences]


def token_schedule(nodes: Sequence[Node], generated: Sequence[bool], tags) -> list[dict]:
    """The requests of a trajectory with no recorded timings, on a clock of generated tokens:
    a request starts when its context is ready (a thread at its block's head, a continuation
    when its block's last thread ends) and lasts as many tokens as it generates."""
    requests: list[dict] = []
    clocks: list[list] = [[(), 0, 0]]  # per open sequence: its path, its clock, its open request's first token
    forks: list[list[float]] = []  # per open block: when its head ended, and its threads' ends

    def close(end_position: int) -> None:
        path, clock, start = clocks[-1]
        tokens = sum(generated[start:end_position])
        requests.append(
            {
                "thread_path": [list(p) for p in path],
                "started": clock,
                "ended": clock + tokens,
                "completion_tokens": tokens,
            }
        )
        clocks[-1][1] = clock + tokens

    for span in spans(nodes, tags):
        end = span.start + len(span.ids)
        if span.kind == "head":
            close(end)
            clocks[-1][2] = end
            forks.append([clocks[-1][1]])
        elif span.kind == "seed":
            clocks.append([span.path, forks[-1][0], end])
        elif span.kind == "close":
            close(end)
            forks[-1].append(clocks.pop()[1])
        elif span.kind == "join":
            clocks[-1][1], clocks[-1][2] = max(forks.pop()), end
    close(len(generated))
    return requests


def _compress(data) -> str:
    return base64.b64encode(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), 6)).decode()


class Reader:
    """Reads the rows of files into the page's summaries and details."""

    def __init__(self, reader: RowReader):
        self.reader, self.fmt = reader, reader.fmt
        self.vocab: dict[int, str] = {}

    def piece(self, token: int) -> str:
        if token not in self.vocab:
            self.vocab[token] = self.fmt.decode([token])
        return self.vocab[token]

    def rows(self, path: str, file: int, on_torn: Callable[[int], None] | None = None) -> Iterator[tuple[dict, str]]:
        """(summary, compressed details) per row of ``path``; a bad row names its line (``on_torn``: as
        :func:`~threadweaver.jsonl.read_jsonl` takes it)."""
        for line, row in read_jsonl(path, on_torn):
            try:
                yield self.row(row, line, file)
            except ValueError as err:
                raise RowError.at(line, err) from None

    def row(self, row: dict, line: int, file: int) -> tuple[dict, str]:
        fmt, tags = self.fmt, self.fmt.tags
        prompt = self.reader.prompt(row)
        decoded = read_decoded(row, self.reader)
        ids, parsed, generated, closed, stats = (
            decoded.ids,
            decoded.parsed,
            decoded.generated,
            decoded.closed,
            decoded.stats,
        )
        text = fmt.decode(ids)
        faults = [asdict(f) for f in decoded.faults]
        measured = "requests" in row
        requests = _recorded_requests(row) if measured else token_schedule(parsed.nodes, generated, tags)
        critical = critical_requests(requests, stats.as_dict())
        trie = trajectory_trie(prompt, parsed.nodes, fmt, train_injected=not decoded.recorded, closed_threads=closed)
        for token in {*prompt, *ids, *trie.input_ids}:
            self.piece(token)
        summary = {
            "file": file,
            "line": line,
            "id": row_name(row, line),
            "sample": row_sample(row),
            "correct": _correct(row, text),
            "well_formed": not faults,
            "kinds": sorted({f["kind"] for f in faults}),
            "speedup": round(stats.speedup, 4),
            "critical": stats.critical_path_tokens,
            "total": stats.total_tokens,
            "blocks": stats.blocks,
            "threads": list(stats.threads_per_block),
            "drop": row.get("drop_reason"),
            "text": text,
        }
        details = {
            "prompt": prompt,
            "ids": ids,
            "injected": [i for i, g in enumerate(generated) if not g],
            "faults": faults,
            "tree": tree_json(parsed.nodes, fmt),
            "timeline": {"requests": requests, "critical": critical, "measured": measured, "wall_s": row.get("wall_s")},
            "trie": {
                "ids": trie.input_ids,
                "position": trie.position_ids,
                "parent": trie.parent,
                "end": trie.subtree_end,
                "trained": [int(t) for t in trie.trained],
                "prompt": len(prompt),
            },
        }
        return summary, _compress(details)


def _recorded_requests(row: dict) -> list[dict]:
    """The request timings a row records, as ``generate`` writes them; :class:`ValueError` where they are not."""
    requests = row["requests"]
    if not isinstance(requests, list) or not all(map(_is_request, requests)):
        raise ValueError(
            "field 'requests' must be a list of {thread_path, started, ended, completion_tokens}, as generate writes it"
        )
    return requests


def _is_request(request) -> bool:
    def step(value) -> bool:  # (block, thread) of a thread path
        return isinstance(value, list) and len(value) == 2 and all(isinstance(k, int) for k in value)

    return (
        isinstance(request, dict)
        and isinstance(request.get("thread_path"), list)
        and all(map(step, request["thread_path"]))
        and all(is_number(request.get(name)) for name in ("started", "ended", "completion_tokens"))
    )


def _correct(row: dict, text: str) -> bool | None:
    """The grade the row records (lm-eval's, in its trajectories file), else the answer's against the text."""
    if isinstance(row.get("correct"), bool):
        return row["correct"]
    return None if row.get("answer") is None else grade(text, str(row["answer"])).correct


def page(payload: dict) -> str:
    """The page for ``payload``, with its script and style inlined."""
    here = files("threadweaver.view")
    data = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    return (
        (here / "page.html")
        .read_text()
        .replace("{{title}}", html.escape(payload.get("title", "")))
        .replace("{{style}}", (here / "page.css").read_text())
        .replace("{{script}}", (here / "page.js").read_text())
        .replace("{{data}}", data)
    )


def tag_names(fmt) -> dict[int, str]:
    return {token: fmt.tags.name(token) for token in (*fmt.tags.structural, fmt.tags.think, fmt.tags.think_end)}


def file_page(
    paths: Sequence[str],
    reader: RowReader,
    title: str | None = None,
    progress=None,
    on_torn: Callable[[str, int], None] | None = None,
) -> str:
    """The page for trajectory or training-data files (two: side by side). ``on_torn(path, line)``: a file's
    torn last line is left out (:func:`~threadweaver.jsonl.read_jsonl`)."""
    view = Reader(reader)
    summaries, details = [], []
    for file, path in enumerate(paths):
        torn = None if on_torn is None else functools.partial(on_torn, path)
        rows, before = view.rows(path, file, torn), len(summaries)
        try:
            for summary, detail in progress(rows, path) if progress else rows:
                summaries.append(summary)
                details.append(detail)
        except RowError as err:
            raise prefixed(path, err) from None
        if len(summaries) == before:
            raise FieldError(f"{path}: no rows to show")
    payload = {
        "title": title or " vs ".join(paths),
        "files": list(paths),
        "rows": summaries,
        "details": details,
        "vocab": {str(k): v for k, v in view.vocab.items()},
        "tags": tag_names(reader.fmt),
    }
    return page(payload)


def timelines_page(groups: Iterable[tuple[str, list[Timeline]]], title: str, intro: str) -> str:
    """Groups of timelines, each group on one time axis (request timings as recorded)."""
    out = []
    for heading, timelines in groups:
        entries = []
        for t in timelines:
            requests = t.row["requests"]
            entries.append(
                {
                    "label": t.label,
                    "requests": requests,
                    "critical": critical_requests(requests, t.row["stats"]),
                    "measured": True,
                    "wall_s": t.row.get("wall_s"),
                    "stats": t.row["stats"],
                    "tree": t.row.get("tree", []),
                }
            )
        out.append({"title": heading, "timelines": entries})
    return page({"title": title, "intro": intro, "groups": out, "rows": [], "files": []})
