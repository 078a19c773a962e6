"""Fork-join behind the OpenAI API: what the vLLM endpoint plugin and ``threadweaver proxy`` share.

A request asks for fork-join decoding with the field ``"threadweaver"``: ``true``, or an
object of :class:`~threadweaver.orchestrator.Limits` fields for this request (with the
``openai`` SDK: ``extra_body={"threadweaver": {"max_threads": 4}}``); ``false`` asks for a
plain reply. Without the field a request is plain, unless the server makes fork-join its
default (``THREADWEAVER_BRANCHING=default``). The operator's limits are ceilings: a request
may ask for less (a smaller number, a switch turned off), never more; a field above its
ceiling is a 400 naming the field and the ceiling. Beyond the operator's most trajectories
at once (``THREADWEAVER_MAX_TRAJECTORIES``) a fork-join request gets a 429. The reply is an ordinary OpenAI reply whose
text is the whole trajectory, tags included; ``usage.completion_tokens`` counts every token
generated in every request, and the field ``threadweaver`` holds the latency stats, the
requests (as ``threadweaver generate`` records them) and the problems the orchestrator
decoded around.

A field the orchestrator does not honour (``logprobs``, ``echo``, ``tools``, ``response_format``,
...) is a 400 naming it, where a plain reply would honour it; behind the vLLM plugin a ``model``
the server does not serve is vLLM's own 404 (:func:`check_model`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
import typing
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace

from threadweaver.cli_args import SettingError, check_counts, is_number, is_whole, option, value_type
from threadweaver.engine import EngineError, RequestRefused
from threadweaver.format import Format
from threadweaver.orchestrator import Limits, Orchestrator, Sampling, Trajectory, trajectory_text
from threadweaver.rows import chat_prompt_text, plain_ids
from threadweaver.wall_clock import wall_clock

from .http import PLAIN_HEADER
from .streamed_text import StreamedText

FIELD = "threadweaver"
DEFAULT_ENV = "THREADWEAVER_BRANCHING"
"""``default``: requests without the field are decoded fork-join too (:attr:`ServerSettings.branching_default`)."""
LIMITS_ENV = "THREADWEAVER_LIMITS"
"""A JSON object of :class:`Limits` fields: the server's limits, each a ceiling for a request's own."""
MAX_TRAJECTORIES_ENV = "THREADWEAVER_MAX_TRAJECTORIES"
"""The most fork-join trajectories the server decodes at once (unset: no limit)."""
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
HONOURED = frozenset(
    {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed"}
    | {"stop", "stream", "stream_options", "n", "add_special_tokens", FIELD}
)
"""The request fields fork-join decoding honours (``n`` only as 1; of ``stream_options``, ``include_usage``)."""
ADD_SPECIAL_TOKENS = {"chat": False, "completion": True}
"""``add_special_tokens`` unless a request says: vLLM's defaults (a chat template writes its own BOS; a
completion's text gets the tokenizer's)."""
HARMLESS = frozenset(
    {"user", "metadata", "store", "service_tier", "priority", "request_id", "session_id", "cache_salt"}
    | {"stream_interval", "kv_transfer_params", "ec_transfer_params", "parallel_tool_calls"}
    | {"include_reasoning", "skip_special_tokens", "spaces_between_special_tokens"}
    | {"truncation_side", "mm_payload", "media_io_kwargs", "mm_processor_kwargs", "return_mm_kwargs"}
    | {"routed_experts_prompt_start"}
)
"""Request fields that do not change the text decoded, or only with a field of :data:`UNSUPPORTED` (a
replica's routing, the stream's pacing, multimodal inputs a text prompt has none of): taken as they come."""
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1.0, 1),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),  # auto: what vLLM sets beside tools (refused); without, no call
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None, []),
    "guided_grammar": (None,),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0.0, 0),
    "frequency_penalty": (None, 0.0, 0),
    "repetition_penalty": (None, 1.0, 1),
    "min_p": (None, 0.0, 0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "stop_token_ids": (None, []),
    "include_stop_str_in_output": (None, False),
    "bad_words": (None, []),
    "allowed_token_ids": (None, []),
    "watermarking": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None,),
    "reasoning_effort": (None,),
    "truncate_prompt_tokens": (None,),
    "prompt_embeds": (None,),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "documents": (None, []),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "return_token_offsets": (None, False),
    "return_prompt_text": (None, False),
    "vllm_xargs": (None, {}),
}
"""The OpenAI and vLLM request fields that fork-join does not honour, each with the values that ask for
nothing: any other value is a 400, not a reply that silently lacks what was asked for. Every field of
vLLM's two request schemas is :data:`HONOURED`, :data:`HARMLESS` or here (a test holds vLLM to it); a field
vLLM does not know is ignored, as vLLM ignores it."""
SWITCH_WORDS = {"0": False, "off": False, "f": False, "false": False, "n": False, "no": False}
SWITCH_WORDS |= {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True}
"""The strings vLLM's schemas (pydantic's lax booleans) read as a switch, in any case."""
MESSAGE_LIMIT = 1000
"""The most characters of an error message: vLLM's ``sanitize_message`` takes time superlinear in its length
(16 KB of echoed input took 20 s on the event loop)."""


def branching_default_option():
    """The operator's ``--branching-default`` flag, for ``threadweaver serve`` and ``threadweaver proxy``."""
    return option(
        False,
        "Decode every chat and completion request fork-join unless it sends threadweaver=false "
        "(default: only requests that send the threadweaver field).",
    )


def max_trajectories_option():
    """The operator's ``--max-trajectories`` flag, for ``threadweaver serve`` and ``threadweaver proxy``."""
    return option(
        None, "Most fork-join trajectories decoded at once; beyond, a request gets a 429 (default: no limit)."
    )


class APIError(Exception):
    """A request that ends in an error reply, in vLLM's shape (``{"error": {...}}``)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(cut(message, MESSAGE_LIMIT))
        self.status, self.param = status, param

    def body(self, sanitize: Callable[[str], str] | None = None) -> dict:
        """The reply's body; ``sanitize``: what the server does to an error's message (vLLM drops its paths)."""
        kind = {404: "NotFoundError", 429: "RateLimitError"}.get(
            self.status, "BadRequestError" if self.status < 500 else "InternalServerError"
        )
        message = sanitize(str(self)) if sanitize else str(self)
        return {"error": {"message": message, "type": kind, "param": self.param, "code": self.status}}


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last of them "…" where it was longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value, limit: int = 80) -> str:
    """A client's value as an error message quotes it: its ``repr``, cut to ``limit`` characters."""
    return cut(repr(value), limit)


def check_model(name: str | None, served: Sequence[str], adapters: Collection[str] = ()) -> None:
    """A ``model`` the server does not serve is a 404, as vLLM's own routes answer it (none: the first). A LoRA
    adapter it serves (``adapters``) is a 400: the orchestrator decodes the base model only."""
    if not name or name in served:
        return
    if name in adapters:
        raise APIError(
            f"fork-join decodes the base model only ({', '.join(served)}), not the LoRA adapter `{name}` "
            '(plain requests, with "threadweaver": false, take it)',
            param="model",
        )
    name = name if isinstance(name, str) and len(name) <= 200 else shown(name)
    raise APIError(f"The model `{name}` does not exist. Valid aliases: {', '.join(served)}.", status=404, param="model")


def unprepared(missing: str, model: str = "MODEL", then: str = "serve DIR") -> str:
    """Why the model cannot decode fork-join, and how to prepare it: ``missing`` is what its tokenizer lacks
    (:func:`~threadweaver.format.missing_tags`); ``model``: its path in the advice, for the operator (a
    client reads ``MODEL``); ``then``: what to do with the prepared model."""
    return (
        f"the model's {missing}, so it cannot decode fork-join: "
        f"`threadweaver prepare {model} DIR` adds the tags (then {then})"
    )


def _typed(name: str, value, hint):
    """``value`` as the type ``hint`` (``bool``, ``int``, ``float``, or one of them or None), or an error naming it."""
    if value is None and value_type(hint) is not hint:
        return None
    hint = value_type(hint)
    number = is_number(value)
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if not (isinstance(value, bool) if hint is bool else number and (hint is float or whole)):
        raise APIError(f"{name} must be {'true or false' if hint is bool else 'a number'}, not {shown(value)}")
    try:
        return hint(value)
    except OverflowError:  # an integer past a float's range (JSON has no limit)
        raise APIError(f"{name}: the number is too large") from None


def _limit_values(values: dict, where: str) -> dict:
    """The :class:`Limits` fields in ``values``, typed; an unknown or mistyped field is named."""
    hints = typing.get_type_hints(Limits)
    known = {f.name for f in fields(Limits)}
    unknown = sorted(set(values) - known)
    if unknown:
        names = ", ".join(cut(name, 40) for name in unknown[:5])
        names += ", …" if len(unknown) > 5 else ""
        raise APIError(f"unknown {where} field(s) {names}; known: {', '.join(sorted(known))}")
    return {name: _typed(f"{where}.{name}", value, hints[name]) for name, value in values.items()}


def _limits(base: Limits, values: dict, where: str) -> Limits:
    try:
        return replace(base, **values)
    except ValueError as err:  # out of range
        raise APIError(f"{where}: {err}") from None


def limits_from(values: dict, base: Limits, where: str) -> Limits:
    """``base`` with the :class:`Limits` fields in ``values`` (the operator's own settings)."""
    return _limits(base, _limit_values(values, where), where)


def capped_limits(values: dict, ceilings: Limits, where: str) -> Limits:
    """A request's limits: the operator's ``ceilings`` where it says nothing, and its own where
    they ask for less. A number above its ceiling, no timeout under a server's timeout, or a
    switch the server has off turned on is a 400 naming the field and the ceiling."""
    asked = _limit_values(values, where)
    for name, value in asked.items():
        ceiling = getattr(ceilings, name)
        if isinstance(ceiling, bool):
            if value and not ceiling:
                raise APIError(f"{where}.{name}: this server has it off, and a request may not turn it on")
        elif ceiling is not None and (value is None or value > ceiling):
            asked_for = "no limit" if value is None else shown(value)
            raise APIError(f"{where}.{name}: {asked_for} is above this server's ceiling of {ceiling}")
    return _limits(ceilings, asked, where)


class Admission:
    """How many fork-join trajectories run now; beyond ``most``, a request is a 429."""

    def __init__(self, most: int | None):
        self.most, self.running = most, 0

    def enter(self) -> None:
        if self.most is not None and self.running >= self.most:
            raise APIError(
                f"this server decodes at most {self.most} fork-join trajectories at once; try again shortly", 429
            )
        self.running += 1

    def leave(self) -> None:
        self.running -= 1


@dataclass(frozen=True)
class ServerSettings:
    """What the server decides for every request."""

    branching_default: bool = False
    """``Limits.branching`` of a request that does not send the field: fork-join, or vLLM's own reply."""
    limits: Limits = Limits()
    """The ceilings of every request's limits."""
    max_trajectories: int | None = None
    """The most fork-join trajectories decoded at once; beyond, a 429."""
    prompt_window: int | None = None
    """Where the server knows it, the prompt length that leaves it no room to generate (vLLM: the model's
    context): a prompt of as many tokens or more is a 400, as vLLM's own."""

    def __post_init__(self):
        check_counts(self, ("max_trajectories",), none_ok=True)

    @classmethod
    def from_env(cls, environ=os.environ) -> ServerSettings:
        default = environ.get(DEFAULT_ENV, "")
        if default not in ("", "default", "on-request"):
            raise ValueError(f"{DEFAULT_ENV} must be 'default' or 'on-request', not {default!r}")
        try:
            values = json.loads(environ.get(LIMITS_ENV) or "{}")
        except json.JSONDecodeError as err:
            raise ValueError(f"{LIMITS_ENV} is not a JSON object: {err}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{LIMITS_ENV} must be a JSON object of Limits fields, not {shown(values)}")
        most = environ.get(MAX_TRAJECTORIES_ENV) or None
        if most is not None and not (most.isdigit() and int(most) >= 1):
            raise ValueError(f"{MAX_TRAJECTORIES_ENV} must be a whole number of at least 1, not {most!r}")
        try:
            return cls(default == "default", limits_from(values, Limits(), LIMITS_ENV), most and int(most))
        except APIError as err:
            raise ValueError(str(err)) from None

    def env(self) -> dict[str, str]:
        """The environment that gives a server process these settings."""
        changed = {f.name: getattr(self.limits, f.name) for f in fields(Limits)}
        changed = {k: v for k, v in changed.items() if v != getattr(Limits(), k)}
        most = "" if self.max_trajectories is None else str(self.max_trajectories)
        return {
            DEFAULT_ENV: "default" if self.branching_default else "on-request",
            LIMITS_ENV: json.dumps(changed),
            MAX_TRAJECTORIES_ENV: most,
        }

    def wants_fork_join(self, body: dict, headers: typing.Mapping[str, str] | None = None) -> bool:
        """What the body's field asks, else the server's default, but for an engine's own request (its
        ``PLAIN_HEADER``, case-insensitive ``headers``): plain."""
        value = body.get(FIELD)
        if value is None:
            return self.branching_default and (headers or {}).get(PLAIN_HEADER, "").lower() != "false"
        if isinstance(value, bool):
            return value
        if isinstance(value, dict):
            return True
        raise APIError(f"{FIELD} must be true, false or an object of limits, not {shown(value)}")


@dataclass(frozen=True)
class ForkJoinRequest:
    prompt_ids: list[int]
    limits: Limits
    sampling: Sampling
    stop: tuple[str, ...] = ()
    """Stop strings: the reply's text ends before the first, as vLLM's would."""
    usage_chunk: bool = False
    """``stream_options.include_usage``: a stream ends with a chunk of ``usage`` and no choices, as vLLM's."""
    stream: bool = False
    """The reply as server-sent events."""

    def cut(self, text: str) -> tuple[str, bool]:
        """``text`` up to the first stop string, and whether one was found."""
        ends = [text.index(s) for s in self.stop if s in text]
        return (text[: min(ends)], True) if ends else (text, False)


def parse_request(body: dict, route: str, tokenizer, settings: ServerSettings) -> ForkJoinRequest:
    """A fork-join request's prompt ids, limits and sampling; anything we cannot honour is a 400."""
    if body.get("n") not in (None, 1):
        raise APIError("fork-join decodes one trajectory a request: n must be 1")
    if route == "chat" and body.get("logprobs") is not None:  # a switch on chat (a count on completions)
        body = {**body, "logprobs": _switch("'logprobs'", body["logprobs"])}
    _refuse_unsupported(body)
    special = _switch("'add_special_tokens'", body.get("add_special_tokens", ADD_SPECIAL_TOKENS[route]))
    if route == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError("'messages' must be a non-empty list")
        try:
            text = chat_prompt_text(tokenizer, messages)
        except Exception as err:  # the template's own errors too (jinja's UndefinedError): the messages' fault
            raise APIError(f"cannot apply the chat template to 'messages': {type(err).__name__}: {err}") from None
        prompt_ids = _text_ids(text, "'messages'", tokenizer, special, settings.prompt_window)
    else:
        prompt_ids = _prompt_ids(body.get("prompt"), tokenizer, special, settings.prompt_window)
    if not prompt_ids:  # an empty string, where the tokenizer adds no BOS (vLLM: "The decoder prompt cannot be empty")
        raise APIError("the prompt is empty: there is nothing to continue")
    if settings.prompt_window is not None and len(prompt_ids) >= settings.prompt_window:
        raise _too_long(str(len(prompt_ids)), settings.prompt_window)
    value = body.get(FIELD)
    limits = capped_limits(value if isinstance(value, dict) else {}, settings.limits, FIELD)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(name) is not None:
        budget, ceiling = _typed(f"'{name}'", body[name], int), settings.limits.max_tokens
        if budget > ceiling:
            raise APIError(f"'{name}': {shown(budget)} is above this server's ceiling of {ceiling}")
        # the smaller of the two, where the request's own limits ask for a max_tokens too
        limits = _limits(limits, {"max_tokens": min(budget, limits.max_tokens)}, f"'{name}'")
    try:  # checked before a stream starts: vLLM would refuse a bad one only after a stream's 200
        sampling = Sampling(
            temperature=_number(body, "temperature", Sampling.temperature),
            top_p=_number(body, "top_p", Sampling.top_p),
            top_k=_number(body, "top_k", Sampling.top_k, int),
            seed=_number(body, "seed", None, int),
        )
    except SettingError as err:
        raise APIError(f"'{err.names[0]}' {err.reason}") from None
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise APIError(f"'stop' must be a string or a list of strings, not {shown(body.get('stop'))}")
    stream = body.get("stream") is not None and _switch("'stream'", body["stream"])  # "false" is false, as vLLM's
    return ForkJoinRequest(
        prompt_ids, limits, sampling, tuple(s for s in stop if s), _usage_chunk(body, stream), stream
    )


def _usage_chunk(body: dict, stream: bool) -> bool:
    """Whether a stream asks for its ``usage`` (``stream_options``, checked as vLLM's schema checks it)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise APIError(f"'stream_options' must be an object, not {shown(options)}", param="stream_options")
    if options and not stream:
        raise APIError("'stream_options' can only be given with stream: true", param="stream_options")
    if _switch("'stream_options.continuous_usage_stats'", options.get("continuous_usage_stats") or False):
        raise APIError(
            "fork-join streams send usage once, at the end: 'stream_options.continuous_usage_stats' is not supported",
            param="stream_options",
        )
    return _switch("'stream_options.include_usage'", options.get("include_usage") or False)


def _switch(name: str, value) -> bool:
    """A boolean field as vLLM's schemas read it: a bool, 0 or 1, or one of :data:`SWITCH_WORDS`; else a 400."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in SWITCH_WORDS:
        return SWITCH_WORDS[value.lower()]
    raise APIError(f"{name} must be true or false, not {shown(value)}")


def _refuse_unsupported(body: dict) -> None:
    """A 400 naming each :data:`UNSUPPORTED` field set to more than its default."""
    asked = [name for name, defaults in UNSUPPORTED.items() if name in body and _asks(name, body[name], defaults)]
    if asked:
        names = ", ".join(f"'{name}'" for name in asked)
        raise APIError(
            f'fork-join requests do not support {names} (plain requests, with "threadweaver": false, do)',
            param=asked[0],
        )


def _asks(name: str, value, defaults: tuple) -> bool:
    """Whether ``value`` is none of ``defaults``, type and all (``logprobs: 0`` asks for the sampled token's); a
    switch is read as vLLM's schemas read it (``echo: 0`` or ``"false"`` asks for nothing)."""
    if name != "logprobs" and any(isinstance(default, bool) for default in defaults):  # logprobs: a count
        with contextlib.suppress(APIError):
            value = _switch(name, value)
    return not any(type(value) is type(default) and value == default for default in defaults)


def _prompt_ids(prompt, tokenizer, add_special_tokens: bool, window: int | None) -> list[int]:
    """A completion request's prompt: one string (its special tokens added if asked) or one list of token ids
    (alone or in a list of one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _text_ids(prompt, "'prompt'", tokenizer, add_special_tokens, window)
    if not (isinstance(prompt, list) and prompt and all(map(is_whole, prompt))):
        raise APIError("'prompt' must be one string or one list of token ids with fork-join")
    vocabulary = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    outside = next((t for t in prompt if t < 0 or (vocabulary is not None and t >= vocabulary)), None)
    if outside is not None:
        raise APIError(f"'prompt' holds token id {outside}, outside the vocabulary (0..{(vocabulary or 1) - 1})")
    return list(prompt)


PROMPT_PIECE_CHARS = 1 << 16
"""How much of a long prompt's text is tokenized at a time while its length is unknown."""
MOST_PROMPT_TOKENS = 1 << 21
"""Where the server's context is not known (a proxy behind SGLang's router, before a refusal says it): the
longest prompt passed on, beyond any model's context."""


def _text_ids(text: str, name: str, tokenizer, add_special_tokens: bool, window: int | None) -> list[int]:
    """``text``'s token ids. A text clearly longer than the server's context (over twice it, or over
    :data:`MOST_PROMPT_TOKENS` where it is not known), counted piece by piece, is a 400 before it is tokenized
    whole: one prompt of tens of MB held the server for seconds and took gigabytes (a 60 MB one ran the proxy out
    of memory). A text of no more bytes than that is not counted (a token is at least a byte, but where a
    normalizer expands the text). A lone surrogate is a 400 too: the tokenizer refuses it with a TypeError."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise APIError(f"{name} is not Unicode text: it holds the lone surrogate {shown(text[err.start])}") from None
    most = 2 * window if window is not None else MOST_PROMPT_TOKENS
    if len(text) > PROMPT_PIECE_CHARS and size > most:
        counted = 0
        for start in range(0, len(text), PROMPT_PIECE_CHARS):
            counted += len(plain_ids(tokenizer, text[start : start + PROMPT_PIECE_CHARS]))
            if counted > most:
                if window is None:
                    raise APIError(f"the prompt is over {most} tokens, the most passed on where the context is unknown")
                raise _too_long(f"over {most}", window)
    return plain_ids(tokenizer, text, add_special_tokens)


def _too_long(tokens: str, window: int) -> APIError:
    return APIError(f"the prompt is {tokens} tokens: the server has room to generate after at most {window - 1}")


def _number(body: dict, name: str, default, hint: type = float):
    """``body[name]`` as ``hint`` (``default`` where it is missing or null), or a 400 naming it."""
    value = body.get(name)
    return default if value is None else _typed(f"'{name}'", value, hint)


async def decode(request: ForkJoinRequest, engine, fmt: Format, on_tokens=None) -> Trajectory:
    """The trajectory, or a 500 where the engine failed (in the main sequence it raises; in a thread it degrades)."""
    try:
        orchestrator = Orchestrator(engine, fmt, request.limits, request.sampling)
        trajectory = await orchestrator.run(request.prompt_ids, on_tokens=on_tokens)
    except RequestRefused as err:
        raise APIError(f"the engine refused a request of the trajectory: {err}", status=400) from None
    except EngineError as err:
        raise APIError(f"the engine failed during fork-join decoding: {err}", status=500) from None
    except (
        Exception
    ) as err:  # an in-process engine's own errors (vLLM's EngineDeadError, ...): a reply, not a dropped stream
        raise APIError(f"fork-join decoding failed: {type(err).__name__}: {err}", status=500) from None
    failures = [d for d in trajectory.degradations if d.kind == "engine_error"]
    if failures:
        raise APIError(f"the engine failed during fork-join decoding: {failures[0]}", status=500)
    return trajectory


def _head(route: str, model: str, chunk: bool = False) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if route == "chat" else "text_completion"
    ident = f"{'chatcmpl' if route == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    return {"id": ident, "object": kind, "created": int(time.time()), "model": model}


def _totals(trajectory: Trajectory) -> tuple[dict, dict]:
    """``usage`` (every generated token of every request); the latency stats and where the seconds went."""
    generated = sum(r.completion_tokens for r in trajectory.requests)
    prompt = len(trajectory.prompt_ids)
    usage = {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
    stats = {
        **trajectory.stats.as_dict(),
        "requests": [dataclasses.asdict(r) for r in trajectory.requests],
        "degradations": [d.as_dict() for d in trajectory.degradations],
        "wall_clock": wall_clock(trajectory).as_dict(),
    }
    return {"usage": usage}, {FIELD: stats}


def reply(route: str, request: ForkJoinRequest, trajectory: Trajectory, fmt: Format, model: str) -> dict:
    """The OpenAI reply for a decoded trajectory."""
    text, stopped = request.cut(trajectory_text(trajectory, fmt))
    choice = {"index": 0, "logprobs": None, "finish_reason": "stop" if stopped else trajectory.finish_reason}
    if route == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    usage, stats = _totals(trajectory)
    return {**_head(route, model), "choices": [choice], **usage, **stats}


PARSING = ThreadPoolExecutor(1, thread_name_prefix="threadweaver-parse")
"""Where fork-join requests are read (their prompts tokenized, their chat templates applied): beside the event
loop, which a prompt of a megabyte held for a second, with every reply streamed meanwhile. One at a time: the
event loop only decodes with the tokenizer meanwhile, which changes nothing in it, but two encodes at once could
(a tokenizer's truncation settings are its own state)."""


async def answer(
    body: dict,
    route: str,
    tokenizer,
    settings: ServerSettings,
    engine,
    fmt: Format,
    model: str,
    admission: Admission | None = None,
    sanitize: Callable[[str], str] | None = None,
) -> dict | AsyncIterator[str]:
    """A fork-join request's reply: its JSON body, or (``stream``) its server-sent events.

    ``admission`` holds a slot from the request's admission until its reply is sent or its
    stream ends (read to the end, closed, or dropped when the client goes). ``sanitize``: what the
    server does to an error's message, here for a stream's error event (:meth:`APIError.body`)."""
    request = await asyncio.get_running_loop().run_in_executor(PARSING, parse_request, body, route, tokenizer, settings)
    admission = admission or Admission(None)
    admission.enter()
    if request.stream:
        return _Held(stream_reply(route, request, engine, fmt, model, sanitize), admission)
    try:
        return reply(route, request, await decode(request, engine, fmt), fmt, model)
    finally:
        admission.leave()


class _Held:
    """An event stream that gives its admission slot back once, however it ends."""

    def __init__(self, events: AsyncIterator[str], admission: Admission):
        self.events, self.admission, self.held = events, admission, True

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        try:
            return await self.events.__anext__()
        except BaseException:  # the end, a failure, or the client gone (cancelled)
            self.release()
            raise

    async def aclose(self) -> None:
        self.release()
        await self.events.aclose()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.admission.leave()

    def __del__(self) -> None:  # a stream nobody read
        self.release()


def _event(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def error_events(err: APIError, sanitize: Callable[[str], str] | None = None) -> tuple[str, str]:
    """The end of a stream that fails: its error event, then ``[DONE]``, as vLLM's streams end."""
    return _event(err.body(sanitize)), _event("[DONE]")


async def stream_reply(
    route: str, request: ForkJoinRequest, engine, fmt: Format, model: str, sanitize: Callable[[str], str] | None = None
) -> AsyncIterator[str]:
    """Server-sent events of a fork-join reply: the text in trajectory order as it becomes final
    (thread 2 after thread 1), then a chunk with the finish reason and the stats, then (if the request
    asks, :attr:`ForkJoinRequest.usage_chunk`) one with ``usage``. An engine failure ends the stream
    with an error event; it never hangs."""
    head = _head(route, model, chunk=True)

    def chunk(text: str | None, finish: str | None = None, **extra) -> str:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish}
        if route == "chat":
            choice["delta"] = (
                {} if text is None else {"content": text} if text else {"role": "assistant", "content": ""}
            )
        else:
            choice["text"] = text or ""
        return _event({**head, "choices": [choice], **extra})

    runs: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(decode(request, engine, fmt, on_tokens=runs.put_nowait))
    task.add_done_callback(lambda _: runs.put_nowait(None))
    streamed = StreamedText(fmt.decode, fmt.eos_ids, request.stop)
    try:
        if route == "chat":
            yield chunk("")  # first the role, as vLLM's own streams
        while (run := await runs.get()) is not None:
            if text := streamed.add(run):
                yield chunk(text)
        try:
            trajectory = task.result()
        except APIError as err:
            for event in error_events(err, sanitize):
                yield event
            return
        if text := streamed.finish():
            yield chunk(text)
        usage, stats = _totals(trajectory)
        yield chunk(None, "stop" if streamed.stopped else trajectory.finish_reason, **stats)
        if request.usage_chunk:
            yield _event({**head, "choices": [], **usage})
        yield _event("[DONE]")
    finally:
        task.cancel()  # the client went away: stop decoding
