"""Run by test_llm_engine.py in its own process (vLLM in-process sets up torch.distributed and caps torch's
threads): ``LLMEngine`` over a real ``vllm.LLM`` on a random-weights model that never stops on its own.
Writes what it measured as JSON for the test to check."""

from __future__ import annotations

import asyncio
import json
import sys
import time

MAX_TOKENS = 30_000
"""A budget the abandoned request would take minutes to decode here."""


def main(model: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    from threadweaver.orchestrator import Sampling
    from threadweaver.vllm_orchestrator import LLMEngine

    llm = LLM(model, dtype="float32", max_model_len=MAX_TOKENS + 16, seed=0)
    budgets = [5, 40, 17]
    prompts = [[1, 2, 3], [4, 5], [6]]
    direct = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(max_tokens=n, temperature=0.0, detokenize=False) for n in budgets],
        use_tqdm=False,
    )
    steps = []
    step = llm.llm_engine.step
    llm.llm_engine.step = lambda: steps.append(time.monotonic()) or step()

    async def run() -> dict:
        engine = LLMEngine(llm)
        batch = await asyncio.gather(
            *(engine.generate(p, (), n, Sampling(temperature=0.0)) for p, n in zip(prompts, budgets))
        )
        # a request vLLM refuses as it is added (a prompt over the context) fails alone: the one added before it
        # decodes, and nothing is left decoding after the batch
        refused = await asyncio.gather(
            engine.generate([1, 2], (), 20, Sampling()),
            engine.generate([5] * (MAX_TOKENS + 100), (), 20, Sampling()),
            return_exceptions=True,
        )
        left_after_refusal = llm.llm_engine.has_unfinished_requests()
        steps.clear()
        request = asyncio.ensure_future(engine.generate([7, 8, 9], (), MAX_TOKENS, Sampling(temperature=0.0)))
        while len(steps) < 3:
            await asyncio.sleep(0.01)
        given_up = time.monotonic()
        request.cancel()
        await asyncio.wait([engine._worker], timeout=300)
        return {
            "batch": [list(c.token_ids) for c in batch],
            "finish": [c.finish_reason for c in batch],
            "worker_done": engine._worker.done(),
            "steps_after": sum(t > given_up for t in steps),
            "unfinished": llm.llm_engine.has_unfinished_requests(),
            "refused": [type(r).__name__ for r in refused],
            "left_after_refusal": left_after_refusal,
        }

    measured = asyncio.run(run())
    measured["direct"] = [list(o.outputs[0].token_ids) for o in direct]
    with open(out_path, "w") as f:
        json.dump(measured, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
