"""A one-character-per-token format for core tests (no tokenizer needed)."""

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
