"""Host-free pieces of P-GRPO: a rollout as one training row (what to log of a batch: :mod:`threadweaver.metrics`).

A trajectory trains as ONE row: its trie (:func:`threadweaver.trie.trajectory_trie`)
split after the prompt. Every token the model sampled is scored from the position that
preceded it in the request that sampled it (its trie parent), under the tree mask, so
the row gives each thread exactly the context it was decoded in. Injected tokens
(``<Thread>`` + ``i:`` seeds, ``</Parallel>``, a ``</Thread>`` the orchestrator closed
a thread with) and the context copies of threads 2..k carry no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from threadweaver.format import Format
from threadweaver.orchestrator import EngineCall, Trajectory
from threadweaver.reward import RewardConfig
from threadweaver.trie import trajectory_trie


@dataclass(frozen=True)
class PaperSettings:
    """P-GRPO's settings in the paper, declared once: TRL's ``PGRPOConfig`` and the verl configs refer to them."""

    learning_rate: float = 1e-6
    rollouts_per_prompt: int = 8
    clip_low: float = 0.2
    """Lower clip of the importance ratio (its epsilon)."""
    clip_high: float = 0.28
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    acceleration_factor: float = RewardConfig.factor
    acceleration_clip: float = RewardConfig.clip


PAPER = PaperSettings()


@dataclass(frozen=True)
class TrieRow:
    """One trajectory's trie, split after the prompt; indices count from the row's first prompt token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    """The trie after the prompt, in pre-order: branches and context copies included."""
    trained: list[int]
    """Per completion token: 1 if the model sampled it in this context (it carries loss), else 0."""
    parent: list[int]
    """Per completion token: the row index whose logits predict it."""
    position_ids: list[int]
    """Per completion token: its position in its own request (the trie depth)."""
    subtree_end: list[int]
    """Per completion token: the row index just past its subtree (see :mod:`threadweaver.trie`)."""

    @property
    def trained_tokens(self) -> int:
        return sum(self.trained)

    @property
    def row_parents(self) -> list[int]:
        """Per row token, prompt included: the row index whose logits predict it (-1 for the first)."""
        return list(range(-1, len(self.prompt_ids) - 1)) + self.parent


def trie_row(trajectory: Trajectory, fmt: Format) -> TrieRow:
    """``trajectory`` as one training row (its prompt stays a plain prefix of the row)."""
    prompt = list(trajectory.prompt_ids)
    flat = trajectory_trie(prompt, trajectory.nodes, fmt, closed_threads=trajectory.closed_threads)
    n = len(prompt)
    if flat.input_ids[:n] != prompt or any(flat.parent[i] != i - 1 for i in range(n)):
        raise ValueError("the trajectory's prompt is not a plain prefix of its trie")
    return TrieRow(
        prompt,
        flat.input_ids[n:],
        [int(t) for t in flat.trained[n:]],
        flat.parent[n:],
        flat.position_ids[n:],
        flat.subtree_end[n:],
    )


def sampling_logprobs(row: TrieRow, calls: Sequence[EngineCall]) -> list[float | None]:
    """Per completion token of ``row``: the log-prob the engine reported when it sampled it.

    Each call's context + completion is a path from the row's first token; its completion
    tokens are found by walking that path. A completion's last token may be missing (the
    end-of-sequence token a thread wrote, which the orchestrator replaced by ``</Thread>``).
    Tokens no call sampled (injected ones, context copies) and calls without log-probs
    give ``None``. Any other token off the trie means the call is another trajectory's: an error.
    """
    tokens = row.prompt_ids + row.completion_ids
    start = len(row.prompt_ids)
    children = {(parent, token): i for i, (parent, token) in enumerate(zip(row.row_parents, tokens))}
    out: list[float | None] = [None] * len(row.completion_ids)
    for number, call in enumerate(calls):
        path = call.context + call.completion
        at = -1
        for position, token in enumerate(path):
            at = children.get((at, token))
            if at is None:
                if position == len(path) - 1 and call.completion:
                    break
                raise ValueError(
                    f"engine call {number}: token {position} ({token}) of its context + completion is "
                    "not in this trajectory's trie"
                )
            sampled = position - len(call.context)
            if sampled >= 0 and call.logprobs is not None:
                out[at - start] = call.logprobs[sampled]
    return out
