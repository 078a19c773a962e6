"""verl's RL dataset layout (parquet) for problems with a gold answer.

    python -m threadweaver.verl_rollout.data OUT_DIR [--train 2048] [--test 128] [--problems FILE.jsonl]

Writes ``OUT_DIR/{train,test}.parquet`` with the columns verl's ``RLHFDataset`` reads:
``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info``, and ``agent_name`` when ``--agent`` is given. Problems come from the
synthetic task (held-out test problems never occur in train), or from a JSONL file of
``{"prompt": ..., "answer": ...}`` rows, split by ``--test``.
"""

from __future__ import annotations

import argparse
import os

from threadweaver.dataset import synth_splits
from threadweaver.jsonl import RowError, read_jsonl
from threadweaver.synth import SynthConfig

DATA_SOURCE = "threadweaver/synth"


def verl_row(
    prompt: str, answer: str, index: int, split: str, data_source: str = DATA_SOURCE, agent_name: str | None = None
) -> dict:
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index},
    }
    if agent_name:
        row["agent_name"] = agent_name
    return row


def read_problems(path: str) -> list[dict]:
    problems = []
    for line, row in read_jsonl(path):
        missing = [k for k in ("prompt", "answer") if not isinstance(row.get(k), str)]
        if missing:
            raise RowError(line, f"needs string field(s) {missing}; it has {sorted(row)}")
        problems.append(row)
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="directory for train.parquet and test.parquet")
    parser.add_argument("--train", type=int, default=2048, help="synthetic training problems")
    parser.add_argument("--test", type=int, default=128, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", help="a JSONL file of {prompt, answer} rows instead of the synthetic task")
    parser.add_argument("--data-source", default=None, help="the data_source column (default: the file's name)")
    parser.add_argument("--agent", default=None, help="an agent_name column, e.g. threadweaver_sequential")
    args = parser.parse_args(argv)

    import pandas as pd

    if args.problems:
        try:
            problems = read_problems(args.problems)
        except (OSError, UnicodeDecodeError, RowError) as err:
            parser.exit(2, f"{parser.prog}: {args.problems}: {err}\n")
        if len(problems) <= args.test:
            parser.exit(
                2, f"{parser.prog}: {args.problems} has {len(problems)} problems; --test {args.test} leaves none"
            )
        splits = {"train": problems[args.test :], "test": problems[: args.test]}
        source = args.data_source or os.path.splitext(os.path.basename(args.problems))[0]
    else:
        synth = synth_splits(SynthConfig(), args.train, args.test, args.seed)
        splits = {"train": synth["train"], "test": synth["validation"]}
        source = args.data_source or DATA_SOURCE
    os.makedirs(args.out, exist_ok=True)
    for split, problems in splits.items():
        rows = [verl_row(p["prompt"], p["answer"], i, split, source, args.agent) for i, p in enumerate(problems)]
        path = os.path.join(args.out, f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(path)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
