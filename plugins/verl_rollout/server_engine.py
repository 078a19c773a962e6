"""The orchestrator's engine over verl's ``server_manager.generate``.

verl decides how the rollout samples (temperature, top-p and the log-prob switch come in
its ``sampling_params``, with validation overrides already applied); the orchestrator
adds what a request needs: ``max_tokens`` and ``stop_token_ids``. Every request of a
trajectory goes out under one request id, so verl's sticky routing sends them to the same
server and its prefix cache serves the shared context (verl gives each engine call its
own id underneath, so concurrent threads do not collide).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from threadweaver.orchestrator import Completion, Sampling


class ServerManagerEngine:
    def __init__(self, server_manager: Any, request_id: str, sampling_params: dict[str, Any]):
        self.server_manager = server_manager
        self.request_id = request_id
        self.sampling_params = dict(sampling_params)

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        params = dict(self.sampling_params, max_tokens=max_tokens, stop_token_ids=list(stop_ids))
        output = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=list(prompt_ids), sampling_params=params
        )
        tokens = tuple(output.token_ids[:max_tokens])
        logprobs = tuple(output.log_probs[: len(tokens)]) if output.log_probs else None
        reason = "stop" if tokens and tokens[-1] in stop_ids else "length"
        return Completion(tokens, reason, logprobs)
