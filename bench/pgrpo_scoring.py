"""Memory and time of P-GRPO's scoring: each trie token's log-prob from its parent's logits.

    .venv/bin/python bench/pgrpo_scoring.py [--rows 4] [--tokens 1024] [--vocab 49152 151936] [--repeats 3]

Side by side, on the same random logits (float32, the CPU's training dtype) of ``--rows`` rows
of ``--tokens`` completion tokens, a fifth of which fork back to an earlier parent:

* ``gathered``: how ``PGRPOTrainer`` scored before, and the straightforward way: each token's
  parent row of logits gathered, divided by the temperature, a float32 ``log_softmax``, and
  the entropy from it;
* ``chunked``: :func:`threadweaver.trl_pgrpo.scoring.parent_logps`, 1,024 positions at a time,
  recomputed in backward.

Each arm runs forward + backward (and the entropy) in a process of its own, which reports its
peak resident memory above what it held once the logits were made (the logits and the weights
of the loss are in both), and the median time of ``--repeats`` runs after one warm-up.
Vocabularies: SmolLM2's 49,152 and Qwen3's 151,936.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time


def inputs(rows: int, tokens: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    kept = tokens + 1
    logits = torch.randn(rows, kept, vocab, generator=g).requires_grad_()
    parents = torch.arange(tokens).repeat(rows, 1)  # position j's parent is kept position j
    forks = torch.rand(rows, tokens, generator=g) < 0.2
    earlier = (torch.rand(rows, tokens, generator=g) * (parents + 1)).long()
    parents = torch.where(forks, earlier, parents)
    ids = torch.randint(vocab, (rows, tokens), generator=g)
    weights = torch.randn(rows, tokens, generator=g)
    return logits, parents, ids, weights


def gathered(logits, parents, ids, temperature):
    import torch

    rows = logits.gather(1, parents[:, :, None].expand(-1, -1, logits.shape[-1]))
    scores = torch.log_softmax(rows.float() / temperature, dim=-1)
    return scores.gather(-1, ids[:, :, None])[..., 0], -(scores.exp() * scores).sum(-1)


def chunked(logits, parents, ids, temperature):
    from threadweaver.trl_pgrpo.scoring import parent_logps

    return parent_logps(logits, parents, ids, temperature, entropy=True)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def run_arm(arm: str, rows: int, tokens: int, vocab: int, repeats: int) -> dict:
    """In this process: one warm-up and ``repeats`` timed runs of one arm; peak memory above the inputs."""

    logits, parents, ids, weights = inputs(rows, tokens, vocab)
    score = {"gathered": gathered, "chunked": chunked}[arm]
    held = rss_mib()
    times = []
    for i in range(1 + repeats):
        logits.grad = None
        start = time.perf_counter()
        logps, entropy = score(logits, parents, ids, 0.7)
        (logps * weights).sum().backward()
        if i:
            times.append(time.perf_counter() - start)
        del logps, entropy
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"seconds": statistics.median(times), "peak_above_inputs_mib": peak - held, "inputs_mib": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="Completion tokens a row.")
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.rows, args.tokens, args.vocab[0], args.repeats)))
        return

    print(f"{platform.processor() or platform.machine()}, {args.rows} rows x {args.tokens} tokens, float32 logits")
    print("vocab | logits MiB | gathered: s, peak MiB above | chunked: s, peak MiB above | memory ratio | time ratio")
    for vocab in args.vocab:
        results = {}
        for arm in ("gathered", "chunked"):
            command = [sys.executable, __file__, "--arm", arm, "--rows", str(args.rows), "--tokens", str(args.tokens)]
            command += ["--vocab", str(vocab), "--repeats", str(args.repeats)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                results[arm] = None
                print(f"{arm} at vocabulary {vocab} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            results[arm] = json.loads(done.stdout.strip().splitlines()[-1])
        old, new = results["gathered"], results["chunked"]
        logits_mib = args.rows * (args.tokens + 1) * vocab * 4 / 2**20
        cells = [str(vocab), f"{logits_mib:.0f}"]
        for arm in (old, new):
            cells.append("failed" if arm is None else f"{arm['seconds']:.2f} s, {arm['peak_above_inputs_mib']:.0f}")
        if old and new:
            cells.append(f"{old['peak_above_inputs_mib'] / max(new['peak_above_inputs_mib'], 1):.1f}x")
            cells.append(f"{old['seconds'] / new['seconds']:.2f}x")
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
