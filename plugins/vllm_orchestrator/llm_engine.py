"""vLLM's offline ``LLM`` as an engine: what TRL's colocate mode holds in every training process.

Requests that arrive together (the threads of a block, the rollouts of a batch) go to the
``LLM``'s engine as one batch, each with its own stop tokens, budget and seed, so vLLM
schedules them side by side as it would over HTTP. The batch is stepped here, as
``LLM.generate`` steps it, so that a batch nobody waits for any more (its trajectories timed
out) is aborted at its next step instead of decoding to its budget.
"""

from __future__ import annotations

import itertools

from threadweaver.engine import EngineError, RequestRefused
from threadweaver.orchestrator import Completion

from .batching import BatchingEngine, Request
from .wire import vllm_completion, vllm_sampling_params

_request_ids = itertools.count()


class LLMEngine(BatchingEngine):
    def __init__(self, llm, *, logprobs: bool = False, max_batch: int = 1024):
        """``llm``: a ``vllm.LLM``. ``logprobs``: each completion carries its sampled tokens' log-probs."""
        super().__init__(max_batch)
        self.llm = llm
        self.logprobs = logprobs

    def generate_batch(self, requests: list[Request]) -> list[Completion]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        waiting: dict[str, int] = {}  # request id -> its place in the batch
        outputs: list = [None] * len(requests)
        try:
            for place, r in enumerate(requests):
                params = vllm_sampling_params(r.stop_ids, r.max_tokens, r.sampling, self.logprobs)
                params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate asks: the finished output only
                request_id = f"threadweaver-{next(_request_ids)}"
                waiting[request_id] = place  # before it is added: aborting an id never added does nothing
                try:
                    engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(r.prompt_ids)), params)
                except _refusals() as err:  # this request's fault (a prompt over the context): it fails alone
                    del waiting[request_id]
                    outputs[place] = RequestRefused(f"vLLM LLM refused a request: {err}")
            while waiting:
                if self.abandoned():
                    raise EngineError("vLLM LLM: the batch was given up")  # nobody reads it
                for output in engine.step():
                    if output.finished and output.request_id in waiting:
                        outputs[waiting.pop(output.request_id)] = output
        finally:
            if waiting:  # given up, or a request refused or a step failed: nothing of the batch stays in the engine
                engine.abort_request(list(waiting))
        return [
            output
            if isinstance(output, RequestRefused)
            else vllm_completion(output, r.stop_ids, self.logprobs, where="vLLM LLM")
            for output, r in zip(outputs, requests)
        ]


def _refusals() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request's own fault: its client errors (a 4xx over HTTP), or ``ValueError`` before
    it had them."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (VLLMClientError, ValueError)
