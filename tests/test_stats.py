"""Latency statistics on a worked example, counted by hand."""

import json

from threadweaver.stats import LatencyStats, latency_stats
from threadweaver.tree import parse


def test_worked_example(fmt):
    # head: <Parallel> <Outlines> (<Outline> 1 : a </Outline>) x2 </Outlines> = 13 tokens
    text = (
        "xyz<Parallel><Outlines><Outline>1:a</Outline><Outline>2:b</Outline></Outlines>"
        "<Thread>1:aaaa</Thread><Thread>2:bb</Thread></Parallel>qq"
    )
    s = latency_stats(parse(fmt.encode(text), fmt).nodes, fmt.tags)
    assert s.total_tokens == 3 + 13 + (4 + 1) + (2 + 1) + 2
    assert s.critical_path_tokens == 3 + 13 + (4 + 1) + 2
    assert s.injected_tokens == 2 * (1 + 2) + 1  # <Thread> "i" ":" twice, </Parallel>
    assert s.thread_tokens == 8 and s.blocks == 1 and s.threads_per_block == (2,)
    assert abs(s.speedup - 26 / 23) < 1e-12
    # reference: everything outside thread interiors (incl. all thread tags and </Parallel>)
    # + the longest interior, which includes its "i:" prefix
    assert s.reference_total_tokens == len(fmt.encode(text))
    assert s.reference_longest_thread == 3 + 13 + 2 * 2 + 1 + (2 + 4) + 2


def test_nested_blocks_count_their_longest_thread(fmt):
    opening = "<Parallel><Outlines><Outline>1:</Outline><Outline>2:</Outline></Outlines>"
    inner = f"{opening}<Thread>1:aaaaaa</Thread><Thread>2:b</Thread></Parallel>"
    text = f"{opening}<Thread>1:{inner}c</Thread><Thread>2:dddd</Thread></Parallel>"
    s = latency_stats(parse(fmt.encode(text), fmt).nodes, fmt.tags)
    head = 1 + 1 + 2 * (1 + 2 + 1) + 1  # 11 tokens, both levels
    inner_critical = head + max(6, 1) + 1
    assert s.critical_path_tokens == head + max(inner_critical + 1 + 1, 4 + 1)
    assert s.critical_sequences == ((), ((0, 1),), ((0, 1), (0, 1)))  # thread 1, inside it thread 1.1
    assert s.max_depth == 2 and s.threads_per_block == (2, 2)
    one_after_another = latency_stats(parse(fmt.encode(text), fmt).nodes, concurrent_threads=False)
    assert one_after_another.critical_sequences == ((), ((0, 1),), ((0, 1), (0, 1)), ((0, 1), (0, 2)), ((0, 2),))
    assert one_after_another.critical_path_tokens == one_after_another.total_tokens
    # The reference's flat scan: the inner </Thread> ends the outer thread 1 (22 tokens: "1:", the
    # inner head, its <Thread> as text and "1:aaaaaa"); "<Thread>2:b</Thread>" is the outer block's
    # thread 2, and the inner </Parallel> closes the outer block (10 + 4 tags + 22). The rest is
    # outside any block: 13 tokens with the two <Parallel>/</Parallel> already counted.
    assert s.reference_longest_thread == 13 + (10 + 4 + 22)
    assert LatencyStats.from_dict(json.loads(json.dumps(s.as_dict()))) == s  # as a JSONL row keeps it


def test_sequential_output_has_speedup_one(fmt):
    s = latency_stats(parse(fmt.encode("just text"), fmt).nodes)
    assert (s.total_tokens, s.critical_path_tokens, s.speedup, s.blocks) == (9, 9, 1.0, 0)
    assert s.critical_sequences == ((),)
