"""threadweaver.vllm_orchestrator: engines that run the shared orchestration state machine on vLLM and SGLang.

Each engine is imported from its own module on first use (``from threadweaver.vllm_orchestrator import
VLLMServerEngine``), so naming one loads neither vLLM nor an HTTP client that another needs.
"""

import importlib

PUBLIC_NAMES = {
    "VLLMServerEngine": "vllm_server_engine",
    "SGLangEngine": "sglang_engine",
    "AsyncLLMEngine": "async_llm_engine",
    "LLMEngine": "llm_engine",
    "TransformersEngine": "transformers_engine",
    "Replicas": "replicas",
    "HTTPOptions": "http",
}
"""Each public name and the module that defines it."""

__all__ = list(PUBLIC_NAMES)


def __getattr__(name: str):
    if name not in PUBLIC_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{PUBLIC_NAMES[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *PUBLIC_NAMES])
