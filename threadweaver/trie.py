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

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from threadweaver.format import Format
from threadweaver.layout import ThreadPath, spans
from threadweaver.tree import Node

IGNORE_INDEX = -100
"""The label of a token no loss is taken on: PyTorch's cross-entropy default, and what Hugging Face trainers use."""


class TokenTrie:
    """A forest of token paths; a token is trained if any path that reaches it trains it."""

    def __init__(self) -> None:
        self._token: list[int] = []
        self._parent: list[int] = []
        self._trained: list[bool] = []
        self._depth: list[int] = []
        self._children: list[dict[int, int]] = []
        self._roots: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._token)

    def extend(self, node: int, ids: Sequence[int], trained: bool) -> int:
        """Walk (creating as needed) ``ids`` below ``node`` (-1: the root); return the last node."""
        children = self._children[node] if node >= 0 else self._roots
        depth = self._depth[node] + 1 if node >= 0 else 0
        for token in ids:
            child = children.get(token)
            if child is None:
                child = len(self._token)
                self._token.append(token)
                self._parent.append(node)
                self._depth.append(depth)
                self._trained.append(False)
                self._children.append({})
                children[token] = child
            if trained:
                self._trained[child] = True
            node, children, depth = child, self._children[child], depth + 1
        return node

    def add_trajectory(
        self,
        prompt: Sequence[int],
        nodes: Sequence[Node],
        fmt: Format,
        *,
        train_injected: bool = False,
        closed_threads: Collection[ThreadPath] = (),
    ) -> None:
        """Every request of the trajectory ``prompt`` + ``nodes``, in one pass over its layout.

        The same trie as inserting each (context, completion) of
        :func:`threadweaver.requests.plan_requests`, in O(trie size) rather than O(sum of
        request lengths), which grows with the square of the number of blocks. A cursor
        follows each request path that is being laid out: the trajectory's own sequential
        path, and from the fork of each block a branch per thread 2..k (thread 1 shares
        its parent's path). A token is trained on the path whose request generated it:
        the cursor that started at its sequence or at a thread-1 ancestor of it.
        ``closed_threads``: paths (as in :class:`~threadweaver.orchestrator.Trajectory`)
        whose ``</Thread>`` was injected, not generated; it is not trained.
        """
        cursors = {(): self.extend(-1, prompt, False)}
        """Per request path being laid out (its first thread's path; ``()``: the trajectory's own), its last node."""
        forks: dict[ThreadPath, int] = {}
        """Per block (its thread 1's path): the node after its first ``<Thread>``, where threads 2..k branch."""
        for span in spans(nodes, fmt.tags, closed_threads):
            owner = _owner(span.path)
            branch = span.kind == "open" and span.path[-1][1] != 1
            for base, node in cursors.items():
                own = base == owner
                # train_injected trains the injected tokens of the trajectory's own path (a
                # closing </Thread> only where that path owns the thread)
                injected = train_injected and not base and not span.generated and (own or span.kind != "close")
                cursors[base] = self.extend(node, span.ids, (own and span.generated) or injected)
            if branch:
                cursors[span.path] = forks[(*span.path[:-1], (span.path[-1][0], 1))]
            elif span.kind == "open":
                forks[span.path] = cursors[owner]
            elif span.kind == "close":
                cursors.pop(span.path, None)

    def flatten(self) -> FlatTrie:
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

    def labels(self, ignore_index: int = IGNORE_INDEX) -> list[int]:
        """Causal-LM labels (the trainer shifts them): a trained token where its parent
        is the previous position, ``ignore_index`` elsewhere.

        Raises if a trained token is not its parent's first child, which happens only
        when one position has two trained continuations; use :meth:`targets` then.
        """
        stray = next((i for i, p in enumerate(self.parent) if self.trained[i] and 0 <= p != i - 1), None)
        if stray is not None:
            raise ValueError(
                f"trained token {stray} is not predicted from position {stray - 1} (its parent is "
                f"{self.parent[stray]}): a position with two trained continuations needs targets()"
            )
        return ([ignore_index] + self.targets(ignore_index))[: len(self.input_ids)]

    def targets(self, ignore_index: int = IGNORE_INDEX) -> list[int]:
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

    def truncate(self, max_length: int) -> FlatTrie:
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


def _owner(path: ThreadPath) -> ThreadPath:
    """The request path a sequence's generated tokens belong to: thread 1 shares its parent's."""
    while path and path[-1][1] == 1:
        path = path[:-1]
    return path


def trajectory_trie(
    prompt: Sequence[int],
    nodes: Sequence[Node],
    fmt: Format,
    *,
    train_injected: bool = False,
    closed_threads: Collection[tuple] = (),
) -> FlatTrie:
    """The flattened trie of one trajectory's requests.

    Completion tokens are trained; contexts are not, so the copies of threads 2..k in
    the continuation's context (which attend to the threads before them, a conditioning
    inference never uses) carry no loss. With ``train_injected`` the orchestrator's
    injected tokens on the trajectory's own sequential path are trained too, so the
    model also writes them itself when it is run with branching off (SFT default).
    Several trajectories (a group of samples) share one :class:`TokenTrie` through
    :meth:`TokenTrie.add_trajectory`.
    """
    trie = TokenTrie()
    trie.add_trajectory(prompt, nodes, fmt, train_injected=train_injected, closed_threads=closed_threads)
    return trie.flatten()
