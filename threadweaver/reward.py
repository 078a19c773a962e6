"""P-GRPO reward: correctness (math-verify) plus an acceleration term.

math-verify enforces its time limits with ``signal.alarm``, which raises outside the
main thread, and verl reward managers and TRL async rewards call from worker threads.
On the main thread (TRL's reward functions, lm-eval's scoring) math-verify runs in
process with its own time limits. From any other thread grading runs in a small pool of
worker processes, where each call is in the worker's main thread; a hard deadline on the
caller's side replaces a stuck pool. Only that pool starts processes, which re-import an
unguarded ``__main__`` script. ``grade`` is safe to call from any thread; ``agrade`` from
asyncio code.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import math
import multiprocessing
import numbers
import re
import signal
import threading
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Literal

from threadweaver.cli_args import is_finite
from threadweaver.jsonl import RowError, json_kind
from threadweaver.stats import speedup

_BOXED = "\\boxed{"


@dataclass(frozen=True)
class Grade:
    correct: bool
    detail: str
    """How it was decided: ``exact``, ``math-verify``, ``no boxed answer``, ``timeout``, or an error."""


ACCELERATION_FORMS = ("reduction", "ratio")


@dataclass(frozen=True)
class RewardConfig:
    factor: float = 0.5
    """Weight of the acceleration term (the paper's rho)."""
    clip: float = 0.2
    """Upper clip of the acceleration term before weighting (the paper's rho_clip)."""
    form: Literal["reduction", "ratio"] = "reduction"
    """``reduction``: ``1 - critical/total`` (the reference's code, the paper);
    ``ratio``: ``total/critical - 1`` (the reference's README)."""
    timeout_s: float = 5.0
    """Time limit for grading one answer."""

    def __post_init__(self) -> None:
        _check_number("factor", self.factor, positive=False)
        _check_number("clip", self.clip, positive=False)
        _check_number("timeout_s", self.timeout_s, positive=True)
        if self.form not in ACCELERATION_FORMS:
            raise ValueError(f"RewardConfig.form must be 'reduction' or 'ratio', not {self.form!r}")


def _check_number(name: str, value: object, positive: bool) -> None:
    """A finite real number, > 0 (``positive``) or >= 0; a string from a config file is refused, not coerced."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"RewardConfig.{name} must be a number, not {type(value).__name__} {value!r}")
    if not is_finite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"RewardConfig.{name} must be a finite number {'>' if positive else '>='} 0, not {value!r}")


@dataclass(frozen=True)
class RewardParts:
    correctness: float
    acceleration: float
    grade: Grade

    @property
    def reward(self) -> float:
        return self.correctness + self.acceleration


def acceleration(total_tokens: int, critical_path_tokens: int, config: RewardConfig = RewardConfig()) -> float:
    """``factor * min(gain, clip)``, with the gain in the configured form (0 if no tokens)."""
    if total_tokens <= 0 or critical_path_tokens <= 0:
        return 0.0
    if config.form == "reduction":
        gain = 1.0 - critical_path_tokens / total_tokens
    else:  # "ratio" (RewardConfig checks the form)
        gain = speedup(total_tokens, critical_path_tokens) - 1.0
    return config.factor * min(max(gain, 0.0), config.clip)


def reward(
    response: str, gold: str, total_tokens: int, critical_path_tokens: int, config: RewardConfig = RewardConfig()
) -> RewardParts:
    """Correctness (1 or 0) plus the acceleration term, which is paid only when correct."""
    result = grade(response, gold, timeout_s=config.timeout_s)
    if not result.correct:
        return RewardParts(0.0, 0.0, result)
    return RewardParts(1.0, acceleration(total_tokens, critical_path_tokens, config), result)


@functools.lru_cache(maxsize=16384)
def is_correct(response: str, gold: str, timeout_s: float = RewardConfig.timeout_s) -> bool:
    """``grade(...).correct``, remembered: a rollout's rewards and metrics, or a response's score and its
    trajectory row, grade the same response more than once."""
    return grade(response, gold, timeout_s).correct


def answer_text(value) -> str:
    """A row's gold answer as the text the correctness reward grades against: a string, or a finite number as
    its text. Anything else (null, a boolean, a list, NaN, an empty string) is a ValueError saying what it is:
    as text, ``None`` or ``nan`` would be matched by ``\\boxed{None}`` or ``\\boxed{nan}``."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):  # numpy's numbers too (parquet)
        raise ValueError(f"is {json_kind(value)}, not a string or a number")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        raise ValueError(f"is {value}, not a number an answer can be")
    text = str(value)
    if not text.strip():
        raise ValueError("is empty")
    return text


def row_answer(row: dict, line: int) -> str:
    """A row's gold answer (its ``answer`` field) as :func:`answer_text` reads it; a row without one, or with one
    no answer can be, raises :class:`~threadweaver.jsonl.RowError` naming its line and the field."""
    if "answer" not in row:
        raise RowError(line, "no 'answer' field (the gold answer the correctness reward grades against)", shape=True)
    try:
        return answer_text(row["answer"])
    except ValueError as err:
        raise RowError(line, f"field 'answer' {err}", shape=True) from None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _normalise(answer: str) -> str:
    return re.sub(r"\s+", "", answer).strip("$.")


def grade(response: str, gold: str, timeout_s: float = RewardConfig.timeout_s) -> Grade:
    """Is the last boxed answer in ``response`` equal to ``gold``? Safe from any thread."""
    answer = last_boxed(response)
    if answer is None:
        return Grade(False, "no boxed answer")
    if _normalise(answer) == _normalise(gold):
        return Grade(True, "exact")
    if threading.current_thread() is threading.main_thread():
        try:
            return Grade(_verify_in_worker(answer, gold, timeout_s), "math-verify")
        except Exception as err:  # a grading failure is a wrong answer, never a crash
            return Grade(False, f"error: {type(err).__name__}: {err}")
    return _pool.run(answer, gold, timeout_s)


async def agrade(response: str, gold: str, timeout_s: float = RewardConfig.timeout_s) -> Grade:
    """``grade`` for asyncio code: runs off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, grade, response, gold, timeout_s)


def _verify_in_worker(answer: str, gold: str, timeout_s: float) -> bool:
    """math-verify on one answer; must run on its process's main thread (its time limits use signals)."""
    from math_verify import parse, verify

    limit = max(1, int(round(timeout_s)))
    answer, gold = _e_notation_as_latex(answer), _e_notation_as_latex(gold)
    gold_parsed = parse(f"${gold}$", parsing_timeout=limit) or parse(gold, parsing_timeout=limit)
    answer_parsed = parse(_BOXED + answer + "}", parsing_timeout=limit)
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=limit))


_DEAD_WORKERS = (
    "math-verify's grading worker process died twice in a row. Workers are spawned, so they re-import "
    'your __main__ module: a script that grades at import time must run under `if __name__ == "__main__":`.'
)


_E_NOTATION = re.compile(r"\s*([-+]?\d+(?:\.\d*)?)[eE]([-+]?\d+)\s*")


def _e_notation_as_latex(answer: str) -> str:
    """``4.5e33`` as ``4.5\\times10^{33}``: math-verify reads the ``e`` as Euler's number.

    Minerva Math writes many gold answers this way.
    """
    match = _E_NOTATION.fullmatch(answer)
    return f"{match[1]}\\times10^{{{int(match[2])}}}" if match else answer


def _ignore_ctrl_c() -> None:
    """In a grading worker: Ctrl-C at the terminal reaches the whole process group, and the parent
    alone decides what it means (a worker's own KeyboardInterrupt would print a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _GradingPool:
    """A lazily started pool of spawned worker processes, replaced if a call hangs."""

    def __init__(self, workers: int = 2):
        self.workers = workers
        self.lock = threading.Lock()
        self.executor: ProcessPoolExecutor | None = None
        atexit.register(self.close)

    def _get(self) -> ProcessPoolExecutor:
        with self.lock:
            if self.executor is None:
                self.executor = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_ctrl_c
                )
            return self.executor

    def run(self, answer: str, gold: str, timeout_s: float, retry: bool = True) -> Grade:
        executor = self._get()
        try:
            future = executor.submit(_verify_in_worker, answer, gold, timeout_s)
            # Worker start-up (imports sympy) is not the answer's fault: allow for it.
            return Grade(future.result(timeout=3 * timeout_s + 60), "math-verify")
        except FutureTimeout:
            self._replace(executor)
            return Grade(False, "timeout")
        except BrokenProcessPool:
            self._replace(executor)
            if retry:
                return self.run(answer, gold, timeout_s, retry=False)
            warnings.warn(_DEAD_WORKERS, RuntimeWarning, stacklevel=3)
            return Grade(False, "error: the grading worker died")
        except Exception as err:  # a grading failure is a wrong answer, never a crash
            return Grade(False, f"error: {type(err).__name__}: {err}")

    def _replace(self, stuck: ProcessPoolExecutor) -> None:
        with self.lock:
            if self.executor is stuck:
                self.executor = None
        for process in list(getattr(stuck, "_processes", {}).values()):
            process.kill()
        stuck.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self.lock:
            executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


_pool = _GradingPool()
