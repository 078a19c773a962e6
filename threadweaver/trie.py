"""Token tries flattened in pre-order, with O(N) tree metadata instead of an N x N mask.

Requests are inserted as token paths; shared prefixes are stored once. The flat layout
is a depth-first pre-order, so:

* ``position_ids`` is the depth, which equals the position the token has in its own
  request; RoPE sees exactly what it sees at inference;
* token ``q`` may attend to token ``kv`` iff ``kv <= q < subtree_end[kv]`` (``kv`` is
  ``q`` or one of its ancestors); any backend builds its mask from that rule;
* every prefix of the layout is ancestor-closed, so cutting at ``max_length`` never
  leaves a token without its context.

In a trie a token is predicted from its *parent's* hidden state. Children are laid out
trained-first, so where each position has at most one trained child (any one SFT
trajectory) the parent of every trained token is the previous flat position and
:meth:`FlatTrie.labels` are ordinary causal-LM labels: every trainer's own shift is
right. :meth:`FlatTrie.targets` gives labels pre-shifted to the parent for the general
case.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from typing import Iterable, Sequence

from threadweaver.requests import RequestPlan


class TokenTrie:
    """A forest of token paths; ``add`` marks which tokens of a path are trained."""

    def __init__(self) -> None:
        self._token: list[int] = []
        self._parent: list[int] = []
        self._trained: list[bool] = []
        self._depth: list[int] = []
        self._children: list[dict[int, int]] = []
        self._roots: dict[int, int] = {}
        self._last_ids: tuple[int, ...] = ()
        self._last_path: list[int] = []

    def __len__(self) -> int:
        return len(self._token)

    def add(self, ids: Sequence[int], trained: Sequence[bool]) -> None:
        if len(ids) != len(trained):
            raise ValueError(f"{len(ids)} tokens but {len(trained)} trained flags")
        ids = tuple(ids)
        # Paths usually share a long prefix with the previous one: start the walk there.
        shared = _common_prefix(ids, self._last_ids)
        path = self._last_path[:shared]
        parent = path[-1] if path else -1
        children = self._children[parent] if path else self._roots
        depth = shared
        for token in ids[shared:]:
            node = children.get(token)
            if node is None:
                node = len(self._token)
                self._token.append(token)
                self._parent.append(parent)
                self._depth.append(depth)
                self._trained.append(False)
                self._children.append({})
                children[token] = node
            path.append(node)
            parent, children, depth = node, self._children[node], depth + 1
        for node in compress(path, trained):
            self._trained[node] = True
        self._last_ids, self._last_path = ids, path

    def flatten(self) -> "FlatTrie":
        order = self._preorder()
        n = len(order)
        index = [0] * n
        for i, node in enumerate(order):
            index[node] = i
        # Node ids grow along every path, so one backward sweep sums subtree sizes.
        size = [1] * n
        for node in range(n - 1, -1, -1):
            p = self._parent[node]
            if p >= 0:
                size[p] += size[node]
        index.append(-1)  # index[-1]: a root's parent
        return FlatTrie(
            input_ids=[self._token[node] for node in order],
            position_ids=[self._depth[node] for node in order],
            parent=[index[self._parent[node]] for node in order],
            subtree_end=[i + size[node] for i, node in enumerate(order)],
            trained=[self._trained[node] for node in order],
        )

    def _preorder(self) -> list[int]:
        """Depth-first node order, trained children first, following single-child chains without the stack."""
        order: list[int] = []
        stack = self._trained_first(self._roots.values())
        while stack:
            node = stack.pop()
            while True:
                order.append(node)
                kids = self._children[node]
                if len(kids) == 1:
                    (node,) = kids.values()
                    continue
                if kids:
                    ranked = self._trained_first(kids.values())
                    node = ranked.pop()
                    stack.extend(ranked)
                    continue
                break
        return order

    def _trained_first(self, nodes) -> list[int]:
        """``nodes`` in stack order (popped last-first) with trained nodes popped first."""
        return sorted(reversed(list(nodes)), key=self._trained.__getitem__)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix, by bisection over C-speed slice comparisons."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class FlatTrie:
    input_ids: list[int]
    position_ids: list[int]
    """Depth in the trie: the token's position in its own request."""
    parent: list[int]
    """Flat index of the parent, -1 for a root."""
    subtree_end: list[int]
    """Index just past the token's subtree: ``kv`` is visible to ``q`` iff ``kv <= q < subtree_end[kv]``."""
    trained: list[bool]
    """Tokens that carry loss."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def attends(self, query: int, key: int) -> bool:
        return key <= query < self.subtree_end[key]

    def labels(self, ignore_index: int = -100) -> list[int]:
        """Causal-LM labels (the trainer shifts them): a trained token where its parent
        is the previous position, ``ignore_index`` elsewhere.

        Raises if a trained token is not its parent's first child, which happens only
        when one position has two trained continuations; use :meth:`targets` then.
        """
        out = [ignore_index] * len(self.input_ids)
        for i, p in enumerate(self.parent):
            if not self.trained[i]:
                continue
            if p < 0:
                raise ValueError(f"token {i} is trained but has no context to predict it from")
            if p != i - 1:
                raise ValueError(
                    f"trained token {i} is not predicted from position {i - 1} (its parent is {p}): "
                    "a position with two trained continuations needs targets()"
                )
            out[i] = self.input_ids[i]
        return out

    def targets(self, ignore_index: int = -100) -> list[int]:
        """Per position, the trained token predicted from it (its trained child).

        These are labels already shifted for a trie: feed them where a causal-LM loss
        takes pre-shifted labels (``shift_labels`` in transformers). Raises if one
        position would have to predict two different trained tokens.
        """
        out = [ignore_index] * len(self.input_ids)
        for i, p in enumerate(self.parent):
            if not self.trained[i]:
                continue
            if p < 0:
                raise ValueError(f"token {i} is trained but has no context to predict it from")
            if out[p] != ignore_index:
                raise ValueError(
                    f"position {p} has two trained continuations (tokens {out[p]} and "
                    f"{self.input_ids[i]}); score it by gathering at parent indices instead"
                )
            out[p] = self.input_ids[i]
        return out

    def truncate(self, max_length: int) -> "FlatTrie":
        """The first ``max_length`` tokens: still a valid (ancestor-closed) trie."""
        if len(self) <= max_length:
            return self
        return FlatTrie(
            input_ids=self.input_ids[:max_length],
            position_ids=self.position_ids[:max_length],
            parent=self.parent[:max_length],
            subtree_end=[min(e, max_length) for e in self.subtree_end[:max_length]],
            trained=self.trained[:max_length],
        )


def trajectory_trie(plans: RequestPlan | Iterable[RequestPlan], *, train_injected: bool = False) -> FlatTrie:
    """The trie of one or more trajectories' requests.

    Completion tokens are trained; contexts are not, so the copies of threads 2..k in
    the continuation's context (which attend to the threads before them, a conditioning
    inference never uses) carry no loss. With ``train_injected`` the orchestrator's
    injected tokens on the trajectory's own sequential path are trained too, so the
    model also writes them itself when it is run with branching off (SFT default).
    """
    trie = TokenTrie()
    for plan in [plans] if isinstance(plans, RequestPlan) else plans:
        for request in plan.requests:
            trie.add(request.context + request.completion,
                     [False] * len(request.context) + [True] * len(request.completion))
        if train_injected:
            trie.add(plan.prompt + plan.trajectory,
                     [False] * len(plan.prompt) + [not g for g in plan.generated])
    return trie.flatten()
