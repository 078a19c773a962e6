"""threadweaver.trl_pgrpo: P-GRPO for TRL.

``PGRPOTrainer(model, args=PGRPOConfig(...), train_dataset=...)`` trains with fork-join
rollouts (the shared orchestrator), one token-trie row per trajectory under the tree
mask, and the correctness + acceleration rewards (:func:`pgrpo_rewards`).
"""

from threadweaver.hosts import check_host, each_warning_once

check_host("trl")  # before TRL is imported: an unsupported TRL is refused with the range, not a deep AttributeError

with each_warning_once():  # TRL warns of vLLM's version from each of its modules that asks
    from threadweaver.trl_pgrpo.config import PGRPOConfig
    from threadweaver.trl_pgrpo.rewards import pgrpo_rewards
    from threadweaver.trl_pgrpo.trainer import PGRPOTrainer

__all__ = ["PGRPOConfig", "PGRPOTrainer", "pgrpo_rewards"]
