"""LLM calls for ``curate``: the official ``openai`` async client against any OpenAI-compatible
chat endpoint, structured outputs, a call cache on disk, and token accounting per stage.

The client retries connection errors, timeouts, 408/409/429 (honouring ``Retry-After``) and 5xx with
exponential backoff and jitter; what still fails, and every other 4xx, becomes :class:`CallFailed`
with a reason code and the server's message. Every reply the server gives is cached in SQLite by a
hash of (model, messages, schema, sampling, stage version) the moment it arrives, so a killed run
resumes without paying for a finished call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ValidationError

from . import prompts
from .config import LLMArgs
from .schemas import json_schema

SERVER_FAILURES = ("rate_limited", "server_error", "timeout", "connection", "refused")
"""Why a call got no reply from the server (after the client's retries)."""
FAILURES = (*SERVER_FAILURES, "truncated", "invalid_json", "schema_invalid")
"""Why a call gave no usable reply."""


class CallFailed(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class Usage:
    calls: int = 0
    """Requests the server answered in this run."""
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the server says it served from its cache (where it says)."""
    unreported: int = 0
    """Replies that came without ``usage``: their tokens count as none, in the costs and ``--max-cost`` too."""

    def add(self, usage: dict) -> None:
        self.calls += 1
        self.unreported += usage.get("prompt_tokens") is None
        self.prompt_tokens += usage.get("prompt_tokens") or 0
        self.completion_tokens += usage.get("completion_tokens") or 0
        self.cached_tokens += usage.get("cached_tokens") or 0


class CallCache:
    """Replies by call key, in one SQLite file; each reply is committed as it arrives."""

    def __init__(self, path: str):
        """:class:`ValueError` names ``path`` and why where it cannot be read or written as a call cache: that
        is known here, before any call, not as each paid reply fails to be kept."""
        if os.path.isdir(path):
            raise ValueError(f"{path} is a folder, not a call cache; move it away to ask every call again")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        try:
            self.db = sqlite3.connect(path)
        except sqlite3.Error as err:  # its folder not writable, say
            raise ValueError(f"cannot open the call cache {path} ({err})") from None
        try:
            self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, stage TEXT, reply TEXT)")
            self.db.commit()
            self.db.execute("INSERT OR REPLACE INTO replies VALUES ('', '', 'null')")  # a write, undone
            self.db.rollback()
        except sqlite3.OperationalError as err:  # read-only, its folder read-only (no journal), or locked
            self.db.close()
            raise ValueError(f"cannot write the call cache {path} ({err})") from None
        except sqlite3.DatabaseError as err:  # not SQLite (a file written over), or a broken one
            self.db.close()
            raise ValueError(f"{path} is not a call cache ({err}); move it away to ask every call again") from None

    def get(self, key: str) -> dict | None:
        row = self.db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, stage: str, reply: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?)", (key, stage, json.dumps(reply)))
        self.db.commit()

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        self.db.close()


def call_key(model: str, messages: list[dict], schema: dict, sampling: dict, stage: str) -> str:
    blob = json.dumps([model, messages, schema, sampling, stage, prompts.VERSION[stage]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class LLM:
    """Structured chat calls for the stages, cached and counted."""

    def __init__(self, args: LLMArgs, cache: CallCache):
        import openai

        key = args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # a local server needs none
        self.keyless = key == "EMPTY"
        self.client = openai.AsyncOpenAI(
            base_url=args.base_url, api_key=key, timeout=args.timeout_s, max_retries=args.retries
        )
        self.args, self.cache = args, cache
        self.slots = asyncio.Semaphore(args.concurrency)
        self.usage: dict[str, Usage] = defaultdict(Usage)
        self.warned_unreported = False

    async def ask(
        self,
        stage: str,
        messages: list[dict],
        model: type[BaseModel],
        use: Callable | None = None,
        schema: dict | None = None,
    ):
        """``use(reply)`` of the validated reply (the reply itself without ``use``), where ``use``
        raises ``Refused`` for a reply the stage cannot use. ``schema``: the one to send, if
        tighter than ``model``'s (``model`` still validates the reply).

        A refused reply is asked again with the reason up to ``reasks`` times; a reply cut by the
        token budget once more with twice the budget. Raises :class:`CallFailed` or the last ``Refused``.
        """
        from .blocks import Refused

        budget = self.args.max_reply_tokens
        schema = schema or json_schema(model)
        for attempt in range(self.args.reasks + 1):
            reply = await self.complete(stage, messages, schema, budget)
            if reply["finish_reason"] == "length" and budget == self.args.max_reply_tokens:
                budget *= 2
                reply = await self.complete(stage, messages, schema, budget)
            if reply["finish_reason"] == "length":
                raise self._failed(stage, "truncated", f"the reply reached {budget} tokens unfinished")
            try:
                parsed = model.model_validate_json(reply["content"] or "")
                return parsed if use is None else use(parsed)
            except ValidationError as err:
                bad_json = any(e["type"] == "json_invalid" for e in err.errors())
                failure: Exception = CallFailed("invalid_json" if bad_json else "schema_invalid", _first_error(err))
            except Refused as err:
                failure = err
            if attempt < self.args.reasks:
                messages = prompts.reask(messages, reply["content"] or "", str(failure))
        self.usage[stage].failures += 1
        raise failure

    async def complete(self, stage: str, messages: list[dict], schema: dict, max_tokens: int) -> dict:
        """One reply (content, finish_reason, usage) from the cache, or from the server and then cached."""
        import openai

        sampling = {"temperature": self.args.temperature, "max_tokens": max_tokens}  # as the cache keys it
        extra_body = json.loads(self.args.extra_body) if self.args.extra_body else None
        key = call_key(self.args.model, messages, schema, {**sampling, "extra_body": extra_body}, stage)
        cached = self.cache.get(key)
        if cached is not None:
            self.usage[stage].cache_hits += 1
            return cached
        response_format = {"type": "json_schema", "json_schema": {"name": stage, "schema": schema, "strict": True}}
        try:
            async with self.slots:
                completion = await self.client.chat.completions.create(
                    model=self.args.model,
                    messages=messages,
                    response_format=response_format,
                    extra_body=extra_body,
                    temperature=self.args.temperature,
                    max_completion_tokens=max_tokens,  # OpenAI's reasoning models refuse max_tokens; vLLM takes both
                )
        except openai.APITimeoutError as err:
            raise self._failed(stage, "timeout", str(err)) from None
        except openai.APIConnectionError as err:
            cause = f" ({err.__cause__})" if err.__cause__ and str(err.__cause__) else ""
            raise self._failed(stage, "connection", f"{self.base_url}: {err}{cause}") from None
        except openai.RateLimitError as err:
            raise self._failed(stage, "rate_limited", err.message) from None
        except openai.InternalServerError as err:
            raise self._failed(stage, "server_error", f"{err.status_code}: {err.message}") from None
        except openai.APIStatusError as err:
            keyless = " (no API key was given: set $OPENAI_API_KEY or --api-key)" if self.keyless else ""
            raise self._failed(stage, "refused", f"{err.status_code}: {err.message}{keyless}") from None
        except openai.APIError as err:  # a reply the client could not read
            raise self._failed(stage, "refused", str(err)) from None
        except ValueError as err:  # a body sent as JSON that is not: a web page at the address, say
            raise self._failed(stage, "server_error", f"{self.base_url}: the reply is not JSON ({err})") from None
        if not hasattr(completion, "choices"):  # the client hands back a body that is not JSON as text
            page = " ".join(str(completion).split())[:120]
            raise self._failed(stage, "server_error", f"{self.base_url}: the reply is not a chat completion: {page!r}")
        if not completion.choices:
            raise self._failed(stage, "server_error", "the reply has no choices")
        choice = completion.choices[0]
        refusal = getattr(choice.message, "refusal", None)
        if refusal or choice.finish_reason == "content_filter":
            raise self._failed(stage, "refused", f"the model refused: {refusal or 'finish_reason content_filter'}")
        usage = completion.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        counted = {
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": (getattr(details, "cached_tokens", None) or 0) if details else 0,
        }
        if counted["prompt_tokens"] is None and not self.warned_unreported:
            self.warned_unreported = True
            print(
                f"threadweaver curate: warning: {self.base_url} reports no token usage: its calls count no "
                "tokens, so the costs in report.json and --max-cost count none of them",
                file=sys.stderr,
                flush=True,
            )
        reply = {"content": choice.message.content, "finish_reason": choice.finish_reason, "usage": counted}
        self.cache.put(key, stage, reply)
        self.usage[stage].add(counted)
        return reply

    @property
    def base_url(self) -> str:
        """The endpoint called: ``--base-url``, else ``$OPENAI_BASE_URL``, else OpenAI's."""
        return str(self.client.base_url)

    def _failed(self, stage: str, reason: str, detail: str) -> CallFailed:
        self.usage[stage].failures += 1
        return CallFailed(reason, detail)

    def usage_dict(self) -> dict[str, dict]:
        return {stage: asdict(u) for stage, u in self.usage.items()}

    async def close(self) -> None:
        await self.client.close()


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(map(str, e["loc"])) or "the reply"
    return f"{where}: {e['msg']}"
