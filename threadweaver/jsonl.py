"""JSONL files: rows in with errors that name the line, rows out atomically or as they finish."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class RowError(ValueError):
    """A bad input row; names the file line (1-based)."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line


def read_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, row) per non-blank line; a line that is not a JSON object raises :class:`RowError`."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise RowError(line_no, f"not JSON ({err})") from None
            if not isinstance(row, dict):
                raise RowError(line_no, "not a JSON object")
            yield line_no, row


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
    """Write rows atomically: a crash never leaves a half-written file under ``path``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


@contextmanager
def appending(path: str) -> Iterator[Callable[[dict], None]]:
    """A function that appends one row to ``path`` and flushes it, so a crash loses no finished row."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:

        def append(row: dict) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()

        yield append


def finished_keys(path: str) -> set[tuple[str, int]]:
    """(id, sample) of rows already in ``path``; a torn last line (a crash mid-write) is cut off."""
    if not os.path.exists(path):
        return set()
    keys = set()
    good = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                row = json.loads(line)
                keys.add((row["id"], row["sample"]))
            except (ValueError, KeyError, TypeError):
                break
            if not line.endswith(b"\n"):
                break
            good += len(line)
    if good < os.path.getsize(path):
        with open(path, "r+b") as f:
            f.truncate(good)
    return keys
