"""A rollout as one P-GRPO training row: every trained token is one token the engine
sampled, in exactly the context it was sampled in; nothing injected is trained."""

import asyncio
import dataclasses

import pytest
from orchestrator_scripts import CASES, GOOD, NESTED, PROMPT

from threadweaver.metrics import rollout_metrics
from threadweaver.orchestrator import EngineCall, Limits, Orchestrator
from threadweaver.pgrpo import sampling_logprobs, trie_row
from threadweaver.testing import ScriptedEngine

SCRIPTS = {
    "well-formed": (GOOD, Limits()),
    "nested": (NESTED, Limits()),
    **{name: (script, limits) for name, (script, limits, _) in CASES.items()},
}


def logprob(context, token) -> float:
    """A made-up log-prob that tells apart every (context, token)."""
    return -(hash((tuple(context), token)) % 10_007) / 1000


class RecordingEngine(ScriptedEngine):
    """The scripted engine, with log-probs, keeping each (context, completion) it answered."""

    def __init__(self, fmt, script):
        super().__init__(fmt, script)
        self.answered = []

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        completion = await super().generate(prompt_ids, stop_ids, max_tokens, sampling)
        context = tuple(prompt_ids)
        self.answered.append((context, completion.token_ids))
        scores = tuple(logprob(context + completion.token_ids[:i], t) for i, t in enumerate(completion.token_ids))
        return dataclasses.replace(completion, logprobs=scores)


def rollout(fmt, script, limits=Limits()):
    engine = RecordingEngine(fmt, script)
    return asyncio.run(Orchestrator(engine, fmt, limits, keep_calls=True).run(fmt.encode(PROMPT))), engine


def sampled(engine) -> list[tuple[tuple[int, ...], int]]:
    """(context, token) for every token the engine sampled."""
    return [
        (context + completion[:i], token)
        for context, completion in engine.answered
        for i, token in enumerate(completion)
    ]


def ancestors(row, j) -> tuple[int, ...]:
    """The tokens row token ``j`` is scored under: its ancestors, first to last."""
    ids, parent = row.prompt_ids + row.completion_ids, row.row_parents
    path, at = [], parent[j]
    while at >= 0:
        path.append(ids[at])
        at = parent[at]
    return tuple(reversed(path))


def trained_pairs(row) -> list[tuple[tuple[int, ...], int]]:
    """(the path of ancestors a trained token is scored under, the token)."""
    ids = row.prompt_ids + row.completion_ids
    out = []
    for j, trained in enumerate(row.trained, start=len(row.prompt_ids)):
        if trained:
            out.append((ancestors(row, j), ids[j]))
    return out


@pytest.mark.parametrize("script, limits", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_every_trained_token_was_sampled_in_that_context(fmt, script, limits):
    trajectory, engine = rollout(fmt, script, limits)
    row = trie_row(trajectory, fmt)
    pairs = trained_pairs(row)
    assert len(set(pairs)) == len(pairs) == row.trained_tokens
    assert set(pairs) <= set(sampled(engine))
    assert row.trained_tokens == trajectory.stats.total_tokens == sum(trajectory.generated)
    assert row.prompt_ids == list(trajectory.prompt_ids)
    depth = {j: d for j, d in enumerate(row.position_ids, start=len(row.prompt_ids))}
    assert all(depth[j] == depth.get(p, p) + 1 for j, p in zip(depth, row.parent))


@pytest.mark.parametrize("script, limits", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_kept_calls_give_each_trained_token_its_sampling_logprob(fmt, script, limits):
    trajectory, engine = rollout(fmt, script, limits)
    assert [(c.context, c.completion) for c in trajectory.calls] == engine.answered
    row = trie_row(trajectory, fmt)
    scores = sampling_logprobs(row, trajectory.calls)
    ids = row.prompt_ids + row.completion_ids
    for j, (trained, score) in enumerate(zip(row.trained, scores), start=len(row.prompt_ids)):
        assert score == (logprob(ancestors(row, j), ids[j]) if trained else None)


def test_sampling_logprobs_refuses_a_call_from_another_trajectory(fmt):
    trajectory, _ = rollout(fmt, GOOD)
    other = EngineCall(trajectory.prompt_ids + (7,), (8,), (-0.5,))
    with pytest.raises(ValueError, match=rf"engine call 1: token {len(trajectory.prompt_ids)} \(7\)"):
        sampling_logprobs(trie_row(trajectory, fmt), (trajectory.calls[0], other))


def test_calls_are_kept_only_when_asked(fmt):
    engine = RecordingEngine(fmt, GOOD)
    assert asyncio.run(Orchestrator(engine, fmt).run(fmt.encode(PROMPT))).calls == ()


def test_injected_tokens_and_context_copies_are_not_trained(fmt):
    trajectory, engine = rollout(fmt, GOOD)
    row = trie_row(trajectory, fmt)
    tags = fmt.tags
    untrained = [t for t, trained in zip(row.completion_ids, row.trained) if not trained]
    assert untrained.count(tags.parallel_end) == 1
    assert untrained.count(tags.thread) == 2 == sum(t == tags.thread for t in row.completion_ids)
    # thread 2 ("bbbb") sits once as its own branch (trained) and once as a context copy of the
    # continuation; the ninth "b" is outline 2's
    b = fmt.encode("b")[0]
    assert row.completion_ids.count(b) == 9 and untrained.count(b) == 4
    assert set(sampled(engine)) == set(trained_pairs(row))


def test_a_thread_closed_by_the_orchestrator_has_no_trained_end(fmt):
    script, limits, _ = CASES["a thread never closes"]
    trajectory, _ = rollout(fmt, script, limits)
    assert trajectory.closed_threads == {((0, 1),)}
    row = trie_row(trajectory, fmt)
    ends = [trained for t, trained in zip(row.completion_ids, row.trained) if t == fmt.tags.thread_end]
    assert sorted(ends) == [0, 0, 1]  # thread 1 (injected), thread 2's context copy, thread 2's own


def test_rollout_metrics(fmt):
    parallel, _ = rollout(fmt, GOOD)
    sequential, _ = rollout(fmt, GOOD, Limits(branching=False))
    degraded, _ = rollout(fmt, *CASES["a gap in the numbers"][:2])
    metrics = rollout_metrics([parallel, sequential, degraded], correct=[True, False, True])
    assert metrics["correct_rate"] == pytest.approx(2 / 3)
    assert metrics["parallel_activation"] == pytest.approx(1 / 3)
    assert metrics["well_formed"] == pytest.approx(2 / 3)
    assert metrics["speedup"] == pytest.approx((parallel.stats.speedup + 2) / 3)
    assert metrics["critical_path_tokens"] == pytest.approx(
        (parallel.stats.critical_path_tokens + sequential.stats.total_tokens + degraded.stats.total_tokens) / 3
    )
    assert "correct_rate" not in rollout_metrics([parallel])
    with pytest.raises(ValueError, match="no rollouts"):
        rollout_metrics([])
