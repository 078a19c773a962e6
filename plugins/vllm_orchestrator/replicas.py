"""Several servers of one model without a router: a trajectory sticks to one, trajectories spread by load."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from threadweaver.engine import Completion, Sampling

logger = logging.getLogger(__name__)


class Replicas:
    """Engines of the same model on several servers (``--base-url "URL1 URL2"``).

    Each trajectory's requests go to one server (:meth:`pinned`, which the orchestrator calls
    once per trajectory), so its threads and its join find the prompt in that server's prefix
    cache. A new trajectory goes to the server with the fewest requests in flight, ties in turn.
    """

    def __init__(self, engines: Sequence):
        if not engines:
            raise ValueError("Replicas needs at least one engine")
        self.engines = list(engines)
        self.in_flight = [0] * len(self.engines)
        self._turn = 0

    def pinned(self) -> _Pinned:
        count = len(self.engines)
        index = min(range(count), key=lambda i: (self.in_flight[i], (i - self._turn) % count))
        self._turn = index + 1
        kind = _PinnedStreaming if hasattr(self.engines[index], "stream") else _Pinned
        return kind(self, index)

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        """A request on its own (not a trajectory's): to the least loaded server."""
        return await self.pinned().generate(prompt_ids, stop_ids, max_tokens, sampling)

    @property
    def root_is_tokenizer(self) -> bool:
        """Whether :meth:`model_root` names a tokenizer's folder (SGLang's servers)."""
        return any(getattr(engine, "root_is_tokenizer", False) for engine in self.engines)

    async def model_root(self) -> str | None:
        """Where the first server loaded the model from (see :func:`.engines.tokenizer_source`). Every server
        that says is asked: ones that loaded different models are warned of, as each trajectory would come
        from whichever model its server holds (the same model under two paths reads the same way)."""
        roots = [await engine.model_root() if hasattr(engine, "model_root") else None for engine in self.engines]
        if len({root for root in roots if root is not None}) > 1:
            served = "; ".join(f"server {i + 1}: {root}" for i, root in enumerate(roots) if root is not None)
            logger.warning(
                "the servers loaded different models (%s); each trajectory comes from its own server's model, "
                "so the rows mix them: give --base-url replicas of one model",
                served,
            )
        return roots[0]

    async def prompt_window(self) -> int | None:
        """The narrowest prompt window the servers say (see :func:`.engines.prompt_window`): every server is asked,
        so one that cannot be reached is an error here, before any trajectory."""
        said = [await engine.prompt_window() for engine in self.engines if hasattr(engine, "prompt_window")]
        said = [window for window in said if window is not None]
        return min(said) if said else None

    async def aclose(self) -> None:
        """Close each engine that has connections to close (an engine of one's own may have no ``aclose``)."""
        for engine in self.engines:
            if hasattr(engine, "aclose"):
                await engine.aclose()


class _Pinned:
    def __init__(self, replicas: Replicas, index: int):
        self.replicas, self.index = replicas, index
        self.engine = replicas.engines[index]

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        self.replicas.in_flight[self.index] += 1
        try:
            return await self.engine.generate(prompt_ids, stop_ids, max_tokens, sampling)
        finally:
            self.replicas.in_flight[self.index] -= 1


class _PinnedStreaming(_Pinned):
    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        self.replicas.in_flight[self.index] += 1
        try:
            async for item in self.engine.stream(prompt_ids, stop_ids, max_tokens, sampling):
                yield item
        finally:
            self.replicas.in_flight[self.index] -= 1
