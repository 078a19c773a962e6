"""Each trie token's log-prob from its parent's logits, without copies of the logits.

A trie token is predicted at its parent's position, which is the position before it except
where a block forks. Gathering each token's parent row of logits and taking a float32
``log_softmax`` of it made [rows, tokens, vocabulary] copies, five of them with the entropy.
For Qwen3's vocabulary of 151,936, 4,096 tokens and 8 rows, each float32 copy is 20 GB.
(TRL's own fused head scores one label per position; a fork's parent predicts several.)

Here the forward reads the logits a chunk of positions at a time, in float32: each position's
log-sum-exp and entropy, and each token's score. It keeps those two numbers a position. The
backward reads the logits again, a chunk at a time, and writes the gradient straight into a
tensor of the logits' size. With ``s = logits / T``, ``p = softmax(s)`` and ``H = -sum(p log p)``:
``d log p[token] / ds = onehot(token) - p`` and ``dH / ds = -p (log p + H)``, each weighted by
the gradients of the tokens (and entropies) at that position. So memory holds the logits, their
gradient and two chunks.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

CHUNK = 1024
"""Positions whose float32 scores are held at once (0.6 GB at Qwen3's vocabulary)."""


def _chunks(positions: int, chunk: int):
    for start in range(0, positions, chunk):
        yield start, min(start + chunk, positions)


def _scores(logits: torch.Tensor, temperature: float, buffer: torch.Tensor) -> torch.Tensor:
    """``logits / temperature`` in float32 (a bf16 quotient would round), in ``buffer``, never in the logits."""
    out = buffer[: len(logits)].copy_(logits)
    return out.div_(temperature) if temperature != 1.0 else out


def _per_position(where: torch.Tensor, values: torch.Tensor | None, positions: int) -> torch.Tensor | None:
    """The sum of ``values`` over the tokens predicted at each position (None: no gradient came)."""
    if values is None:
        return None
    return torch.zeros(positions, dtype=torch.float32, device=values.device).index_add_(0, where, values.float())


class _ParentLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, where, tokens, temperature: float, chunk: int, entropy: bool):
        ctx.set_materialize_grads(False)
        flat = logits.reshape(-1, logits.shape[-1])
        positions = len(flat)
        buffer = torch.empty(min(chunk, positions), flat.shape[1], dtype=torch.float32, device=flat.device)
        lse = torch.empty(positions, dtype=torch.float32, device=flat.device)
        per_position = torch.empty_like(lse) if entropy else None
        for start, end in _chunks(positions, chunk):
            scores = _scores(flat[start:end], temperature, buffer)
            torch.logsumexp(scores, -1, out=lse[start:end])
            if entropy:  # H = lse - sum(p * s)
                weighted = (scores - lse[start:end, None]).exp_().mul_(scores).sum(-1)
                per_position[start:end] = lse[start:end] - weighted
        logps = flat[where, tokens].float() / temperature - lse[where]
        ctx.save_for_backward(logits, where, tokens, lse, per_position)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logps, None if per_position is None else per_position[where]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logps, grad_entropies):
        logits, where, tokens, lse, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        flat = logits.reshape(-1, logits.shape[-1])
        positions = len(flat)
        if grad_logps is None:
            grad_logps = torch.zeros(where.shape, dtype=torch.float32, device=flat.device)
        weight = _per_position(where, grad_logps, positions)  # the softmax term's weight
        entropy_weight = _per_position(where, grad_entropies, positions)
        order = torch.argsort(where)
        where, tokens, grad_logps = where[order], tokens[order], grad_logps.float()[order]
        starts = torch.tensor([s for s, _ in _chunks(positions, chunk)] + [positions], device=where.device)
        bounds = torch.searchsorted(where, starts).tolist()  # the tokens predicted in each chunk
        grad = torch.empty_like(flat)
        buffer = torch.empty(min(chunk, positions), flat.shape[1], dtype=torch.float32, device=flat.device)
        for i, (start, end) in enumerate(_chunks(positions, chunk)):
            log_p = _scores(flat[start:end], temperature, buffer).sub_(lse[start:end, None])
            if entropy_weight is None:  # -w p, in the buffer
                part = log_p.exp_().mul_(-weight[start:end, None])
            else:  # -p (w + e (log p + H)), with p in a second chunk
                p = log_p.exp()
                spread = log_p.add_(entropy[start:end, None]).mul_(entropy_weight[start:end, None])
                part = spread.add_(weight[start:end, None]).mul_(p).neg_()
            lo, hi = bounds[i], bounds[i + 1]
            part.index_put_((where[lo:hi] - start, tokens[lo:hi]), grad_logps[lo:hi], accumulate=True)
            grad[start:end] = part.div_(temperature) if temperature != 1.0 else part
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
    where asked the entropy of that distribution; both carry gradients (TRL's entropy bonus uses the
    entropy's).

    ``logits`` is [B, K, V] (any float dtype); ``parents`` [B, C] indexes K; ``tokens`` is [B, C].
    """
    batch, kept, _ = logits.shape
    outside = (parents < 0) | (parents >= kept)
    if bool(outside.any()):  # a layout error, which would read another row's logits
        b, j = torch.nonzero(outside)[0].tolist()
        raise IndexError(f"row {b}, token {j}: parent {int(parents[b, j])} is outside the {kept} positions with logits")
    where = (parents + torch.arange(batch, device=parents.device)[:, None] * kept).flatten()
    logps, entropies = _ParentLogps.apply(logits, where, tokens.flatten(), temperature, chunk, entropy)
    return logps.view(parents.shape), None if entropies is None else entropies.view(parents.shape)
