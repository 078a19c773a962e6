"""An in-process transformers engine: for CPU use, tests and RL rollouts without a server.

Requests that arrive together (the threads of a block) are batched into one
``generate`` call with left padding, so a block costs one batched decode. With
``logprobs=True`` each completion carries its sampled tokens' log-probs under the raw
logits (before temperature and top-p), as vLLM reports them by default. A batch that no
trajectory waits for any more (timed out, or the run stopped) stops at its next token.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadweaver.engine import Completion, RequestRefused, Sampling, to_completion

from .batching import BatchingEngine, Request


class TransformersEngine(BatchingEngine):
    def __init__(self, model, pad_token_id: int | None = None, max_batch: int = 32, logprobs: bool = False):
        super().__init__(max_batch)
        self.model = model.eval()
        self.logprobs = logprobs
        config_pad = model.generation_config.pad_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else config_pad
        if self.pad_token_id is None:
            raise ValueError("TransformersEngine needs a pad_token_id")

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        """Refused, as a server refuses it, where a prompt id has no embedding row (torch's "index out of range
        in self" otherwise, for the whole batch it joined)."""
        rows = self.model.get_input_embeddings().num_embeddings
        if (outside := next((token for token in prompt_ids if not 0 <= token < rows), None)) is not None:
            raise RequestRefused(
                f"transformers: token id {outside} is outside the model's vocabulary (0 to {rows - 1})"
            )
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)

    def batch_key(self, request: Request):
        """One ``generate`` call takes one set of stop tokens and sampling settings."""
        return request.stop_ids, request.sampling

    def generate_batch(self, requests: list[Request]) -> list[Completion]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        engine = self

        class Abandoned(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), engine.abandoned(), dtype=torch.bool, device=input_ids.device)

        stop, sampling = requests[0].stop_ids, requests[0].sampling
        width = max(len(r.prompt_ids) for r in requests)
        device = self.model.device
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            input_ids[row, width - n :] = torch.tensor(request.prompt_ids)
            attention_mask[row, width - n :] = 1
        kwargs = {"do_sample": sampling.temperature > 0}
        if kwargs["do_sample"]:
            kwargs.update(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else None,
            )
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=max(r.max_tokens for r in requests),
                eos_token_id=list(stop),
                pad_token_id=self.pad_token_id,
                return_dict_in_generate=True,
                output_logits=self.logprobs,
                stopping_criteria=StoppingCriteriaList([Abandoned()]),
                **kwargs,
            )
        generated = output.sequences[:, width:]
        if self.logprobs:
            logits = torch.stack(output.logits, dim=1).float()
            sampled = torch.log_softmax(logits, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1).tolist()
        stops = set(stop)
        results = []
        for row, request in enumerate(requests):
            new = generated[row].tolist()[: request.max_tokens]
            end = next((i for i, t in enumerate(new) if t in stops), None)
            n = len(new) if end is None else end + 1
            logprobs = sampled[row][:n] if self.logprobs else None
            results.append(to_completion(new[:n], None, None, stop, logprobs, where="transformers"))
        return results
