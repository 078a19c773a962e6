"""Every field of vLLM's two request schemas is honoured by fork-join, harmless to it, or refused unless
it asks for nothing: a field that a vLLM upgrade adds, which fork-join would silently ignore, fails here."""

from __future__ import annotations

import pytest
from vllm_server import NO_VLLM, have_vllm

from threadweaver.vllm_orchestrator import openai_api


def vllm_request_schemas() -> list:
    if not have_vllm():
        pytest.skip(NO_VLLM)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return [ChatCompletionRequest, CompletionRequest]


def test_every_field_of_vllms_requests_is_honoured_harmless_or_refused_unless_it_asks_for_nothing():
    unaccounted, refused_by_default = [], []
    for schema in vllm_request_schemas():
        for name, field in schema.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if name in openai_api.HONOURED | openai_api.HARMLESS:
                continue
            if name not in openai_api.UNSUPPORTED:
                unaccounted.append(f"{schema.__name__}.{name}")
            elif openai_api._asks(name, default, openai_api.UNSUPPORTED[name]):
                refused_by_default.append(f"{schema.__name__}.{name} = {default!r}")
    assert not unaccounted, f"fork-join would silently ignore {unaccounted}"
    assert not refused_by_default, f"vLLM's own defaults would be refused: {refused_by_default}"


def test_special_tokens_are_added_as_vllm_adds_them_by_default():
    chat, completion = vllm_request_schemas()
    defaults = {
        route: schema.model_fields["add_special_tokens"].get_default(call_default_factory=True)
        for route, schema in (("chat", chat), ("completion", completion))
    }
    assert defaults == openai_api.ADD_SPECIAL_TOKENS
