"""The synthetic task: correct arithmetic, strictly valid trajectories, same content in both forms."""

import json
import os
import random
import re

import pytest

from threadweaver.dataset import synth_splits
from threadweaver.format import Format
from threadweaver.kit.tokenizers import synth_tokenizer_object
from threadweaver.reward import grade
from threadweaver.stats import latency_stats
from threadweaver.synth import SynthConfig, column_sum, make_problem
from threadweaver.tree import Block, parse_text


def test_column_sum():
    assert column_sum(4821, 3907) == "4821+3907 1+7+0=08 2+0+0=02 8+9+0=17 4+3+1=08 ;8728"
    assert column_sum(999, 1) == "999+1 9+1+0=10 9+0+1=10 9+0+1=10 ;1000"


@pytest.mark.parametrize("seed", range(20))
def test_problems_are_right_and_well_formed(seed):
    fmt = Format.from_tokenizer(synth_tokenizer_object())
    p = make_problem(random.Random(seed), SynthConfig(min_terms=2, max_terms=4, digits=4))
    pairs = [tuple(map(int, m)) for m in re.findall(r"[A-H]=(\d+)\+(\d+)", p.prompt)]
    assert int(p.answer) == sum(a + b for a, b in pairs)
    parallel = parse_text(p.parallel, fmt)  # strict
    (block,) = [n for n in parallel.nodes if isinstance(n, Block)]
    assert len(block.threads) == len(pairs)
    assert grade(p.parallel, p.answer).correct and grade(p.sequential, p.answer).correct
    for tag in (
        "<Parallel>",
        "<Outlines>",
        "<Outline>",
        "</Outline>",
        "</Outlines>",
        "<Thread>",
        "</Thread>",
        "</Parallel>",
    ):
        assert tag not in p.sequential
    sequential = latency_stats(parse_text(p.sequential, fmt).nodes)
    assert sequential.blocks == 0
    # same content: the sequential form is the parallel one without tags, outlines and seeds
    stripped = re.sub(r"<Parallel><Outlines>.*?</Outlines>|<Thread>\d+:|</Parallel>\n", "", p.parallel)
    assert stripped.replace("</Thread>", "\n") == p.sequential


def test_splits_are_disjoint_and_reproducible():
    a = synth_splits(SynthConfig(digits=2, min_terms=2, max_terms=2), 300, 50, seed=3)
    b = synth_splits(SynthConfig(digits=2, min_terms=2, max_terms=2), 300, 50, seed=3)
    assert a == b
    assert not {r["prompt"] for r in a["train"]} & {r["prompt"] for r in a["validation"]}
    assert len(a["validation"]) == 50


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="min_terms"):
        SynthConfig(min_terms=5, max_terms=2)


@pytest.mark.parametrize("seed", range(10))
def test_shopping_problems_are_right_and_well_formed_on_a_real_tokenizer(seed, qwen):
    from threadweaver.shopping import NAMES

    fmt = Format.from_tokenizer(qwen)
    config = SynthConfig(task="shopping", min_terms=2, max_terms=len(NAMES))
    p = make_problem(random.Random(seed), config)
    bought = [(int(n), int(price)) for n, price in re.findall(r"(\d+) \w+ at (\d+) dollars? each", p.prompt)]
    bills = [n1 * p1 + n2 * p2 for (n1, p1), (n2, p2) in zip(bought[::2], bought[1::2])]
    assert int(p.answer) == sum(bills)
    sums = re.findall(r"(\d[\d +]*): ((?:\w+ [\d +=]+, )+)so (\d+)", p.sequential)
    assert len(sums) == 2 * len(bills) - 1  # each bill, then a running total
    for numbers, columns, total in sums:
        values, carry = [int(v) for v in numbers.split(" + ")], 0
        assert int(total) == sum(values)
        for place, column in enumerate(columns.rstrip(", ").split(", ")):
            name, written = column.split(" ", 1)
            terms, *column_sum = written.split(" = ")
            assert name == ("ones", "tens", "hundreds", "thousands")[place]
            digits = [int(d) for d in terms.split(" + ")]
            assert digits == [v // 10**place % 10 for v in values if v >= 10**place] + ([carry] if carry else [])
            carry = sum(digits) // 10
            assert column_sum in ([str(sum(digits))], [])  # a one-term column writes no sum
        assert carry == 0 and 10 ** (place + 1) > max(values)  # no column left out
    assert [sum(int(v) for v in numbers.split(" + ")) for numbers, *_ in sums[: len(bills)]] == bills
    running = [[int(v) for v in numbers.split(" + ")] for numbers, *_ in sums[len(bills) :]]
    assert running == [[sum(bills[:i]), bills[i]] for i in range(1, len(bills))]  # the join adds them in order
    assert p.sequential.count(" dollars.\n") == len(bills) + 1  # a bill per person, then the total
    (block,) = [n for n in parse_text(p.parallel, fmt).nodes if isinstance(n, Block)]  # strict
    assert len(block.threads) == len(bought) // 2 == p.prompt.count(" buys ")
    assert grade(p.parallel, p.answer).correct and grade(p.sequential, p.answer).correct
    stripped = re.sub(r"<Parallel><Outlines>.*?</Outlines>|<Thread>\d+: |</Parallel>\n", "", p.parallel)
    assert stripped.replace("</Thread>", "\n") == p.sequential  # the same content, one bill after another


def test_shopping_with_three_or_four_people_has_a_critical_path_a_third_shorter(qwen):
    fmt = Format.from_tokenizer(qwen)
    rng = random.Random(0)
    problems = [make_problem(rng, SynthConfig(task="shopping")) for _ in range(50)]
    sequential = sum(latency_stats(parse_text(p.sequential, fmt).nodes).total_tokens for p in problems)
    critical = sum(latency_stats(parse_text(p.parallel, fmt).nodes).critical_path_tokens for p in problems)
    assert sequential / critical > 1.3


def test_every_task_bounds_its_sub_questions_alike():
    from threadweaver.shopping import NAMES
    from threadweaver.synth import LABELS

    assert len(NAMES) == len(LABELS)
    with pytest.raises(ValueError, match="task must be one of digits, shopping"):
        SynthConfig(task="poems")


def test_a_caller_that_owns_the_folder_replaces_another_recipe_and_a_stopped_run_is_rerun(tmp_path):
    """``replace``: quickstart's --retrain writes its own data folder anew, whatever recipe wrote it before. A run
    stopped part way left recipe.json (written first) and some splits: the same command finishes them."""
    from threadweaver.dataset import write_synth

    small, other = SynthConfig(digits=2, min_terms=2, max_terms=2), SynthConfig(digits=3, min_terms=2, max_terms=2)
    paths = write_synth(str(tmp_path), small, 6, 2, seed=0)
    with pytest.raises(ValueError, match="holds a dataset of another recipe \\(--digits 2, says its recipe.json\\)"):
        write_synth(str(tmp_path), other, 6, 2, seed=0)
    write_synth(str(tmp_path), other, 6, 2, seed=0, replace=True)
    assert json.loads((tmp_path / "recipe.json").read_text())["config"]["digits"] == 3
    whole = {path: open(path).read() for path in paths}
    os.remove(paths[-1])  # as if stopped before its last split
    write_synth(str(tmp_path), other, 6, 2, seed=0)
    assert {path: open(path).read() for path in paths} == whole
