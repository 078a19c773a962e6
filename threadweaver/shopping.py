"""A task written in sentences, for pretrained language models: who pays what, and who pays most.

A problem names ``k`` people, each buying two kinds of things at a price each, and asks
what the biggest bill is::

    Ann buys 3 apples at 4 dollars each and 2 pens at 1 dollar each. Ben buys 6 cups at
    2 dollars each and 4 hats at 3 dollars each. How many dollars does the one of Ann and
    Ben who spends the most pay?

Each person's bill is a sub-question of its own. The parallel solution outlines one
thread per person; a thread multiplies both purchases and adds them column by column
(ones, then tens with the carry); the join compares the bills left to right, keeping the
larger, and the answer goes in ``\\boxed{}``. The sequential solution is the same content
without tags, outlines and seeds, one bill after another.

Why columns (``bench/RESULTS.md``): fine-tuned 80 steps on whole sums (``12 + 57 = 69``),
SmolLM2-135M-Instruct got every product right but 12-13% of its sums wrong, mostly with a
carry; written column by column, 3 of its 689 sums were. Its comparisons are what still
fails (23% wrong, and no better written digit by digit). The point is the format on a real
tokenizer, not mathematical strength.
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


def _column_sum_in_words(a: int, b: int) -> str:
    """``"49 + 18: ones 9 + 8 = 17, tens 4 + 1 + 1 = 6, so 67"`` for sums of numbers below 100: the
    same columns as :func:`threadweaver.synth.column_sum`, written in words for a BPE tokenizer."""
    ones = a % 10 + b % 10
    carry = " + 1" if ones >= 10 else ""
    tens = a // 10 + b // 10 + ones // 10
    return f"{a} + {b}: ones {a % 10} + {b % 10} = {ones}, tens {a // 10} + {b // 10}{carry} = {tens}, so {a + b}"


def _running_max(values: list[int]) -> str:
    """``"23 < 39, 39 > 30"``: the larger so far, compared with each next value in turn."""
    steps, best = [], values[0]
    for value in values[1:]:
        steps.append(f"{best} {'<' if value > best else '>'} {value}")
        best = max(best, value)
    return ", ".join(steps)


def _purchases(rng: random.Random) -> tuple[tuple[str, int, int], tuple[str, int, int]]:
    first, second = rng.sample(ITEMS, 2)
    return (first, rng.choice(COUNTS), rng.choice(PRICES)), (second, rng.choice(COUNTS), rng.choice(PRICES))


def shopping_problem(rng: random.Random, people: int) -> tuple[str, str, str, str]:
    """(prompt, answer, parallel solution, sequential solution) for ``people`` buyers.

    Every bill differs from the others, so the biggest is one person's."""
    names = NAMES[:people]
    carts, bills = [], []
    while len(carts) < people:
        cart = _purchases(rng)
        bill = sum(n * p for _, n, p in cart)
        if bill not in bills:
            carts.append(cart)
            bills.append(bill)
    bought, threads = [], []
    for name, ((first, n1, p1), (second, n2, p2)) in zip(names, carts):
        bought.append(f"{name} buys {n1} {first} at {_dollars(p1)} each and {n2} {second} at {_dollars(p2)} each.")
        threads.append(
            f" {name} pays {n1} x {p1} = {n1 * p1} for {first} and {n2} x {p2} = {n2 * p2} for {second}. "
            f"{_column_sum_in_words(n1 * p1, n2 * p2)} dollars."
        )
    answer = str(max(bills))
    if people > 1:
        who = ", ".join(names[:-1]) + f" and {names[-1]}"
        prompt = " ".join(bought) + f" How many dollars does the one of {who} who spends the most pay?"
        join = f"The most: {_running_max(bills)}, so {answer} dollars."
    else:
        prompt = " ".join(bought) + f" How many dollars does {names[0]} pay?"
        join = f"The most: {answer} dollars."
    lead = "I work out each person's bill, then compare them.\n"
    outlines = [f" {name}'s bill" for name in names]
    parallel = f"<think>\n{lead}{block_text(outlines, threads)}\n{join}\n</think>\n\\boxed{{{answer}}}"
    sequential = f"<think>\n{lead}" + "".join(t[1:] + "\n" for t in threads) + f"{join}\n</think>\n\\boxed{{{answer}}}"
    return prompt, answer, parallel, sequential
