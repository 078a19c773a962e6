"""threadweaver.hf_collator: trie SFT for transformers and TRL (collator and attention-mask hook)."""
