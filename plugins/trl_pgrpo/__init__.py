"""threadweaver.trl_pgrpo: P-GRPO for TRL (PGRPOConfig, PGRPOTrainer)."""
