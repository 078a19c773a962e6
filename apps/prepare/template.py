"""The chat template of a prepared model: what ThreadWeaver needs of it, checked by rendering.

ThreadWeaver's rows and its orchestrator take the prompt to be the chat template's rendering
of the user's turns *with the generation prompt*, and the trajectory to follow it as the model
writes it, ``<think>`` first (:mod:`threadweaver.rows`). So a template serves where, for a sample
conversation:

* it writes a generation prompt after the user's turn, that does not open ``<think>`` itself;
* the conversation with the assistant's turn renders as that prompt, then the trajectory as it is
  written (``<think>...</think>`` and the blocks inside it kept), then a token the orchestrator
  stops on (:data:`threadweaver.format.EOS_TOKENS`).

A model's own template that does all this is kept (Qwen3's, SmolLM2's ChatML). Otherwise, where the
tokenizer has ChatML's turn tokens, the template becomes the kit's ChatML with ``<think>``
(:data:`threadweaver.kit.chat_template.CHATML_THINK`); else ``prepare`` stops and asks for one.
"""

from __future__ import annotations

from threadweaver.format import EOS_TOKENS, THINK, block_text
from threadweaver.kit.chat_template import CHATML_THINK

CHATML_TURN_TOKENS = ("<|im_start|>", "<|im_end|>")
SAMPLE_PROMPT = [{"role": "user", "content": "What are 2+3 and 4+5?"}]
SAMPLE_TRAJECTORY = (
    f"{THINK}\nTwo sums.\n" + block_text([" 2+3", " 4+5"], [" 2+3=5", " 4+5=9"]) + "\nSo 5 and 9.\n</think>\n\n5 and 9"
)
"""A trajectory as the model writes it: what the template must render as it is."""


def faults(tokenizer, template: str | None = None) -> list[str]:
    """What keeps ``template`` (default: the tokenizer's own) from serving ThreadWeaver; empty where it serves."""
    template = template if template is not None else getattr(tokenizer, "chat_template", None)
    if not template:
        return ["there is none"]

    def render(messages, generation_prompt=False) -> str:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=generation_prompt
        )

    try:
        bare = render(SAMPLE_PROMPT)
        prompt = render(SAMPLE_PROMPT, True)
        conversation = render([*SAMPLE_PROMPT, {"role": "assistant", "content": SAMPLE_TRAJECTORY}])
    except Exception as err:  # a template is a program: jinja's errors, and the template's own raise_exception
        first = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
        return [f"it fails to render a conversation ({type(err).__name__}: {first})"]
    if not prompt.startswith(bare) or prompt == bare:
        return ["it writes no generation prompt after the user's turn"]
    found = []
    if THINK in prompt[len(bare) :]:
        found.append(f"its generation prompt opens {THINK} itself, where the model writes it")
    if not conversation.startswith(prompt + SAMPLE_TRAJECTORY):
        found.append(
            f"it does not render the assistant's turn as the generation prompt, then the reasoning as written "
            f"({THINK}...</think> and the blocks in it)"
        )
    elif not conversation[len(prompt + SAMPLE_TRAJECTORY) :].startswith(EOS_TOKENS):
        end = conversation[len(prompt + SAMPLE_TRAJECTORY) :][:20]
        found.append(
            f"it ends the assistant's turn with {end!r}, not with a token the orchestrator stops on "
            f"({', '.join(EOS_TOKENS)})"
        )
    return found


def has_chatml_turns(tokenizer) -> bool:
    """Whether the tokenizer has ChatML's turn tokens, each a token of its own."""
    vocab = tokenizer.get_vocab()
    return all(t in vocab and tokenizer.encode(t, add_special_tokens=False) == [vocab[t]] for t in CHATML_TURN_TOKENS)


def choose(tokenizer, given: str | None = None, given_name: str = "") -> tuple[str, str]:
    """(the template to save, a line saying what was done and why); raises ``ValueError`` where no
    template serves. ``given``: a template the user chose (from the file ``given_name``), checked as it is."""
    if given is not None:
        found = faults(tokenizer, given)
        if found:
            raise ValueError(f"{given_name}: the chat template does not serve ThreadWeaver: {'; '.join(found)}")
        return given, f"chat template: {given_name}, as given (renders {THINK}...</think> and a generation prompt)"
    own = faults(tokenizer)
    if not own:
        prompt = _generation_prompt(tokenizer)
        return tokenizer.chat_template, (
            f"chat template: the model's own, kept (renders the reasoning inside {THINK}...</think> as written; "
            f"generation prompt {prompt!r})"
        )
    if not has_chatml_turns(tokenizer):
        raise ValueError(
            f"the model's chat template does not serve ThreadWeaver ({'; '.join(own)}), and its tokenizer has no "
            "ChatML turn tokens for the default one: write a template that does (see `threadweaver prepare --help`) "
            "and pass it with --chat-template FILE"
        )
    return CHATML_THINK, (
        f"chat template: replaced by ChatML with {THINK} (threadweaver.kit.chat_template.CHATML_THINK), as the "
        f"model's own does not serve: {'; '.join(own)}"
    )


def _generation_prompt(tokenizer) -> str:
    bare = tokenizer.apply_chat_template(SAMPLE_PROMPT, tokenize=False)
    return tokenizer.apply_chat_template(SAMPLE_PROMPT, tokenize=False, add_generation_prompt=True)[len(bare) :]
