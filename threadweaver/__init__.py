"""threadweaver: adaptive parallel reasoning (ThreadWeaver) for the frameworks you already use.

The core is host-free and light: ``import threadweaver`` imports no torch, transformers
or host framework. The core API is re-exported here lazily (the reward function lives
at ``threadweaver.reward.reward``: a name that is also a submodule cannot be re-exported).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"  # the one declaration: pyproject.toml reads it (statically) from here

_EXPORTS = {
    "Format": "threadweaver.format",
    "TAGS": "threadweaver.format",
    "add_tags": "threadweaver.format",
    "parse": "threadweaver.tree",
    "parse_text": "threadweaver.tree",
    "render": "threadweaver.layout",
    "TrajectoryFormatError": "threadweaver.tree",
    "plan_requests": "threadweaver.requests",
    "trajectory_trie": "threadweaver.trie",
    "latency_stats": "threadweaver.stats",
    "Orchestrator": "threadweaver.orchestrator",
    "Limits": "threadweaver.orchestrator",
    "Sampling": "threadweaver.orchestrator",
    "RewardConfig": "threadweaver.reward",
    "grade": "threadweaver.reward",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'threadweaver' has no attribute {name!r}")
