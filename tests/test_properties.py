"""Properties over random nested trajectories (hypothesis)."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from trees import FMT, all_blocks, prompts, sequences

from threadweaver.layout import render
from threadweaver.requests import plan_requests
from threadweaver.stats import latency_stats
from threadweaver.tree import Text, parse
from threadweaver.trie import TokenTrie, trajectory_trie

settings.register_profile("ci", max_examples=150, deadline=None)
settings.load_profile("ci")


@given(sequences())
def test_parse_render_round_trip(tree):
    ids = render(tree, FMT)
    parsed = parse(ids, FMT, strict=True)
    assert parsed.nodes == tree
    assert parsed.faults == ()
    assert render(parsed.nodes, FMT) == ids


@given(sequences())
def test_text_round_trip_through_canonical_encoding(tree):
    ids = render(tree, FMT)
    assert FMT.encode(FMT.decode(ids)) == ids


@given(prompts, sequences())
def test_requests_reconstruct_the_trajectory(prompt, tree):
    plan = plan_requests(prompt, tree, FMT)
    final = plan.requests[-1]
    assert final.context + final.completion == prompt + plan.trajectory
    covered = [0] * len(plan.trajectory)
    for r in plan.requests:
        assert r.completion == plan.trajectory[r.start : r.start + len(r.completion)]
        assert r.context[: len(prompt)] == prompt
        for i in range(r.start, r.start + len(r.completion)):
            covered[i] += 1
    # every generated token comes from exactly one request; injected ones from none
    assert covered == [1 if g else 0 for g in plan.generated]
    assert sum(not g for g in plan.generated) == sum(
        1 + sum(1 + len(t.seed) for t in b.threads) for b in all_blocks(tree)
    )


@given(prompts, sequences())
def test_each_request_starts_after_a_seed_or_a_join(prompt, tree):
    plan = plan_requests(prompt, tree, FMT)
    tags, first = FMT.tags, set()
    for r in plan.requests:
        if r.thread_path not in first:
            first.add(r.thread_path)
            expected = (tags.thread,) + FMT.seed(r.thread_path[-1][1]) if r.thread_path else ()
            assert r.context[len(r.context) - len(expected) :] == expected
            if not r.thread_path:
                assert r.context == prompt
        else:
            assert r.context[-1] == tags.parallel_end
        stop_tag = {"outlines": tags.outlines_end, "thread": tags.thread_end}.get(r.stop)
        if stop_tag is not None:
            assert r.completion[-1] == stop_tag


def _ancestor_path(flat, q):
    return [flat.input_ids[kv] for kv in range(len(flat)) if flat.attends(q, kv)]


@given(prompts, sequences(max_depth=2))
def test_trie_ancestors_are_exactly_the_request_context(prompt, tree):
    plan = plan_requests(prompt, tree, FMT)
    flat = trajectory_trie(prompt, tree, FMT)
    paths, index = [], {}
    for i, token in enumerate(flat.input_ids):
        paths.append((paths[flat.parent[i]] if flat.parent[i] >= 0 else ()) + (token,))
        index[paths[i]] = i
    for r in plan.requests:
        for j in range(len(r.completion)):
            path = r.context + r.completion[: j + 1]
            q = index[path]
            assert flat.trained[q]
            assert _ancestor_path(flat, q) == list(path)
    # trained tokens are exactly the generated ones, each once
    assert sum(flat.trained) == sum(plan.generated)


@given(prompts, sequences())
def test_every_prefix_is_ancestor_closed(prompt, tree):
    flat = trajectory_trie(prompt, tree, FMT, train_injected=True)
    assert all(p < i for i, p in enumerate(flat.parent))
    for m in range(0, len(flat) + 1, max(1, len(flat) // 7)):
        cut = flat.truncate(m)
        for q in range(m):
            ancestors = {kv for kv in range(m) if cut.attends(q, kv)}
            chain, node = set(), q
            while node >= 0:
                chain.add(node)
                node = cut.parent[node]
            assert ancestors == chain


@given(prompts, sequences())
def test_train_injected_trains_the_whole_sequential_path_without_conflicts(prompt, tree):
    plan = plan_requests(prompt, tree, FMT)
    for train_injected in (False, True):
        flat = trajectory_trie(prompt, tree, FMT, train_injected=train_injected)
        targets = flat.targets()
        assert sum(t != -100 for t in targets) == sum(flat.trained)
        for i, p in enumerate(flat.parent):
            if flat.trained[i]:
                assert targets[p] == flat.input_ids[i]
    assert sum(flat.trained) == len(plan.trajectory)


@given(prompts, sequences())
def test_trained_first_layout_makes_plain_causal_labels_exact(prompt, tree):
    """labels() shifted by one position is targets(): any trainer's own shift is right."""
    for train_injected in (False, True):
        flat = trajectory_trie(prompt, tree, FMT, train_injected=train_injected)
        labels = flat.labels()
        assert labels[1:] + [-100] == flat.targets()
        assert labels[0] == -100


@given(prompts, sequences(), sequences(), st.booleans())
def test_direct_construction_equals_inserting_every_request(prompt, tree, other, train_injected):
    """The tree walk builds exactly the trie of all (context, completion) paths, same trained
    tokens; two trajectories (a group of samples) share their prompt in one trie."""
    trie = TokenTrie()
    for nodes in (tree, other):
        trie.add_trajectory(prompt, nodes, FMT, train_injected=train_injected)
    flat = trie.flatten()
    paths = {}
    for i, p in enumerate(flat.parent):
        paths[i] = (paths[p] if p >= 0 else ()) + (flat.input_ids[i],)
    naive, trained = set(), set()
    for nodes in (tree, other):
        plan = plan_requests(prompt, nodes, FMT)
        for r in plan.requests:
            ids = r.context + r.completion
            naive.update(ids[:k] for k in range(1, len(ids) + 1))
            trained.update(ids[:k] for k in range(len(r.context) + 1, len(ids) + 1))
        if train_injected:
            ids = prompt + plan.trajectory
            trained.update(ids[: len(prompt) + k + 1] for k, g in enumerate(plan.generated) if not g)
    assert set(paths.values()) == naive and len(paths) == len(naive)
    assert {paths[i] for i in range(len(flat)) if flat.trained[i]} == trained


def _all_path_lengths(nodes):
    """Every root-to-leaf chain of generated tokens, enumerated (no dynamic programming)."""
    options = []
    for node in nodes:
        if isinstance(node, Text):
            options.append([len(node.ids)])
        else:
            options.append([len(node.head) + 1 + n for thread in node.threads for n in _all_path_lengths(thread.body)])
    return [sum(choice) for choice in itertools.product(*options)] if options else [0]


@given(sequences(max_depth=2))
def test_critical_path_is_the_brute_force_longest_path(tree):
    stats = latency_stats(tree)
    assert stats.critical_path_tokens == max(_all_path_lengths(tree))
    plan = plan_requests((), tree, FMT)
    assert stats.total_tokens == sum(plan.generated)
    assert stats.injected_tokens == len(plan.trajectory) - stats.total_tokens
