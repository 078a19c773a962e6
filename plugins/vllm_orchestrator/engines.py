"""Pick an engine by name: the settings shared by ``threadweaver generate`` and the Python API."""

from __future__ import annotations

import os
from dataclasses import dataclass

from threadweaver.cli_args import check_counts, check_url, option
from threadweaver.model_dirs import check_model_dir

from .http import HTTPOptions
from .serve import ServeArgs

ENGINES = ("vllm", "sglang", "vllm-inprocess", "transformers")
SERVER_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineArgs:
    engine: str = option(
        "vllm",
        "'vllm' (an OpenAI-compatible vLLM server), 'sglang' (its /generate), 'vllm-inprocess' "
        "(AsyncLLM, no server) or 'transformers' (in-process, CPU friendly).",
        choices=ENGINES,
    )
    base_url: str = option(
        f"http://{ServeArgs.host}:{ServeArgs.port}",  # threadweaver serve's, vLLM's
        "Server URL (vllm, sglang); several, space-separated, spread the trajectories over the servers, "
        "each trajectory on one.",
    )
    served_model: str | None = option(None, "Model name on the vLLM server (default: the only one it serves).")
    max_inflight: int = option(HTTPOptions.max_inflight, "Most requests in flight to a server.")
    retries: int = option(HTTPOptions.retries, "Retries with backoff on connection errors, 429 and 5xx.")
    api_key: str | None = option(None, "Bearer token for the server.")

    def __post_init__(self):
        check_counts(self, ("max_inflight",))
        check_counts(self, ("retries",), least=0)
        if self.engine in SERVER_ENGINES:
            for url in self.base_url.split():
                check_url(self, "base_url", url)

    def check_model(self, model: str | None) -> None:
        """Refuse, before anything loads, a local ``model`` that cannot be one: a model directory for the
        in-process engines, a tokenizer's for the servers'."""
        if model:
            check_model_dir(model, contents=self.engine != "vllm-inprocess", weights=self.engine not in SERVER_ENGINES)


def make_engine(args: EngineArgs, model: str | None = None):
    """``model``: the model directory, for the in-process engines."""
    options = HTTPOptions(max_inflight=args.max_inflight, retries=args.retries, api_key=args.api_key)
    if args.engine in SERVER_ENGINES:
        urls = args.base_url.split()
        if not urls:
            raise ValueError("--base-url is empty: give the server's URL")
        engines = [_server_engine(args, url, options) for url in urls]
        if len(engines) == 1:
            return engines[0]
        from .replicas import Replicas

        return Replicas(engines)
    if model is None:
        raise ValueError(
            f"the {args.engine} engine runs in-process and needs a model directory: --model DIR (model=DIR in "
            "lm-eval's --model_args)"
        )
    args.check_model(model)  # before anything loads (lm-eval printed transformers' traceback)
    if args.engine == "vllm-inprocess":
        from .async_llm_engine import AsyncLLMEngine

        return AsyncLLMEngine.from_model(model)
    if args.engine == "transformers":
        from transformers import AutoModelForCausalLM

        from .transformers_engine import TransformersEngine

        return TransformersEngine(AutoModelForCausalLM.from_pretrained(model))
    raise ValueError(f"unknown engine {args.engine!r}; choose one of {', '.join(ENGINES)}")


def _server_engine(args: EngineArgs, url: str, options: HTTPOptions):
    if args.engine == "vllm":
        from .vllm_server_engine import VLLMServerEngine

        return VLLMServerEngine(url, args.served_model, options=options)
    from .sglang_engine import SGLangEngine

    return SGLangEngine(url, options=options)


async def prompt_window(engine) -> int | None:
    """The prompt length that leaves the server no room to generate, where it says, else None."""
    return await engine.prompt_window() if hasattr(engine, "prompt_window") else None


async def served_models(engine) -> tuple[list[str], list[str]] | None:
    """The server's model names and its LoRA adapters' where it says (vLLM), else None (SGLang)."""
    return await engine.served_models() if hasattr(engine, "served_models") else None


async def served_elsewhere(engine, model: str) -> str | None:
    """The folder ``engine``'s server loaded its model from, where that is a folder here and ``model`` another
    (a second server's, a slip of the port); else None. A server that names no folder here (a hub id, another
    machine's path) is taken at its word; a relative root is read from this folder, as a server started here
    reports it. SGLang's servers name their tokenizer's folder, which may be loaded apart: not compared."""
    model = os.path.expanduser(model)
    if not (hasattr(engine, "model_root") and os.path.isdir(model)) or getattr(engine, "root_is_tokenizer", False):
        return None
    root = await engine.model_root()
    return root if isinstance(root, str) and os.path.isdir(root) and not os.path.samefile(root, model) else None


async def tokenizer_source(engine, given: str | None) -> str | None:
    """``given``, else where the server reports it loaded the model from, else None (an engine of your own)."""
    if given:
        return given
    if hasattr(engine, "model_root"):
        return await engine.model_root()
    return None
