"""Token tries flattened in pre-order, with O(N) tree metadata instead of an N x N mask.

Requests are inserted as token paths; shared prefixes are stored once. The flat layout
is a depth-first pre-order, so:

* ``position_ids`` is the depth, which equals the position the token has in its own
  request; RoPE sees exactly what it sees at inference;
* token ``q`` may attend to token ``kv`` iff ``kv <= q < subtree_end[kv]`` (``kv`` is
  ``q`` or one of its ancestors); any backend builds its mask from that rule;
* every prefix of the layout is ancestor-closed, so cutting at ``max_length`` never
  leaves a token without its context.

In a trie a token is predicted from its *parent's* hidden state, which is not the
previous flat position. :meth:`FlatTrie.targets` gives labels already shifted that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from threadweaver.requests import RequestPlan


class TokenTrie:
    """A forest of token paths; ``add`` marks which tokens of a path are trained."""

    def __init__(self) -> None:
        self._token: list[int] = []
        self._parent: list[int] = []
        self._trained: list[bool] = []
        self._children: list[dict[int, int]] = []
        self._roots: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._token)

    def add(self, ids: Sequence[int], trained: Sequence[bool]) -> None:
        if len(ids) != len(trained):
            raise ValueError(f"{len(ids)} tokens but {len(trained)} trained flags")
        children = self._roots
        parent = -1
        for token, train in zip(ids, trained):
            node = children.get(token)
            if node is None:
                node = len(self._token)
                self._token.append(token)
                self._parent.append(parent)
                self._trained.append(False)
                self._children.append({})
                children[token] = node
            if train:
                self._trained[node] = True
            parent, children = node, self._children[node]

    def flatten(self) -> "FlatTrie":
        order: list[int] = []
        stack = list(reversed(self._roots.values()))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self._children[node].values()))
        index = {node: i for i, node in enumerate(order)}
        parent = [index[self._parent[n]] if self._parent[n] >= 0 else -1 for n in order]
        depth = [0] * len(order)
        for i, p in enumerate(parent):
            if p >= 0:
                depth[i] = depth[p] + 1
        size = [1] * len(order)
        for i in range(len(order) - 1, 0, -1):
            if parent[i] >= 0:
                size[parent[i]] += size[i]
        return FlatTrie(
            input_ids=[self._token[n] for n in order],
            position_ids=depth,
            parent=parent,
            subtree_end=[i + s for i, s in enumerate(size)],
            trained=[self._trained[n] for n in order],
        )


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
