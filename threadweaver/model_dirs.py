"""A MODEL given as a local path, checked before anything loads.

transformers, handed a path that is not a model directory, fails late and far from the cause:
a missing path reads as a hub id ("Repo id must use alphanumeric chars"), a file as a pickle.
Every command that takes MODEL names what is wrong with it in one line instead.
"""

from __future__ import annotations

import os

from threadweaver.kit.tokenizers import hub_id

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "merges.txt")
"""A model directory's tokenizer, for AutoTokenizer: one of these files, or a vocabulary model
(``*.model``: sentencepiece's, ``*.tiktoken``)."""


def check_model_dir(
    model: str,
    *,
    contents: bool = True,
    weights: bool = True,
    what: str = "a model directory",
    gguf_advice: str = "`threadweaver prepare` makes a model directory of it",
) -> None:
    """Refuse a local ``model`` (``~`` expanded) that cannot be a transformers model directory, with a
    :class:`ValueError` naming it; a hub id (``org/name`` where no such path exists) is the hub's to judge.

    ``contents``: check what it holds, not only that it exists (off where the loader takes more than a
    transformers directory: vLLM also reads a GGUF file, Mistral's format, a tokenizer given apart).
    ``weights``: it must hold a model (``config.json``), not only a tokenizer. ``what``: what the command
    takes, for a file given in its place. ``gguf_advice``: what to do with a GGUF file the folder holds
    (``{name}``: its name)."""
    if hub_id(model):
        return
    path = os.path.expanduser(model)
    if not os.path.exists(path):
        raise ValueError(f"{model}: no such directory (a hub id reads org/name)")
    if not contents:
        return
    if not os.path.isdir(path):
        advice = f": {gguf_advice.format(name=os.path.basename(path))}" if path.endswith(".gguf") else ""
        raise ValueError(f"{model}: a file, not {what}{advice}")
    names = os.listdir(path)
    if weights and "config.json" not in names:
        ggufs = sorted(name for name in names if name.endswith(".gguf"))
        advice = f"; it holds {ggufs[0]}: {gguf_advice.format(name=ggufs[0])}" if ggufs else ""
        raise ValueError(f"{model}: not a model directory (no config.json){advice}")
    if not any(name in TOKENIZER_FILES or name.endswith((".model", ".tiktoken")) for name in names):
        raise ValueError(f"{model}: no tokenizer (tokenizer.json or tokenizer_config.json) in it")
