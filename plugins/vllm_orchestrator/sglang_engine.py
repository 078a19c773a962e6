"""SGLang's native ``/generate`` over HTTP, in token space (``input_ids`` in, ``output_ids`` out).

SGLang's radix cache shares the prefix of a block's threads without any hint; its stream gives
a fork-join reply token by token.

SGLang refuses a request that does not fit, so each is fitted first, by SGLang's own rules: with
``max_req_len`` = min(context - 1, KV pool - 1), its scheduler serves a prompt and new tokens of at
most ``max_req_len - 1`` and refuses a prompt of ``max_req_len - 5`` tokens or more; its tokenizer
manager counts the tokens it reserves for speculative decoding in the prompt. The context is read
from ``/v1/models`` (``max_model_len``), or, where that does not say (SGLang's router answers it
for its workers, without one), from SGLang's refusal, as are the KV pool's limit and the reserve,
which no route says; the refused request is then sent again, fitted.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence

from threadweaver.engine import Completion, EngineError, RequestRefused, Sampling, to_completion

from .http import HTTPOptions, JSONClient, SessionKeyed

_WINDOW = re.compile(r"context length (?:of |\()(\d+) tokens")
"""The context in the tokenizer manager's refusals: "Requested token count exceeds the model's maximum context
length of N tokens. You requested a total of T tokens: I tokens from the input messages and ..." and "The input
(I tokens) is longer than the model's context length (N tokens)"."""
_COUNTED_INPUT = re.compile(r"The input \((\d+) tokens\)|(\d+) tokens from the input messages")
"""The prompt as those refusals count it: with the tokens reserved for speculative decoding."""
_INPUT_CAP = re.compile(r"maximum allowed length \((\d+) tokens\)")
"""The scheduler's refusal: "Input length (I tokens) exceeds the maximum allowed length (M tokens)"."""
_ATTEMPTS = 4
"""Sends of one request at most: each refusal after the first teaches a limit it had not said."""


def _error_message(error) -> str:
    return str(error.get("message", error) if isinstance(error, dict) else error)


class SGLangEngine(SessionKeyed):
    def __init__(
        self,
        base_url: str,
        *,
        options: HTTPOptions = HTTPOptions(),
        logprobs: bool = False,
        extra_sampling: dict | None = None,
    ):
        """``extra_sampling`` is merged into every request's ``sampling_params`` (SGLang's own fields, e.g.
        ``min_p``); ``max_new_tokens`` is each request's own, fitted to the server."""
        if "max_new_tokens" in (extra_sampling or {}):
            raise ValueError("extra_sampling may not set max_new_tokens: each request's is fitted to the server")
        self.client = JSONClient(base_url, options, what="SGLang server")
        self.logprobs = logprobs
        self.extra_sampling = dict(extra_sampling or {})
        self._server: dict = {}  # what the server said of its model; filled in place, so pinned views share it

    root_is_tokenizer = True
    """:meth:`model_root` names the tokenizer's folder, which a server may load apart from the model's."""

    @property
    def where(self) -> str:
        return f"SGLang server at {self.client.base_url}"

    async def model_root(self) -> str | None:
        """Where the server loaded its tokenizer from (``/model_info``, or ``/get_model_info`` as SGLang's
        router and older SGLang name it), as it was given it; None where neither answers."""
        if "root" not in self._server:
            info = {}
            for route in ("/model_info", "/get_model_info"):
                try:
                    info = await self.client.get(route)
                    break
                except RequestRefused:
                    continue
            root = info.get("tokenizer_path") or info.get("model_path")
            self._server["root"] = root if isinstance(root, str) and root else None
        return self._server["root"]

    async def model_context(self) -> int | None:
        """The model's context in tokens, where the server says (``max_model_len`` at ``/v1/models``), or as a
        refusal said it; else None."""
        if "context" not in self._server:
            try:
                cards = (await self.client.get("/v1/models")).get("data") or [{}]
            except RequestRefused:  # a server without the route: a refusal will say the window
                cards = [{}]
            context = cards[0].get("max_model_len") if isinstance(cards[0], dict) else None
            self._server.setdefault("context", context if isinstance(context, int) and context > 0 else None)
        return self._server["context"]

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        for attempt in range(_ATTEMPTS):
            room = await self._room(len(prompt_ids), max_tokens)
            if room <= 0:  # nothing SGLang would serve
                return to_completion((), "length", None, stop_ids, where=self.where)
            body = self._body(prompt_ids, stop_ids, room, sampling)
            try:
                reply = await self.client.post("/generate", body, self.headers)
                break
            except RequestRefused as refusal:
                if not await self._fitted_otherwise(str(refusal), prompt_ids, max_tokens, room, attempt):
                    raise
        if "output_ids" not in reply:
            raise EngineError(f"{self.where} returned no output_ids; the reply has {sorted(reply)}")
        meta = reply.get("meta_info") or {}
        logprobs = [entry[0] for entry in meta.get("output_token_logprobs") or ()] if self.logprobs else None
        return self._completion(reply["output_ids"], meta, stop_ids, logprobs)

    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        """The new ids of each of SGLang's stream events, then the completion.

        An event's ``output_ids`` are all so far (SGLang's default) or the new ones only (with
        ``--incremental-streaming-output``, ``--stream-output`` before it): ``meta_info.completion_tokens``,
        the count so far, says which, and at the end that no id was lost. In a stream SGLang answers 200 and
        refuses in an event: an error (its tokenizer manager's) or a finish of type "abort" with a 4xx status
        (its scheduler's)."""
        for attempt in range(_ATTEMPTS):
            room = await self._room(len(prompt_ids), max_tokens)
            if room <= 0:
                yield to_completion((), "length", None, stop_ids, where=self.where)
                return
            body = {**self._body(prompt_ids, stop_ids, room, sampling), "stream": True}
            ids: list[int] = []
            logprobs: list[float] = []
            meta: dict = {}
            refusal, gave_ids = None, False
            async with contextlib.aclosing(self.client.events("/generate", body, self.headers)) as events:
                async for event in events:  # closed on a refusal, or a consumer that stops early: its slot is freed
                    meta = event.get("meta_info") or {}
                    refusal = self._refusal_in(event)
                    if refusal is not None:
                        break
                    gave_ids = gave_ids or "output_ids" in event
                    count = meta.get("completion_tokens", -1)
                    chunk = list(event.get("output_ids") or ())
                    new = chunk[len(ids) :] if len(chunk) == count else chunk  # all so far, or the new ones only
                    if self.logprobs:
                        entries = [entry[0] for entry in meta.get("output_token_logprobs") or ()]
                        logprobs.extend(entries[len(logprobs) :] if len(entries) == count else entries)
                    if new:
                        ids.extend(new)
                        yield tuple(new)
            if refusal is None:
                self._check_stream(gave_ids, ids, logprobs, meta)
                yield self._completion(ids, meta, stop_ids, logprobs if self.logprobs else None)
                return
            if ids or not await self._fitted_otherwise(refusal, prompt_ids, max_tokens, room, attempt):
                raise RequestRefused(f"{self.where} refused POST /generate in its stream: {refusal}")

    async def _longest(self) -> int | None:
        """The scheduler's ``max_req_len`` by what the server has said of its limits, else None."""
        context, cap = await self.model_context(), self._server.get("input_cap")
        limits = [
            n for n in (None if context is None else context - 1, None if cap is None else cap + 5) if n is not None
        ]
        return min(limits) if limits else None

    async def prompt_window(self) -> int | None:
        """The prompt length from which SGLang serves no new token, by what it has said of its limits, else None."""
        longest = await self._longest()
        return None if longest is None else self._window(longest)

    def _window(self, longest: int) -> int:
        """Under ``max_req_len`` = ``longest``: the prompt length SGLang refuses, or where the reserve takes the
        room left."""
        return min(longest - 5, longest - 1 - self._server.get("reserve", 0))

    async def _room(self, prompt_tokens: int, max_tokens: int) -> int:
        """The most new tokens SGLang serves a request of ``prompt_tokens`` (0 or less: none), by what it has
        said of its limits; ``max_tokens`` where it has said none."""
        longest = await self._longest()
        if longest is None:
            return max_tokens
        if prompt_tokens >= self._window(longest):
            return 0
        return min(max_tokens, longest - 1 - prompt_tokens - self._server.get("reserve", 0))

    async def _fitted_otherwise(
        self, refusal: str, prompt_ids: Sequence[int], max_tokens: int, sent: int, attempt: int
    ) -> bool:
        """Whether a request refused with ``sent`` new tokens is to be sent again: what ``refusal`` says of the
        server's limits is kept, and the request would now ask for another number (here, or as another request
        refused at the same time learnt). Each limit only tightens, so each send asks for fewer."""
        self._learn(refusal, len(prompt_ids))
        return attempt + 1 < _ATTEMPTS and await self._room(len(prompt_ids), max_tokens) != sent

    def _check_stream(self, gave_ids: bool, ids: list[int], logprobs: list[float], meta: dict) -> None:
        """Refuse a stream that lost ids: SGLang 0.5 and older with ``--stream-output`` sent only the last of
        the events that queued up, each the new ids only."""
        count = meta.get("completion_tokens")
        if not gave_ids or (count is not None and count != len(ids)) or (self.logprobs and len(logprobs) != len(ids)):
            raise EngineError(
                f"{self.where}: its stream gave {len(ids)} token ids (and {len(logprobs)} log-probs) where it counts "
                f"{count} tokens{'' if gave_ids else ', with no output_ids'}: an SGLang of 0.5 or older drops ids "
                "with --stream-output; serve without it (or with --incremental-streaming-output on a newer SGLang)"
            )

    def _refusal_in(self, event: dict) -> str | None:
        """The refusal a stream event carries (its tokenizer manager's error, its scheduler's abort with a 4xx),
        if it is one; a failure with a 5xx raises :class:`EngineError`, as a reply's does."""
        finish = (event.get("meta_info") or {}).get("finish_reason") or {}
        if "error" in event:
            error = event["error"]
            message, status = _error_message(error), error.get("code") if isinstance(error, dict) else None
        elif isinstance(finish, dict) and finish.get("type") == "abort" and finish.get("status_code"):
            message, status = str(finish.get("message") or finish), finish["status_code"]
        else:
            return None
        if isinstance(status, int) and status >= 500:
            raise EngineError(f"{self.where} failed POST /generate in its stream (HTTP {status}): {message}")
        return message

    def _learn(self, refusal: str, prompt_tokens: int) -> None:
        """Keep what ``refusal`` says of the server's limits: the least context and prompt cap, the largest
        reserve, so that what one refusal taught another cannot undo."""
        if window := _WINDOW.search(refusal):
            known = self._server.get("context")
            self._server["context"] = min(int(window.group(1)), known or int(window.group(1)))
            if counted := _COUNTED_INPUT.search(refusal):
                reserve = int(counted.group(1) or counted.group(2)) - prompt_tokens
                self._server["reserve"] = max(reserve, self._server.get("reserve", 0))
        if cap := _INPUT_CAP.search(refusal):
            self._server["input_cap"] = min(int(cap.group(1)), self._server.get("input_cap") or int(cap.group(1)))

    def _completion(self, ids, meta: dict, stop_ids: Sequence[int], logprobs) -> Completion:
        finish = meta.get("finish_reason") or {}
        return to_completion(
            ids,
            finish.get("type"),
            finish.get("matched"),
            stop_ids,
            logprobs,
            meta.get("cached_tokens"),
            where=self.where,
        )

    def _body(self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int, sampling: Sampling):
        params = {
            "max_new_tokens": max_new_tokens,
            "stop_token_ids": list(stop_ids),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        params.update(self.extra_sampling)
        return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": self.logprobs}

    async def aclose(self) -> None:
        await self.client.aclose()
