"""threadweaver.verl_rollout: the ThreadWeaver agent loop for unmodified verl."""
