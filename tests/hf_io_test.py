"""Tests for rspo_jax.models.hf_io: save/load round trips, errors, meshes.

tests/conftest.py gives the session 8 CPU devices.
"""

import json
import os
import shutil
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rspo_jax import models, sharding
from rspo_jax.models import hf_io

DATA = os.path.join(os.path.dirname(__file__), "data")
_fwd = nnx.jit(lambda m, i, p, a: m(i, p, a))


def _micro(family="qwen2", **kw):
  shape = dict(
      num_layers=2,
      vocab_size=256,
      hidden_size=32,
      intermediate_size=64,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
  )
  name = "tiny" if family == "qwen2" else "tiny-llama"
  return models.get_model_config(name, **{**shape, **kw})


def _leaves(model):
  return {
      "/".join(map(str, p)): np.asarray(v.value)
      for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
  }


def _assert_same_params(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert la.keys() == lb.keys()
  for k in la:
    assert la[k].dtype == lb[k].dtype, k
    np.testing.assert_array_equal(la[k], lb[k], err_msg=k)


def _inputs(vocab=256, b=2, t=9, seed=0):
  ids = np.random.RandomState(seed).randint(0, vocab, (b, t)).astype(np.int32)
  pos = np.tile(np.arange(t, dtype=np.int32), (b, 1))
  return jnp.asarray(ids), jnp.asarray(pos), jnp.ones((b, t), jnp.int32)


@pytest.fixture(scope="module")
def qwen_model():
  cfg = _micro()
  return cfg, models.create_model(cfg, seed=0)


def test_save_load_bit_exact_qwen2(tmp_path, qwen_model):
  cfg, model = qwen_model
  models.save_hf_model(model, cfg, str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == [
      "config.json",
      "generation_config.json",
      "model.safetensors",
  ]
  cfg2, model2 = models.load_hf_model(str(tmp_path))
  assert cfg2 == cfg
  _assert_same_params(model, model2)
  tensors = load_file(str(tmp_path / "model.safetensors"))
  assert "lm_head.weight" not in tensors  # tied
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (32, 32)
  assert tensors["model.layers.1.self_attn.k_proj.bias"].shape == (16,)
  assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (32, 32)
  assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (32, 64)
  # q_proj row j*Dh + d is our q[:, j, d].
  q = np.asarray(model.layers[0].attn.q.value)
  np.testing.assert_array_equal(
      tensors["model.layers.0.self_attn.q_proj.weight"][1 * 8 + 3], q[:, 1, 3]
  )
  hf = json.load(open(tmp_path / "config.json"))
  assert (
      hf["architectures"] == ["Qwen2ForCausalLM"] and hf["dtype"] == "float32"
  )


def test_save_load_bit_exact_reference_llama(tmp_path):
  # An untied llama3-scaled checkpoint written by transformers itself.
  cfg, model = models.load_hf_model(os.path.join(DATA, "tiny_llama"))
  models.save_hf_model(model, cfg, str(tmp_path))
  ref = load_file(os.path.join(DATA, "tiny_llama", "model.safetensors"))
  ours = load_file(str(tmp_path / "model.safetensors"))
  assert ours.keys() == ref.keys()
  for k in ref:
    np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)
  cfg2, model2 = models.load_hf_model(str(tmp_path))
  assert cfg2 == cfg
  _assert_same_params(model, model2)


def test_sharded_save_and_load(tmp_path, qwen_model):
  cfg, model = qwen_model
  models.save_hf_model(model, cfg, str(tmp_path), max_shard_bytes=40_000)
  files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
  n = len(files)
  assert n > 2 and files[0] == f"model-00001-of-{n:05d}.safetensors"
  index = json.load(open(tmp_path / "model.safetensors.index.json"))
  assert set(index["weight_map"].values()) == set(files)
  total = sum(t.nbytes for t in hf_io.hf_tensors(model, cfg).values())
  assert index["metadata"]["total_size"] == total
  _, model2 = models.load_hf_model(str(tmp_path))
  _assert_same_params(model, model2)
  # Saving again unsharded removes the stale shards and index.
  models.save_hf_model(model, cfg, str(tmp_path))
  assert not any(f.startswith("model-") for f in os.listdir(tmp_path))
  assert not (tmp_path / "model.safetensors.index.json").exists()


def test_qwen2_without_bias_saves_zero_biases(tmp_path):
  cfg = _micro(qkv_bias=False, num_layers=1)
  model = models.create_model(cfg, seed=1)
  models.save_hf_model(model, cfg, str(tmp_path))
  t = load_file(str(tmp_path / "model.safetensors"))
  assert not t["model.layers.0.self_attn.v_proj.bias"].any()
  cfg2, model2 = models.load_hf_model(str(tmp_path))
  assert cfg2.qkv_bias  # HF Qwen2 always has the biases
  ids, pos, mask = _inputs()
  a, _, _ = _fwd(model, ids, pos, mask)
  b, _, _ = _fwd(model2, ids, pos, mask)
  np.testing.assert_array_equal(a, b)


def test_load_errors_name_the_problem(tmp_path):
  src = os.path.join(DATA, "tiny_qwen2")
  with pytest.raises(ValueError, match="config.json"):
    models.load_hf_model(str(tmp_path))
  d = tmp_path / "ck"
  d.mkdir()
  shutil.copy(os.path.join(src, "config.json"), d)
  with pytest.raises(ValueError, match="model.safetensors"):
    models.load_hf_model(str(d))
  tensors = load_file(os.path.join(src, "model.safetensors"))
  bad = dict(tensors)
  bad["model.layers.1.mlp.up_proj.weight"] = np.zeros((128, 63), np.float32)
  save_file(bad, str(d / "model.safetensors"))
  with pytest.raises(ValueError, match=r"up_proj.weight.*\(128, 63\)"):
    models.load_hf_model(str(d))
  missing = dict(tensors)
  del missing["model.norm.weight"]
  save_file(missing, str(d / "model.safetensors"))
  with pytest.raises(ValueError, match="model.norm.weight"):
    models.load_hf_model(str(d))
  hf = json.load(open(os.path.join(src, "config.json")))
  hf.update(model_type="mistral", architectures=["MistralForCausalLM"])
  json.dump(hf, open(d / "config.json", "w"))
  with pytest.raises(ValueError, match="MistralForCausalLM"):
    models.load_hf_model(str(d))
  d2 = tmp_path / "idx"
  d2.mkdir()
  shutil.copy(os.path.join(src, "config.json"), d2)
  json.dump(
      {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}},
      open(d2 / "model.safetensors.index.json", "w"),
  )
  with pytest.raises(ValueError, match="model-00001-of-00002"):
    models.load_hf_model(str(d2))


def test_tokenizer_files_are_copied(tmp_path, qwen_model):
  cfg, model = qwen_model
  tok_dir = tmp_path / "tok"
  models.train_tokenizer(["hello world"] * 20, 270, str(tok_dir))
  out = tmp_path / "out"
  models.save_hf_model(model, cfg, str(out), tokenizer_dir=str(tok_dir))
  assert (out / "tokenizer.json").exists()
  assert (out / "tokenizer_config.json").exists()
  assert models.load_tokenizer(str(out))("hello")["input_ids"]
  # Next to a qwen2 config.json, our tokenizer still tokenizes as trained
  # (AutoTokenizer alone would switch to Qwen2Tokenizer's digit splitting).
  text = "size: 75 ft, price lower than 60.00 dollars"
  tok_dir = tmp_path / "tok_digits"
  models.train_tokenizer([text] * 20, 300, str(tok_dir))
  models.save_hf_model(model, cfg, str(out), tokenizer_dir=str(tok_dir))
  want = models.load_tokenizer(str(tok_dir)).encode(text)
  assert models.load_tokenizer(str(out)).encode(text) == want
  with pytest.raises(ValueError, match="no tokenizer files"):
    models.save_hf_model(
        model, cfg, str(out), tokenizer_dir=str(tmp_path / "x")
    )


def test_load_dtype_override():
  # dtype is the compute dtype: the parameters stay float32 masters.
  path = os.path.join(DATA, "tiny_qwen2")
  cfg, model = models.load_hf_model(path, dtype="bfloat16")
  assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
  assert model.embedding.value.dtype == jnp.float32
  cfg, model = models.load_hf_model(
      path, dtype="bfloat16", param_dtype="bfloat16", remat=True
  )
  assert cfg.dtype == cfg.param_dtype == "bfloat16" and cfg.remat
  assert model.embedding.value.dtype == jnp.bfloat16


# ---------------------------------------------------------------- meshes


def test_mesh_load_matches_unsharded():
  assert len(jax.devices()) == 8
  mesh = sharding.make_mesh((2, 2, 2))
  path = os.path.join(DATA, "tiny_llama")
  _, plain = models.load_hf_model(path)
  cfg, sharded = models.load_hf_model(path, mesh=mesh)
  q = sharded.layers[0].attn.q.value
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert len(q.addressable_shards) == 8
  assert q.addressable_shards[0].data.shape == (32, 2, 16)
  assert sharded.lm_head.value.sharding.spec == jax.sharding.PartitionSpec(
      "fsdp", "tensor"
  )
  _assert_same_params(plain, sharded)
  ref = np.load(os.path.join(path, "reference_logits.npz"))
  ids, mask = jnp.asarray(ref["input_ids"]), jnp.asarray(ref["attention_mask"])
  pos = jnp.tile(jnp.arange(ids.shape[1], dtype=jnp.int32), (ids.shape[0], 1))
  a, _, _ = _fwd(plain, ids, pos, mask)
  with jax.set_mesh(mesh):
    b, _, _ = _fwd(sharded, ids, pos, mask)
  real = np.asarray(mask).astype(bool)
  np.testing.assert_allclose(
      np.asarray(a)[real], np.asarray(b)[real], atol=1e-5
  )
  err = np.abs(np.asarray(b) - ref["logits"])[real].max()
  assert err <= 1e-4


def test_create_sharded_model_equals_create_model(qwen_model):
  cfg, model = qwen_model
  mesh = sharding.make_mesh((2, 2, 2))
  sharded = models.create_sharded_model(cfg, 0, mesh, sharding.DEFAULT_RULES)
  emb = sharded.embedding.value
  assert emb.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  # 2 KV heads on a tensor axis of 2 shard; the per-head bias too.
  assert sharded.layers[0].attn.k_bias.value.sharding.spec[0] == "tensor"
  _assert_same_params(model, sharded)


def test_save_safetensors_gives_the_umask_at_the_write(tmp_path):
  """save_safetensors' files get 0o666 & ~umask with the umask the process
  has when it writes them (safetensors alone makes 0o600), not the one it
  had when hf_io was imported: a process that sets 0o077 afterwards keeps
  its weights private (it got 0o644), one with 0o002 shares them."""
  old = os.umask(0o077)
  try:
    for mask in (0o077, 0o002, 0o022):
      os.umask(mask)
      path = str(tmp_path / f"w{mask:o}.safetensors")
      hf_io.save_safetensors({"w": np.zeros(2, np.float32)}, path)
      assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~mask, oct(mask)
  finally:
    os.umask(old)
