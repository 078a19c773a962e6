"""Tokens a P-GRPO step trains on: one trie row per trajectory against one row per request.

    .venv/bin/python bench/pgrpo_tokens.py [--problems 8] [--generations 8] [--repeats 3]

Rollouts are sampled as ``PGRPOTrainer`` samples them: the embedded ThreadWeaver model
(the quickstart's), the shared orchestrator in-process, temperature 1.0, on held-out
synthetic problems. For the same rollouts it prints, side by side:

* tokens: the trainer's rows (:func:`threadweaver.pgrpo.trie_row`, prompt + trie) against
  the reference code's expanded layout, where every request (its context + completion) is
  a row of its own (``agent_return_expanded_sequences``), unpadded and as padded batches;
* time of one forward + backward of the loss over each layout on this machine (the tiny
  model; tree attention for the trie rows, plain causal attention for the expanded rows).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def rollouts(problems: int, generations: int, max_tokens: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.orchestrator import Limits, Orchestrator, Sampling
    from threadweaver.quickstart.recipe import embedded_models
    from threadweaver.rows import chat_prompt_ids
    from threadweaver.synth import make_rows
    from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

    path = str(embedded_models()["parallel"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    fmt = Format.from_tokenizer(tokenizer)
    engine = TransformersEngine(model, pad_token_id=tokenizer.pad_token_id, max_batch=problems * generations)
    limits = Limits(max_tokens=max_tokens, max_request_tokens=max_tokens)  # as PGRPOTrainer caps a rollout
    orchestrator = Orchestrator(engine, fmt, limits, Sampling(temperature=1.0))
    prompts = [
        chat_prompt_ids(tokenizer, [{"role": "user", "content": row["prompt"]}])
        for row in make_rows(problems, 0, split="validation")
    ]

    async def run():
        return await asyncio.gather(*(orchestrator.run(p) for p in prompts for _ in range(generations)))

    torch.manual_seed(0)
    return model, fmt, asyncio.run(run())


def expanded_rows(trajectory, fmt) -> list[tuple[list[int], list[int]]]:
    """The reference's layout: each request as (context, completion), rebuilt from the tree."""
    from threadweaver.requests import plan_requests

    plan = plan_requests(trajectory.prompt_ids, trajectory.nodes, fmt)
    return [(list(r.context), list(r.completion)) for r in plan.requests]


def fwd_bwd_seconds(model, batches: list[dict], repeats: int) -> float:
    """Median over ``repeats`` of one forward + backward over every micro-batch (gradients accumulate)."""
    import torch

    times = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k not in ("target_index", "targets", "weights")}
            logits = model(**inputs).logits
            picked = logits.gather(1, batch["target_index"][..., None].expand(-1, -1, logits.shape[-1]))
            logps = torch.log_softmax(picked.float(), -1).gather(-1, batch["targets"][..., None])[..., 0]
            (-(logps * batch["weights"]).sum()).backward()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def trie_batch(rows) -> dict:
    import torch

    length = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    width = max(len(r.completion_ids) for r in rows)
    out = {
        "input_ids": torch.zeros((len(rows), length), dtype=torch.long),
        "position_ids": torch.zeros((len(rows), length), dtype=torch.long),
        "subtree_end": torch.arange(1, length + 1).repeat(len(rows), 1),
        "target_index": torch.zeros((len(rows), width), dtype=torch.long),
        "targets": torch.zeros((len(rows), width), dtype=torch.long),
        "weights": torch.zeros((len(rows), width)),
    }
    for b, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.prompt_ids) + len(r.completion_ids)
        out["input_ids"][b, :n] = torch.tensor(r.prompt_ids + r.completion_ids)
        out["position_ids"][b, :n] = torch.tensor(list(range(p)) + r.position_ids)
        out["subtree_end"][b, :p] = n
        out["subtree_end"][b, p:n] = torch.tensor(r.subtree_end)
        out["target_index"][b, : n - p] = torch.tensor(r.parent)
        out["targets"][b, : n - p] = torch.tensor(r.completion_ids)
        out["weights"][b, : n - p] = torch.tensor(r.trained, dtype=torch.float)
    return out


def causal_batch(requests: list[tuple[list[int], list[int]]]) -> dict:
    import torch

    length = max(len(c) + len(x) for c, x in requests)
    out = {
        "input_ids": torch.zeros((len(requests), length), dtype=torch.long),
        "attention_mask": torch.zeros((len(requests), length), dtype=torch.long),
        "target_index": torch.zeros((len(requests), length), dtype=torch.long),
        "targets": torch.zeros((len(requests), length), dtype=torch.long),
        "weights": torch.zeros((len(requests), length)),
    }
    for b, (context, completion) in enumerate(requests):
        ids, n = context + completion, len(context) + len(completion)
        out["input_ids"][b, :n] = torch.tensor(ids)
        out["attention_mask"][b, :n] = 1
        out["target_index"][b, : n - 1] = torch.arange(n - 1)
        out["targets"][b, : n - 1] = torch.tensor(ids[1:])
        out["weights"][b, len(context) - 1 : n - 1] = 1.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-completion-length", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per forward, in both layouts")
    args = parser.parse_args()

    from threadweaver.hf_collator import use_tree_attention
    from threadweaver.pgrpo import trie_row

    started = time.perf_counter()
    model, fmt, trajectories = rollouts(args.problems, args.generations, args.max_completion_length)
    print(
        f"{len(trajectories)} rollouts in {time.perf_counter() - started:.0f} s: "
        f"{sum(t.stats.blocks > 0 for t in trajectories)} with a parallel block, "
        f"{sum(not t.well_formed for t in trajectories)} degraded, "
        f"{statistics.fmean(t.stats.total_tokens for t in trajectories):.0f} generated tokens each"
    )
    rows = [trie_row(t, fmt) for t in trajectories]
    requests = [r for t in trajectories for r in expanded_rows(t, fmt)]
    trained = sum(r.trained_tokens for r in rows)
    assert trained == sum(t.stats.total_tokens for t in trajectories)

    trie = [trie_batch(chunk) for chunk in chunks(rows, args.micro_batch)]
    causal = [causal_batch(chunk) for chunk in chunks(requests, args.micro_batch)]
    trie_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    expanded_tokens = sum(len(c) + len(x) for c, x in requests)
    print(f"\ntrained (sampled) tokens in both layouts: {trained}")
    print(f"{'layout':<28}{'rows':>6}{'tokens':>9}{'padded':>9}{'fwd+bwd s':>11}   ({args.micro_batch} rows a forward)")
    model.train()
    use_tree_attention(model)
    trie_s = fwd_bwd_seconds(model, trie, args.repeats)
    model.set_attn_implementation("sdpa")
    causal_s = fwd_bwd_seconds(model, causal, args.repeats)
    padded = {"trie": sum(b["input_ids"].numel() for b in trie), "causal": sum(b["input_ids"].numel() for b in causal)}
    for name, count, tokens, width, seconds in (
        ("trie row per trajectory", len(rows), trie_tokens, padded["trie"], trie_s),
        ("row per request (reference)", len(requests), expanded_tokens, padded["causal"], causal_s),
    ):
        print(f"{name:<28}{count:>6}{tokens:>9}{width:>9}{seconds:>11.2f}")
    print(
        f"\nexpanded / trie: {expanded_tokens / trie_tokens:.2f}x tokens, "
        f"{padded['causal'] / padded['trie']:.2f}x padded tokens, {causal_s / trie_s:.2f}x fwd+bwd time"
    )


if __name__ == "__main__":
    main()
