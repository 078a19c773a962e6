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

from threadweaver.engine import Completion, Sampling, to_completion


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
        # verl says only "completed" or "aborted"; a stop token at the end tells stop from length.
        reason = None if output.stop_reason in (None, "completed") else output.stop_reason
        return to_completion(
            output.token_ids,
            reason,
            None,
            stop_ids,
            output.log_probs or None,
            output.extra_fields.get("num_cached_tokens"),
            where="verl's rollout server",
        )
