"""Synthetic tasks whose solutions are naturally parallel: ``digits`` here, learnable by a tiny
model, and ``shopping`` (:mod:`threadweaver.shopping`), in English for pretrained models.

A digits problem gives ``k`` labelled sums of two numbers and asks for their total::

    A=482+390 B=123+567 C=555+111
    A+B+C=?

The parallel solution outlines one thread per label; each thread restates its operands
and adds them column by column (least significant first, ``a+b+carry=two digits``),
then writes the result after ``;``. The join adds the thread results left to right
with the same column step, and the answer goes in ``\\boxed{}``. The sequential
solution has the same content without tags, outlines and seeds, as one chain.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from threadweaver.cli_args import SettingError, check_counts, option
from threadweaver.format import block_text
from threadweaver.shopping import shopping_problem

LABELS = "ABCDEFGH"


TASKS = ("digits", "shopping")


@dataclass(frozen=True)
class SynthConfig:
    task: str = option(
        "digits",
        "'digits': labelled sums of digit strings, for the embedded tiny models; 'shopping': a word problem "
        "in English (each person's bill, then the total), for pretrained language models.",
        choices=TASKS,
    )
    min_terms: int = option(3, "Fewest sub-questions (threads) per problem: labelled sums, or people.")
    max_terms: int = option(4, "Most sub-questions (threads) per problem: labelled sums, or people.")
    digits: int = option(3, "Digits of each operand (the digits task).")

    def __post_init__(self) -> None:
        check_counts(self, ("min_terms", "digits"))
        if self.max_terms > len(LABELS):
            raise SettingError("max_terms", f"must be at most {len(LABELS)}, not {self.max_terms}")
        if self.min_terms > self.max_terms:
            raise SettingError(("min_terms", "max_terms"), f"disagree: {self.min_terms} is more than {self.max_terms}")
        if self.task not in TASKS:
            raise SettingError("task", f"must be one of {', '.join(TASKS)}, not {self.task!r}")


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    parallel: str
    """The assistant turn as a ThreadWeaver trajectory."""
    sequential: str
    """The same content as one sequential chain (the paper's baseline format)."""


def column_sum(a: int, b: int) -> str:
    """``"a+b c0 c1 ... ;result"``: one ``x+y+carry=dd`` step per column, low digit first."""
    width = max(len(str(a)), len(str(b)))
    xs, ys = str(a).zfill(width)[::-1], str(b).zfill(width)[::-1]
    carry, steps = 0, []
    for x, y in zip(xs, ys):
        s = int(x) + int(y) + carry
        steps.append(f"{x}+{y}+{carry}={s:02d}")
        carry = s // 10
    return f"{a}+{b} {' '.join(steps)} ;{a + b}"


def make_problem(rng: random.Random, config: SynthConfig = SynthConfig()) -> Problem:
    k = rng.randint(config.min_terms, config.max_terms)
    if config.task == "shopping":
        return Problem(*shopping_problem(rng, k))
    low, high = 10 ** (config.digits - 1), 10**config.digits - 1
    pairs = [(rng.randint(low, high), rng.randint(low, high)) for _ in range(k)]
    labels = LABELS[:k]
    prompt = " ".join(f"{c}={a}+{b}" for c, (a, b) in zip(labels, pairs)) + "\n" + "+".join(labels) + "=?"
    sums = [a + b for a, b in pairs]
    threads = [f"{c}={column_sum(a, b)}" for c, (a, b) in zip(labels, pairs)]
    joins, acc = [], sums[0]
    for s in sums[1:]:
        joins.append(column_sum(acc, s))
        acc += s
    join_text = "".join(line + "\n" for line in joins)
    answer = str(acc)
    parallel = f"<think>\n{block_text(labels, threads)}\n{join_text}</think>\n\\boxed{{{answer}}}"
    sequential = "<think>\n" + "".join(t + "\n" for t in threads) + f"{join_text}</think>\n\\boxed{{{answer}}}"
    return Problem(prompt, answer, parallel, sequential)


def make_rows(n: int, seed: int, config: SynthConfig = SynthConfig(), split: str = "train") -> list[dict]:
    """``n`` dataset rows, each with chat messages in both forms and the ground truth."""
    rng = random.Random(f"{seed}:{split}")
    rows = []
    for i in range(n):
        p = make_problem(rng, config)
        rows.append(
            {
                "id": f"{split}-{i}",
                "prompt": p.prompt,
                "answer": p.answer,
                "parallel": p.parallel,
                "sequential": p.sequential,
            }
        )
    return rows


def chat_row(row: dict, form: str) -> dict:
    """A dataset row in chat form: ``messages`` with the ``form`` solution as assistant turn."""
    return {
        "id": row["id"],
        "messages": [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row[form]}],
        "answer": row["answer"],
    }
