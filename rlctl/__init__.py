"""rlctl: RL post-training of LLMs from a laptop to GKE, in one CLI."""

__version__ = "0.1.0"
