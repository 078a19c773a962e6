"""An in-process transformers engine: for CPU use, tests and RL rollouts without a server.

Requests that arrive together (the threads of a block) are batched into one
``generate`` call with left padding, so a block costs one batched decode. With
``logprobs=True`` each completion carries its sampled tokens' log-probs under the raw
logits (before temperature and top-p), as vLLM reports them by default.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from threadweaver.orchestrator import Completion, Sampling


class TransformersEngine:
    def __init__(self, model, pad_token_id: int | None = None, max_batch: int = 32, logprobs: bool = False):
        self.model = model.eval()
        self.logprobs = logprobs
        config_pad = model.generation_config.pad_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else config_pad
        if self.pad_token_id is None:
            raise ValueError("TransformersEngine needs a pad_token_id")
        self.max_batch = max_batch
        self._pending: list[tuple] = []
        self._worker: asyncio.Task | None = None

    async def generate(self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int,
                       sampling: Sampling) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((tuple(prompt_ids), tuple(sorted(stop_ids)), max_tokens, sampling, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let requests issued together join the batch
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault((item[1], item[3]), []).append(item)
            for (stop, sampling), items in groups.items():
                try:
                    results = await asyncio.to_thread(self._generate, items, stop, sampling)
                except Exception as err:  # hand the failure to every waiting caller
                    for item in items:
                        item[4].set_exception(err)
                    continue
                for item, result in zip(items, results):
                    item[4].set_result(result)

    def _generate(self, items: list[tuple], stop: tuple[int, ...], sampling: Sampling) -> list[Completion]:
        import torch

        width = max(len(item[0]) for item in items)
        device = self.model.device
        input_ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item[0])
            input_ids[row, width - n:] = torch.tensor(item[0])
            attention_mask[row, width - n:] = 1
        kwargs = {"do_sample": sampling.temperature > 0}
        if kwargs["do_sample"]:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k if sampling.top_k > 0 else None)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=max(item[2] for item in items), eos_token_id=list(stop),
                pad_token_id=self.pad_token_id, return_dict_in_generate=True, output_logits=self.logprobs,
                **kwargs,
            )
        generated = output.sequences[:, width:]
        if self.logprobs:
            logits = torch.stack(output.logits, dim=1).float()
            sampled = torch.log_softmax(logits, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1).tolist()
        stops = set(stop)
        results = []
        for row, item in enumerate(items):
            new = generated[row].tolist()[: item[2]]
            end = next((i for i, t in enumerate(new) if t in stops), None)
            n, reason = (len(new), "length") if end is None else (end + 1, "stop")
            logprobs = tuple(sampled[row][:n]) if self.logprobs else None
            results.append(Completion(tuple(new[:n]), reason, logprobs))
        return results
