"""What a user's own engine and settings get wrong, met as the README's "Parallel decoding" section has
one write them: an engine that answers past a stop id, a reply that is not a Completion, a
``generate`` that is not async, settings of the wrong type, an empty prompt."""

import asyncio
import contextlib
import dataclasses
import logging

import pytest
from chars import EOS
from orchestrator_scripts import GOOD, PROMPT, WELL_FORMED

from threadweaver.engine import Completion, Sampling
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.testing import ScriptedEngine
from threadweaver.vllm_orchestrator.replicas import Replicas


class IgnoresStops(ScriptedEngine):
    """Answers the whole script reply, past any stop id (an engine with no stop support)."""

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        return await super().generate(prompt_ids, [], max_tokens, sampling)


def test_an_engine_that_answers_past_a_stop_id_decodes_as_one_that_stops_there(fmt):
    """Its first reply runs on past </Outlines>: cut there, the block forks as vLLM's reply would."""
    engine = IgnoresStops(fmt, GOOD)
    t = asyncio.run(Orchestrator(engine, fmt).run(fmt.encode(PROMPT)))
    assert t.token_ids == tuple(fmt.encode(WELL_FORMED) + [EOS])
    assert t.degradations == () and t.finish_reason == "stop"
    assert [r.finish_reason for r in t.requests] == ["stop"] * 4


class NumpyIds(ScriptedEngine):
    """Answers with its ids as a NumPy array (a tensor's ``.numpy()``, say)."""

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        import numpy as np

        done = await super().generate(prompt_ids, stop_ids, max_tokens, sampling)
        return dataclasses.replace(done, token_ids=np.array(done.token_ids))


def test_a_reply_of_numpy_ids_decodes_as_one_of_ints(fmt):
    t = asyncio.run(Orchestrator(NumpyIds(fmt, GOOD), fmt).run(fmt.encode(PROMPT)))
    assert t.token_ids == tuple(fmt.encode(WELL_FORMED) + [EOS]) and {type(i) for i in t.token_ids} == {int}


class Replies:
    """An engine of one's own that answers every request with ``reply``."""

    def __init__(self, reply):
        self.reply = reply

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        return self.reply


@pytest.mark.parametrize(
    "reply, message",
    [
        ([1, 2, 3], "returned list [1, 2, 3], not a threadweaver.engine.Completion"),
        ({"token_ids": [1], "finish_reason": "stop"}, "returned dict {'token_ids': [1], 'finish_reason': 'stop'}, not"),
        (Completion(None, "stop"), "returned token_ids NoneType None, not a sequence of ints"),
        (Completion("aa", "stop"), "returned token_ids str 'aa', not a sequence of ints"),
        (Completion((97, 1.5), "stop"), "returned token_ids tuple (97, 1.5), not a sequence of ints"),
        (Completion((97,), "eos"), "returned finish_reason 'eos', not 'stop' or 'length'"),
    ],
)
@pytest.mark.parametrize("degrade", [False, True])
def test_a_reply_that_is_not_a_completion_of_token_ids_names_the_engine(fmt, reply, message, degrade):
    """Not an AttributeError deep in the decoding, nor (RL's degrade_on_engine_error) an engine outage."""
    orchestrator = Orchestrator(Replies(reply), fmt, degrade_on_engine_error=degrade)
    with pytest.raises(TypeError) as refused:
        asyncio.run(orchestrator.run(fmt.encode(PROMPT)))
    assert str(refused.value).startswith(f"Replies.generate {message}")


class Synchronous:
    def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        return Completion((EOS,), "stop")


@pytest.mark.parametrize("degrade", [False, True])
def test_a_generate_that_is_not_async_names_the_engine(fmt, degrade):
    """Under degrade_on_engine_error it was an engine_error on every sequence, each trajectory empty."""
    orchestrator = Orchestrator(Synchronous(), fmt, degrade_on_engine_error=degrade)
    with pytest.raises(TypeError, match=r"^Synchronous\.generate must be async \(async def generate\), but returned"):
        asyncio.run(orchestrator.run(fmt.encode(PROMPT)))


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: Sampling(temperature="0.5"), "temperature"),
        (lambda: Sampling(top_p="1"), "top_p"),
        (lambda: Sampling(top_k=2.5), "top_k"),
        (lambda: Sampling(top_k=True), "top_k"),
        (lambda: Sampling(seed=1.5), "seed"),
        (lambda: Sampling(seed="7"), "seed"),
        (lambda: Limits(timeout_s="5"), "timeout_s"),
        (lambda: Limits(timeout_s=True), "timeout_s"),
    ],
)
def test_settings_of_the_wrong_type_are_refused_naming_the_field(make, field):
    """A TypeError from a comparison before; seeds and top_k only at the server's first 400."""
    with pytest.raises(ValueError, match=f"^{field} must be"):
        make()


def test_settings_of_the_right_type_still_pass():
    assert Sampling(temperature=1, top_p=0.5, top_k=0, seed=-3).seed == -3
    assert Limits(timeout_s=2).timeout_s == 2


def test_an_empty_prompt_is_refused_before_any_request(fmt):
    """vLLM answered a 400, transformers a reshape error from inside the model."""
    engine = ScriptedEngine(fmt, GOOD)
    with pytest.raises(ValueError, match="^prompt_ids is empty"):
        asyncio.run(Orchestrator(engine, fmt).run([]))
    assert not engine.calls


def test_replicas_of_engines_without_aclose_close_as_the_readme_snippet_closes_them(fmt):
    """``contextlib.aclosing(Replicas([...]))`` over engines of one's own (or ScriptedEngine) raised AttributeError."""
    replicas = Replicas([ScriptedEngine(fmt, GOOD) for _ in range(2)])

    async def main():
        async with contextlib.aclosing(replicas):
            return await Orchestrator(replicas, fmt).run(fmt.encode(PROMPT))

    assert asyncio.run(main()).token_ids == tuple(fmt.encode(WELL_FORMED) + [EOS])


class Served(ScriptedEngine):
    """A server that says where it loaded its model from, as ``VLLMServerEngine.model_root`` does."""

    def __init__(self, fmt, root):
        super().__init__(fmt, GOOD)
        self.root = root

    async def model_root(self):
        return self.root


def test_servers_that_loaded_different_models_are_warned_of(fmt, caplog):
    """``--base-url "URL1 URL2"`` over a ThreadWeaver model and its baseline mixed their rows without a word."""
    replicas = Replicas([Served(fmt, "runs/parallel"), Served(fmt, "runs/sequential")])
    with caplog.at_level(logging.WARNING, logger="threadweaver.vllm_orchestrator.replicas"):
        assert asyncio.run(replicas.model_root()) == "runs/parallel"
    (record,) = caplog.records
    assert "server 1: runs/parallel; server 2: runs/sequential" in record.getMessage()


def test_servers_of_one_model_are_not_warned_of(fmt, caplog):
    replicas = Replicas([Served(fmt, "runs/sft"), ScriptedEngine(fmt, GOOD), Served(fmt, "runs/sft")])
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(replicas.model_root()) == "runs/sft"
    assert not caplog.records


class Budgets(ScriptedEngine):
    """Records each request's ``max_tokens``."""

    def __init__(self, fmt, script):
        super().__init__(fmt, script)
        self.budgets = []

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        self.budgets.append(max_tokens)
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)


@pytest.mark.parametrize("branching", [False, True])
def test_a_request_may_use_what_is_left_of_the_trajectorys_budget(fmt, branching):
    """A plain (--no-branching) baseline is one request: a request cap of 4096 under max_tokens 8192 cut it there,
    while a fork-join trajectory, spread over several requests, went on. Capping a request is opt-in."""
    engine = Budgets(fmt, GOOD)
    asyncio.run(Orchestrator(engine, fmt, Limits(branching=branching, max_tokens=6000)).run(fmt.encode(PROMPT)))
    assert engine.budgets[0] == 6000
    capped = Budgets(fmt, GOOD)
    limits = Limits(branching=branching, max_tokens=6000, max_request_tokens=100)
    asyncio.run(Orchestrator(capped, fmt, limits).run(fmt.encode(PROMPT)))
    assert max(capped.budgets) == 100


def test_a_reply_cut_at_max_tokens_ended_by_length(fmt):
    """An engine that answers past max_tokens, up to its stop id: cut where vLLM would have stopped it, by length,
    not the engine's 'stop'."""
    reply = Completion(tuple(fmt.encode("abcd")) + (EOS,), "stop")
    limits = Limits(branching=False, max_tokens=12, max_request_tokens=3)
    t = asyncio.run(Orchestrator(Replies(reply), fmt, limits).run(fmt.encode(PROMPT)))
    assert [(r.completion_tokens, r.finish_reason) for r in t.requests] == [(3, "length")]
