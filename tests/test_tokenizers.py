"""The embedded kit's tokenizers: real Qwen ids, single-token tags, canonical encoding, add_tags."""

import pytest

from threadweaver.format import TAGS, Format, add_tags
from threadweaver.kit.tokenizers import QWEN3_FIRST_SPECIAL_ID, QWEN3_SPECIAL_TOKENS
from threadweaver.layout import render
from threadweaver.requests import plan_requests
from threadweaver.tree import Block, parse, parse_text

QWEN3_PUBLISHED_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<think>": 151667,
    "</think>": 151668,
}

TRAJECTORY = (
    "<think>\nWe use d = sqrt(dx^2 + dy^2).\n"
    "<Parallel>\n<Outlines>\n<Outline>1: Compute (dx)^2.</Outline>\n"
    "<Outline>2: Compute (dy)^2.</Outline>\n</Outlines>\n"
    "<Thread>\n1: dx = 2 - (-4) = 6, so (dx)^2 = 36.\n</Thread>\n"
    "<Thread> 2: dy = -6 - 3 = -9, so (dy)^2 = 81.\n</Thread>\n</Parallel>\n"
    "Sum: 36 + 81 = 117.\n</think>\nThe distance is \\boxed{3\\sqrt{13}}."
)


def test_qwen_special_ids_match_qwen3(qwen):
    for token, expected in QWEN3_PUBLISHED_IDS.items():
        assert qwen.convert_tokens_to_ids(token) == expected
    for offset, (token, _) in enumerate(QWEN3_SPECIAL_TOKENS):
        assert qwen.convert_tokens_to_ids(token) == QWEN3_FIRST_SPECIAL_ID + offset
    assert qwen.eos_token_id == 151645 and qwen.pad_token_id == 151643


def test_qwen_bpe_is_the_real_one(qwen):
    # "Hello world" is [9707, 1879] in every Qwen2/Qwen3 tokenizer
    assert qwen.encode("Hello world", add_special_tokens=False) == [9707, 1879]


@pytest.mark.parametrize("which", ["qwen", "synth"])
def test_tags_are_single_tokens_that_decode_back(which, request):
    tok = request.getfixturevalue(which)
    for tag in TAGS:
        ids = tok.encode(f"a{tag}b" if which == "qwen" else f"1{tag}2", add_special_tokens=False)
        assert len(ids) == 3, tag
        assert tok.decode(ids[1:2], skip_special_tokens=True) == tag


def test_chat_template_is_chatml_with_assistant_prompt(qwen):
    text = qwen.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    off = qwen.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == text + "<think>\n\n</think>\n\n"


def test_canonical_encoding_of_a_real_trajectory(qwen):
    fmt = Format.from_tokenizer(qwen)
    parsed = parse_text(TRAJECTORY, fmt)
    assert parsed.well_formed
    (block,) = [n for n in parsed.nodes if isinstance(n, Block)]
    assert [t.number for t in block.threads] == [1, 2]
    ids = render(parsed.nodes, fmt)
    text = fmt.decode(ids)
    # join-point whitespace and the space before a thread number are dropped, nothing else
    assert "</Outlines><Thread>1:" in text and "</Thread><Thread>2: dy" in text and "</Thread></Parallel>" in text
    assert text.replace("\n", "").replace(" ", "") == TRAJECTORY.replace("\n", "").replace(" ", "")
    assert fmt.encode(text) == ids
    # the orchestrator injects exactly <Thread> + encode("2:") before thread 2
    plan = plan_requests(qwen.encode("Q", add_special_tokens=False), parsed.nodes, fmt)
    thread2 = [r for r in plan.requests if r.thread_path == ((0, 2),)][0]
    assert thread2.context[-3:] == (fmt.tags.thread, *qwen.encode("2:", add_special_tokens=False))
    assert fmt.decode(thread2.completion).startswith(" dy = -6")


def test_unknown_characters_are_an_error_not_unk(synth):
    fmt = Format.from_tokenizer(synth)
    with pytest.raises(ValueError, match=r"cannot represent \['x'\]"):
        fmt.encode("A=1x2")


def test_missing_tags_are_named():
    from tokenizers import Tokenizer, models

    with pytest.raises(ValueError, match="<think>, </think>, <Parallel>.*add_tags"):
        Format.from_tokenizer(Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")))


def test_add_tags_grows_the_model_and_initialises_new_rows_from_the_mean():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3

    base = Tokenizer(
        models.WordLevel({c: i for i, c in enumerate("<>|abcdefgh :12")} | {"<unk>": 15}, unk_token="<unk>")
    )
    base.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=base, unk_token="<unk>", eos_token="|", pad_token="<")
    model = tiny_qwen3(
        tok,
        TinyQwen3Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
        ),
        vocab_size=len(tok),
    )
    old = model.get_input_embeddings().weight.detach().clone()
    new_ids = add_tags(tok, model, init="mean")
    assert len(new_ids) == len(TAGS) and model.get_input_embeddings().weight.shape[0] == len(tok)
    weight = model.get_input_embeddings().weight.detach()
    assert torch.equal(weight[: len(old)], old)
    for i in new_ids:
        assert torch.allclose(weight[i], old.mean(dim=0))
    assert add_tags(tok, model) == []
    fmt = Format.from_tokenizer(tok)
    assert parse(
        fmt.encode("ab<Parallel><Outlines><Outline>1:a</Outline></Outlines><Thread>1:b</Thread></Parallel>"), fmt
    ).well_formed


def test_rows_record_the_embedded_tokenizers_by_name_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """A folder ./synth (what `threadweaver synth --out synth` makes) turned the recorded name into its path,
    which no tokenizer loads from: every reader takes 'synth' for the embedded one."""
    from threadweaver.format import Format
    from threadweaver.kit.tokenizers import load_tokenizer

    monkeypatch.chdir(tmp_path)
    for name in ("synth", "qwen"):
        (tmp_path / name).mkdir()
        assert Format.from_tokenizer(load_tokenizer(name)).tokenizer_name == name


@pytest.mark.parametrize("given", ["qwen", "synth"], ids=["a name", "a tokenizers.Tokenizer"])
def test_add_tags_refuses_what_is_not_a_transformers_tokenizer_by_its_type(given):
    from threadweaver.format import add_tags
    from threadweaver.kit.tokenizers import synth_tokenizer_object

    tokenizer = synth_tokenizer_object() if given == "synth" else given
    with pytest.raises(TypeError, match=f"^add_tags needs a transformers tokenizer, not {type(tokenizer).__name__}$"):
        add_tags(tokenizer)
