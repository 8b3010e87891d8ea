"""Flax NNX Qwen2 / Llama decoders, scalar heads, HF IO and tokenizer."""

from rspo_jax.models.config import (
    LOCAL_TOKENIZER_PRESETS,
    PRESETS,
    ModelConfig,
    get_model_config,
    local_vocab_size,
)
from rspo_jax.models.heads import PRMHead, ProcessRewardModel, ValueModel
from rspo_jax.models.hf_io import (
    create_model,
    create_sharded_model,
    export_dtype,
    load_hf_model,
    save_hf_model,
)
from rspo_jax.models.tokenizer import (
    check_tokenizer_matches,
    load_tokenizer,
    train_tokenizer,
)
from rspo_jax.models.transformer import (
    KVCache,
    Transformer,
    init_cache,
    positions_from_mask,
    token_logprobs,
)

__all__ = [
    "LOCAL_TOKENIZER_PRESETS",
    "PRESETS",
    "KVCache",
    "ModelConfig",
    "PRMHead",
    "ProcessRewardModel",
    "Transformer",
    "ValueModel",
    "check_tokenizer_matches",
    "create_model",
    "create_sharded_model",
    "export_dtype",
    "get_model_config",
    "local_vocab_size",
    "init_cache",
    "load_hf_model",
    "load_tokenizer",
    "positions_from_mask",
    "save_hf_model",
    "token_logprobs",
    "train_tokenizer",
]
