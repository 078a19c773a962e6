"""The ``threadweaver`` endpoint plugin for vLLM's OpenAI server (entry-point group ``vllm.endpoint_plugins``).

``VLLM_PLUGINS=threadweaver vllm serve MODEL`` (``threadweaver serve`` allowlists it) puts
fork-join decoding behind ``/v1/chat/completions`` and ``/v1/completions`` for requests
that ask for it (see :mod:`.openai_api`); every other request goes to vLLM's own handler,
untouched. The orchestrator runs in the server process over the engine client, so no
request of a trajectory leaves the process and its threads share the prefix cache.

A model whose tokenizer lacks the tags still serves plain requests: the server starts, logs
one warning, and answers a fork-join request with a 400 that says how to prepare the model.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' parameter types, imported in attach_router.
import asyncio
import dataclasses
import logging

from .openai_api import ROUTES, Admission, APIError, ServerSettings, answer, check_model, unprepared

logger = logging.getLogger(f"vllm.{__name__}")
"""Under vLLM's logger, in its format and at VLLM_LOGGING_LEVEL: the server's root logger drops warnings."""


class ThreadWeaverEndpoint:
    name = "threadweaver"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        try:
            self.settings, self.settings_error = ServerSettings.from_env(), None
        except ValueError as err:  # vLLM logs what a plugin's constructor raises and serves on without it
            self.settings, self.settings_error = ServerSettings(), err
        self.admission = Admission(self.settings.max_trajectories)
        self.engine = self.tokenizer = self.fmt = self.model = self.unprepared = None
        self.served: list[str] = []

    def attach_router(self, app) -> None:
        if self.settings_error is not None:  # the server does not start, naming the variable
            raise self.settings_error
        from fastapi import Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse
        from fastapi.routing import APIRoute
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.exception_handling.utils import sanitize_message

        plain = {
            route.path: route.endpoint
            for route in app.routes
            if isinstance(route, APIRoute) and route.path in ROUTES and "POST" in route.methods
        }

        async def respond(path: str, request, raw_request: Request):
            body = await raw_request.json()
            try:
                if not self.settings.wants_fork_join(body, raw_request.headers):
                    return await plain[path](request, raw_request)
                self.check(body, raw_request.app.state)
                model = body.get("model") or self.model
                out = await until_disconnected(
                    answer(
                        body,
                        ROUTES[path],
                        self.tokenizer,
                        self.settings,
                        self.engine,
                        self.fmt,
                        model,
                        self.admission,
                        sanitize_message,
                    ),
                    raw_request,
                )
                if out is None:  # the client left: its trajectory was cancelled, and there is nobody to answer
                    return Response(status_code=499)
                if isinstance(out, dict):
                    return JSONResponse(out)
                return StreamingResponse(out, media_type="text/event-stream")
            except APIError as err:  # without the server's paths, as vLLM's own error replies
                return JSONResponse(err.body(sanitize_message), status_code=err.status)

        async def chat(request: ChatCompletionRequest, raw_request: Request):
            return await respond("/v1/chat/completions", request, raw_request)

        async def completion(request: CompletionRequest, raw_request: Request):
            return await respond("/v1/completions", request, raw_request)

        app.post("/v1/chat/completions")(chat)
        app.post("/v1/completions")(completion)

    def check(self, body: dict, state=None) -> None:
        """What vLLM's routes check first (the model's name, unless ``VLLM_SKIP_MODEL_NAME_VALIDATION``), then
        whether this server can decode fork-join. ``state``: the app's, with vLLM's LoRA adapters."""
        from vllm import envs

        if self.engine is None:
            raise APIError("the threadweaver plugin has no engine on this server", status=501)
        if not envs.VLLM_SKIP_MODEL_NAME_VALIDATION:
            models = getattr(state, "openai_serving_models", None)
            check_model(body.get("model"), self.served, getattr(models, "lora_requests", {}))
        if self.unprepared:
            raise APIError(self.unprepared)

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None:  # vLLM's render-only server: no engine to decode with
            return
        from transformers import AutoTokenizer

        from threadweaver.format import Format, missing_tags

        from .async_llm_engine import AsyncLLMEngine

        self.tokenizer = AutoTokenizer.from_pretrained(  # the one vLLM loads, as its flags name it
            args.tokenizer or args.model,
            revision=getattr(args, "tokenizer_revision", None) or getattr(args, "revision", None),
            trust_remote_code=getattr(args, "trust_remote_code", False),
        )
        missing = missing_tags(self.tokenizer)
        if missing:
            why = unprepared(missing, args.model)
            logger.warning("%s; plain requests are served, fork-join requests get a 400 saying so", why)
            self.unprepared = unprepared(missing)
        else:
            self.fmt = Format.from_tokenizer(self.tokenizer)
        self.served = list(args.served_model_name or [args.model])
        self.model = self.served[0]
        self.engine = AsyncLLMEngine(engine_client)
        self.settings = dataclasses.replace(self.settings, prompt_window=engine_client.model_config.max_model_len)


async def until_disconnected(work, raw_request):
    """``work``'s result, or None, with ``work`` cancelled, if the client disconnects first.

    The pattern of vLLM's own ``with_cancellation`` (the body is read already, so the next
    message is the disconnect); a stream, once returned, listens for it itself."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(raw_request))
    done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        gone.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _disconnect(raw_request) -> None:
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass
