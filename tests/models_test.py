"""Tests for rspo_jax.models: config, decoder, KV cache, heads, tokenizer.

HF parity uses checkpoints made by scripts/make_reference_checkpoints.py
(torch is not needed here).
"""

import dataclasses
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rspo_jax import models
from rspo_jax.models import transformer as tf
from rspo_jax.models import windows

DATA = os.path.join(os.path.dirname(__file__), "data")


def _tiny(**kw):
  """A micro Qwen2 (GQA, bias, tied): fast to compile on a busy CPU."""
  shape = dict(
      num_layers=2,
      vocab_size=256,
      hidden_size=32,
      intermediate_size=64,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
  )
  return models.get_model_config("tiny", **{**shape, **kw})


_fwd = nnx.jit(lambda m, i, p, a: m(i, p, a))
_fwd_cache = nnx.jit(lambda m, i, p, a, c: m(i, p, a, cache=c))


def _count(cfg):
  abstract = nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))
  return sum(
      int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract))
  )


def _positions(b, t):
  return jnp.tile(jnp.arange(t, dtype=jnp.int32), (b, 1))


def _rebuild(model, cfg):
  """The same parameters under another static config (remat, dtype, RoPE)."""
  abstract = nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.merge(nnx.graphdef(abstract), nnx.state(model))


@pytest.fixture(scope="module")
def tiny_model():
  # Random init compiles one RNG kernel per shape: create one model per file.
  cfg = _tiny()
  return cfg, models.create_model(cfg, seed=3)


# ----------------------------------------------------------------- config


def test_preset_param_counts():
  # Published sizes of the real models; tiny shape from the design brief.
  expected = {
      "tiny": 3_477_760,
      # 2048*128 tied embedding + 2 * (q 128*128+128, k and v 128*64+64
      # each, o 128*128, mlp 3*128*352, 2 norms of 128) + final norm 128.
      "nano": 631_936,
      "qwen2.5-0.5b": 494_032_768,
      "qwen2.5-1.5b": 1_543_714_304,
      "qwen2.5-7b": 7_615_616_512,
      "llama-3.2-3b": 3_212_749_824,
  }
  for name, n in expected.items():
    assert models.get_model_config(name).num_params() == n, name
  assert 20e6 < models.get_model_config("small-25m").num_params() < 30e6
  assert 90e6 < models.get_model_config("base-100m").num_params() < 110e6
  for name in ("nano", "tiny", "tiny-llama", "small-25m"):
    cfg = models.get_model_config(name)
    assert _count(cfg) == cfg.num_params(), name
  # The abstract 7B model has the published count too (no memory used).
  assert _count(models.get_model_config("qwen2.5-7b")) == 7_615_616_512


def test_local_presets_take_the_tokenizers_vocab_padded_to_128():
  from rspo_jax import build  # noqa: PLC0415
  from configs import alfworld_grpo, webshop_grpo  # noqa: PLC0415

  assert [models.local_vocab_size(n) for n in (1, 128, 129, 300, 1982)] == [
      128,
      128,
      256,
      384,
      2048,
  ]

  class Tok:  # only len() is read

    def __len__(self):
      return 1982

  for cfg in (
      webshop_grpo.get_config(),
      alfworld_grpo.get_config(),
      webshop_grpo.get_config("model=tiny"),
  ):
    assert cfg.model.preset in models.LOCAL_TOKENIZER_PRESETS
    assert build.model_config(cfg, Tok()).vocab_size == 2048
  # A released model keeps its own vocabulary.
  qwen = webshop_grpo.get_config("model=qwen2.5-0.5b")
  assert build.model_config(qwen, Tok()).vocab_size == 151936


def test_unknown_preset_and_bad_fields():
  with pytest.raises(ValueError, match="tiny"):
    models.get_model_config("gpt-5")
  with pytest.raises(ValueError, match="bogus"):
    models.get_model_config("tiny", bogus=1)
  with pytest.raises(ValueError, match="num_kv_heads"):
    models.get_model_config("tiny", num_kv_heads=3)
  with pytest.raises(ValueError, match="family"):
    models.get_model_config("tiny", family="gpt2")


def test_hf_dict_round_trip_all_presets():
  for name in models.PRESETS:
    cfg = models.get_model_config(name)
    back = models.ModelConfig.from_hf_dict(cfg.to_hf_dict())
    assert back == cfg, name
    assert hash(back) == hash(cfg)
  d = models.get_model_config("qwen2.5-1.5b").to_hf_dict()
  assert d["architectures"] == ["Qwen2ForCausalLM"]
  assert d["model_type"] == "qwen2"
  d = models.get_model_config("llama-3.2-3b").to_hf_dict()
  assert d["architectures"] == ["LlamaForCausalLM"]
  assert d["rope_scaling"]["rope_type"] == "llama3"
  assert d["rope_parameters"]["rope_theta"] == 500000.0


def test_from_hf_dict_legacy_and_errors():
  legacy = {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "vocab_size": 128,
      "hidden_size": 64,
      "intermediate_size": 96,
      "num_hidden_layers": 1,
      "num_attention_heads": 4,
      "num_key_value_heads": 2,
      "rope_theta": 500000.0,
      "rope_scaling": {
          "type": "llama3",
          "factor": 8.0,
          "low_freq_factor": 1.0,
          "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64,
      },
  }
  cfg = models.ModelConfig.from_hf_dict(legacy)
  assert cfg.family == "llama" and cfg.head_dim == 16
  assert cfg.rope_theta == 500000.0 and not cfg.qkv_bias
  assert cfg.rope_scaling["rope_type"] == "llama3"
  assert cfg.rope_scaling["original_max_position_embeddings"] == 64
  with pytest.raises(ValueError, match="GPT2LMHeadModel"):
    models.ModelConfig.from_hf_dict(
        dict(legacy, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    )
  with pytest.raises(ValueError, match="yarn"):
    models.ModelConfig.from_hf_dict(
        dict(legacy, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    )


# ------------------------------------------------------------------- RoPE


def test_llama3_inv_freq_by_hand():
  cfg = models.ModelConfig.from_hf_dict(
      {
          "model_type": "llama",
          "vocab_size": 8,
          "hidden_size": 64,
          "intermediate_size": 8,
          "num_hidden_layers": 1,
          "num_attention_heads": 4,
          "rope_theta": 10000.0,
          "rope_scaling": {
              "rope_type": "llama3",
              "factor": 8.0,
              "low_freq_factor": 1.0,
              "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32,
          },
      }
  )
  got = tf.rope_inv_freq(cfg)
  base = 10000.0 ** (-np.arange(0, 16, 2) / 16)
  # i=0: wavelength 2 pi < 32/4 = 8 -> unchanged.
  assert got[0] == pytest.approx(1.0)
  # i=1: wavelength 19.87 in [8, 32] -> smoothed.
  s = (32 / (2 * math.pi / base[1]) - 1.0) / 3.0
  assert got[1] == pytest.approx((1 - s) * base[1] / 8 + s * base[1], rel=1e-6)
  # i>=2: wavelength > 32 -> divided by the factor.
  np.testing.assert_allclose(got[2:], base[2:] / 8, rtol=1e-6)
  plain = tf.rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
  np.testing.assert_allclose(plain, base, rtol=1e-6)


def test_apply_rope_is_a_rotation_of_pairs():
  x = jnp.asarray(np.random.RandomState(0).randn(1, 1, 1, 4), jnp.float32)
  inv = np.array([1.0, 0.5], np.float32)
  y = tf.apply_rope(x, jnp.array([[3]]), inv)
  a = 3 * inv  # pair (0, 2) turns by 3 rad, pair (1, 3) by 1.5 rad
  x0, x1, x2, x3 = np.asarray(x)[0, 0, 0]
  want = [
      x0 * np.cos(a[0]) - x2 * np.sin(a[0]),
      x1 * np.cos(a[1]) - x3 * np.sin(a[1]),
      x2 * np.cos(a[0]) + x0 * np.sin(a[0]),
      x3 * np.cos(a[1]) + x1 * np.sin(a[1]),
  ]
  np.testing.assert_allclose(np.asarray(y)[0, 0, 0], want, rtol=1e-5)


# ------------------------------------------------------------- HF parity


@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_llama"])
def test_matches_hf_reference_logits(name):
  cfg, model = models.load_hf_model(os.path.join(DATA, name))
  ref = np.load(os.path.join(DATA, name, "reference_logits.npz"))
  ids, mask = ref["input_ids"], ref["attention_mask"]
  assert mask.min() == 0  # a right-padded row is part of the check
  b, t = ids.shape
  logits, hidden, cache = _fwd(
      model, jnp.asarray(ids), _positions(b, t), jnp.asarray(mask)
  )
  assert cache is None and hidden.shape == (b, t, cfg.hidden_size)
  assert logits.dtype == jnp.float32
  err = np.abs(np.asarray(logits) - ref["logits"])[mask.astype(bool)].max()
  assert err <= 1e-4
  if name == "tiny_llama":
    assert cfg.rope_scaling is not None and not cfg.tie_word_embeddings
    # Without the llama3 scaling the logits are clearly off: the test sees it.
    plain = _rebuild(model, dataclasses.replace(cfg, rope_scaling=None))
    off, _, _ = _fwd(
        plain, jnp.asarray(ids), _positions(b, t), jnp.asarray(mask)
    )
    bad = np.abs(np.asarray(off) - ref["logits"])[mask.astype(bool)].max()
    assert bad > 1e-3
  else:
    assert cfg.qkv_bias and cfg.tie_word_embeddings


# --------------------------------------------------------------- forward


def test_right_padding_does_not_change_real_positions(tiny_model):
  cfg, model = tiny_model
  rng = np.random.RandomState(1)
  ids = jnp.asarray(rng.randint(0, cfg.vocab_size, (2, 10)), jnp.int32)
  mask = jnp.array([[1] * 10, [1] * 6 + [0] * 4])
  full, _, _ = _fwd(model, ids, _positions(2, 10), mask)
  alone, _, _ = _fwd(model, ids[1:, :6], _positions(1, 6), mask[1:, :6])
  np.testing.assert_allclose(full[1, :6], alone[0], atol=1e-5)
  assert np.all(np.isfinite(np.asarray(full)))  # pad queries give no NaN


def test_kv_cache_prefill_and_decode_match_full_forward(tiny_model):
  cfg, model = tiny_model
  rng = np.random.RandomState(2)
  b, t, p = 3, 12, 7
  ids = jnp.asarray(rng.randint(0, cfg.vocab_size, (b, t)), jnp.int32)
  pos, mask = _positions(b, t), jnp.ones((b, t), jnp.int32)
  full, hid_full, _ = _fwd(model, ids, pos, mask)
  step = _fwd_cache
  cache = models.init_cache(cfg, b, 16)
  assert len(cache.k) == len(cache.v) == cfg.num_layers
  assert cache.k[0].shape == (b, cfg.num_kv_heads, 16, cfg.head_dim)
  logits, hid, cache = step(model, ids[:, :p], pos[:, :p], mask[:, :p], cache)
  np.testing.assert_allclose(logits, full[:, :p], atol=1e-5)
  np.testing.assert_allclose(hid, hid_full[:, :p], atol=1e-5)
  for i in range(p, t):
    logits, _, cache = step(
        model, ids[:, i : i + 1], pos[:, i : i + 1], mask[:, i : i + 1], cache
    )
    np.testing.assert_allclose(logits[:, 0], full[:, i], atol=1e-5)
  assert int(cache.index) == t
  assert np.asarray(cache.key_mask)[:, :t].all()
  assert not np.asarray(cache.key_mask)[:, t:].any()


def test_left_padded_prompt_with_cache_matches_unpadded(tiny_model):
  cfg, model = tiny_model
  rng = np.random.RandomState(3)
  prompt_a = rng.randint(0, cfg.vocab_size, 6)
  prompt_b = rng.randint(0, cfg.vocab_size, 3)
  nxt = rng.randint(0, cfg.vocab_size, (2, 3))
  # Row 1 is left-padded with 3 pad tokens (id 0) to the length of row 0.
  ids = jnp.asarray(np.stack([prompt_a, np.r_[[0, 0, 0], prompt_b]]), jnp.int32)
  mask = jnp.array([[1] * 6, [0, 0, 0, 1, 1, 1]])
  pos = models.positions_from_mask(mask)
  np.testing.assert_array_equal(pos[1], [0, 0, 0, 0, 1, 2])
  cache = models.init_cache(cfg, 2, 12)
  first, _, cache = _fwd_cache(model, ids, pos, mask, cache)
  steps = [first[:, -1]]
  last = pos[:, -1]
  for i in range(3):
    tok = jnp.asarray(nxt[:, i : i + 1], jnp.int32)
    last = last + 1
    lg, _, cache = _fwd_cache(
        model, tok, last[:, None], jnp.ones((2, 1)), cache
    )
    steps.append(lg[:, 0])
  for row, prompt in ((0, prompt_a), (1, prompt_b)):
    seq = np.r_[prompt, nxt[row]]
    ref, _, _ = _fwd(
        model,
        jnp.asarray(seq[None], jnp.int32),
        _positions(1, len(seq)),
        jnp.ones((1, len(seq))),
    )
    want = ref[0, len(prompt) - 1 : len(prompt) + 3]
    np.testing.assert_allclose(jnp.stack(steps)[:, row], want, atol=1e-5)


def test_token_logprobs_by_hand():
  logits = jnp.asarray(np.random.RandomState(4).randn(2, 4, 5), jnp.float32)
  tokens = jnp.array([[1, 2, 3, 4], [0, 0, 1, 1]])
  got = np.asarray(models.token_logprobs(logits, tokens))
  lg = np.asarray(logits, np.float64)
  logsm = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
  assert got.shape == (2, 4) and np.all(got[:, 0] == 0)
  for b in range(2):
    for t in range(1, 4):
      assert got[b, t] == pytest.approx(logsm[b, t - 1, tokens[b, t]], abs=1e-5)


def test_remat_same_values_and_grads(tiny_model):
  cfg, plain = tiny_model
  ids = jnp.asarray(np.random.RandomState(5).randint(0, 256, (2, 8)))
  pos, mask = _positions(2, 8), jnp.ones((2, 8))

  def loss(m):
    lg, _, _ = m(ids, pos, mask)
    return models.token_logprobs(lg, ids).sum()

  remat = _rebuild(plain, dataclasses.replace(cfg, remat=True))
  l1, g1 = nnx.jit(nnx.value_and_grad(loss))(plain)
  l2, g2 = nnx.jit(nnx.value_and_grad(loss))(remat)
  assert l1 == pytest.approx(float(l2), rel=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("remat", [False, True])
def test_window_equals_full_forward_at_its_positions(tiny_model, remat):
  cfg, plain = tiny_model
  model = _rebuild(plain, dataclasses.replace(cfg, remat=remat))
  b, t, r = 3, 12, 4
  ids = jnp.asarray(np.random.RandomState(6).randint(0, 256, (b, t)))
  mask = jnp.ones((b, t)).at[2, 10:].set(0)  # a right-padded row
  pos = models.positions_from_mask(mask)
  starts = jnp.array([0, 5, 8])
  full, hid, _ = _fwd(model, ids, pos, mask)
  lg, h, _ = model(ids, pos, mask, window=(starts, r))
  assert lg.shape == (b, r, cfg.vocab_size) and h.shape == (b, r, 32)
  for row, s in enumerate([0, 5, 8]):
    np.testing.assert_allclose(lg[row], full[row, s : s + r], atol=1e-5)
    np.testing.assert_allclose(h[row], hid[row, s : s + r], atol=1e-5)

  def loss(m, window):
    lg, _, _ = m(ids, pos, mask, window=window)
    if window is None:
      lg = windows.take_window(lg, starts, r)
    return jnp.sum(jnp.sin(lg))

  g_full = nnx.grad(loss)(model, None)
  g_win = nnx.grad(lambda m: loss(m, (starts, r)))(model)
  for a, c in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_win)):
    np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="window and cache"):
    model(
        ids, pos, mask, window=(starts, r), cache=models.init_cache(cfg, b, t)
    )


def test_bfloat16_compute_is_close(tiny_model):
  cfg, model = tiny_model
  ids = jnp.asarray(np.random.RandomState(6).randint(0, 256, (2, 8)))
  pos, mask = _positions(2, 8), jnp.ones((2, 8))
  f32, _, _ = _fwd(model, ids, pos, mask)
  bf16_model = _rebuild(model, dataclasses.replace(cfg, dtype="bfloat16"))
  bf, hid, _ = _fwd(bf16_model, ids, pos, mask)
  assert bf.dtype == jnp.float32 and hid.dtype == jnp.bfloat16
  assert np.abs(np.asarray(bf) - np.asarray(f32)).max() < 0.05


def test_params_carry_logical_names(tiny_model):
  _, model = tiny_model
  names = {
      "/".join(map(str, p)): v.get_metadata()["out_sharding"]
      for p, v in nnx.to_flat_state(nnx.state(model))
  }
  assert names["embedding"] == ("vocab", "embed")
  assert names["layers/0/attn/q"] == ("embed", "heads", "head_dim")
  assert names["layers/0/attn/k"] == ("embed", "kv_heads", "head_dim")
  assert names["layers/0/attn/o"] == ("heads", "head_dim", "embed")
  assert names["layers/1/mlp/down"] == ("mlp", "embed")
  assert names["final_norm/scale"] == ("norm",)
  from rspo_jax import sharding

  for n in names.values():
    assert set(n) <= set(sharding.LOGICAL_AXES)


# ------------------------------------------------------------------ heads


def test_value_model_is_linear_in_hidden(tiny_model):
  cfg, backbone = tiny_model
  vm = models.ValueModel(cfg, rngs=nnx.Rngs(0), backbone=backbone)
  ids = jnp.asarray(np.random.RandomState(7).randint(0, 256, (2, 5)))
  pos, mask = _positions(2, 5), jnp.ones((2, 5))
  values = nnx.jit(lambda m: m(ids, pos, mask))(vm)
  _, h, _ = _fwd(backbone, ids, pos, mask)
  want = np.asarray(h) @ np.asarray(vm.head.kernel.value)[:, 0] + float(
      vm.head.bias.value[0]
  )
  assert values.shape == (2, 5) and values.dtype == jnp.float32
  np.testing.assert_allclose(values, want, atol=1e-5)


def test_prm_scores_bounded_and_only_head_gets_gradient(tiny_model):
  cfg, backbone = tiny_model
  prm = models.ProcessRewardModel(
      cfg, rngs=nnx.Rngs(0), head_hidden=32, backbone=backbone
  )
  ids = jnp.asarray(np.random.RandomState(8).randint(0, 256, (2, 5)))
  pos, mask = _positions(2, 5), jnp.ones((2, 5))
  scores = nnx.jit(lambda m: m(ids, pos, mask))(prm)
  assert scores.shape == (2, 5)
  assert np.all(np.abs(np.asarray(scores)) < 1)

  def prm_loss(m):  # L_P = (sum_t r_hat_t - R)^2 with R = 1
    return jnp.mean((m(ids, pos, mask).sum(-1) - 1.0) ** 2)

  grads = nnx.jit(nnx.grad(prm_loss))(prm)
  backbone_g = jax.tree.leaves(grads["backbone"])
  head_g = jax.tree.leaves(grads["head"])
  assert all(float(jnp.abs(g).max()) == 0 for g in backbone_g)
  assert any(float(jnp.abs(g).max()) > 0 for g in head_g)


# -------------------------------------------------------------- tokenizer


def test_tokenizer_train_chat_template_and_checks(tmp_path):
  texts = [
      f"search[red shoes size {i}] click[buy now] fox {i * 7}"
      for i in range(200)
  ]
  tok = models.train_tokenizer(texts, 400, str(tmp_path / "tok"))
  assert len(tok) <= 400
  assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
  assert tok.convert_tokens_to_ids(
      ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  ) == [0, 1, 2]
  text = tok.apply_chat_template(
      [{"role": "user", "content": "hi"}],
      add_generation_prompt=True,
      tokenize=False,
  )
  assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  ids = tok("click[buy now]<|im_end|>")["input_ids"]
  assert ids[-1] == 2 and tok.decode(ids) == "click[buy now]<|im_end|>"
  again = models.load_tokenizer(str(tmp_path / "tok"))
  assert again("fox 7")["input_ids"] == tok("fox 7")["input_ids"]
  models.check_tokenizer_matches(tok, _tiny(vocab_size=400))
  with pytest.raises(ValueError, match=r"\(300\)"):
    models.check_tokenizer_matches(tok, _tiny(vocab_size=300))
  with pytest.raises(ValueError, match="no tokenizer"):
    models.load_tokenizer(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="vocab_size"):
    models.train_tokenizer(texts, 100, str(tmp_path / "small"))


@pytest.mark.parametrize(
    "mesh_shape", [(1, 4, 2), (1, 1, 8), (2, 1, 4)], ids=str
)
def test_vocab_parallel_embedding_equals_the_gathered_lookup(mesh_shape):
  """The engine's rules (weights split over 'tensor' only): the table's
  rows lie split over 'tensor' and each shard looks up the tokens it owns.
  Same vectors bit for bit as ``table[tokens]`` (ids in every shard, the
  first and last row of each), the same gradient (repeated tokens summed),
  and no collective that moves the table: the only one is the all-reduce
  of the [B, T, D] rows."""
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from rspo_jax import sharding as shd

  mesh = shd.make_mesh(mesh_shape)
  rules = shd.inference_rules(shd.DEFAULT_RULES)
  shard = shd.ActivationSharding(mesh, rules)
  v, d = 64, 16
  table = jax.random.normal(jax.random.key(0), (v, d), jnp.float32)
  table = jax.device_put(table, NamedSharding(mesh, P("tensor", None)))
  tokens = np.asarray(
      [[0, 7, 8, 15], [16, 31, 32, 63], [7, 7, 48, 1], [63, 62, 0, 40]],
      np.int32,
  )

  def embed(t, ids):
    return tf._vocab_parallel_take(t, ids, shard, ("tensor",), ("data", "fsdp"))

  fn = jax.jit(embed)
  out = fn(table, tokens)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(table)[tokens])
  weights = jax.random.normal(jax.random.key(1), (4, 4, d))
  grad = jax.grad(lambda t: jnp.sum(embed(t, tokens) * weights))(table)
  want = np.zeros((v, d), np.float32)
  np.add.at(want, tokens, np.asarray(weights))
  np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-6)
  hlo = fn.lower(table, tokens).compile().as_text()
  moved = re.findall(
      r"= \w+\[([\d,]*)\]\S* (all-gather|all-to-all|"
      r"all-reduce|collective-permute)(?:-start)?\(",
      hlo,
  )
  assert [op for _, op in moved] == ["all-reduce"], moved
  rows = np.prod([int(x) for x in moved[0][0].split(",")])
  assert rows == tokens.size * d // (mesh.shape["data"] * mesh.shape["fsdp"])
