"""vLLM's offline ``LLM`` as an engine: what TRL's colocate mode holds in every training process.

Requests that arrive together (the threads of a block, the rollouts of a batch) go to
``LLM.generate`` as one call, each with its own stop tokens, budget and seed, so vLLM
schedules them side by side as it would over HTTP.
"""

from __future__ import annotations

from threadweaver.orchestrator import Completion

from .batching import BatchingEngine, Request
from .wire import vllm_completion, vllm_sampling_params


class LLMEngine(BatchingEngine):
    def __init__(self, llm, *, logprobs: bool = False, max_batch: int = 1024):
        """``llm``: a ``vllm.LLM``. ``logprobs``: each completion carries its sampled tokens' log-probs."""
        super().__init__(max_batch)
        self.llm = llm
        self.logprobs = logprobs

    def generate_batch(self, requests: list[Request]) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        params = [vllm_sampling_params(r.stop_ids, r.max_tokens, r.sampling, self.logprobs) for r in requests]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            vllm_completion(output, r.stop_ids, self.logprobs, where="vLLM LLM") for output, r in zip(outputs, requests)
        ]
