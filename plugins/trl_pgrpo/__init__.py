"""threadweaver.trl_pgrpo: P-GRPO for TRL.

``PGRPOTrainer(model, args=PGRPOConfig(...), train_dataset=...)`` trains with fork-join
rollouts (the shared orchestrator), one token-trie row per trajectory under the tree
mask, and the correctness + acceleration rewards (:func:`pgrpo_rewards`).
"""

from threadweaver.hosts import check_host

check_host("trl")  # before TRL is imported: an unsupported TRL is refused with the range, not a deep AttributeError

from threadweaver.trl_pgrpo.config import PGRPOConfig  # noqa: E402
from threadweaver.trl_pgrpo.rewards import pgrpo_rewards  # noqa: E402
from threadweaver.trl_pgrpo.trainer import PGRPOTrainer  # noqa: E402

__all__ = ["PGRPOConfig", "PGRPOTrainer", "pgrpo_rewards"]
