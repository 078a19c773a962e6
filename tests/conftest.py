import pytest

from threadweaver.format import TAGS, Format, TagIds


class CharCodec:
    """One token per character (its code point); tags are ids 1000..1009."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) if i < 1000 else TAGS[i - 1000] for i in ids)


EOS = 999


def char_format() -> Format:
    return Format(CharCodec(), TagIds.from_lookup({t: 1000 + i for i, t in enumerate(TAGS)}.get), eos_ids=[EOS])


@pytest.fixture(scope="session")
def fmt() -> Format:
    return char_format()


@pytest.fixture(scope="session")
def qwen():
    from threadweaver.kit.tokenizers import qwen_tokenizer

    return qwen_tokenizer()


@pytest.fixture(scope="session")
def synth():
    from threadweaver.kit.tokenizers import synth_tokenizer

    return synth_tokenizer()
