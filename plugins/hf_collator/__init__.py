"""threadweaver.hf_collator: trie SFT for transformers and TRL.

Importing this package registers the ``threadweaver_sdpa``, ``threadweaver_eager``,
``threadweaver_flex`` and ``threadweaver_varlen`` attention implementations with transformers.
"""

from threadweaver.hf_collator.attention import (
    NAMES,
    TreeAttentionError,
    check_tree_attention,
    register,
    use_tree_attention,
)
from threadweaver.hf_collator.collator import RowFormatError, TrieCollator

register()

__all__ = [
    "NAMES",
    "RowFormatError",
    "TreeAttentionError",
    "TrieCollator",
    "check_tree_attention",
    "register",
    "use_tree_attention",
]
