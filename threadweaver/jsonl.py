"""Row files: JSONL rows in with errors that name the line (parquet and JSON arrays too), rows
out atomically or as they finish."""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import TextIO

from threadweaver.cli_args import is_whole


class FieldError(ValueError):
    """A row whose shape is at fault (a field missing or of the wrong type, a turn the chat template
    cannot render): the commands' hint to read it with another tokenizer is left off."""

    shape = True


def prefixed(context: str, err: ValueError) -> ValueError:
    """``err``'s message after ``context``; still a :class:`FieldError` where ``err`` was one of a row's shape."""
    return (FieldError if getattr(err, "shape", False) else ValueError)(f"{context}: {err}")


class RowError(ValueError):
    """A bad input row; names the file line (1-based). ``shape``: the row's shape is at fault, not the
    tokenizer it was read with (the commands' tokenizer hint is left off)."""

    def __init__(self, line: int, message: str, shape: bool = False, cut_off: bool = False):
        super().__init__(f"line {line}: {message}")
        self.line, self.shape = line, shape
        self.cut_off = cut_off
        """The line's bytes end before its row does (a torn line, where it is the last one)."""

    @classmethod
    def at(cls, line: int, err: ValueError) -> RowError:
        """``err`` at ``line``, a :class:`FieldError` still a fault of the row's shape."""
        return cls(line, str(err), shape=getattr(err, "shape", False))


def row_name(row: dict, line: int) -> str:
    """A row's id, or ``line-N`` for a row without one (or with a null one): how every command names a row."""
    value = row.get("id")
    return f"line-{line}" if value is None else str(value)


def row_sample(row: dict) -> int:
    """Which sample of its problem a row is (``generate --n``, lm-eval's repeats; 0 where it does not say); a value
    that is no whole number is a :class:`FieldError`."""
    value = row.get("sample", 0)
    if not is_whole(value):
        raise FieldError(f"field 'sample' must be a whole number, not {value!r}")
    return value


def read_jsonl(path: str, on_torn: Callable[[int], None] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, row) per non-blank line; a line that is not a JSON object in UTF-8 raises :class:`RowError`.

    ``on_torn``: a torn last line (no newline, and cut off before its row ends: a file still being written, as
    :func:`appending` writes it) is passed, by its number, to this function and left out, instead of raising.
    """
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                row = parse_line(raw, line_no)
            except RowError as err:
                if on_torn is None or not err.cut_off or raw.endswith(b"\n"):
                    raise
                on_torn(line_no)
                return
            if row is not None:
                yield line_no, row


def torn_note(path: str, line: int) -> str:
    """What a reader that left out ``path``'s torn last ``line`` (:func:`read_jsonl`) says on stderr."""
    return f"{path}: line {line} is torn (cut off mid-row, no newline): left out; is the file still being written?"


_TORN_TAIL = re.compile(
    r"[-+.0-9eE]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|u[0-9a-fA-F]{0,4}(\\(u[0-9a-fA-F]{0,4})?)?"
)
"""What the JSON parser stops at where a line is cut off: nothing, the start of a number or a literal, or of a
``\\uXXXX`` escape after its backslash (a pair of them, for a character past the BMP)."""


def parse_line(raw: bytes, line_no: int) -> dict | None:
    """One JSONL line as a row (None: a blank line); :class:`RowError` says why it is not a JSON object in UTF-8.
    The first line may begin with a byte order mark, as files saved by some Windows editors do."""
    if line_no == 1:
        raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        cut_off = raw.lstrip().startswith(b"{") and err.reason == "unexpected end of data"  # inside a character
        raise RowError(
            line_no, f"not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})", shape=True, cut_off=cut_off
        ) from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        opened = line.strip() in ("{", "[")  # the first line of a JSON document written over several lines
        hint = "; rows are JSONL, one JSON object per line, not a JSON document over several lines" if opened else ""
        ran_out = err.msg.startswith("Unterminated string") or _TORN_TAIL.fullmatch(line[err.pos :].rstrip())
        cut_off = line.lstrip().startswith("{") and bool(ran_out)
        raise RowError(line_no, f"not JSON ({err}){hint}", shape=True, cut_off=cut_off) from None
    except ValueError as err:  # an integer of more digits than Python reads (4,300)
        raise RowError(line_no, f"a number too long to read ({err})", shape=True) from None
    except RecursionError:
        raise RowError(line_no, "JSON nested too deep to read", shape=True) from None
    if not isinstance(row, dict):
        raise RowError(line_no, "not a JSON object", shape=True)
    return row


class InputError(ValueError):
    """A file that cannot be read as a whole (not one row of it)."""


def read_rows(path: str) -> Iterator[tuple[int, dict | RowError]]:
    """(line or 1-based row, row) of a JSONL, parquet (``.parquet``, read in batches) or JSON-array
    (``.json``) file, where a row that is not a JSON object comes as the :class:`RowError` that
    says why, in its place, and reading goes on. A file that cannot be read as a whole raises
    :class:`InputError`."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8-sig") as f:  # a byte order mark too
            try:
                rows = json.load(f)
            except ValueError as err:  # not JSON, not UTF-8, or an integer of more digits than Python reads
                raise InputError(f"not a JSON file ({err})") from None
            except RecursionError:
                raise InputError("JSON nested too deep to read") from None
        if not isinstance(rows, list):
            raise InputError("a .json input must be a JSON array of rows")
        for k, row in enumerate(rows, 1):
            yield k, row if isinstance(row, dict) else RowError(k, "not a JSON object", shape=True)
        return
    if path.endswith(".parquet"):
        yield from _parquet_rows(path)
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                row = parse_line(raw, number)
            except RowError as err:
                yield number, err
            else:
                if row is not None:
                    yield number, row


def unreadable_note(path: str, dropped: Iterable[dict]) -> str | None:
    """One line for stderr where a command dropped lines of ``path`` it could not read and went on without them:
    how many, and the first with why; None where there were none. ``dropped``: the command's dropped rows, each
    with its ``line``, ``reason`` and ``detail``."""
    unreadable = [d for d in dropped if d["reason"] == "unreadable"]
    if not unreadable:
        return None
    first, n = unreadable[0], len(unreadable)
    why = first["detail"].removeprefix(f"line {first['line']}: ")  # named once
    return f"{path}: {n} unreadable line{'s' if n > 1 else ''} dropped (the first: line {first['line']}: {why})"


def _parquet_rows(path: str) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=256)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except ValueError as err:  # pyarrow's ArrowInvalid: not a parquet file, or a corrupt one
        raise InputError(f"not a readable parquet file ({' '.join(str(err).split())})") from None


def not_a_file_of_rows(path: str) -> str | None:
    """Why ``path`` cannot be read as a file of rows (a folder, or nothing there), or None where it can be
    (a pipe, ``<(zcat rows.gz)``, is a file of rows too)."""
    if os.path.isdir(path):
        return "a folder, not a file of rows"
    return None if os.path.exists(path) else "no such file"


def check_outputs(outputs: Iterable[str], inputs: Iterable[str], named: bool = True) -> None:
    """Refuse, before any work, output paths that would overwrite an input or cannot be files.

    :class:`ValueError` names the path: one that is an input (the same file by any name), an
    existing directory, or one whose folder is a file. A missing folder is fine (writers make it).
    ``named``: the user named the paths (else a command names its files in a folder the user gave).
    """
    inputs = [path for path in inputs if os.path.exists(path)]
    for out in outputs:
        if os.path.isdir(out):
            advice = "name a file to write" if named else "move it, or give another folder"
            raise ValueError(f"{out} is a directory; {advice}")
        check_folder(os.path.dirname(os.path.abspath(out)))
        for path in inputs:
            if os.path.exists(out) and os.path.samefile(out, path):
                raise ValueError(f"{out} is the input file {path}; name another")


def check_writable(path: str, atomic: bool = False) -> None:
    """Refuse a file path where no file can be written, by writing: an existing file is opened to append
    (which changes nothing), else a file is made and removed in its folder, or the nearest one there is (the
    writer makes the rest). :func:`os.access` says yes to root anywhere, /proc included. ``atomic``: the file
    is written beside itself and moved into place (:func:`write_jsonl`, :func:`write_json`), so its folder
    must take a new file even where the file exists."""
    import tempfile

    if os.path.isfile(path) and not atomic:
        try:
            open(path, "ab").close()
        except OSError as err:
            raise ValueError(f"cannot write {path} ({err.strerror or err})") from None
        return
    folder = nearest_existing(os.path.dirname(os.path.abspath(path)))
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ValueError(f"cannot write a file in {folder} ({err.strerror or err})") from None


_JSON_KINDS = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def json_kind(value) -> str:
    """What a value read from JSON is, in JSON's words ("a list", "null"; parquet may hold other types: their
    names)."""
    return "null" if value is None else _JSON_KINDS.get(type(value), f"a {type(value).__name__}")


def nearest_existing(path: str) -> str:
    """``path`` made absolute, or its nearest parent that exists: where a writer that makes folders starts."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return existing


def check_folder(folder: str) -> None:
    """Refuse a folder to write into that is a file or lies under one; a missing folder is fine."""
    existing = nearest_existing(folder)
    if not os.path.isdir(existing):
        raise ValueError(f"cannot write into {folder}: {existing} is a file, not a folder")


def report_path(out: str) -> str:
    """Where a command that writes the rows ``out`` (``filter``, ``convert``) writes its report: ``OUT.report.json``."""
    return out + ".report.json"


def check_reported_output(out: str) -> None:
    """Refuse an ``out`` of rows that exists without a report beside it (:func:`report_path`): not an earlier
    run's output, which a rerun writes over, but other rows (a command's two arguments swapped, say)."""
    if os.path.isfile(out) and not os.path.exists(report_path(out)):
        raise ValueError(
            f"{out} exists without the report that filter and convert write beside their output "
            f"({report_path(out)}): writing would replace rows that are no earlier run's of theirs (or of a run "
            "stopped before its report); name a new file, or remove it first"
        )


@contextmanager
def _replacing(path: str) -> Iterator[TextIO]:
    """A file written beside ``path`` and moved over it once whole: on any error (a full disk, an error in what
    is written, Ctrl-C) ``path`` is untouched and the half-written file gone."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):  # none made, or none removable: the first error is the one to tell
            os.remove(tmp)
        raise


def file_digest(path: str) -> str:
    """The SHA-256 of a file's bytes."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):  # hashlib.file_digest is Python 3.11's
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str, value) -> None:
    """One JSON document, written atomically."""
    with _replacing(path) as f:
        json.dump(value, f, indent=1)


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
    """Write rows atomically: a crash never leaves a half-written file under ``path``."""
    with _replacing(path) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


@contextmanager
def appending(path: str) -> Iterator[Callable[[dict], None]]:
    """A function that appends one row to ``path`` and flushes it, so a crash loses no finished row.

    A torn last line (a crash mid-write) is cut first, and a last row without its newline
    gets one, so the first new row starts a line of its own.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        with open(path, "r+b") as f:
            start = _last_line_start(f)
            f.seek(start)
            tail = f.read()
            if tail:
                f.seek(start)
                f.truncate()
                if _is_object(tail):
                    f.write(tail + b"\n")
    with open(path, "a", encoding="utf-8") as f:

        def append(row: dict) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()

        yield append


SET_ASIDE = ".set-aside"
"""Suffix of the file where resuming moves the lines of an output file that are not finished rows."""


def _scan(path: str) -> tuple[set[tuple[str, int]], list[bytes], list[bytes], bytes, int]:
    """(finished keys, lines kept, lines to set aside, the torn last line, how many whole lines) of an output."""
    with open(path, "rb") as f:  # a byte order mark (OUT saved again by some Windows editor) is read past
        lines = f.read().removeprefix(codecs.BOM_UTF8).split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    keys: set[tuple[str, int]] = set()
    kept, aside = [], []
    for i, line in enumerate([*lines, torn]):
        key = _row_key(line)
        if key is not None and key not in keys:
            keys.add(key)
            kept.append(line)
        elif line.strip() and i < len(lines):
            aside.append(line)
    return keys, kept, aside, torn, len(lines)


def check_resumable(path: str) -> None:
    """Refuse, reading only, an existing ``path`` with lines but no finished row: no output to resume (most
    often the problems file, named in its place), which :func:`finished_keys` would set aside whole."""
    if not os.path.isfile(path):
        return
    keys, _, aside, _, _ = _scan(path)
    if aside and not keys:
        raise ValueError(
            f"{path} holds no finished row: none of its {len(aside)} lines is a JSON object with an 'id' and a "
            "'sample', so it is no output to resume; name another output, or move it"
        )


def finished_keys(path: str) -> tuple[set[tuple[str, int]], int]:
    """(id, sample) of the finished rows in ``path``, which is left ready to append to; and how many
    lines were set aside.

    Resuming never deletes a finished row. A torn last line (a crash mid-write: not a JSON
    row) is cut off, and a last row that lacks only its newline gets one. Any other line that
    is not a finished row (not UTF-8, not a JSON object with an ``id`` and a ``sample``) and
    every repeat of an (id, sample) is moved, byte for byte, to ``path + SET_ASIDE``, and the
    file is rewritten without it. A file that :func:`check_resumable` refuses is left as it was.
    """
    if not os.path.exists(path):
        return set(), 0
    check_resumable(path)
    keys, kept, aside, torn, whole = _scan(path)
    if aside:
        with open(path + SET_ASIDE, "ab") as f:
            f.write(b"".join(line + b"\n" for line in aside))
    if torn or len(kept) != whole:  # a torn or newline-less last line, lines set aside or blank
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return keys, len(aside)


def _last_line_start(f) -> int:
    """Where the text after the last newline starts (the file's length when it ends with one)."""
    chunk = 1 << 16  # bytes read back at a time
    end = f.seek(0, os.SEEK_END)
    at = end
    while at > 0:
        at = max(0, at - chunk)
        f.seek(at)
        newline = f.read(min(chunk, end - at)).rfind(b"\n")
        if newline >= 0:
            return at + newline + 1
    return 0


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line.decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False


def _row_key(line: bytes) -> tuple[str, int] | None:
    """The (id, sample) of a finished row, or None."""
    try:
        row = json.loads(line.decode("utf-8"))
        key = (row["id"], row["sample"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return key if isinstance(key[0], str) and isinstance(key[1], int) else None
