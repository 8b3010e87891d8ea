"""Hugging Face safetensors directories <-> NNX ``Transformer``; model init.

Tensor map (HF ``nn.Linear`` weights are [out, in]; ours are [in, ...]):

  model.embed_tokens.weight            [V, D]       embedding     [V, D]
  model.layers.N.self_attn.q_proj.w    [H*Dh, D]    attn.q        [D, H, Dh]
  model.layers.N.self_attn.{k,v}_proj  [Hkv*Dh, D]  attn.{k,v}    [D, Hkv, Dh]
  model.layers.N.self_attn.*_proj.bias [H*Dh]       attn.*_bias   [H, Dh]
  model.layers.N.self_attn.o_proj.w    [D, H*Dh]    attn.o        [H, Dh, D]
  model.layers.N.mlp.{gate,up}_proj.w  [F, D]       mlp.{gate,up} [D, F]
  model.layers.N.mlp.down_proj.w       [D, F]       mlp.down      [F, D]
  model.layers.N.input_layernorm.w     [D]          input_norm.scale
  model.layers.N.post_attention_layernorm.w         post_attn_norm.scale
  model.norm.weight                    [D]          final_norm.scale
  lm_head.weight                       [V, D]       lm_head       [D, V]

A scanned model (``ModelConfig.scan_layers``) holds ``layers/<sub>`` as
[L, ...] stacks: layer N's tensors are read into (written from) row N of
the stack, so its files are the unrolled model's, tensor for tensor.

Only the safetensors numpy API is used (no pickle, no torch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from rspo_jax import sharding
from rspo_jax.models.config import ModelConfig
from rspo_jax.models.transformer import Transformer

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def _process_umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


# Read once: os.umask is process-wide, not thread-safe.
_UMASK = _process_umask()


def current_umask() -> int:
  """The process's umask now, from /proc/self/status's ``Umask:`` line
  (Linux >= 4.7; reading it changes nothing, where os.umask would set it
  for every thread while writer threads create files); without one, the
  umask at import. A umask set after import (``os.umask(0o077)`` before an
  export) is the one files get."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  return _UMASK


def save_safetensors(
    tensors: dict, path: str, metadata: Optional[dict] = None
) -> None:
  """safetensors' ``save_file``, then the mode ``open()`` would have given
  (0o666 & ~umask, ``current_umask``): safetensors creates its files 0o600,
  which SGLang servers running as another user cannot read from a shared
  directory."""
  save_file(tensors, path, metadata=metadata)
  os.chmod(path, 0o666 & ~current_umask())


_ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
_MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_NORMS = {
    "input_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm",
}


# ------------------------------------------------------------ name mapping


def _hf_name(path) -> str:
  """HF tensor name of one of our parameter paths."""
  path = tuple(str(p) for p in path)
  if path == ("embedding",):
    return "model.embed_tokens.weight"
  if path == ("lm_head",):
    return "lm_head.weight"
  if path == ("final_norm", "scale"):
    return "model.norm.weight"
  if path[0] == "layers":
    n, sub = path[1], path[2:]
    pre = f"model.layers.{n}."
    if sub[0] == "attn":
      name = sub[1]
      if name.endswith("_bias"):
        return pre + f"self_attn.{_ATTN[name[0]]}.bias"
      return pre + f"self_attn.{_ATTN[name]}.weight"
    if sub[0] == "mlp":
      return pre + f"mlp.{_MLP[sub[1]]}.weight"
    if sub[0] in _NORMS:
      return pre + f"{_NORMS[sub[0]]}.weight"
  raise ValueError(f"no HF name for parameter {'/'.join(path)}")


def _is_stacked(path) -> bool:
  """A scanned model's parameter: ``layers/<sub>`` of [L, ...] values."""
  return path[0] == "layers" and not isinstance(path[1], int)


def _layer_path(path, i: int) -> tuple:
  """The unrolled path of layer ``i`` of a stacked parameter's path."""
  return ("layers", i) + tuple(path[1:])


def _from_hf(name: str, t: np.ndarray, shape) -> np.ndarray:
  """HF tensor -> our layout (shape is ours)."""
  if name.endswith("o_proj.weight"):
    return t.T.reshape(shape)
  if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
    return t.T.reshape(shape)
  if name.endswith("_proj.bias"):
    return t.reshape(shape)
  if name.endswith("_proj.weight") or name == "lm_head.weight":
    return t.T
  return t


def _to_hf(name: str, a):
  """Our layout -> HF tensor: numpy (C-contiguous) for numpy, a device
  array for a jax.Array (the same reshapes and transposes, on device)."""
  out = np.ascontiguousarray if isinstance(a, np.ndarray) else lambda x: x
  if name.endswith("o_proj.weight"):
    return out(a.reshape(-1, a.shape[-1]).T)
  if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
    return out(a.reshape(a.shape[0], -1).T)
  if name.endswith("_proj.bias"):
    return out(a.reshape(-1))
  if name.endswith("_proj.weight") or name == "lm_head.weight":
    return out(a.T)
  return out(a)


def _hf_shape(name: str, shape) -> tuple:
  return tuple(_to_hf(name, np.empty(shape, np.int8)).shape)


# ------------------------------------------------------------------ create


def _abstract(cfg: ModelConfig, seed: int = 0):
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)))
  return nnx.split(model)


def _init_compiler_options():
  # XLA:CPU spends seconds optimising each threefry kernel (one per param
  # shape); an init runs once, so skip backend optimisation there. Values
  # match an optimised build to float32 rounding.
  if jax.default_backend() == "cpu":
    return {"xla_backend_optimization_level": 0}
  return None


def create_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """Random init (normal(0.02) weights, zero biases, unit norms), jitted."""
  graphdef, _ = _abstract(cfg, seed)
  state = jax.jit(
      lambda: nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))[1],
      compiler_options=_init_compiler_options(),
  )()
  return nnx.merge(graphdef, state)


def create_sharded_model(
    cfg: ModelConfig, seed: int, mesh, rules=sharding.DEFAULT_RULES
) -> Transformer:
  """Like create_model, but every param is created directly sharded."""
  graphdef, abstract = _abstract(cfg, seed)
  shardings = sharding.state_shardings(mesh, abstract, rules)
  state = jax.jit(
      lambda: nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))[1],
      out_shardings=shardings,
      compiler_options=_init_compiler_options(),
  )()
  return nnx.merge(graphdef, state)


# -------------------------------------------------------------------- load


def _tensor_files(path: str) -> dict:
  """HF tensor name -> safetensors file holding it."""
  index = os.path.join(path, SAFE_INDEX)
  single = os.path.join(path, SAFE_SINGLE)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = {n: os.path.join(path, f) for n, f in weight_map.items()}
    for f in sorted(set(files.values())):
      if not os.path.exists(f):
        raise ValueError(f"{index} names shard {f}, which does not exist")
    return files
  if os.path.exists(single):
    with safe_open(single, framework="np") as f:
      return {n: single for n in f.keys()}
  raise ValueError(
      f"no {SAFE_SINGLE} or {SAFE_INDEX} in {path} (only safetensors"
      " checkpoints are read)"
  )


def read_config(path: str) -> ModelConfig:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise ValueError(f"missing {cfg_path}")
  with open(cfg_path) as f:
    return ModelConfig.from_hf_dict(json.load(f))


def _place(arr: np.ndarray, sharding_):
  if sharding_ is None:
    return jnp.asarray(arr)
  return jax.make_array_from_callback(arr.shape, sharding_, lambda i: arr[i])


def load_hf_model(
    path: str,
    *,
    mesh=None,
    rules=sharding.DEFAULT_RULES,
    dtype: Optional[str] = None,
    param_dtype: Optional[str] = None,
    **overrides,
) -> tuple[ModelConfig, Transformer]:
  """Reads config.json + safetensors into a Transformer.

  ``dtype`` is the compute dtype (e.g. 'bfloat16'), ``param_dtype`` the
  dtype the parameters are held in; both default to float32 whatever the
  checkpoint stores, so a bfloat16 checkpoint loads as float32 master
  weights (``param_dtype='bfloat16'`` only for weights never trained, e.g.
  an inference server). ``overrides`` are other ModelConfig fields (e.g.
  ``remat=True``). With a mesh, each param is placed with
  ``sharding.state_shardings`` (only local shards are copied). Raises
  ValueError naming the file/tensor on a missing file, unsupported
  architecture, missing tensor or shape mismatch.
  """
  cfg = read_config(path)
  overrides.setdefault("logical_axis_rules", rules)  # activations' too
  if dtype is not None:
    overrides["dtype"] = dtype
  if param_dtype is not None:
    overrides["param_dtype"] = param_dtype
  if overrides:
    cfg = dataclasses.replace(cfg, **overrides)
  files = _tensor_files(path)
  graphdef, abstract = _abstract(cfg)
  flat_sh = None
  if mesh is not None:
    flat_sh = dict(
        nnx.to_flat_state(sharding.state_shardings(mesh, abstract, rules))
    )
  handles, out = {}, []
  pdt = jnp.dtype(cfg.param_dtype)

  def read(name: str, shape) -> np.ndarray:
    if name not in files:
      raise ValueError(f"checkpoint {path} has no tensor {name!r}")
    fname = files[name]
    if fname not in handles:
      handles[fname] = safe_open(fname, framework="np")
    t = handles[fname].get_tensor(name)
    want = _hf_shape(name, shape)
    if tuple(t.shape) != want:
      raise ValueError(
          f"tensor {name!r} in {fname} has shape {tuple(t.shape)}, config"
          f" implies {want}"
      )
    return _from_hf(name, t, shape).astype(pdt)

  try:
    for p, var in nnx.to_flat_state(abstract):
      shape = tuple(var.value.shape)
      if _is_stacked(p):  # scanned layers: layer i's tensors at [i]
        arr = np.stack(
            [
                read(_hf_name(_layer_path(p, i)), shape[1:])
                for i in range(shape[0])
            ]
        )
      else:
        arr = read(_hf_name(p), shape)
      sh = flat_sh[p].value if flat_sh is not None else None
      out.append((p, var.replace(_place(arr, sh))))
  finally:
    for h in handles.values():
      if hasattr(h, "__exit__"):
        h.__exit__(None, None, None)
  return cfg, nnx.merge(graphdef, nnx.from_flat_state(out))


# -------------------------------------------------------------------- save


def _host_array(x, dtype) -> np.ndarray:
  """x as numpy in ``dtype``; a device array is cast before it is gathered
  (a bfloat16 export moves half the bytes of the float32 masters)."""
  if isinstance(x, jax.Array):
    x = x.astype(dtype)
    if not x.is_fully_addressable:
      from jax.experimental import multihost_utils

      x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x)).astype(dtype, copy=False)


def export_dtype(cfg: ModelConfig, dtype: Optional[str] = None) -> str:
  """The dtype of an export: ``dtype`` if given, else the compute dtype
  (what a server computes in: bfloat16 at paper scale)."""
  return str(jnp.dtype(dtype or cfg.dtype))


def hf_tensors(
    model: Transformer, cfg: ModelConfig, dtype: Optional[str] = None
) -> dict:
  """HF name -> numpy tensor in ``export_dtype(cfg, dtype)``, in checkpoint
  order."""
  if cfg.family == "llama" and cfg.qkv_bias:
    raise ValueError("llama family with qkv_bias has no HF equivalent")
  dt = jnp.dtype(export_dtype(cfg, dtype))
  entries = []  # (unrolled path, HF name, tensor)
  for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    host = _host_array(var.value, dt)
    if _is_stacked(p):
      items = [(_layer_path(p, i), host[i]) for i in range(host.shape[0])]
    else:
      items = [(p, host)]
    for q, a in items:
      name = _hf_name(q)
      entries.append((q, name, _to_hf(name, a)))
  # The unrolled layout's order (layer by layer), whichever layout this is.
  entries.sort(
      key=lambda e: tuple(
          f"{x:09d}" if isinstance(x, int) else str(x) for x in e[0]
      )
  )
  tensors = {name: t for _, name, t in entries}
  if cfg.family == "qwen2" and not cfg.qkv_bias:
    # HF Qwen2 always has q/k/v biases: zeros are the exact equivalent.
    for n in range(cfg.num_layers):
      for proj, heads in (
          ("q", cfg.num_heads),
          ("k", cfg.num_kv_heads),
          ("v", cfg.num_kv_heads),
      ):
        name = f"model.layers.{n}.self_attn.{proj}_proj.bias"
        tensors[name] = np.zeros((heads * cfg.head_dim,), dt)
  return tensors


def _shard_groups(tensors: dict, max_bytes: int) -> list[list[str]]:
  groups, cur, size = [], [], 0
  for name, t in tensors.items():
    if cur and size + t.nbytes > max_bytes:
      groups.append(cur)
      cur, size = [], 0
    cur.append(name)
    size += t.nbytes
  if cur:
    groups.append(cur)
  return groups


def save_hf_model(
    model: Transformer,
    cfg: ModelConfig,
    path: str,
    *,
    tokenizer_dir: Optional[str] = None,
    max_shard_bytes: int = 2**31,
    dtype: Optional[str] = None,
) -> None:
  """Writes an HF directory loadable by transformers and SGLang.

  config.json, generation_config.json, model.safetensors (or
  model-0000i-of-0000n.safetensors + model.safetensors.index.json when the
  weights exceed max_shard_bytes), and tokenizer files copied from
  tokenizer_dir. Weights in ``dtype``, by default the compute dtype
  (``export_dtype``); ``dtype=cfg.param_dtype`` (e.g. 'float32') keeps the
  master weights exactly. All processes gather; process 0 writes.
  """
  dtype_name = export_dtype(cfg, dtype)
  tensors = hf_tensors(model, cfg, dtype_name)
  if jax.process_index() != 0:
    return
  os.makedirs(path, exist_ok=True)
  for f in os.listdir(path):  # stale weights of an earlier save
    if f == SAFE_INDEX or (
        f.startswith("model") and f.endswith(".safetensors")
    ):
      os.remove(os.path.join(path, f))
  hf_cfg = cfg.to_hf_dict()
  hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dtype_name
  _write_json(os.path.join(path, "config.json"), hf_cfg)
  gen = {"_from_model_config": True}
  if cfg.bos_token_id is not None:
    gen["bos_token_id"] = cfg.bos_token_id
  if cfg.eos_token_id is not None:
    gen["eos_token_id"] = hf_cfg["eos_token_id"]
  _write_json(os.path.join(path, "generation_config.json"), gen)
  meta = {"format": "pt"}
  groups = _shard_groups(tensors, max_shard_bytes)
  if len(groups) == 1:
    save_safetensors(tensors, os.path.join(path, SAFE_SINGLE), metadata=meta)
  else:
    weight_map, n = {}, len(groups)
    for i, names in enumerate(groups):
      fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
      save_safetensors(
          {k: tensors[k] for k in names},
          os.path.join(path, fname),
          metadata=meta,
      )
      weight_map.update({k: fname for k in names})
    total = int(sum(t.nbytes for t in tensors.values()))
    _write_json(
        os.path.join(path, SAFE_INDEX),
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )
  if tokenizer_dir is not None:
    copy_tokenizer_files(tokenizer_dir, path)


def copy_tokenizer_files(src: str, dst: str) -> list[str]:
  """Copies the HF tokenizer files of src into dst; returns their names."""
  names = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(src, f))]
  if not names:
    raise ValueError(f"no tokenizer files {TOKENIZER_FILES} in {src}")
  os.makedirs(dst, exist_ok=True)
  for f in names:
    shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
  return names


def _write_json(path: str, obj) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")
