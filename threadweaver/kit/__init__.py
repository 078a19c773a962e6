"""The embedded default kit: tokenizers, chat template and tiny Qwen3 models, built offline."""
