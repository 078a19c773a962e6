"""``threadweaver proxy``: the endpoint plugin's routes in front of a server we cannot extend.

For SGLang, or a vLLM server you do not control: fork-join requests (see :mod:`.openai_api`)
are decoded here by the orchestrator over the backend's HTTP engine; every other request,
and every other path, is passed to the backend as it is, streamed back as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from threadweaver.cli_args import check_counts, check_listen_host, check_port, check_seconds, check_url, option
from threadweaver.engine import EngineError
from threadweaver.interrupts import STOPPING_SIGNALS, raise_keyboard_interrupt
from threadweaver.model_dirs import check_model_dir
from threadweaver.orchestrator import Limits

from .engines import SERVER_ENGINES, EngineArgs
from .http import HTTPOptions, server_root
from .openai_api import (
    ROUTES,
    Admission,
    APIError,
    ServerSettings,
    answer,
    branching_default_option,
    check_model,
    error_events,
    max_trajectories_option,
    shown,
    unprepared,
)
from .serve import ServeArgs, bound_socket

STOP_GRACE_S = 10.0
"""On Ctrl-C or SIGTERM, how long the replies still running get to end before the proxy stops them (their
trajectories stop and their backend requests are closed, as when a client leaves); a second Ctrl-C or SIGTERM stops
them at once. aiohttp alone would wait twice its 60 s, in silence."""

STOPPED = "the server is stopping: this reply was cut short"
MAX_BODY_BYTES = 64 * 2**20
"""The largest request body the proxy reads; beyond, a 413."""

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass(frozen=True)
class ProxyArgs:
    backend: str = option(EngineArgs.base_url, "URL of the server that decodes (vLLM or SGLang).")
    engine: str = option(EngineArgs.engine, "What the backend is: 'vllm' or 'sglang'.", choices=SERVER_ENGINES)
    model: str | None = option(
        None, "Tokenizer directory or hub id (default: the model the vLLM backend reports it loaded)."
    )
    host: str = option(ServeArgs.host, "Address to listen on.")
    port: int = option(8001, "Port to listen on (0: a free one, which the proxy prints).")
    branching_default: bool = branching_default_option()
    api_key: str | None = option(
        None,
        "Bearer token for the backend; the proxy asks its clients for it as the backend's --api-key does: on /v1 "
        "paths for vLLM, on every path but /health and /metrics for SGLang.",
    )
    max_trajectories: int | None = max_trajectories_option()
    backend_timeout_s: float = option(
        HTTPOptions.timeout_s,
        "Most seconds a request passed on waits for the backend's reply to begin, or for its next part; then it is "
        "answered 504, or its reply, begun, is cut (a fork-join request's limit is --timeout-s).",
    )

    def __post_init__(self):
        check_url(self, "backend")
        check_seconds(self, ("backend_timeout_s",))
        if self.model:
            check_model_dir(self.model, weights=False)
        check_listen_host(self)
        check_port(self)
        check_counts(self, ("max_trajectories",), none_ok=True)


def proxy_app(args: ProxyArgs, limits: Limits = Limits()):
    """The aiohttp application (its engine and tokenizer are made when it starts)."""
    import aiohttp
    from aiohttp import web

    from .engines import make_engine, prompt_window, served_models, tokenizer_source
    from .http import Unreachable

    state: dict = {"settings": ServerSettings(args.branching_default, limits, args.max_trajectories)}
    admission = Admission(args.max_trajectories)
    backend = server_root(args.backend, "backend")
    hide = backend_hider(backend)

    async def start(app) -> None:
        from transformers import AutoTokenizer

        from threadweaver.format import Format, missing_tags

        engine = make_engine(EngineArgs(engine=args.engine, base_url=backend, api_key=args.api_key))
        try:
            source = await tokenizer_source(engine, args.model)
            if source is None:
                raise ValueError("--model is needed to load the tokenizer (the backend does not say which model)")
            state["tokenizer"], state["source"] = AutoTokenizer.from_pretrained(source), source
            if missing := missing_tags(state["tokenizer"]):  # plain requests pass; fork-join ones get a 400
                if args.branching_default:  # every request would be fork-join
                    raise ValueError(unprepared(missing, source))
                state["unprepared"] = unprepared(missing)
                print(f"threadweaver proxy: {unprepared(missing, source)}; plain requests pass", file=sys.stderr)
            else:
                state["fmt"] = Format.from_tokenizer(state["tokenizer"])
        except BaseException:  # the proxy does not start: its engine's connections are closed
            await engine.aclose()
            raise
        state["engine"] = engine
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
        state["session"] = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(  # connect: resolving the name and connecting
                total=None, connect=args.backend_timeout_s, sock_read=args.backend_timeout_s
            ),
            connector=aiohttp.TCPConnector(limit=0),  # aiohttp's 100: a 101st stream would wait, and all after it
        )

    async def stop(app) -> None:
        await state["session"].close()
        await state["engine"].aclose()

    async def forward(request: web.Request, body: bytes) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"authorization"}}
        response = None
        try:
            async with state["session"].request(
                request.method, backend + request.path_qs, data=body, headers=headers
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
                )
                await response.prepare(request)
                chunks = upstream.content.iter_any()
                while True:
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except (aiohttp.ClientError, asyncio.TimeoutError) as err:  # begun: cut, not answered twice
                        timed_out = isinstance(err, asyncio.TimeoutError)
                        why = (
                            f"sent nothing for --backend-timeout-s {args.backend_timeout_s:g}"
                            if timed_out
                            else "broke off"
                        )
                        print(
                            f"threadweaver proxy: the backend's reply to {request.method} {request.path} {why}, "
                            f"and was cut there for its client{'' if timed_out else f': {err}'}",
                            file=sys.stderr,
                            flush=True,
                        )
                        if request.transport is not None:
                            request.transport.close()
                        return response
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, ConnectionResetError, asyncio.TimeoutError) as err:
            if response is not None:  # the client left as its reply was written ("Cannot write to closing transport")
                return response
            if isinstance(err, asyncio.TimeoutError):
                error = APIError(
                    f"the backend did not begin its reply within --backend-timeout-s {args.backend_timeout_s:g}",
                    status=504,
                )
                print(
                    f"threadweaver proxy: the backend did not begin its reply to {request.method} {request.path} "
                    f"within --backend-timeout-s {args.backend_timeout_s:g}: answered 504",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                error = APIError(f"cannot reach the backend at {backend}: {err}", status=502)
            return web.json_response(error.body(hide), status=error.status)

    async def check_served(model) -> None:
        """A ``model`` the vLLM backend does not serve is the 404 vLLM (and the plugin) answer. The names are read
        at the first fork-join request (a backend not up yet still lets the proxy start), and again for a name
        they lack (an adapter loaded since)."""
        served = state.get("served")
        if model and (served is None or model not in [*served[0], *served[1]]):  # SGLang's None costs no request
            try:
                served = state["served"] = await served_models(state["engine"])
            except Unreachable as err:
                raise APIError(str(err), status=502) from None
            except EngineError:
                return  # an answer that is no list of models: the trajectory's first request says what is wrong
        if served is not None:
            check_model(model, *served)

    async def default_model() -> str:
        """A reply's model where its request names none: the first name the backend serves, as vLLM's own replies
        say (read once), else the tokenizer's source."""
        if "served" not in state:
            with contextlib.suppress(EngineError):  # Unreachable too: the trajectory's requests say it
                state["served"] = await served_models(state["engine"])
        served = state.get("served")
        return served[0][0] if served and served[0] else state["source"]

    async def window() -> int | None:
        """The backend's prompt window as its engine knows it now: read at the first fork-join request, or
        (behind SGLang's router, which does not list the context) once a refusal has said it."""
        try:
            return await prompt_window(state["engine"])
        except Unreachable as err:  # one round of retries, not one more for each of the trajectory's requests
            raise APIError(str(err), status=502) from None
        except EngineError:
            return None  # it serves several models, say: the trajectory's requests say so

    async def openai_route(request: web.Request) -> web.StreamResponse:
        forwarding = decoding = ended = False  # passed on; a trajectory started; its stream written to its end
        stream = None
        try:
            raw = await read_body(request)
            try:  # on the loop: json.loads holds the GIL, so a thread would not free it (50 MiB: 0.4 s either way)
                body = json.loads(raw)
            except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, a number or nesting too large
                raise APIError(f"the request body is not JSON: {err}") from None
            settings = state["settings"]
            if not isinstance(body, dict) or not settings.wants_fork_join(body, request.headers):
                forwarding = True
                return await forward(request, raw)
            model = body.get("model") or ""
            await check_served(model)
            if "unprepared" in state:
                raise APIError(state["unprepared"])
            prompt_window = await window()
            decoding = True
            out = await answer(
                body,
                ROUTES[request.path],
                state["tokenizer"],
                dataclasses.replace(settings, prompt_window=prompt_window),
                state["engine"],
                state["fmt"],
                model or await default_model(),
                admission,
                hide,
            )
            if isinstance(out, dict):
                return web.json_response(out)
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            try:
                await stream.prepare(request)
                async for event in out:
                    await stream.write(event.encode())
                ended = True
                await stream.write_eof()
            except ConnectionResetError:  # aiohttp's "Cannot write to closing transport" too
                say_cut(True, stopping=False)
            finally:
                await out.aclose()
            return stream
        except APIError as err:
            return web.json_response(err.body(hide), status=err.status)
        except asyncio.CancelledError:  # the client left and aiohttp cancelled this handler, or the proxy stops
            task = asyncio.current_task()
            if ended:  # written whole; a cancel in write_eof's drain left aiohttp to end it, which would end it twice
                raise
            if task not in cut or forwarding:  # a passed-on reply is the backend's, begun: it is cut
                if decoding:
                    say_cut(True, stopping=False)
                raise
            say_cut(decoding, stopping=True)
            if hasattr(task, "uncancel"):  # Python 3.11's count: the handler goes on, to answer
                task.uncancel()
            stopped = APIError(STOPPED, status=503)
            if stream is None or not stream.prepared:  # an OpenAI client would retry a 503 (on a closed port)
                return web.json_response(stopped.body(), status=stopped.status, headers={"x-should-retry": "false"})
            with contextlib.suppress(ConnectionResetError):  # it ends as a failed one, not as a network fault would
                for event in error_events(stopped):
                    await stream.write(event.encode())
                await stream.write_eof()
            return stream

    async def other(request: web.Request) -> web.StreamResponse:
        try:
            return await forward(request, await read_body(request))
        except APIError as err:
            return web.json_response(err.body(), status=err.status)

    async def read_body(request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:  # aiohttp's answer is plain text
            raise APIError(f"the request body is over this proxy's {MAX_BODY_BYTES} bytes", status=413) from None

    def say_cut(decoding: bool, stopping: bool) -> None:
        why = "stopping cut a reply short" if stopping else "a client left before its reply ended"
        stopped = "; its trajectory was stopped" if decoding else ""
        print(f"threadweaver proxy: {why}{stopped}", file=sys.stderr, flush=True)

    live: set[asyncio.Task] = set()
    cut: set[asyncio.Task] = set()  # the replies stopping ended

    @web.middleware
    async def tracked(request: web.Request, handler):
        """Each request's handler, known while it runs, so that stopping can end it."""
        task = asyncio.current_task()
        live.add(task)
        try:
            return await handler(request)
        finally:
            live.discard(task)

    async def end_live_replies(app) -> None:
        """On Ctrl-C or SIGTERM (the listening socket is closed by now): the replies still running get
        :data:`STOP_GRACE_S` to end, or until a second Ctrl-C or SIGTERM, then they are stopped."""
        loop = asyncio.get_running_loop()
        now = loop.create_future()

        def again(*_) -> None:  # a second Ctrl-C or SIGTERM: the replies end now
            if not loop.is_closed():
                loop.call_soon_threadsafe(lambda: now.done() or now.set_result(None))

        # Python's handlers in place of aiohttp's (which would end the stop half-way), not the loop's: aiohttp's end
        # gives the loop's back to the defaults, and a signal then cut the exit short (status 130 or 143).
        for stopping in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # Windows
                loop.remove_signal_handler(stopping)
            signal.signal(stopping, again)
        if not live:
            return
        running = "1 reply still running gets" if len(live) == 1 else f"{len(live)} replies still running get"
        print(
            f"threadweaver proxy: stopping; {running} {STOP_GRACE_S:g} s to end (Ctrl-C again stops them now)",
            file=sys.stderr,
            flush=True,
        )
        deadline = loop.time() + STOP_GRACE_S
        while live and not now.done() and loop.time() < deadline:
            await asyncio.wait([*live, now], timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        for task in live:
            cut.add(task)
            task.cancel()  # aiohttp's shutdown then waits for them to end

    @web.middleware
    async def guarded(request: web.Request, handler):
        """The backend's own ``--api-key`` rule, with its key (which the proxy sends on): vLLM guards the /v1 paths,
        SGLang every path but its health and metrics. A path with a ``.``, ``..`` or empty segment is refused:
        the proxy's client resolves them (``/health/../v1/models`` is sent as ``/v1/models``), the guard would not."""
        if args.api_key and request.method != "OPTIONS":
            path = urllib.parse.unquote(request.raw_path.partition("?")[0])
            if not _plain_path(path):
                error = APIError(f"the path {shown(path)} has an empty, '.' or '..' segment")
                return web.json_response(error.body(), status=error.status)
            if _guarded_path(args.engine, path):
                scheme, _, key = request.headers.get("Authorization", "").partition(" ")
                given = key.encode("utf-8", "surrogateescape")  # aiohttp's text of bytes that are not UTF-8
                if scheme.lower() != "bearer" or not secrets.compare_digest(given, args.api_key.encode()):
                    return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[tracked, guarded])
    app.on_startup.append(start)
    app.on_shutdown.append(end_live_replies)
    app.on_cleanup.append(stop)
    for path in ROUTES:
        app.router.add_post(path, openai_route)
    app.router.add_route("*", "/{tail:.*}", other)
    return app


SOCKET_ADDRESS = re.compile(r"\('[0-9A-Fa-f:.%]+', \d+(?:, \d+)*\)")
"""A socket address as Python's connection errors write it: ``('10.0.0.7', 8000)``, IPv6's with four parts."""


def backend_hider(backend: str) -> Callable[[str], str]:
    """What an error reply tells clients of the backend: not where it is (an address behind the proxy, a password
    in its URL). The proxy's log gives the whole message."""
    parts = urllib.parse.urlsplit(backend)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    names = {backend, f"{parts.hostname}:{port}"}  # host:port as aiohttp's connection errors name it
    if "@" in parts.netloc or parts.port is not None:  # not a bare host name: "vllm" is in other words too
        names.add(parts.netloc)
    longest_first = sorted(names, key=len, reverse=True)

    def hide(message: str) -> str:
        hidden = SOCKET_ADDRESS.sub("<backend>", message)  # the address a host name resolved to
        for name in longest_first:
            hidden = hidden.replace(name, "<backend>")
        if hidden != message:
            print(f"threadweaver proxy: {message}", file=sys.stderr, flush=True)
        return hidden

    return hide


def _plain_path(path: str) -> bool:
    """Whether a (percent-decoded) path has no ``.``, ``..`` or empty segment (but a trailing slash)."""
    inner = path.removeprefix("/").removesuffix("/").split("/")
    return path.startswith("/") and (path == "/" or all(s not in ("", ".", "..") for s in inner))


def _guarded_path(engine: str, path: str) -> bool:
    if engine == "sglang":
        return not path.startswith(("/health", "/metrics"))
    return path.startswith("/v1")


def serve_proxy(args: ProxyArgs, limits: Limits = Limits()) -> None:
    from aiohttp import web

    if args.port == 0:  # bound here, so that the announcement can name it
        free = _free_port(args.host)
        listening, port = {"sock": free}, free.getsockname()[1]
    else:  # bound by aiohttp, on every address --host resolves to
        listening, port = {"host": args.host, "port": args.port}, args.port
    url = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{port}"

    def announce(_) -> None:
        print(f"{url} (fork-join in front of {args.backend}; Ctrl-C stops)", flush=True)

    logging.getLogger("aiohttp.server").addFilter(_no_bad_request_tracebacks)
    hang_ups = [s for s in STOPPING_SIGNALS if s != signal.SIGTERM and signal.getsignal(s) is raise_keyboard_interrupt]
    for hang_up in hang_ups:  # a closed terminal's SIGHUP (not where ignored, as under nohup)
        signal.signal(hang_up, _as_sigterm)
    try:
        # A client that leaves cancels its handler, so its trajectory stops and frees the engine.
        web.run_app(
            proxy_app(args, limits),
            **listening,
            print=announce,
            handler_cancellation=True,
            shutdown_timeout=STOP_GRACE_S,  # for replies to end once stopped (aiohttp waits 60 s, twice)
        )
    finally:  # one more signal must not cut the exit short (torch's clean-up included)
        for stopping in (signal.SIGINT, signal.SIGTERM, *hang_ups):
            signal.signal(stopping, signal.SIG_IGN)
        if "sock" in listening:  # aiohttp closes it once it served; not where the proxy did not start
            listening["sock"].close()


def _as_sigterm(*_) -> None:
    """A signal handler: the signal stops the proxy as SIGTERM does (a second one ends the replies still running,
    and it exits 0), where a KeyboardInterrupt would cut the stop short."""
    os.kill(os.getpid(), signal.SIGTERM)


def _free_port(host: str) -> socket.socket:
    """A free port on ``host`` (its first address), bound; listened on once the proxy has started (a client is
    refused until then, not held)."""
    try:
        return bound_socket(host, 0)
    except OSError as err:
        raise OSError(f"cannot listen on {host}: {err.strerror}") from None


def _no_bad_request_tracebacks(record: logging.LogRecord) -> bool:
    """aiohttp logs a traceback for each request line it cannot parse, after its 400: a client could fill the log."""
    from aiohttp.http_exceptions import HttpProcessingError

    return not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError))
