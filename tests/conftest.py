import pytest
from chars import char_format

from threadweaver.format import Format


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
