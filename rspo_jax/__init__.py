"""rspo_jax: Reward-Swap Policy Optimization for multi-turn LLM agents, in
JAX."""

__version__ = "0.1.0"
