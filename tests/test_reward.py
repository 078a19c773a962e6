"""Reward: grading through math-verify from any thread or event loop, and the acceleration term."""

import asyncio
import threading

import pytest

from threadweaver.reward import RewardConfig, acceleration, agrade, grade, last_boxed, reward


def test_last_boxed_balances_braces():
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert last_boxed("no answer") is None
    assert last_boxed(r"\boxed{unclosed") is None


@pytest.mark.parametrize(
    "response,gold,correct",
    [
        (r"so \boxed{1884}", "1884", True),
        (r"\boxed{\frac{1}{2}}", "0.5", True),
        (r"\boxed{\dfrac{3}{4}}", r"\frac34", True),
        (r"\boxed{1885}", "1884", False),
        ("1884", "1884", False),
    ],
)
def test_grade(response, gold, correct):
    assert grade(response, gold).correct is correct


@pytest.mark.parametrize(
    "answer,gold,correct",
    [
        # thousands separators and lists: a comma is a separator only where it makes one number
        ("1,000", "1000", True),
        ("1,234,567", "1234567", True),
        ("1,2", "12", False),
        ("12", "1,2", False),
        ("84, 69", "69,84", True),
        ("(1,8,19), (2,7,13)", "(1,8,19), (2,7,13)", True),
        # fractions
        (r"\dfrac{1}{2}", r"\frac12", True),
        ("1/2", r"\frac{1}{2}", True),
        (r"\tfrac{1}{2}", "0.5", True),
        (r"\frac{1}{3}", "0.33", False),
        (r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}", True),
        # intervals: the brackets matter
        (r"(-\infty, 3]", r"(-\infty,3]", True),
        (r"(-\infty, 3)", r"(-\infty,3]", False),
        ("(1,2)", "[1,2]", False),
        (r"x \in [2, 5]", "[2,5]", True),
        ("(2,3)", "(2, 3)", True),
        # text answers
        (r"\text{Monday}", r"\text{Monday}", True),
        ("Monday", r"\text{Monday}", True),
        (r"\text{Tuesday}", r"\text{Monday}", False),
        ("C", r"\text{(C)}", True),
        ("A", r"\text{(C)}", False),
        (r"\textbf{(C)}", "C", True),
        # numbers with units, leading zeros, e-notation (Minerva), equations
        (r"5 \text{ cm}", "5", True),
        ("027", "27", True),
        ("27.0", "27", True),
        (r"4.5 \times 10^{33}", "4.5e33", True),
        (r"4.6 \times 10^{33}", "4.5e33", False),
        ("x=2", "2", True),
    ],
)
def test_grade_edge_cases(answer, gold, correct):
    """Each answer boxed at the end of a response, graded by math-verify on the main thread."""
    assert grade(f"so the answer is \\boxed{{{answer}}}", gold).correct is correct


def test_grade_from_a_worker_thread_uses_math_verify():
    results = []
    worker = threading.Thread(target=lambda: results.append(grade(r"\boxed{\frac{2}{4}}", "1/2")))
    worker.start()
    worker.join(timeout=120)
    assert results and results[0].correct and results[0].detail == "math-verify"


def test_ctrl_c_at_the_terminal_leaves_the_grading_workers_to_the_parent():
    """A terminal's Ctrl-C reaches the whole process group: the workers must neither die nor print."""
    import os
    import signal
    import time

    import threadweaver.reward as module

    def from_a_thread():
        results = []
        worker = threading.Thread(target=lambda: results.append(grade(r"\boxed{\frac{3}{6}}", "1/2")))
        worker.start()
        worker.join(timeout=120)
        return results[0]

    assert from_a_thread().detail == "math-verify"
    executor = module._pool.executor
    processes = list(executor._processes.values())
    for process in processes:
        os.kill(process.pid, signal.SIGINT)
    time.sleep(1.0)
    assert all(process.is_alive() for process in processes)
    assert from_a_thread().correct and module._pool.executor is executor  # the same pool goes on


def test_grade_on_the_main_thread_starts_no_worker_process(monkeypatch):
    """Spawned workers would re-import an unguarded __main__ script (and rerun it)."""
    import threadweaver.reward as module

    monkeypatch.setattr(module._pool, "run", lambda *args: pytest.fail("graded in a worker process"))
    result = grade(r"\boxed{\frac{2}{4}}", "1/2")
    assert result.correct and result.detail == "math-verify"


def test_grade_from_asyncio():
    async def main():
        return await asyncio.gather(agrade(r"\boxed{2\sqrt{2}}", r"\sqrt{8}"), agrade(r"\boxed{3}", "4"))

    right, wrong = asyncio.run(main())
    assert right.correct and right.detail == "math-verify"
    assert not wrong.correct


def test_acceleration_forms_and_clip():
    assert acceleration(100, 90) == pytest.approx(0.5 * 0.1)
    assert acceleration(100, 50) == pytest.approx(0.5 * 0.2)  # clipped
    ratio = RewardConfig(form="ratio")
    assert acceleration(100, 90, ratio) == pytest.approx(0.5 * (100 / 90 - 1))
    assert acceleration(100, 50, ratio) == pytest.approx(0.5 * 0.2)
    assert acceleration(100, 100) == 0.0 and acceleration(0, 0) == 0.0
    with pytest.raises(ValueError, match="form"):
        acceleration(10, 5, RewardConfig(form="other"))


def test_reward_pays_acceleration_only_when_correct():
    right = reward(r"\boxed{7}", "7", total_tokens=100, critical_path_tokens=80)
    assert (right.correctness, right.acceleration, right.reward) == (1.0, pytest.approx(0.1), pytest.approx(1.1))
    wrong = reward(r"\boxed{8}", "7", total_tokens=100, critical_path_tokens=80)
    assert (wrong.correctness, wrong.acceleration, wrong.reward) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("factor", "0.5", TypeError),
        ("clip", None, TypeError),
        ("timeout_s", "5", TypeError),
        ("factor", True, TypeError),
        ("factor", -0.5, ValueError),
        ("clip", float("nan"), ValueError),
        ("timeout_s", 0, ValueError),
        ("timeout_s", float("inf"), ValueError),
    ],
)
def test_reward_config_refuses_wrong_types_and_ranges_naming_the_field(field, value, error):
    with pytest.raises(error, match=rf"^RewardConfig\.{field} must be a") as caught:
        RewardConfig(**{field: value})
    assert "\n" not in str(caught.value)


def test_reward_config_keeps_valid_values_as_given():
    config = RewardConfig(factor=0, clip=1, form="ratio", timeout_s=0.5)
    assert (config.factor, config.clip, config.form, config.timeout_s) == (0, 1, "ratio", 0.5)
    assert RewardConfig() == RewardConfig(factor=0.5, clip=0.2, form="reduction", timeout_s=5.0)


def test_numpys_numbers_are_gold_answers_as_pythons_are():
    """A parquet column reads as numpy's numbers: an int64 was refused where a float64 was read."""
    import numpy as np

    from threadweaver.reward import answer_text

    assert [answer_text(v) for v in (np.int64(4), np.float64(0.5), np.float32(2.0))] == ["4", "0.5", "2.0"]
    for bad, said in ((np.float64("nan"), "is nan, not a number"), (np.bool_(True), "is a bool, not a string")):
        with pytest.raises(ValueError, match=said):
            answer_text(bad)


def test_row_answer_names_the_line_and_the_field():
    """Every reader of gold answers (pgrpo, self-train, filter, verl's data) refuses a bad one in these words."""
    from threadweaver.jsonl import RowError
    from threadweaver.reward import row_answer

    assert row_answer({"answer": 12}, 3) == "12"
    for row, said in (
        ({"prompt": "2+2?"}, "line 3: no 'answer' field"),
        ({"answer": ["4"]}, "line 3: field 'answer' is a list, not a string or a number"),
        ({"answer": " "}, "line 3: field 'answer' is empty"),
    ):
        with pytest.raises(RowError, match=said) as caught:
            row_answer(row, 3)
        assert caught.value.shape  # the row is at fault, not the tokenizer it was read with
