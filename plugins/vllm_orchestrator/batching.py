"""Engines over synchronous batch APIs: requests issued together go out as one batch.

The threads of a block are requested at the same moment; the first ``generate`` call
schedules a drain that yields once to the event loop, so every request made in that
turn joins it, then runs the batch in a worker thread (the event loop keeps serving
deadlines). Each request gets its own result (or its own exception), or the batch's exception. A batch whose
requests have all been given up (their trajectories timed out, or the run stopped) is
:meth:`~BatchingEngine.abandoned`: an engine that can stop a batch midway stops it then.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from threadweaver.engine import EngineError
from threadweaver.orchestrator import Completion, Sampling


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    stop_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling


_batch: contextvars.ContextVar[tuple[asyncio.Future, ...]] = contextvars.ContextVar("batch", default=())
"""The futures of the batch a worker thread decodes."""


class BatchingEngine:
    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self._pending: list[tuple[Request, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self._running: list[asyncio.Future] = []
        """The futures taken from ``_pending`` and not yet answered: the batch in the worker thread and the
        groups of other batch keys waiting for it."""

    def batch_key(self, request: Request) -> Hashable:
        """Requests with equal keys may share a batch (all of them, unless overridden)."""
        return ()

    def generate_batch(self, requests: list[Request]) -> list[Completion | Exception]:
        """A completion per request, in order; an exception in a request's place fails that request alone."""
        raise NotImplementedError

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((Request(tuple(prompt_ids), tuple(sorted(stop_ids)), max_tokens, sampling), future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._drain())
        return await future

    def abandoned(self) -> bool:
        """Whether no request of the batch this worker thread decodes still waits for it (call it from
        ``generate_batch``: each batch's thread sees its own futures)."""
        futures = _batch.get()  # empty outside a drained batch: a direct call is nobody's to give up
        return bool(futures) and all(future.cancelled() for future in futures)

    async def aclose(self) -> None:
        """Give up every request. A batch already in its worker thread finishes there, unawaited: at once
        where the engine stops an abandoned batch (ours do; one that cannot runs to its end, and a process
        that exits waits for it)."""
        self._give_up()
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            await asyncio.wait([self._worker])
        self._give_up()  # requests made while the worker unwound

    def _give_up(self) -> None:
        for future in [*self._running, *(future for _, future in self._pending)]:
            future.cancel()
        self._pending.clear()

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            self._running = [future for _, future in batch]
            try:
                await self._decode(batch)
            except Exception as err:  # a failure outside a batch's decoding (its key): every request gets it
                for future in self._running:
                    if not future.done():
                        future.set_exception(err)
            finally:  # cancelled (aclose): no request of the batch is left waiting
                for future in self._running:
                    future.cancel()
                self._running = []

    async def _decode(self, batch: list[tuple[Request, asyncio.Future]]) -> None:
        groups: dict[Hashable, list[tuple[Request, asyncio.Future]]] = {}
        for item in batch:
            groups.setdefault(self.batch_key(item[0]), []).append(item)
        for items in groups.values():
            items = [item for item in items if not item[1].cancelled()]  # given up while they waited
            if not items:
                continue
            _batch.set(tuple(future for _, future in items))  # the worker thread runs in a copy of this context
            try:
                results = list(await asyncio.to_thread(self.generate_batch, [request for request, _ in items]))
                if len(results) != len(items):
                    raise EngineError(
                        f"{type(self).__name__}.generate_batch answered {len(results)} of {len(items)} requests"
                    )
            except Exception as err:
                for _, future in items:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (_, future), result in zip(items, results):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
