"""Model configuration for the Qwen2 / Llama decoder, and named presets.

One frozen dataclass describes both families; ``from_hf_dict`` /
``to_hf_dict`` convert to and from a Hugging Face ``config.json`` (old style
``rope_theta`` + ``rope_scaling`` and transformers-v5 ``rope_parameters`` are
both read, and both written).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from flax.core import FrozenDict

from rspo_jax import sharding

FAMILIES = ("qwen2", "llama")
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}  # name -> bytes
ATTENTION = ("auto", "xla", "cudnn", "splash", "plain")
# rollout.sglang_lora_sync: how a LoRA policy reaches SGLang servers
# (build.sglang_sync_fn): the adapter, the merged model, or the adapter
# with the merged model as the fallback.
LORA_SYNCS = ("auto", "adapter", "merged")
# Activation checkpointing of the learner's blocks, lightest recompute first
# (transformer.py): 'none' keeps every block's internals, 'dots' keeps the
# weight matmuls' outputs (jax.checkpoint_policies.
# dots_with_no_batch_dims_saveable) and recomputes the rest, 'full' keeps
# only each block's input.
REMAT_POLICIES = ("none", "dots", "full")


def remat_policy(value) -> str:
  """``value`` as one of REMAT_POLICIES; the old bools (and their strings,
  as a command line gives them) still mean False -> 'none', True ->
  'full'. ValueError for anything else."""
  if isinstance(value, str) and value.strip().lower() in ("true", "false"):
    value = value.strip().lower() == "true"
  if isinstance(value, bool):
    return "full" if value else "none"
  if isinstance(value, str) and value.strip().lower() in REMAT_POLICIES:
    return value.strip().lower()
  raise ValueError(
      f"remat {value!r} unknown; use one of {REMAT_POLICIES} (or the old"
      " bools: False = 'none', True = 'full')"
  )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer.

  ``rope_scaling`` is None or a mapping as in HF (e.g. ``{'rope_type':
  'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
  'original_max_position_embeddings': 8192}``); it is stored as a hashable
  FrozenDict so the config can be a static jit argument.

  ``logical_axis_rules`` maps the logical names of activations to mesh axes
  (``sharding.py``; None = ``sharding.DEFAULT_RULES``); the model constrains
  its activations with them when its inputs lie on a mesh.

  ``attention``: the learner's attention kernel (rows without a KV cache;
  ``transformer.attention_implementation``): 'xla' / 'cudnn'
  (``jax.nn.dot_product_attention``), 'splash' (Pallas splash attention,
  ``splash.py``: TPU; elsewhere Pallas's interpreter, exact and slow, for
  tests), 'plain' (einsums and a [B, T, S] mask), 'auto' (splash on TPU,
  cuDNN on GPU for 16-bit compute and head widths it takes, else XLA). The
  KV-cache path and the response window's last block are always plain.

  ``scan_layers``: the L blocks' parameters are stacked on a leading layer
  axis and the forward is one ``jax.lax.scan`` over them, so XLA compiles
  one block instead of L (transformer.py); the same values and outputs as
  the unrolled layout, which HF checkpoints and the rollout engine use
  (hf_io and ``transformer.unscanned`` convert).
  """

  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rope_scaling: Optional[Any] = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  max_position_embeddings: int = 32768
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  remat: str = "none"  # REMAT_POLICIES; False / True read as none / full
  scan_layers: bool = False
  bos_token_id: Optional[int] = None
  eos_token_id: Optional[Any] = None  # int or tuple of ints
  logical_axis_rules: Optional[tuple] = None
  attention: str = "auto"  # auto | xla | cudnn | splash | plain
  # LoRA (models/lora.py): rank 0 = off (full fine-tuning). With a rank r,
  # each target projection W of every block gains W + (alpha / r) A B, A
  # [in, r] random and B [r, out] zero (so the model starts equal to its
  # base); only A and B (float32) train, the base is frozen in the compute
  # dtype. Targets: attention q, k, v, o and MLP gate, up, down.
  lora_rank: int = 0
  lora_alpha: float = 32.0
  lora_targets: tuple = ("q", "k", "v", "o", "gate", "up", "down")

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(
          f"ModelConfig.family {self.family!r} unknown; use one of {FAMILIES}"
      )
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
    ):
      if int(getattr(self, name)) <= 0:
        raise ValueError(
            f"ModelConfig.{name} must be > 0, got {getattr(self, name)}"
        )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of"
          f" num_kv_heads ({self.num_kv_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(
          f"ModelConfig.head_dim must be even, got {self.head_dim}"
      )
    rs = self.rope_scaling
    if rs is not None:
      rs = FrozenDict(dict(rs))
      rope_type = rs.get("rope_type", rs.get("type", "default"))
      if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"ModelConfig.rope_scaling type {rope_type!r} unsupported; use one"
            f" of {ROPE_TYPES}"
        )
      if rope_type == "default":
        rs = None
      object.__setattr__(self, "rope_scaling", rs)
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    for name in ("dtype", "param_dtype"):
      value = getattr(self, name)
      value = str(getattr(value, "__name__", value))  # jnp.bfloat16 etc.
      if value not in DTYPES:
        raise ValueError(
            f"ModelConfig.{name} {value!r} unsupported; use one of"
            f" {tuple(DTYPES)}"
        )
      object.__setattr__(self, name, value)
    object.__setattr__(self, "remat", remat_policy(self.remat))
    if self.attention not in ATTENTION:
      raise ValueError(
          f"ModelConfig.attention {self.attention!r} unknown; use one of"
          f" {ATTENTION}"
      )
    rules = self.logical_axis_rules
    if rules is not None:
      rules = tuple(sharding.check_rules(rules).items())
      if rules == tuple(sharding.check_rules(sharding.DEFAULT_RULES).items()):
        rules = None  # one spelling of the default: equal configs compare ==
      object.__setattr__(self, "logical_axis_rules", rules)

  @property
  def rules(self) -> tuple:
    """The logical axis rules in force (the default when unset)."""
    return self.logical_axis_rules or sharding.DEFAULT_RULES

  @property
  def inference_dtype(self) -> str:
    """dtype of weight copies only ever run forward (pi_ref, the rollout
    engine): the narrower of ``dtype`` and ``param_dtype``.

    The forward casts every weight to ``dtype`` before use, so a copy
    rounded to ``dtype`` gives the same outputs as the master weights, in
    half the memory for float32 masters with bfloat16 compute.
    """
    if DTYPES[self.dtype] < DTYPES[self.param_dtype]:
      return self.dtype
    return self.param_dtype

  # ----------------------------------------------------------------- HF IO

  @classmethod
  def from_hf_dict(cls, d: dict, **overrides) -> "ModelConfig":
    """Builds a config from a HF ``config.json`` dict.

    Raises ValueError naming the architecture when it is not Qwen2 / Llama.
    """
    model_type = d.get("model_type")
    archs = d.get("architectures") or []
    family = None
    if model_type in FAMILIES:
      family = model_type
    else:
      for fam, arch in ARCHITECTURES.items():
        if arch in archs:
          family = fam
    if family is None:
      raise ValueError(
          f"unsupported architecture: model_type={model_type!r},"
          f" architectures={archs!r}; supported: {list(ARCHITECTURES.values())}"
      )
    if family == "llama" and (d.get("attention_bias") or d.get("mlp_bias")):
      raise ValueError(
          "Llama config with attention_bias/mlp_bias is unsupported"
      )
    if d.get("use_sliding_window") or any(
        t != "full_attention" for t in d.get("layer_types") or ()
    ):
      raise ValueError("config.json: sliding-window attention is unsupported")
    heads = int(d["num_attention_heads"])
    head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
    rope = dict(d.get("rope_parameters") or {})
    legacy = d.get("rope_scaling")
    if legacy:
      rope.update(legacy)
    theta = rope.pop("rope_theta", None) or d.get("rope_theta") or 10000.0
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope.pop("type", None)
    if rope_type == "default":
      scaling = None
    else:
      rope["rope_type"] = rope_type
      scaling = rope
    kw = dict(
        family=family,
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rope_theta=float(theta),
        rope_scaling=scaling,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2",
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf_dict(self) -> dict:
    """HF ``config.json`` contents (float32 weights)."""
    rope_params = {"rope_type": "default", "rope_theta": float(self.rope_theta)}
    if self.rope_scaling is not None:
      rope_params.update(dict(self.rope_scaling))
    eos = self.eos_token_id
    d = {
        "architectures": [ARCHITECTURES[self.family]],
        "model_type": self.family,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": self.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings,
        "rope_theta": float(self.rope_theta),
        "rope_scaling": (
            None if self.rope_scaling is None else dict(self.rope_scaling)
        ),
        "rope_parameters": rope_params,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if self.family == "qwen2":
      d.update(
          use_sliding_window=False,
          sliding_window=None,
          max_window_layers=self.num_layers,
      )
    else:
      d.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    return d

  # ---------------------------------------------------------------- counts

  def num_params(self) -> int:
    """Parameter count (the lm_head counted once when tied)."""
    d, h, kv, hd = (
        self.hidden_size,
        self.num_heads,
        self.num_kv_heads,
        self.head_dim,
    )
    attn = d * h * hd * 2 + d * kv * hd * 2
    if self.qkv_bias:
      attn += h * hd + 2 * kv * hd
    layer = attn + 3 * d * self.intermediate_size + 2 * d
    head = 0 if self.tie_word_embeddings else d * self.vocab_size
    return self.num_layers * layer + self.vocab_size * d + d + head


_QWEN_TINY = dict(
    family="qwen2",
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=704,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    qkv_bias=True,
    max_position_embeddings=32768,
)

PRESETS: dict[str, dict] = {
    # 3.48 M parameters: the CPU workhorse.
    "tiny": _QWEN_TINY,
    # 2 layers of width 128 (~0.6 M parameters with a 2 k vocabulary): the
    # embedded WebShop recipe's policy, ~3x cheaper a step than 'tiny' and
    # quicker to learn the task's choices from scratch on 2 CPU cores.
    "nano": dict(
        _QWEN_TINY,
        hidden_size=128,
        intermediate_size=352,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
    ),
    # Same widths, Llama family (no qkv bias, untied lm_head).
    "tiny-llama": dict(
        _QWEN_TINY,
        family="llama",
        qkv_bias=False,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
    ),
    # 24.7 M parameters.
    "small-25m": dict(
        _QWEN_TINY,
        hidden_size=512,
        intermediate_size=1408,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
    ),
    # 98.3 M parameters.
    "base-100m": dict(
        _QWEN_TINY,
        hidden_size=768,
        intermediate_size=2816,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
        head_dim=64,
    ),
    # Published HF config.json values (Instruct variants).
    "qwen2.5-0.5b": dict(
        family="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        qkv_bias=True,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "qwen2.5-1.5b": dict(
        family="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        qkv_bias=True,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "qwen2.5-7b": dict(
        family="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        qkv_bias=True,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "llama-3.2-3b": dict(
        family="llama",
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        qkv_bias=False,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_id=(128001, 128008, 128009),
    ),
}


# Presets without a pretrained tokenizer: their vocabulary is the locally
# trained tokenizer's (``local_vocab_size``).
LOCAL_TOKENIZER_PRESETS = (
    "nano",
    "tiny",
    "tiny-llama",
    "small-25m",
    "base-100m",
)


def local_vocab_size(num_tokens: int, multiple: int = 128) -> int:
  """Embedding rows for a tokenizer of ``num_tokens``: rounded up to a
  multiple of 128, as released models pad theirs (Qwen2.5: 151936 = 128 x
  1187; 2048 for the 1982 tokens of the default WebShop tokenizer)."""
  return max(multiple, -(-num_tokens // multiple) * multiple)


def get_model_config(name: str, **overrides) -> ModelConfig:
  """A preset by name, with field overrides (e.g. ``dtype='bfloat16'``)."""
  if name not in PRESETS:
    raise ValueError(
        f"unknown model preset {name!r}; presets: {sorted(PRESETS)}"
    )
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  bad = sorted(set(overrides) - fields)
  if bad:
    raise ValueError(f"unknown ModelConfig fields {bad} for preset {name!r}")
  return ModelConfig(**{**PRESETS[name], **overrides})
