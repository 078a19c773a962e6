"""The tw_* tasks' datasets: the canonical hub dataset, or a local file in the same schema.

Each task's YAML names its hub dataset in ``dataset_kwargs`` and lm-eval calls
:func:`load` with those plus the run's metadata (``--metadata`` and ``--model_args``).
A local file wins over the hub, so a run can be offline; the first of these is used:

* metadata ``<task>_file`` (``--metadata '{"tw_aime24_file": "aime24.jsonl"}'``),
* the environment variable ``THREADWEAVER_<TASK>_FILE`` (``THREADWEAVER_TW_AIME24_FILE``),
* ``<task>.jsonl`` (or ``.json``, ``.parquet``, ``.csv``) in metadata ``data_dir`` or
  ``$THREADWEAVER_DATA_DIR``,
* the hub dataset (``tw_synth``: its problems are generated, as ``threadweaver synth`` would).

A ``data_dir`` without the task's file is an error where the hub would be used instead,
and so is a metadata key ``tw_..._file`` that names no task.

Every row gets a ``gold`` column: the benchmark's answer field as a string (numbers
without a trailing ``.0``, lists joined with ``, ``, ``$`` signs removed).
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
from collections.abc import Callable
from pathlib import Path

from threadweaver.jsonl import RowError, json_kind, read_jsonl

from . import measured
from .discovery import TASKS_DIR

DATA_DIR_ENV = "THREADWEAVER_DATA_DIR"
_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_DOLLAR = re.compile(r"(?<!\\)\$")


def file_env(benchmark: str) -> str:
    return f"THREADWEAVER_{benchmark.upper()}_FILE"


GOLD_COLUMN = "gold"
"""The column every tw_* document gets: the answer its responses are graded against."""


def gold_answer(value) -> str:
    """A benchmark's answer field as one answer string."""
    if isinstance(value, bool):
        raise ValueError(f"an answer cannot be a boolean ({value})")
    if isinstance(value, float) and not math.isfinite(value):  # as text, \boxed{nan} would be right
        raise ValueError(f"an answer cannot be {value}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(gold_answer(v) for v in value)
    return _DOLLAR.sub("", str(value)).strip()


def local_file(benchmark: str, metadata: dict) -> Path | None:
    """The local file that replaces the hub dataset for ``benchmark``, if one is named."""
    named = metadata.get(f"{benchmark}_file") or os.environ.get(file_env(benchmark))
    if named:
        path = Path(named).expanduser()
        if path.is_dir():
            raise ValueError(f"{benchmark}: the local dataset {path} is a folder, not a file")
        if not path.is_file():
            raise FileNotFoundError(f"{benchmark}: the local dataset {path} does not exist")
        return path
    folder = data_dir(metadata)
    if folder:
        for suffix in _SUFFIXES:
            path = Path(folder).expanduser() / f"{benchmark}{suffix}"
            if path.is_file():
                return path
    return None


def data_dir(metadata: dict) -> str | None:
    return metadata.get("data_dir") or os.environ.get(DATA_DIR_ENV)


def _check_metadata(benchmark: str, metadata: dict) -> None:
    """Refuse a ``tw_..._file`` key that names no task (a typo would otherwise fall back to the hub)."""
    known = sorted({f"{path.stem}_file" for path in TASKS_DIR.glob("tw_*.yaml")} | {f"{benchmark}_file"})
    unknown = sorted(k for k in metadata if k.startswith("tw_") and k.endswith("_file") and k not in known)
    if unknown:
        raise ValueError(f"unknown metadata {', '.join(unknown)}; known: {', '.join([*known, 'data_dir'])}")


def _csv_row(path: Path, index: int) -> str:
    """Where CSV row ``index`` (from 0, after the header) is: the line it starts on (quoted fields may span
    lines; lines of nothing but spaces are skipped, as the CSV reader of ``datasets`` skips them), or the row
    where the file cannot be read so (a field over Python's ``csv`` size limit)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    starts, end = [], 0
    reader = csv.reader(lines)
    try:
        for record in reader:
            start, end = end + 1, reader.line_num
            if record and not (start == end and not lines[start - 1].strip()):  # a quoted "" line is a row
                starts.append(start)
    except csv.Error:
        return f"row {index}"
    return f"line {starts[index + 1]}" if index + 1 < len(starts) else f"row {index}"


def _read_local(path: Path, fields: list[str]):
    """A local file's rows, and for CSV where a row is (:func:`_csv_row`); a bad one names the file, and in JSON
    Lines the line."""
    import datasets

    kind = _SUFFIXES.get(path.suffix)
    if kind is None:
        raise ValueError(f"{path}: unknown file type; use one of {', '.join(_SUFFIXES)}")
    if path.suffix != ".jsonl":
        try:
            rows = datasets.load_dataset(kind, data_files=str(path), split="train")
        except Exception as err:  # the readers' own errors, as one line that names the file
            raise ValueError(f"{path}: not a readable {path.suffix} file ({type(err).__name__}: {err})"[:500]) from None
        return rows, functools.partial(_csv_row, path) if kind == "csv" else None
    try:
        lines, rows = zip(*read_jsonl(str(path))) if path.stat().st_size else ((), ())
    except RowError as err:
        raise ValueError(f"{path}: {err}") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    _check_fields(columns, str(path), fields)
    for line, row in zip(lines, rows):
        if missing := next((f for f in fields if f not in row), None):
            raise ValueError(f"{path}: line {line} has no {missing!r}")
        if empty := next((f for f in fields if row.get(f) in (None, "", [])), None):
            raise ValueError(f"{path}: line {line} has an empty {empty!r}")
    try:
        return datasets.Dataset.from_list(list(rows)), None
    except Exception as err:  # columns whose values do not share a type: name the first row that differs
        raise ValueError(
            f"{path}: the rows do not form one table ({_first_odd_row(lines, rows)}; {type(err).__name__}: {err})"[:500]
        ) from None


def _first_odd_row(lines, rows) -> str:
    """Where a column's values first change JSON type, e.g. ``line 3: 'Answer' is a string where line 2's is a
    number``."""
    first: dict[str, tuple[int, str]] = {}
    for line, row in zip(lines, rows):
        for key, value in row.items():
            kind = json_kind(value)
            if value is None:
                continue
            seen = first.setdefault(key, (line, kind))
            if seen[1] != kind:
                return f"line {line}: {key!r} is {kind} where line {seen[0]}'s is {seen[1]}"
    return "no column changes type"


def synth_size(synth: dict) -> int:
    """The problems a task's ``synth`` settings make: ``threadweaver synth``'s held-out split."""
    from threadweaver.dataset import HELD_OUT_PROBLEMS

    return synth.get("validation", HELD_OUT_PROBLEMS)


def _synth(synth: dict):
    import datasets

    from threadweaver.dataset import TRAIN_PROBLEMS, synth_splits
    from threadweaver.synth import SynthConfig, chat_row

    config = SynthConfig(**{k: v for k, v in synth.items() if k not in ("train", "validation", "seed")})
    rows = synth_splits(config, synth.get("train", TRAIN_PROBLEMS), synth_size(synth), synth.get("seed", 0))
    return datasets.Dataset.from_list([chat_row(row, "parallel") for row in rows["validation"]])


def _check_fields(columns: list[str], where: str, fields: list[str]) -> None:
    missing = [f for f in fields if f not in columns]
    if missing:
        raise ValueError(
            f"{where}: no field {', '.join(repr(f) for f in missing)} (the rows have "
            f"{', '.join(columns)}); write the rows in the benchmark's own schema"
        )


def _check(rows, where: str, fields: list[str], row_at: Callable[[int], str] | None = None) -> None:
    """Every row has each field; an empty one is named by ``row_at`` (its line in a CSV file), else its row (from
    0)."""
    _check_fields(rows.column_names, where, fields)
    for i, row in enumerate(rows):
        for f in fields:
            if row[f] is None or row[f] == "" or row[f] == []:
                raise ValueError(f"{where}: {row_at(i) if row_at else f'row {i}'} has an empty {f!r}")


def _hub(benchmark: str, hub: str, hub_config: str | None, hub_split: str):
    """The hub dataset; unreachable (offline), one error that names the local-file options."""
    import datasets

    try:
        return datasets.load_dataset(hub, hub_config, split=hub_split)
    except ConnectionError as err:
        raise ConnectionError(
            f"{benchmark}: cannot reach the hub dataset {hub} ({err}); offline, use a local file in its schema: "
            f'--metadata \'{{"{benchmark}_file": "FILE"}}\', {file_env(benchmark)}=FILE, or {benchmark}.jsonl '
            f'in --metadata \'{{"data_dir": "DIR"}}\' or {DATA_DIR_ENV}=DIR'
        ) from None


def load(
    benchmark: str,
    problem_field: str,
    answer_field: str,
    hub: str | None = None,
    hub_config: str | None = None,
    hub_split: str = "test",
    synth: dict | None = None,
    **metadata,
):
    """The task's rows as ``{"test": Dataset}`` with a ``gold`` column (called by lm-eval)."""
    import datasets

    measured.hint_tokenizer(metadata.get("tokenizer") or metadata.get("pretrained") or metadata.get("model"))
    _check_metadata(benchmark, metadata)
    if (folder := data_dir(metadata)) and not os.path.isdir(folder):
        raise FileNotFoundError(f"data_dir {folder}: no such folder")
    path, row_at = local_file(benchmark, metadata), None
    if path is not None:
        (rows, row_at), where = _read_local(path, [problem_field, answer_field]), str(path)
    elif synth is not None:
        rows, where = _synth(synth), f"{benchmark} (generated)"
    elif data_dir(metadata):
        raise FileNotFoundError(f"{data_dir(metadata)} has no {benchmark}.jsonl/.json/.parquet/.csv")
    elif hub is not None:
        rows, where = _hub(benchmark, hub, hub_config, hub_split), f"{hub} ({hub_split})"
    else:
        raise ValueError(f"{benchmark}: no hub dataset and no local file; set {file_env(benchmark)}")
    _check(rows, where, [problem_field, answer_field], row_at)
    return datasets.DatasetDict({"test": rows.map(lambda row: {GOLD_COLUMN: gold_answer(row[answer_field])})})
