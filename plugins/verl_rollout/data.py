"""verl's RL dataset layout (parquet) for problems with a gold answer.

    python -m threadweaver.verl_rollout.data OUT_DIR [--train 2048] [--test 128] [--problems FILE.jsonl]

Writes ``OUT_DIR/{train,test}.parquet`` with the columns verl's ``RLHFDataset`` reads:
``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info``, and ``agent_name`` when ``--agent`` is given. Problems come from the
synthetic task (held-out test problems never occur in train), or from a JSONL file of rows
with an ``answer`` and a ``prompt`` string or chat ``messages`` (the turns before the final
assistant turn; :func:`threadweaver.rows.prompt_messages`), split by ``--test``. Existing parquet files in
``OUT_DIR`` are never overwritten.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from threadweaver.dataset import synth_splits
from threadweaver.jsonl import RowError, check_folder, check_writable, json_kind, read_jsonl
from threadweaver.reward import row_answer
from threadweaver.rows import prompt_messages
from threadweaver.synth import SynthConfig
from threadweaver.verl_rollout import AGENT_LOOPS

DATA_SOURCE = "threadweaver/synth"
PROG = "python -m threadweaver.verl_rollout.data"
SPLITS = ("train", "test")


def verl_row(
    prompt: str | list[dict],
    answer: str,
    index: int,
    split: str,
    data_source: str = DATA_SOURCE,
    agent_name: str | None = None,
) -> dict:
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index},
    }
    if agent_name:
        row["agent_name"] = agent_name
    return row


def read_prompts_and_answers(path: str) -> list[dict]:
    """``{prompt, answer}`` rows (a prompt: a string, or chat messages); a numeric answer becomes its text, as
    ``threadweaver pgrpo`` reads it."""
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            raise ValueError("a parquet file; --problems expects a JSONL file of rows with 'prompt' or 'messages'")
    return [{"prompt": _prompt(row, line), "answer": row_answer(row, line)} for line, row in read_jsonl(path)]


def _prompt(row: dict, line: int) -> str | list[dict]:
    """The row's ``prompt`` (a non-empty string), or the turns of its ``messages`` (or of a ``prompt`` of chat
    messages) before the assistant's, as :class:`threadweaver.rows.RowReader` reads a prompt."""
    field = "messages" if "messages" in row else "prompt"  # messages first, as every reader of rows
    if field not in row:
        raise RowError(line, "no prompt: a row needs 'prompt' (a string or chat messages) or 'messages', and 'answer'")
    value = row[field]
    if field == "messages" or isinstance(value, list):
        try:
            return prompt_messages(value, field)
        except ValueError as err:
            raise RowError.at(line, err) from None
    if not isinstance(value, str):
        raise RowError(line, f"field 'prompt' is {json_kind(value)}, not a string or chat messages")
    if not value.strip():
        raise RowError(line, "field 'prompt' is empty")
    return value


SYNTH_TRAIN, SYNTH_SEED = 2048, 0
"""The synthetic task's training problems and seed, where --train and --seed do not say."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error as one line, as every other error here (argparse's exit status 2)."""
        self.exit(2, f"{self.prog}: {message}\n")


def positive(text: str) -> int:
    """argparse type: a whole number above 0."""
    try:
        if int(text) > 0:
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text!r}")


def fail(message: str) -> NoReturn:
    """Stop with one line on stderr, exit status 1."""
    sys.stderr.write(f"{PROG}: {message}\n")
    raise SystemExit(1)


def check_out(out: str) -> None:
    """``out`` can hold the two files and has neither: a user's own data is never overwritten. A folder that
    cannot be made or written (under /proc, a read-only disk) is refused here, before any row is read."""
    if not out:  # os.makedirs("") fails only once the rows are made
        raise ValueError("OUT must name a folder for train.parquet and test.parquet, not ''")
    check_folder(out)
    check_writable(os.path.join(out, f"{SPLITS[0]}.parquet"))
    for split in SPLITS:
        path = os.path.join(out, f"{split}.parquet")
        if os.path.lexists(path):
            raise ValueError(f"{path} exists; move it, or give another folder")


def problem_splits(path: str, test: int) -> dict[str, list[dict]]:
    problems = read_prompts_and_answers(path)
    if not problems:
        raise ValueError("no rows")
    if len(problems) <= test:
        raise ValueError(f"{len(problems)} problems; --test {test} leaves none to train on")
    return {"train": problems[test:], "test": problems[:test]}


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("out", help="directory for train.parquet and test.parquet (neither may exist yet)")
    parser.add_argument(
        "--train", type=positive, default=None, help=f"synthetic training problems (default: {SYNTH_TRAIN})"
    )
    parser.add_argument("--test", type=positive, default=128, help="held-out problems: with --problems, the first rows")
    parser.add_argument("--seed", type=int, default=None, help=f"the synthetic problems' seed (default: {SYNTH_SEED})")
    parser.add_argument(
        "--problems",
        help="a JSONL file of rows with 'prompt' (a string or chat messages) or 'messages', and 'answer', "
        "instead of the synthetic task: all but --test train",
    )
    parser.add_argument("--data-source", default=None, help="the data_source column (default: the file's name)")
    parser.add_argument("--agent", choices=AGENT_LOOPS, default=None, help="an agent_name column for every row")
    args = parser.parse_args(argv)
    if args.problems and (given := [f for f, v in (("--train", args.train), ("--seed", args.seed)) if v is not None]):
        parser.error(
            f"{' and '.join(given)} set the synthetic problems; from --problems, every row but the first --test trains"
        )

    try:
        check_out(args.out)
    except ValueError as err:
        fail(str(err))
    if args.problems:
        try:
            splits = problem_splits(args.problems, args.test)
        except OSError as err:
            fail(f"{args.problems}: {err.strerror or err}")
        except ValueError as err:
            fail(f"{args.problems}: {err}")
        source = args.data_source or os.path.splitext(os.path.basename(args.problems))[0]
    else:
        synth = synth_splits(
            SynthConfig(),
            SYNTH_TRAIN if args.train is None else args.train,
            args.test,
            SYNTH_SEED if args.seed is None else args.seed,
        )
        splits = {"train": synth["train"], "test": synth["validation"]}
        source = args.data_source or DATA_SOURCE
    write(args.out, splits, source, args.agent)


def write(out: str, splits: dict[str, list[dict]], source: str, agent: str | None) -> None:
    import pandas as pd

    os.makedirs(out, exist_ok=True)
    for split in SPLITS:
        rows = [verl_row(p["prompt"], p["answer"], i, split, source, agent) for i, p in enumerate(splits[split])]
        path = os.path.join(out, f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(path)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
