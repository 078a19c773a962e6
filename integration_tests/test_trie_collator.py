"""TrieCollator and the tree-attention switch, with the real Qwen tokenizer and transformers."""

import logging
import subprocess
import sys

import pytest
import torch

from threadweaver.hf_collator import (
    RowFormatError,
    TreeAttentionError,
    TrieCollator,
    check_tree_attention,
    use_tree_attention,
)
from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
from threadweaver.kit.tokenizers import qwen_tokenizer

TRAJECTORY = (
    "<think>\nTwo parts.<Parallel><Outlines><Outline>1: a</Outline><Outline>2: b</Outline></Outlines>"
    "<Thread>1: a is 2</Thread><Thread>2: b is 3</Thread></Parallel>\nSo 5.</think>\n\\boxed{5}"
)
QUESTION = "a=2, b=3. a+b?"


def chat(row_id, trajectory=TRAJECTORY, question=QUESTION):
    return {
        "id": row_id,
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": trajectory}],
    }


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def collator(tokenizer):
    return TrieCollator(tokenizer)


def test_every_row_shape_flattens_to_the_same_trie(tokenizer, collator):
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids, trajectory_ids = collator.encode(chat("m"))
    shapes = [
        chat("messages"),
        {
            "prompt": [{"role": "user", "content": QUESTION}],
            "completion": [{"role": "assistant", "content": TRAJECTORY}],
        },
        {"prompt": prompt_text, "completion": TRAJECTORY},
        {"text": prompt_text + TRAJECTORY + "<|im_end|>\n"},
        {"prompt_ids": prompt_ids, "completion_ids": trajectory_ids},
    ]
    flats = [collator.flatten(row) for row in shapes]
    assert all(f == flats[0] for f in flats)
    assert trajectory_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_only_trajectory_tokens_are_trained(tokenizer, collator):
    prompt, trajectory = collator.encode(chat("r"))
    flat = collator.flatten(chat("r"))
    trained = [i for i, label in enumerate(flat.labels) if label != -100]
    # every trajectory token once (train_injected), none of the prompt
    assert len(trained) == len(trajectory)
    assert min(flat.position_ids[i] for i in trained) == len(prompt)
    untrained_injected = TrieCollator(tokenizer, train_injected=False).flatten(chat("r"))
    assert sum(label != -100 for label in untrained_injected.labels) < len(trajectory)


def test_batch_is_padded_with_self_only_attention(collator):
    short = chat("short", "<think>\nNo branching.</think>\n\\boxed{5}")
    batch = collator([chat("long"), short])
    n = len(collator.flatten(short).input_ids)
    length = batch["input_ids"].shape[1]
    assert n < length
    assert batch["attention_mask"][1].tolist() == [1] * n + [0] * (length - n)
    assert batch["labels"][1, n:].eq(-100).all()
    assert batch["subtree_end"][1, n:].tolist() == list(range(n + 1, length + 1))
    assert batch["subtree_end"].dtype == torch.int32


def test_max_length_cuts_an_ancestor_closed_prefix(tokenizer):
    full = TrieCollator(tokenizer).flatten(chat("r"))
    cut = TrieCollator(tokenizer, max_length=60).flatten(chat("r"))
    assert cut.input_ids == full.input_ids[:60]
    assert max(cut.subtree_end) <= 60
    assert cut.labels == full.labels[:60]


def test_sequential_mode_is_plain_causal(tokenizer):
    collator = TrieCollator(tokenizer, branching=False)
    prompt, trajectory = collator.encode(chat("r"))
    batch = collator([chat("r")])
    assert "subtree_end" not in batch
    assert batch["input_ids"][0].tolist() == prompt + trajectory
    assert batch["labels"][0].tolist() == [-100] * len(prompt) + trajectory
    assert batch["position_ids"][0].tolist() == list(range(len(prompt) + len(trajectory)))


def test_padding_free_packs_each_row_as_its_own_tree(tokenizer, collator):
    """One row, no padding: the rows' tokens one after another, and its tree mask the rows' own
    masks on the diagonal (no token sees another row's), also cut at ``pad_to_multiple_of``."""
    from threadweaver.hf_collator.attention import tree_bool_mask

    rows = three_rows()
    padded = collator(rows)
    lengths = padded["attention_mask"].sum(1).tolist()
    packed = TrieCollator(tokenizer, padding_free=True, pad_to_multiple_of=64)(rows)
    total = sum(lengths)
    length = packed["input_ids"].shape[1]
    assert packed["input_ids"].shape[0] == 1 and length == -(-total // 64) * 64 > total
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(packed[key][0, :total], torch.cat([padded[key][b, :n] for b, n in enumerate(lengths)]))
    assert packed["attention_mask"][0].tolist() == [1] * total + [0] * (length - total)
    own = [tree_bool_mask(padded["subtree_end"][b : b + 1, :n])[0, 0] for b, n in enumerate(lengths)]
    padding = torch.eye(length - total, dtype=torch.bool)
    assert torch.equal(tree_bool_mask(packed["subtree_end"])[0, 0], torch.block_diag(*own, padding))


def test_padding_free_plain_rows_are_separate_sequences_to_the_model(tokenizer):
    """Plain rows carry no tree: packed, their positions restart and no attention_mask is sent, from
    which transformers finds the sequences (TRL's padding-free batches) in a training forward, without
    a KV cache (TRL's ``compute_loss`` passes ``use_cache=False``): the logits are each row's own."""
    collator = TrieCollator(tokenizer, branching=False, padding_free=True)
    rows = [chat("a"), chat("c", "<think>\nshort</think>\n\\boxed{5}")]
    packed = collator(rows)
    assert "attention_mask" not in packed and "subtree_end" not in packed
    model = tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=2, intermediate_size=128)).eval()
    with torch.no_grad():
        logits = model(**packed, use_cache=False).logits[0]
        start = 0
        for row in rows:
            ids = torch.tensor([collator.flatten(row).input_ids])
            n = ids.shape[1]
            assert packed["position_ids"][0, start : start + n].tolist() == list(range(n))
            torch.testing.assert_close(logits[start : start + n], model(ids).logits[0], rtol=0, atol=1e-5)
            start += n
        assert start == packed["input_ids"].shape[1]


MALFORMED = TRAJECTORY.replace("<Thread>2: b is 3</Thread>", "<Thread>3: b is 3</Thread>")


def test_malformed_row_names_the_row_and_token_position(collator):
    with pytest.raises(RowFormatError) as err:
        collator([chat("good"), chat("bad-7", MALFORMED)])
    assert err.value.row == "bad-7"
    assert isinstance(err.value.position, int)
    assert str(err.value).startswith("row bad-7: trajectory token ")
    assert "<Thread>" in str(err.value)


def test_skipped_row_is_logged_and_the_rest_of_the_batch_kept(tokenizer, caplog):
    collator = TrieCollator(tokenizer, skip_malformed=True)
    other = chat("other", TRAJECTORY.replace("is 3", "is three"))
    with caplog.at_level(logging.WARNING):
        batch = collator([chat("good"), chat("bad-7", MALFORMED), other])
    clean = TrieCollator(tokenizer)([chat("good"), other])
    assert collator.skipped == 1
    assert "bad-7" in caplog.text and "1 skipped so far" in caplog.text
    assert batch.keys() == clean.keys()
    assert all(torch.equal(batch[k], clean[k]) for k in batch)
    with pytest.raises(RowFormatError, match="every row of the batch is malformed"):
        collator([chat("bad-8", MALFORMED)])


def test_a_row_without_prompt_is_refused(collator):
    with pytest.raises(RowFormatError, match="empty prompt"):
        collator([{"id": "x", "prompt": "", "completion": TRAJECTORY}])


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=1, intermediate_size=128)).eval()


def test_a_flash_attention_model_is_caught_and_switched_to_the_varlen_trie(tiny):
    """flash_attention_* alone would let sibling threads see each other; the switch runs its varlen kernel."""
    tiny.config._attn_implementation = "flash_attention_2"  # as loaded; flash-attn is not installed here
    with pytest.raises(TreeAttentionError, match="sibling threads would silently attend"):
        check_tree_attention(tiny)
    use_tree_attention(tiny)
    assert tiny.config._attn_implementation == "threadweaver_varlen"
    check_tree_attention(tiny)
    tiny.set_attn_implementation("sdpa")


def test_plain_attention_is_caught_before_training(tiny):
    tiny.set_attn_implementation("sdpa")
    with pytest.raises(TreeAttentionError, match="ignores the trie"):
        check_tree_attention(tiny)
    use_tree_attention(tiny)
    check_tree_attention(tiny)
    assert tiny.config._attn_implementation == "threadweaver_sdpa"
    tiny.set_attn_implementation("sdpa")


@pytest.mark.parametrize(("backend", "tree"), [("sdpa", None), ("eager", None), ("sdpa", "varlen")])
def test_without_a_tree_the_model_generates_exactly_as_before(tiny, collator, backend, tree):
    """Generation (no subtree_end, padded batch, KV cache) is untouched by the switch."""
    batch = collator.tokenizer([QUESTION, "a+b?"], return_tensors="pt", padding=True, padding_side="left")
    tiny.set_attn_implementation(backend)
    plain = tiny.generate(**batch, max_new_tokens=8, do_sample=False)
    use_tree_attention(tiny, tree)
    tree = tiny.generate(**batch, max_new_tokens=8, do_sample=False)
    tiny.set_attn_implementation("sdpa")
    assert torch.equal(plain, tree)


def test_a_tree_batch_refuses_a_kv_cache(tiny, collator):
    batch = collator([chat("r")])
    use_tree_attention(tiny)
    with torch.no_grad():
        out = tiny(**batch, use_cache=True)
        with pytest.raises(TreeAttentionError, match="without a KV cache"):
            tiny(
                input_ids=batch["input_ids"][:, -1:],
                subtree_end=batch["subtree_end"],
                past_key_values=out.past_key_values,
            )
    tiny.set_attn_implementation("sdpa")


def test_compiled_block_mask_is_the_tree(collator):
    """The GPU path compiles create_block_mask; on CPU it compiles too (a few seconds)."""
    from torch.nn.attention.flex_attention import create_mask

    from threadweaver.hf_collator.attention import tree_block_mask, tree_bool_mask

    end = collator([chat("a"), chat("b", "<think>\nshort</think>\n\\boxed{5}")])["subtree_end"]
    compiled, eager = tree_block_mask(end, compile=True), tree_block_mask(end, compile=False)
    assert torch.equal(compiled.to_dense(), eager.to_dense())
    n = end.shape[-1]
    assert torch.equal(create_mask(compiled.mask_mod, 2, 1, n, n, device="cpu"), tree_bool_mask(end))


def test_the_split_mask_is_the_tree(collator):
    """threadweaver_flex's mask: causal up to the first leaf of every row, the BlockMask after it."""
    from torch.nn.attention.flex_attention import create_mask

    from threadweaver.hf_collator.attention import split_tree_mask, tree_bool_mask

    end = collator([chat("a"), chat("b", "<think>\nshort</think>\n\\boxed{5}")])["subtree_end"]
    dense, split = tree_bool_mask(end), split_tree_mask(end, compile=False)
    n, head = end.shape[-1], split.head
    assert 0 < head < n
    assert torch.equal(dense[:, 0, :head, :head], torch.ones(2, head, head, dtype=torch.bool).tril())
    assert not dense[:, 0, :head, head:].any()
    assert torch.equal(create_mask(split.branches.mask_mod, 2, 1, n - head, n, device="cpu"), dense[:, :, head:])
    # The head is as long as it can be: in some row the next query misses a key before it.
    assert not dense[:, 0, head, : head + 1].all(dim=-1).all()


def _compiled_matches_the_dense_mask(tokenizer, backend: str, region: str | None, layers: int = 2) -> list[dict]:
    """Two batches of one shape, the same tokens under two trees (only the mask tells them apart), through
    the model compiled whole (``TrainingArguments(torch_compile=True)``) or a layer at a time (regional
    compilation) with ``aot_eager``, which traces what inductor compiles, or (``None``) not compiled: each
    must give the uncompiled dense mask's logits. ``use_cache=False`` as in training."""
    collator = TrieCollator(tokenizer, pad_to_multiple_of=160)
    first = collator([chat("a")])
    batches = [first, dict(first, subtree_end=collator([chat("b", NESTED_TWICE)])["subtree_end"])]
    config = TinyQwen3Config(hidden_size=64, num_hidden_layers=layers, intermediate_size=128)
    model = tiny_qwen3(tokenizer, config).eval()
    use_tree_attention(model, "sdpa")
    with torch.no_grad():
        expected = [model(**batch, use_cache=False).logits for batch in batches]
    assert (expected[0] - expected[1]).abs().max() > 0.01, "the two trees should give different logits"
    use_tree_attention(model, backend)
    torch._dynamo.reset()
    if region is None:
        compiled = model
    elif region == "model":
        compiled = torch.compile(model, backend="aot_eager")
    else:
        for layer in model.model.layers:
            layer.compile(backend="aot_eager")
        compiled = model
    with torch.no_grad():
        for batch, logits in zip(batches, expected):
            torch.testing.assert_close(compiled(**batch, use_cache=False).logits, logits, rtol=0, atol=1e-5)
    return batches


@pytest.mark.parametrize("region", ["model", "layers"])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
def test_compiled_tree_attention_has_no_graph_break_and_gives_each_batch_its_mask(tokenizer, backend, region):
    """A cache hit traced into a compiled layer used to hand the second batch the first one's mask, and the
    split's head length (``.item()``) broke the graph in every layer. FlexAttention's compiled kernels and
    its backward run on GPU only (bench/tree_attention_gpu.py)."""
    from torch._dynamo.utils import counters

    counters.clear()
    _compiled_matches_the_dense_mask(tokenizer, backend, region)
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("region", ["model", "layers"])
def test_compiled_varlen_plans_once_a_forward(tokenizer, monkeypatch, region):
    """threadweaver_varlen plans its segments on the host, which breaks the graph: under compile it makes
    one plan a forward, each batch of one shape its own, and the planning is never traced (its sizes are
    data: traced, it broke the graph at every step of it, three times as often in all)."""
    from threadweaver.hf_collator import attention

    plans, traced = [], []

    def counted_plan(subtree_end):
        plans.append(subtree_end)
        traced.append(torch.compiler.is_compiling())
        return plan(subtree_end)

    plan = attention.trie_plan
    monkeypatch.setattr(attention, "trie_plan", counted_plan)
    batches = _compiled_matches_the_dense_mask(tokenizer, "varlen", region, layers=3)
    assert len(plans) == len(batches), f"{len(plans)} plans for {len(batches)} forwards"
    assert all(end is batch["subtree_end"] for end, batch in zip(plans, batches))
    assert not any(traced), "the plan was traced"


@pytest.mark.parametrize("region", [None, "model", "layers"])
@pytest.mark.parametrize(
    ("backend", "builder"),
    [("sdpa", "tree_bool_mask"), ("eager", "tree_bool_mask"), ("flex_attention", "split_tree_mask")],
)
def test_one_tree_mask_a_forward(tokenizer, monkeypatch, backend, builder, region):
    """The first layer builds the tree mask and the others take it from the object transformers hands
    every layer of the forward as its attention_mask: once a forward, uncompiled and compiled (where the
    mask used to be built in every layer's graph), and each batch its own. The dense reference's
    forwards (sdpa) build ``tree_bool_mask`` too, and so does the eager mask."""
    from threadweaver.hf_collator import attention

    built = []
    build = getattr(attention, builder)

    def counted(*args, **kwargs):
        built.append(None)
        return build(*args, **kwargs)

    monkeypatch.setattr(attention, builder, counted)
    batches = _compiled_matches_the_dense_mask(tokenizer, backend, region, layers=3)
    forwards = 2 * len(batches) if builder == "tree_bool_mask" else len(batches)
    assert len(built) == forwards, f"{len(built)} masks built for {forwards} forwards"


NESTED_TWICE = (
    "<think>\nTwo parts.<Parallel><Outlines><Outline>1: a</Outline><Outline>2: b</Outline></Outlines>"
    "<Thread>1: a is 2</Thread><Thread>2: b needs <Parallel><Outlines><Outline>1: c</Outline><Outline>2: d"
    "</Outline></Outlines><Thread>1: c is 1</Thread><Thread>2: d is 2</Thread></Parallel> so 3</Thread>"
    "</Parallel>\nSo 5.</think>\n\\boxed{5}"
)
"""A block nested in a second thread: its branches have ancestors off the row's first path."""


def three_rows() -> list[dict]:
    """Rows of three lengths: one block, a block nested off the first path, and no block."""
    return [chat("a"), chat("b", NESTED_TWICE), chat("c", "<think>\nshort</think>\n\\boxed{5}")]


def test_flex_kernel_options_reach_every_layer_and_flash_runs_the_whole_tree(tokenizer, collator, monkeypatch):
    """``use_tree_attention``'s kernel options stay on the model (not in its config, which checkpoints save)
    and reach each layer's FlexAttention call.
    On the FLASH backend (FlashAttention 4) every query runs on one BlockMask, and no call asks for the
    log-sum-exp, which FA4's backward cannot differentiate through. The CPU has no FLASH backend: the spy
    records each call and hands the real kernel the rest, whose logits must be the dense mask's."""
    from transformers.integrations import flex_attention as integration

    from threadweaver.hf_collator.attention import KERNEL_OPTIONS, causal_head

    kernel, calls = integration.compile_friendly_flex_attention, []

    def recorded(query, key, value, **kwargs):
        calls.append((query.shape[2], kwargs))
        options = {k: v for k, v in (kwargs.get("kernel_options") or {}).items() if k != "BACKEND"}
        return kernel(query, key, value, **{**kwargs, "kernel_options": options or None})

    monkeypatch.setattr(integration, "compile_friendly_flex_attention", recorded)
    batch = collator(three_rows())
    n, head = batch["input_ids"].shape[1], causal_head(batch["subtree_end"])
    assert 0 < head < n
    model = tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=2, intermediate_size=128)).eval()
    use_tree_attention(model, "sdpa")
    with torch.no_grad():
        dense = model(**batch, use_cache=False).logits
    flash = {"BACKEND": "FLASH"}
    with pytest.raises(TreeAttentionError, match="kernel_options are FlexAttention's"):
        use_tree_attention(model, "sdpa", kernel_options=flash)
    for options, queries in ((flash, {n}), (None, {n}), ({}, {n - head})):
        use_tree_attention(model, "flex_attention", kernel_options=options)  # None keeps the model's
        calls.clear()
        with torch.no_grad():
            torch.testing.assert_close(model(**batch, use_cache=False).logits, dense, rtol=0, atol=1e-5)
        assert len(calls) == 2 and {length for length, _ in calls} == queries, calls
        expected = flash if options is None else options or None
        assert all(kwargs["kernel_options"] == expected for _, kwargs in calls), calls
        assert not any({"return_lse", "return_aux"} & kwargs.keys() for _, kwargs in calls), calls
        assert [getattr(layer.self_attn, KERNEL_OPTIONS) for layer in model.model.layers] == [expected] * 2
        assert KERNEL_OPTIONS not in model.config.to_json_string() and "FLASH" not in model.config.to_json_string()
    use_tree_attention(model, "flex_attention", kernel_options=flash)
    use_tree_attention(model, "sdpa")
    assert [getattr(layer.self_attn, KERNEL_OPTIONS) for layer in model.model.layers] == [None] * 2, "sdpa drops them"


def test_flex_training_on_cpu_names_the_backend_that_trains_there(tokenizer, collator):
    """FlexAttention has no backward on CPU (torch says only that): a library user is told what does."""
    batch = collator(three_rows())
    model = use_tree_attention(tiny_qwen3(tokenizer, TinyQwen3Config(num_hidden_layers=1)), "flex_attention")
    with pytest.raises(
        TreeAttentionError, match=r"no backward on CPU: train there with use_tree_attention\(model, 'sdpa'\)"
    ):
        model(**batch, use_cache=False)
    with torch.no_grad():
        assert model(**batch, use_cache=False).logits.isfinite().all()


def test_flex_and_varlen_run_in_the_autocast_dtype_as_mixed_precision_trains(tokenizer, collator, monkeypatch):
    """TRL's ``--bf16`` (``threadweaver sft`` on a GPU) trains float32 weights under autocast, where Qwen3's
    query and key norms hand back float32 beside a bf16 value: the tree's FlexAttention call and varlen's
    kernel get all three in autocast's dtype (FlashAttention 4 takes no float32; Triton flex would run a
    float32 kernel; torch casts them in FlexAttention's own autocast rule from 2.11 on only, after this
    call), and their logits are the dense mask's under the same autocast (``sdpa`` casts its own inputs)."""
    from transformers.integrations import flex_attention as integration

    from threadweaver.hf_collator import attention

    dtypes = []

    def recorded(kernel):
        def call(query, key, value, *args, **kwargs):
            dtypes.append((query.dtype, key.dtype, value.dtype))
            return kernel(query, key, value, *args, **kwargs)

        return call

    monkeypatch.setattr(
        integration, "compile_friendly_flex_attention", recorded(integration.compile_friendly_flex_attention)
    )
    monkeypatch.setattr(attention, "trie_attention", recorded(attention.trie_attention))
    batch = collator(three_rows())
    model = tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=2, intermediate_size=128)).eval()
    assert model.dtype == torch.float32
    logits = {}
    for backend in ("sdpa", "flex_attention", "varlen"):
        use_tree_attention(model, backend)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits[backend] = model(**batch, use_cache=False).logits.float()
    assert dtypes == [(torch.bfloat16,) * 3] * 4, dtypes  # two layers each of flex and of varlen's kernel
    for backend in ("flex_attention", "varlen"):
        torch.testing.assert_close(logits[backend], logits["sdpa"], rtol=0, atol=2e-2)


TORCH_2_11_TRACE_RULES = """
import sys, torch
from torch._dynamo.utils import counters
from threadweaver.hf_collator import TrieCollator, use_tree_attention
from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
from threadweaver.kit.tokenizers import qwen_tokenizer

torch._dynamo.disallow_in_graph(torch._C._is_autocast_available)  # torch 2.11's Dynamo cannot trace it
tokenizer = qwen_tokenizer()
row = {"id": "a", "messages": [{"role": "user", "content": sys.argv[1]}, {"role": "assistant", "content": sys.argv[2]}]}
batch = TrieCollator(tokenizer)([row])
model = tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=2, intermediate_size=128)).eval()
use_tree_attention(model, "flex_attention")
for layer in model.model.layers:
    layer.compile(backend="aot_eager")
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    model(**batch, use_cache=False)
print(sum(counters["graph_break"].values()), dict(counters["graph_break"]))
"""


def test_compiled_flex_tree_under_autocast_has_no_graph_break_under_torch_2_11s_trace_rules():
    """``threadweaver_flex`` reading autocast's dtype must not break a compiled layer's graph on any torch
    the ``hf`` extra allows. torch 2.11's Dynamo cannot trace ``torch.amp.is_autocast_available`` (2.13's
    can): a break there recompiled every layer past Dynamo's limit, and FA4 ran 0.80x causal on an H200.
    A subprocess marks that builtin as 2.11 does, since the rule would outlive the test in this one.
    (``threadweaver_varlen`` breaks the graph by design: its plan is data.)"""
    done = subprocess.run(
        [sys.executable, "-c", TORCH_2_11_TRACE_RULES, QUESTION, TRAJECTORY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split(" ", 1)[0] == "0", done.stdout  # graph breaks


def _visible_under(plan, tokens: int) -> torch.Tensor:
    """The [tokens, tokens] visibility the varlen plan's two calls give, one query at a time."""
    seen = torch.zeros(tokens, tokens, dtype=torch.bool)
    if plan.alone is not None:
        seen[plan.alone, plan.alone] = True
    for call in (plan.local, plan.shared):
        if call is None:
            continue
        queries = torch.arange(tokens) if call.query_index is None else call.query_index
        keys = queries if call.key_index is None else call.key_index
        for i in range(len(call.cu_q) - 1):
            q = queries[call.cu_q[i] : call.cu_q[i + 1]]
            k = keys[call.cu_k[i] : call.cu_k[i + 1]]
            for j, query in enumerate(q.tolist()):
                upto = len(k) - len(q) + j + 1 if call.causal else len(k)  # causal: aligned to the end
                assert not seen[query, k[:upto]].any(), "a key seen twice"
                seen[query, k[:upto]] = True
    return seen


def test_the_varlen_plan_is_the_tree(collator):
    """threadweaver_varlen's two calls see exactly the tree: padded rows, a block nested off the first path."""
    from threadweaver.hf_collator.attention import tree_bool_mask
    from threadweaver.hf_collator.segments import trie_plan

    collated = collator(three_rows())
    end = collated["subtree_end"]
    plan = trie_plan(end)
    assert plan.local.key_index is not None, "the nested block's branches see ancestors off the first path"
    assert plan.shared is not None and not plan.shared.causal
    padding = torch.nonzero(collated["attention_mask"].flatten() == 0).flatten()
    assert torch.equal(plan.alone, padding), "padding is left out of the kernel's calls"
    assert len(plan.local.query_index) + len(padding) == end.numel()
    batch, n = end.shape
    expected = torch.block_diag(*tree_bool_mask(end)[:, 0])
    assert torch.equal(_visible_under(plan, batch * n), expected)


def test_the_varlen_plan_of_left_padded_rows_is_the_tree_and_gathers_as_little(collator):
    """TRL's rows start with padding (each pad a leaf of its own): the first path starts after it, so
    a block's threads still see their prompt through the shared call, not as gathered ancestors."""
    from threadweaver.hf_collator.attention import tree_bool_mask
    from threadweaver.hf_collator.segments import trie_plan

    batch = collator(three_rows())
    end, real = batch["subtree_end"].long(), batch["attention_mask"].sum(1)
    n = end.shape[1]
    left = torch.stack([torch.cat([torch.arange(1, n - r + 1), end[b, :r] + n - r]) for b, r in enumerate(real)])
    assert int(real.min()) < n  # some row has padding to move to its left
    for rows in (left, left[[0, 2]]):
        plan = trie_plan(rows)
        expected = torch.block_diag(*tree_bool_mask(rows)[:, 0])
        assert torch.equal(_visible_under(plan, rows.numel()), expected)
    right, flat = trie_plan(end), trie_plan(left)
    assert len(flat.local.key_index) == len(right.local.key_index)  # the nested block's ancestors only
    assert torch.equal(flat.shared.cu_k, right.shared.cu_k) and torch.equal(flat.shared.cu_q, right.shared.cu_q)
    one_level = trie_plan(left[[0, 2]]).local  # one level of threads: no key off the first path
    assert torch.equal(one_level.key_index, one_level.query_index)


def test_the_varlen_plan_of_packed_rows_is_the_tree_and_gathers_as_little(tokenizer, collator):
    """``padding_free``: each packed row is a tree with its own first path, so its threads see their
    prompt through the shared call, as in a padded batch, and no token sees another row's."""
    from threadweaver.hf_collator.attention import tree_bool_mask
    from threadweaver.hf_collator.segments import trie_plan

    rows = three_rows()
    end = TrieCollator(tokenizer, padding_free=True)(rows)["subtree_end"]
    packed, padded = trie_plan(end), trie_plan(collator(rows)["subtree_end"])
    assert torch.equal(_visible_under(packed, end.shape[1]), tree_bool_mask(end)[0, 0])
    assert len(packed.local.key_index) == len(padded.local.key_index)  # the nested block's ancestors only
    assert torch.equal(packed.shared.cu_k, padded.shared.cu_k) and torch.equal(packed.shared.cu_q, padded.shared.cu_q)


def test_varlen_attention_and_its_gradients_equal_the_dense_mask(collator):
    """The plan's calls merged by log-sum-exp, and the backward against the merged output (CPU reference)."""
    from threadweaver.hf_collator.attention import tree_bool_mask
    from threadweaver.hf_collator.segments import trie_attention, trie_plan

    end = collator([chat("a"), chat("b", NESTED_TWICE)])["subtree_end"]
    batch, n = end.shape
    heads, kv_heads, dim = 4, 2, 8
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch * n, h, dim, generator=generator, requires_grad=True) for h in (heads, kv_heads, kv_heads)
    )
    grad = torch.randn(batch * n, heads, dim, generator=generator)
    out = trie_attention(q, k, v, trie_plan(end), 0.3)
    got = [out, *torch.autograd.grad(out, (q, k, v), grad)]

    def rows(x):
        return x.view(batch, n, -1, dim).transpose(1, 2)

    dense = torch.nn.functional.scaled_dot_product_attention(
        rows(q), rows(k), rows(v), attn_mask=tree_bool_mask(end), scale=0.3, enable_gqa=True
    )
    dense = dense.transpose(1, 2).reshape(batch * n, heads, dim)
    expected = [dense, *torch.autograd.grad(dense, (q, k, v), grad)]
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, expected):
        assert (a - b).abs().max() < 1e-5, name
