"""Tree attention as flash attention's variable-length kernel (``threadweaver_varlen``).

Cut a pre-order trie after each leaf and it falls into segments: runs of tokens, each the
child of the one before it. A tree's first path is its first root-to-leaf path (the trajectory's
sequential request); a row holds one tree after any left padding, or several packed
(``padding_free``). A query in a later segment sees a prefix of its tree's first path (up to where
its branch leaves it), its ancestors off the path, and its own segment up to itself. So the
tree mask is the sum of two calls of flash's varlen kernel:

* ``local``: every segment, causal over its off-path ancestors and itself (the first path is
  one causal sequence), queries aligned to the end of their keys (flash's bottom-right causal);
* ``shared``: the queries off the first path, grouped by the prefix they see (the threads of a
  block share one), each group over its prefix, not causal.

Their outputs merge through their log-sum-exps, and the backward runs each call's backward
against the merged output and log-sum-exp, as ring attention does. The cost follows the
visible pairs, and a block's threads fill the kernel's query tiles together. Keys are
gathered per call and not kept for backward, which gathers them again and scatters their
gradients back in float32 (a prefix is shared by many queries).

Tokens that see only themselves (padding) stay out of both calls: each one's attention is its
own value, and only that value has a gradient.

On CUDA the calls run torch's own flash kernels (bf16 or fp16); elsewhere a reference with
the same contract runs them sequence by sequence, which the tests check against the dense mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable


@dataclass(frozen=True)
class Varlen:
    """One call of the varlen kernel: sequences of queries, each over its own list of keys."""

    query_index: torch.Tensor | None
    """[Q] int64: the tokens whose queries the call takes, in order; None: every token."""
    cu_q: torch.Tensor
    """[S + 1] int32: sequence ``i``'s queries are the call's queries ``cu_q[i]:cu_q[i + 1]``."""
    key_index: torch.Tensor | None
    """[K] int64: the tokens whose keys sequence ``i`` sees, at ``cu_k[i]:cu_k[i + 1]``; None: the queries' own."""
    cu_k: torch.Tensor
    """[S + 1] int32."""
    max_q: int
    max_k: int
    causal: bool
    """Causal with the queries aligned to the end of the keys, or every key visible."""


@dataclass(frozen=True)
class TriePlan:
    """The two varlen calls of a trie batch flattened to ``B * N`` tokens."""

    local: Varlen
    shared: Varlen | None
    """None where no query sees a prefix of a first path from off it."""
    alone: torch.Tensor | None = None
    """[A] int64: the tokens that see only themselves (padding), left out of the calls: each one's
    attention is its own value. None: the local call takes every token."""


def _int32_offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``starts[i], starts[i] + 1, ..., starts[i] + lengths[i] - 1`` for each ``i``, concatenated."""
    offsets = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    return torch.repeat_interleave(starts, lengths) + torch.arange(len(offsets), device=starts.device) - offsets


def trie_plan(subtree_end: torch.Tensor) -> TriePlan:
    """The plan of ``subtree_end`` ([B, N]: key ``kv`` is visible to ``q`` iff ``kv <= q < subtree_end[kv]``).

    O(N), but for one [segments with ancestors, N] comparison that finds the ancestors within
    each segment's row: segments start after leaves, and a trajectory's trie has few.
    """
    batch, n = subtree_end.shape
    device = subtree_end.device
    tokens = torch.arange(batch * n, device=device)
    row_start = torch.arange(batch, device=device) * n
    end = (subtree_end.long() + row_start[:, None]).flatten()
    leaf = end == tokens + 1
    ends = torch.nonzero(leaf).flatten() + 1  # after each leaf; every row ends on one
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    lengths = ends - starts
    # Each tree's first path runs from its root down to its first leaf. A root is a token outside
    # every earlier subtree: a row's tree, each row of a packed one, and each pad (a tree of one,
    # so that left padding, TRL's layout, does not make every segment gather its whole ancestry).
    reach = torch.cummax(end, 0).values  # a row's subtrees end within the row
    is_root = torch.cat([reach.new_zeros(1), reach[:-1]]) <= tokens
    root = torch.cummax(torch.where(is_root, tokens, 0), 0).values  # each token's tree
    leaves_before = leaf.long().cumsum(0) - leaf.long()
    on_path = leaves_before == leaves_before[root]

    # Ancestors of a segment starting at s: the tokens kv < s of its row with subtree_end[kv] > s.
    with_ancestors = torch.nonzero((starts > 0) & (reach[(starts - 1).clamp(min=0)] > starts)).flatten()
    s = starts[with_ancestors, None]
    keys = (s // n) * n + torch.arange(n, device=device)  # [segments with ancestors, N]: the row's tokens
    visible = (keys < s) & (end[keys] > s)
    # Per segment: how much of its tree's first path it sees (always a prefix of that path).
    prefix = torch.zeros_like(lengths).index_put_((with_ancestors,), (visible & on_path[keys]).sum(1))
    off_path = visible & ~on_path[keys]
    counts = off_path.sum(1)
    ancestors = torch.zeros_like(lengths).index_put_((with_ancestors,), counts)
    which, column = torch.nonzero(off_path, as_tuple=True)
    segment_of = with_ancestors[which]
    # A segment of one token that sees nothing before it is padding (or a lone root): each of those
    # would be a sequence of its own in the local call, so the kernel's grid would grow with them.
    alone = (lengths == 1) & (ancestors == 0) & (prefix == 0)
    lone_tokens = None
    if bool(alone.any()) and not bool(alone.all()):
        lone_tokens, kept = starts[alone], ~alone
        segment_of = (kept.cumsum(0) - 1)[segment_of]  # numbered among the kept segments
        starts, lengths, ancestors, prefix = (x[kept] for x in (starts, lengths, ancestors, prefix))
    some_left_out = lone_tokens is not None
    local = _local(tokens, starts, lengths, ancestors, segment_of, keys[which, column], counts, some_left_out)
    shared = _shared(tokens, starts, lengths, prefix, root[starts])
    return TriePlan(local, shared, lone_tokens)


def _local(tokens, starts, lengths, ancestors, segment_of, ancestor, counts, some_left_out: bool) -> Varlen:
    """Each segment over its off-path ancestors and itself, causal.

    ``ancestor[i]`` is an off-path ancestor of segment ``segment_of[i]``, by segment, then in order.
    ``some_left_out``: the segments do not cover every token, so the call names its queries.
    """
    cu_q = _int32_offsets(lengths)
    if not int(counts.sum()) and not some_left_out:
        return Varlen(None, cu_q, None, cu_q, int(lengths.max()), int(lengths.max()), causal=True)
    query_index = _ranges(starts, lengths) if some_left_out else tokens
    key_lengths = ancestors + lengths
    cu_k = _int32_offsets(key_lengths).long()
    key_index = torch.empty(int(cu_k[-1]), dtype=torch.long, device=tokens.device)
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=tokens.device), lengths)
    within = torch.arange(len(query_index), device=tokens.device) - cu_q.long()[segment]
    key_index[cu_k[segment] + ancestors[segment] + within] = query_index  # itself, after its ancestors
    rank = torch.arange(len(ancestor), device=tokens.device) - torch.repeat_interleave(
        counts.cumsum(0) - counts, counts
    )
    key_index[cu_k[segment_of] + rank] = ancestor
    queries = query_index if some_left_out else None
    return Varlen(queries, cu_q, key_index, cu_k.to(torch.int32), int(lengths.max()), int(key_lengths.max()), True)


def _shared(tokens, starts, lengths, prefix, path_start) -> Varlen | None:
    """The off-path queries, grouped by the first-path prefix they see, over that prefix.

    ``path_start``: per segment, where its tree's first path starts (the tree's root)."""
    sees = prefix > 0
    if not bool(sees.any()):
        return None
    starts, lengths, prefix, path_start = starts[sees], lengths[sees], prefix[sees], path_start[sees]
    # Consecutive segments seeing the same prefix of the same tree are one group.
    same = (prefix[1:] == prefix[:-1]) & (path_start[1:] == path_start[:-1])
    first = torch.cat([same.new_ones(1), ~same])
    group = first.cumsum(0) - 1
    group_lengths = torch.zeros(int(group[-1]) + 1, dtype=torch.long, device=tokens.device)
    group_lengths.index_add_(0, group, lengths)
    group_prefix, group_path = prefix[first], path_start[first]
    query_index = _ranges(starts, lengths)
    key_index = _ranges(group_path, group_prefix)
    return Varlen(
        query_index,
        _int32_offsets(group_lengths),
        key_index,
        _int32_offsets(group_prefix),
        int(group_lengths.max()),
        int(group_prefix.max()),
        causal=False,
    )


# --- the kernel: torch's flash on CUDA, a reference with the same contract elsewhere ------------


def _flash_forward(q, k, v, call: Varlen, scale: float):
    out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, call.cu_q, call.cu_k, call.max_q, call.max_k, 0.0, call.causal, False, scale=scale
    )
    if lse.shape != (q.shape[1], q.shape[0]):
        raise RuntimeError(
            f"flash's varlen log-sum-exp is {tuple(lse.shape)}, not [heads, tokens]: this torch lays it out otherwise"
        )
    return out, lse, (rng_state, unused)


def _flash_backward(grad, q, k, v, out, lse, call: Varlen, scale: float, state):
    rng_state, unused = state
    return torch.ops.aten._flash_attention_backward(
        grad, q, k, v, out, lse, call.cu_q, call.cu_k, call.max_q, call.max_k, 0.0, call.causal,
        rng_state, unused, scale=scale,
    )  # fmt: skip


def _sequences(call: Varlen):
    cu_q, cu_k = call.cu_q.tolist(), call.cu_k.tolist()
    for i in range(len(cu_q) - 1):
        yield slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])


def _scores(q, k, causal: bool, scale: float):
    """[H, m, n] float32 scores of one sequence (keys' heads repeated for grouped queries), masked."""
    k = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * scale
    if causal:
        m, n = scores.shape[-2:]
        visible = torch.ones(m, n, dtype=torch.bool, device=q.device).tril(n - m)
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores


def _reference_forward(q, k, v, call: Varlen, scale: float):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for qs, ks in _sequences(call):
        scores = _scores(q[qs], k[ks], call.causal, scale)
        lse[:, qs] = scores.logsumexp(-1)
        values = v[ks].float().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out[qs] = torch.einsum("hmn,nhd->mhd", scores.softmax(-1), values).to(q.dtype)
    return out, lse, None


def _reference_backward(grad, q, k, v, out, lse, call: Varlen, scale: float, state):
    """Flash's backward: the probabilities from ``lse``, and ``D = rowsum(grad * out)`` from ``out``."""
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    for qs, ks in _sequences(call):
        p = (_scores(q[qs], k[ks], call.causal, scale) - lse[:, qs, None]).exp()  # [H, m, n]
        g, o = grad[qs].float(), out[qs].float()
        values = v[ks].float().repeat_interleave(group, dim=1)
        keys = k[ks].float().repeat_interleave(group, dim=1)
        dp = torch.einsum("mhd,nhd->hmn", g, values)
        ds = p * (dp - (g * o).sum(-1).T[:, :, None]) * scale
        dq[qs] += torch.einsum("hmn,nhd->mhd", ds, keys)
        heads = (k.shape[1], group)
        dk[ks] += torch.einsum("hmn,mhd->nhd", ds, q[qs].float()).unflatten(1, heads).sum(2)
        dv[ks] += torch.einsum("hmn,mhd->nhd", p, g).unflatten(1, heads).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _kernel(device: torch.device):
    return (_flash_forward, _flash_backward) if device.type == "cuda" else (_reference_forward, _reference_backward)


# --- the attention -------------------------------------------------------------------------------


def _take(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x.index_select(0, index)


_SCATTER_ROWS = 1 << 17
"""Gathered keys' gradients are made float32 this many at a time (a prefix's copies add up to many)."""


def _scatter(grad: torch.Tensor, index: torch.Tensor | None, total: torch.Tensor) -> None:
    """Add the gathered keys' gradients into ``total`` (float32)."""
    if index is None:
        total += grad
        return
    for i in range(0, len(index), _SCATTER_ROWS):
        total.index_add_(0, index[i : i + _SCATTER_ROWS], grad[i : i + _SCATTER_ROWS].float())


class _TrieAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, plan: TriePlan, scale: float):
        forward, _ = _kernel(query.device)
        local = plan.local
        keys, values = _take(key, local.key_index), _take(value, local.key_index)
        if plan.alone is None:
            out, lse, local_state = forward(query, keys, values, local, scale)
        else:  # a lone token's attention is its value; its log-sum-exp is never read
            rows, alone = local.query_index, plan.alone
            out = torch.empty_like(query)
            out[alone] = value[alone].repeat_interleave(query.shape[1] // value.shape[1], dim=1)
            lse = torch.zeros(query.shape[1], query.shape[0], dtype=torch.float32, device=query.device)
            out[rows], lse[:, rows], local_state = forward(query[rows], keys, values, local, scale)
        shared_state = None
        if plan.shared is not None:
            shared, rows = plan.shared, plan.shared.query_index
            keys, values = _take(key, shared.key_index), _take(value, shared.key_index)
            out_s, lse_s, shared_state = forward(query[rows], keys, values, shared, scale)
            lse_l = lse[:, rows]
            merged = torch.logaddexp(lse_l, lse_s)
            w_l, w_s = ((x - merged).exp().T[:, :, None] for x in (lse_l, lse_s))
            out[rows] = (out[rows].float() * w_l + out_s.float() * w_s).to(out.dtype)
            lse[:, rows] = merged
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.plan, ctx.scale, ctx.states = plan, scale, (local_state, shared_state)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        query, key, value, out, lse = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        _, backward = _kernel(query.device)
        grad = grad.contiguous()
        dk = torch.zeros(key.shape, dtype=torch.float32, device=key.device)
        dv = torch.zeros_like(dk)
        local = plan.local
        keys, values = _take(key, local.key_index), _take(value, local.key_index)
        if plan.alone is None:
            dq, dk_l, dv_l = backward(grad, query, keys, values, out, lse, local, scale, ctx.states[0])
        else:  # a lone token's softmax is 1 whatever its score: only its value has a gradient
            rows, alone = local.query_index, plan.alone
            dq = torch.zeros_like(query)
            dq[rows], dk_l, dv_l = backward(
                grad[rows], query[rows], keys, values, out[rows], lse[:, rows].contiguous(), local, scale,
                ctx.states[0],
            )  # fmt: skip
            dv.index_add_(0, alone, grad[alone].float().unflatten(1, (value.shape[1], -1)).sum(2))
        _scatter(dk_l, local.key_index, dk)
        _scatter(dv_l, local.key_index, dv)
        if plan.shared is not None:
            shared, rows = plan.shared, plan.shared.query_index
            keys, values = _take(key, shared.key_index), _take(value, shared.key_index)
            dq_s, dk_s, dv_s = backward(
                grad[rows], query[rows], keys, values, out[rows], lse[:, rows].contiguous(), shared, scale,
                ctx.states[1],
            )  # fmt: skip
            dq = dq.float().index_add_(0, rows, dq_s.float()).to(dq.dtype)
            _scatter(dk_s, shared.key_index, dk)
            _scatter(dv_s, shared.key_index, dv)
        return dq, dk.to(key.dtype), dv.to(value.dtype), None, None


def trie_attention(query, key, value, plan: TriePlan, scale: float) -> torch.Tensor:
    """Tree attention of [T, heads, dim] queries over [T, kv heads, dim] keys and values: [T, heads, dim]."""
    return _TrieAttention.apply(query, key, value, plan, scale)
