"""A task written in sentences, for pretrained language models: who pays what, and in all.

A problem names ``k`` people, each buying two kinds of things at a price each, and asks
what they spend together::

    Ann buys 3 apples at 4 dollars each and 2 pens at 1 dollar each. Ben buys 6 cups at
    2 dollars each and 4 hats at 3 dollars each. How many dollars do Ann and Ben spend in all?

Each person's bill is a sub-question of its own. The parallel solution outlines one
thread per person; a thread multiplies both purchases and adds them; the join adds the
bills left to right, and the answer goes in ``\\boxed{}``. The sequential solution is the
same content without tags, outlines and seeds, one bill after another. The arithmetic is
small on purpose (one-digit factors, sums below a thousand): the point is the format on a
real tokenizer, not mathematical strength.
"""

from __future__ import annotations

import random

from threadweaver.format import block_text

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal")
ITEMS = ("apples", "pens", "cups", "books", "eggs", "hats", "cards", "bowls", "plums", "socks", "maps", "bells")
COUNTS = range(2, 10)
PRICES = range(1, 10)


def _dollars(amount: int) -> str:
    return f"{amount} dollar" + ("" if amount == 1 else "s")


def _sum_steps(values: list[int]) -> str:
    """``"a + b = s, s + c = t"``: the running total, one addition at a time."""
    steps, total = [], values[0]
    for value in values[1:]:
        steps.append(f"{total} + {value} = {total + value}")
        total += value
    return ", ".join(steps)


def shopping_problem(rng: random.Random, people: int) -> tuple[str, str, str, str]:
    """(prompt, answer, parallel solution, sequential solution) for ``people`` buyers."""
    names = NAMES[:people]
    bought, bills, threads = [], [], []
    for name in names:
        first, second = rng.sample(ITEMS, 2)
        (n1, p1), (n2, p2) = ((rng.choice(COUNTS), rng.choice(PRICES)) for _ in range(2))
        bought.append(f"{name} buys {n1} {first} at {_dollars(p1)} each and {n2} {second} at {_dollars(p2)} each.")
        bill = n1 * p1 + n2 * p2
        bills.append(bill)
        threads.append(
            f" {name} pays {n1} x {p1} = {n1 * p1} for {first} and {n2} x {p2} = {n2 * p2} for {second}, "
            f"so {n1 * p1} + {n2 * p2} = {bill} dollars."
        )
    who = ", ".join(names[:-1]) + f" and {names[-1]}"
    prompt = " ".join(bought) + f" How many dollars do {who} spend in all?"
    answer = str(sum(bills))
    join = f"In all: {_sum_steps(bills)} dollars." if people > 1 else f"In all: {answer} dollars."
    lead = "I work out each person's bill, then add them up.\n"
    outlines = [f" {name}'s bill" for name in names]
    parallel = f"<think>\n{lead}{block_text(outlines, threads)}\n{join}\n</think>\n\\boxed{{{answer}}}"
    sequential = f"<think>\n{lead}" + "".join(t[1:] + "\n" for t in threads) + f"{join}\n</think>\n\\boxed{{{answer}}}"
    return prompt, answer, parallel, sequential
