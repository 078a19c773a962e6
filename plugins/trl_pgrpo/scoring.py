"""Each trie token's log-prob from its parent's logits, without copies of the logits.

A trie token is predicted at its parent's position, which is the position before it except
where a block forks. Gathering each token's parent row of logits and taking a float32
``log_softmax`` of it made [rows, tokens, vocabulary] copies, five of them with the entropy.
For Qwen3's vocabulary of 151,936, 4,096 tokens and 8 rows, each float32 copy is 20 GB.

Here the forward reads the logits a chunk of positions at a time, in float32, into one buffer:
each position's log-sum-exp (and entropy) and each token's score. It keeps the log-sum-exps.
The backward reads them again, a chunk at a time, and writes the gradient,
``(onehot(token) - softmax) / temperature`` weighted by the tokens predicted there, into a
tensor of the logits' size. So memory holds the logits, their gradient and one chunk.
"""

from __future__ import annotations

import torch

CHUNK = 1024
"""Positions whose float32 scores are held at once (0.6 GB at Qwen3's vocabulary)."""


def _chunks(positions: int, chunk: int):
    for start in range(0, positions, chunk):
        yield start, min(start + chunk, positions)


def _scores(logits: torch.Tensor, temperature: float, buffer: torch.Tensor) -> torch.Tensor:
    """``logits / temperature`` in float32 (a bf16 quotient would round), in ``buffer``, never in the logits."""
    out = buffer[: len(logits)].copy_(logits)
    return out.div_(temperature) if temperature != 1.0 else out


class _ParentLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, where, tokens, temperature: float, chunk: int, entropy: bool):
        flat = logits.reshape(-1, logits.shape[-1])
        positions = len(flat)
        buffer = torch.empty(min(chunk, positions), flat.shape[1], dtype=torch.float32, device=flat.device)
        lse = torch.empty(positions, dtype=torch.float32, device=flat.device)
        per_position = torch.empty_like(lse) if entropy else None
        for start, end in _chunks(positions, chunk):
            scores = _scores(flat[start:end], temperature, buffer)
            torch.logsumexp(scores, -1, out=lse[start:end])
            if entropy:  # H = lse - sum(p * scores)
                weighted = (scores - lse[start:end, None]).exp_().mul_(scores).sum(-1)
                per_position[start:end] = lse[start:end] - weighted
        logps = flat[where, tokens].float() / temperature - lse[where]
        ctx.save_for_backward(logits, where, tokens, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        if not entropy:
            return logps, None
        entropies = per_position[where]
        ctx.mark_non_differentiable(entropies)
        return logps, entropies

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropies):
        logits, where, tokens, lse = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        flat = logits.reshape(-1, logits.shape[-1])
        positions = len(flat)
        grad_logps = grad_logps.float() / temperature
        # Per position, the summed gradient of the tokens predicted there: the softmax's weight.
        weight = torch.zeros(positions, dtype=torch.float32, device=flat.device).index_add_(0, where, grad_logps)
        order = torch.argsort(where)
        where, tokens, grad_logps = where[order], tokens[order], grad_logps[order]
        starts = torch.tensor([s for s, _ in _chunks(positions, chunk)] + [positions], device=where.device)
        bounds = torch.searchsorted(where, starts).tolist()  # the tokens predicted in each chunk
        grad = torch.empty_like(flat)
        buffer = torch.empty(min(chunk, positions), flat.shape[1], dtype=torch.float32, device=flat.device)
        for i, (start, end) in enumerate(_chunks(positions, chunk)):
            scores = _scores(flat[start:end], temperature, buffer)
            part = scores.sub_(lse[start:end, None]).exp_().mul_(-weight[start:end, None])
            lo, hi = bounds[i], bounds[i + 1]
            part.index_put_((where[lo:hi] - start, tokens[lo:hi]), grad_logps[lo:hi], accumulate=True)
            grad[start:end] = part
        return grad.view_as(logits), None, None, None, None, None


def parent_logps(
    logits: torch.Tensor,
    parents: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per token, its float32 log-prob under ``softmax(logits[b, parents[b, j]] / temperature)``, and
    where asked the entropy of that distribution (no gradient).

    ``logits`` is [B, K, V] (any float dtype); ``parents`` [B, C] indexes K; ``tokens`` is [B, C].
    """
    batch, kept, _ = logits.shape
    where = (parents + torch.arange(batch, device=parents.device)[:, None] * kept).flatten()
    logps, entropies = _ParentLogps.apply(logits, where, tokens.flatten(), temperature, chunk, entropy)
    return logps.view(parents.shape), None if entropies is None else entropies.view(parents.shape)
