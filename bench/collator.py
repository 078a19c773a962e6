"""Collator cost at 4k, 16k and 32k trajectory tokens, side by side in one run.

    .venv/bin/python bench/collator.py [--sizes 4096 16384 32768] [--repeats 5]

Sizes are flattened-row lengths L (the trie, what the model sees). Per size it
prints, for one row given as token ids:

* collate time and peak host memory of ``TrieCollator`` (O(N) tree metadata) against a
  collator that ships a dense [L, L] float mask, the reference's approach (each
  measured in a fresh subprocess, memory as the rise in peak RSS over the loaded state);
* the token count of the trie against the sum of the separate requests;
* on a GPU: forward+backward time and peak memory of sdpa with a dense mask against
  FlexAttention with a compiled BlockMask, on a tiny Qwen3 (skipped without CUDA).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time

DIGITS = "0123456789"


def trajectory_text(target: int, seed: int = 0, width: int = 100) -> str:
    """A trajectory of about ``target`` tokens (synth tokenizer: one per character):
    top-level blocks of four threads of ``width`` tokens, the first of which nests a two-thread block."""
    rng = random.Random(seed)

    def body(n: int) -> str:
        return "".join(rng.choice(DIGITS) for _ in range(n))

    def block(threads: list[str]) -> str:
        outlines = "".join(f"<Outline>{i}:{DIGITS[i % 10]}</Outline>" for i in range(1, len(threads) + 1))
        return (
            f"<Parallel><Outlines>{outlines}</Outlines>"
            + "".join(f"<Thread>{i}:{t}</Thread>" for i, t in enumerate(threads, 1))
            + "</Parallel>"
        )

    parts, size = ["<think>\n"], 8
    while size < target - 8 * width or size == 8:  # one block at least, however long its threads
        nested = block([body(width // 2), body(width // 2)])
        parts.append(block([body(width // 2) + nested, body(width), body(width), body(width)]) + body(20))
        size += 5 * width + 150
    parts.append("</think>\n\\boxed{1}")
    return "".join(parts)


def row(length: int, width: int = 100) -> dict:
    """A row (token ids) whose flattened trie has about ``length`` tokens, threads of ``width``."""
    from threadweaver.format import Format
    from threadweaver.kit.tokenizers import synth_tokenizer
    from threadweaver.tree import parse
    from threadweaver.trie import trajectory_trie

    fmt = Format.from_tokenizer(synth_tokenizer())
    prompt = fmt.encode("A=1+2\nA=?")
    target = int(length * 0.6)
    for _ in range(3):  # aim, measure, re-aim
        completion = fmt.encode(trajectory_text(target, width=width))
        trie = len(trajectory_trie(prompt, parse(completion, fmt).nodes, fmt, train_injected=True))
        target = int(target * length / trie)
    completion = fmt.encode(trajectory_text(target, width=width))
    return {"prompt_ids": prompt, "completion_ids": completion}


def dense_mask_batch(collator, features: list[dict]):
    """The reference's layout: the same trie, plus an [L, L] float mask built on the host."""
    import torch

    batch = collator(features)
    end = batch.pop("subtree_end")
    n = end.shape[-1]
    idx = torch.arange(n)
    allowed = (idx[None, :] <= idx[:, None]) & (idx[None, :, None] < end[:, None, :])
    mask = torch.full(allowed.shape, float("-inf"))
    batch["attention_mask"] = mask.masked_fill_(allowed, 0.0).unsqueeze(1)
    return batch


def measure_collate(kind: str, target: int, repeats: int) -> dict:
    """Runs in a subprocess: one collator, one size."""
    from threadweaver.hf_collator import TrieCollator
    from threadweaver.kit.tokenizers import synth_tokenizer

    collator = TrieCollator(synth_tokenizer())
    features = [row(target)]
    collate = collator if kind == "trie" else (lambda f: dense_mask_batch(collator, f))
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        batch = collate(features)
        times.append(time.perf_counter() - start)
        del batch
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": statistics.median(times), "peak_mib": (peak - baseline) / 1024}


def token_counts(target: int) -> dict:
    from threadweaver.format import Format
    from threadweaver.kit.tokenizers import synth_tokenizer
    from threadweaver.requests import plan_requests
    from threadweaver.tree import parse
    from threadweaver.trie import trajectory_trie

    fmt = Format.from_tokenizer(synth_tokenizer())
    r = row(target)
    nodes = parse(r["completion_ids"], fmt).nodes
    plan = plan_requests(r["prompt_ids"], nodes, fmt)
    trie = trajectory_trie(r["prompt_ids"], nodes, fmt, train_injected=True)
    return {
        "trajectory": len(r["completion_ids"]),
        "trie": len(trie),
        "requests": plan.expanded_tokens,
        "n_requests": len(plan.requests),
    }


def measure_gpu(target: int) -> dict:
    """Forward+backward of a tiny Qwen3 on one trie row: sdpa + dense mask vs flex + BlockMask."""
    import torch

    from threadweaver.hf_collator import TrieCollator, use_tree_attention
    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
    from threadweaver.kit.tokenizers import synth_tokenizer

    tokenizer = synth_tokenizer()
    batch = {k: v.cuda() for k, v in TrieCollator(tokenizer)([row(target)]).items()}
    out = {}
    for backend in ("sdpa", "flex_attention"):
        model = tiny_qwen3(tokenizer, TinyQwen3Config(max_position_embeddings=65536)).cuda().to(torch.bfloat16)
        use_tree_attention(model, backend)
        try:
            for _ in range(2):  # the first flex call compiles
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                model(**batch).loss.backward()
                torch.cuda.synchronize()
                seconds = time.perf_counter() - start
            out[backend] = {"seconds": seconds, "peak_mib": torch.cuda.max_memory_allocated() / 2**20}
        except torch.OutOfMemoryError:
            out[backend] = {"seconds": None, "peak_mib": None, "error": "out of memory"}
        del model
        torch.cuda.empty_cache()
    return out


def _subprocess(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _fmt(value, unit: str) -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--measure", nargs=3, metavar=("KIND", "SIZE", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        kind, size, repeats = args.measure
        print(json.dumps(measure_gpu(int(size)) if kind == "gpu" else measure_collate(kind, int(size), int(repeats))))
        return

    import torch

    print("collate one row (token ids in), median time and peak host memory rise")
    print(
        f"{'traj':>8} {'trie L':>8} {'requests':>9} {'trie ms':>9} {'dense ms':>9} {'trie MiB':>9} "
        f"{'dense MiB':>10} {'mem ratio':>10} {'time ratio':>10}"
    )
    for size in args.sizes:
        counts = token_counts(size)
        trie = _subprocess(["--measure", "trie", str(size), str(args.repeats)])
        dense = _subprocess(["--measure", "dense", str(size), str(max(1, args.repeats // 2))])
        print(
            f"{counts['trajectory']:>8} {counts['trie']:>8} {counts['requests']:>9} "
            f"{trie['seconds'] * 1e3:>9.1f} {dense['seconds'] * 1e3:>9.1f} {trie['peak_mib']:>9.1f} "
            f"{dense['peak_mib']:>10.1f} {trie['peak_mib'] / dense['peak_mib']:>10.4f} "
            f"{dense['seconds'] / trie['seconds']:>10.1f}"
        )
    print("\n(traj = trajectory tokens; trie L = flattened row; requests = tokens of one row per request)")
    if not torch.cuda.is_available():
        print("\nforward+backward sdpa-dense vs flex: skipped (no CUDA device)")
        return
    print(f"\nforward+backward on {torch.cuda.get_device_name()} (tiny Qwen3, bf16, one row)")
    print(f"{'tokens':>8} {'sdpa s':>8} {'flex s':>8} {'sdpa MiB':>10} {'flex MiB':>10}")
    for size in args.sizes:
        gpu = _subprocess(["--measure", "gpu", str(size), "1"])
        sdpa, flex = gpu["sdpa"], gpu["flex_attention"]
        print(
            f"{size:>8} {_fmt(sdpa['seconds'], 's'):>8} {_fmt(flex['seconds'], 's'):>8} "
            f"{_fmt(sdpa['peak_mib'], 'MiB') if sdpa['peak_mib'] else sdpa.get('error'):>10} "
            f"{_fmt(flex['peak_mib'], 'MiB') if flex['peak_mib'] else flex.get('error'):>10}"
        )


if __name__ == "__main__":
    main()
