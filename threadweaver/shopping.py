"""A task written in sentences, for pretrained language models: who pays what, and how much in all.

A problem names ``k`` people, each buying two kinds of things at a price each, and asks
for the total::

    Ann buys 3 apples at 4 dollars each and 2 pens at 1 dollar each. Ben buys 6 cups at
    2 dollars each and 4 hats at 3 dollars each. How many dollars do Ann and Ben pay in all?

Each person's bill is a sub-question of its own. The parallel solution outlines one
thread per person; a thread multiplies both purchases and adds them column by column
(ones, then tens with the carry); the join adds the bills the same way, two at a time (a
running total, up to the hundreds), and the answer goes in ``\\boxed{}``. The sequential
solution is the same content without tags, outlines and seeds, one bill after another.

Why columns, two numbers at a time (``bench/RESULTS.md``): fine-tuned 80 steps on whole
sums (``12 + 57 = 69``), SmolLM2-135M-Instruct got every product right but 12-13% of its
sums wrong, mostly with a carry; written column by column, 3 of its 689 sums were. Asked
for the biggest bill instead, it compared 23% of the pairs wrongly, digit by digit too.
Adding every bill in one column sum (``ones 2 + 4 + 1 + 6 = 13``), it got 56% of those
columns wrong: it adds two digits and a carry reliably, not three or four. The point is
the format on a real tokenizer, not mathematical strength.
"""

from __future__ import annotations

import random

from threadweaver.format import block_text

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal")
ITEMS = ("apples", "pens", "cups", "books", "eggs", "hats", "cards", "bowls", "plums", "socks", "maps", "bells")
COUNTS = range(2, 10)
PRICES = range(1, 10)
PLACES = ("ones", "tens", "hundreds", "thousands")


def _dollars(amount: int) -> str:
    return f"{amount} dollar" + ("" if amount == 1 else "s")


def _column_sum_in_words(values: list[int]) -> str:
    """``"49 + 18: ones 9 + 8 = 17, tens 4 + 1 + 1 = 6, so 67"``: each place's digits, then the carry.

    A number adds a digit only to the places it has, and the columns go on while a carry is left
    (``"tens 8 + 7 + 1 = 16, hundreds 1"``). The same columns as :func:`threadweaver.synth.column_sum`,
    written in words for a BPE tokenizer.
    """
    columns, carry, place = [], 0, 0
    while place == 0 or carry or any(v >= 10**place for v in values):
        digits = [v // 10**place % 10 for v in values if v >= 10**place] + ([carry] if carry else [])
        total, written = sum(digits), " + ".join(map(str, digits))
        columns.append(f"{PLACES[place]} {written} = {total}" if len(digits) > 1 else f"{PLACES[place]} {total}")
        carry, place = total // 10, place + 1
    return f"{' + '.join(map(str, values))}: {', '.join(columns)}, so {sum(values)}"


def _running_total(values: list[int]) -> str:
    """``"42 + 65: ..., so 107; 107 + 79: ..., so 186"``: two numbers at a time, each in columns."""
    steps, total = [], values[0]
    for value in values[1:]:
        steps.append(_column_sum_in_words([total, value]))
        total += value
    return "; ".join(steps)


def _purchases(rng: random.Random) -> tuple[tuple[str, int, int], tuple[str, int, int]]:
    first, second = rng.sample(ITEMS, 2)
    return (first, rng.choice(COUNTS), rng.choice(PRICES)), (second, rng.choice(COUNTS), rng.choice(PRICES))


def shopping_problem(rng: random.Random, people: int) -> tuple[str, str, str, str]:
    """(prompt, answer, parallel solution, sequential solution) for ``people`` buyers."""
    names = NAMES[:people]
    carts = [_purchases(rng) for _ in names]
    bills = [sum(n * p for _, n, p in cart) for cart in carts]
    bought, threads = [], []
    for name, ((first, n1, p1), (second, n2, p2)) in zip(names, carts):
        bought.append(f"{name} buys {n1} {first} at {_dollars(p1)} each and {n2} {second} at {_dollars(p2)} each.")
        threads.append(
            f" {name} pays {n1} x {p1} = {n1 * p1} for {first} and {n2} x {p2} = {n2 * p2} for {second}. "
            f"{_column_sum_in_words([n1 * p1, n2 * p2])} dollars."
        )
    answer = str(sum(bills))
    if people > 1:
        who = ", ".join(names[:-1]) + f" and {names[-1]}"
        prompt = " ".join(bought) + f" How many dollars do {who} pay in all?"
        join = f"In all: {_running_total(bills)} dollars."
    else:
        prompt = " ".join(bought) + f" How many dollars does {names[0]} pay?"
        join = f"In all: {answer} dollars."
    lead = "I work out each person's bill, then add them.\n"
    outlines = [f" {name}'s bill" for name in names]
    parallel = f"<think>\n{lead}{block_text(outlines, threads)}\n{join}\n</think>\n\\boxed{{{answer}}}"
    sequential = f"<think>\n{lead}" + "".join(t[1:] + "\n" for t in threads) + f"{join}\n</think>\n\\boxed{{{answer}}}"
    return prompt, answer, parallel, sequential
