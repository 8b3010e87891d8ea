"""Tests of rollout/distributed_sync.py (rollout.weight_sync='distributed')
and the per-tensor export it sends (weight_sync.hf_named_arrays); marked
``sglang``, a real SGLang CPU server updated over a gloo group."""

import json
import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from rspo_jax import build, weight_sync
from rspo_jax.errors import ConfigError
from rspo_jax.models import hf_io
from rspo_jax.models.config import get_model_config
from rspo_jax.rollout import distributed_sync as ds

pytest_plugins = ("sglang_fixtures",)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position_embeddings=64,
)


def _torch_importable() -> bool:
  try:
    import torch  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


# ------------------------------------------------- the tensors that are sent


@pytest.mark.parametrize(
    "overrides,per_layer",
    [
        (dict(), 12),  # qwen2 with q/k/v biases, tied head
        (dict(qkv_bias=False, tie_word_embeddings=False), 12),  # zero biases
        (dict(qkv_bias=False, scan_layers=True), 12),  # stacked layers
    ],
)
def test_hf_named_arrays_are_the_exported_tensors(overrides, per_layer):
  """Same names, dtypes, shapes and values as hf_io.hf_tensors (what
  save_hf_model writes), one per tensor: the embedding, 12 a layer (q, k,
  v, o, 3 MLP, 2 norms, 3 biases, zero when the model has none), the final
  norm, the head when untied."""
  cfg = get_model_config("tiny", **SMALL, **overrides)
  model = hf_io.create_model(cfg, seed=0)
  want = hf_io.hf_tensors(model, cfg)
  got = list(weight_sync.hf_named_arrays(model, cfg))
  head = 0 if cfg.tie_word_embeddings else 1
  assert len(got) == 1 + 2 * per_layer + 1 + head == len(want)
  names = [n for n, _ in got]
  assert names[0] == "model.embed_tokens.weight"
  assert all(n.startswith("model.layers.0.") for n in names[1:13])
  assert all(n.startswith("model.layers.1.") for n in names[13:25])
  assert names[25] == "model.norm.weight"
  assert sorted(names) == sorted(want)
  for name, a in got:
    assert isinstance(a, np.ndarray) and a.dtype == want[name].dtype, name
    np.testing.assert_array_equal(a, want[name], err_msg=name)
  # On a device (nccl's DLPack hand-over): the same tensors, as jax.Arrays
  # whole on that device.
  device = jax.devices()[0]
  for (n1, a), (n2, d) in zip(
      got, weight_sync.hf_named_arrays(model, cfg, device=device)
  ):
    assert n1 == n2 and isinstance(d, jax.Array) and d.devices() == {device}
    np.testing.assert_array_equal(np.asarray(d), a, err_msg=n1)


def test_hf_named_arrays_cast_to_the_export_dtype():
  cfg = get_model_config("tiny", **SMALL, dtype="bfloat16")
  model = hf_io.create_model(cfg, seed=0)
  pairs = list(weight_sync.hf_named_arrays(model, cfg))
  assert {a.dtype for _, a in pairs} == {np.dtype(ml_dtypes.bfloat16)}
  assert {ds.dtype_name(a) for _, a in pairs} == {"bfloat16"}
  want = hf_io.hf_tensors(model, cfg)
  for name, a in pairs:
    np.testing.assert_array_equal(a.view(np.uint16), want[name].view(np.uint16))


# ---------------------------------------------------------- the requests


def test_init_group_bodies_offset_each_servers_ranks_after_rank_0():
  # Servers of tp 1, 2 and 4: ranks 1 | 2 3 | 4 5 6 7; world 1 + 7 = 8.
  assert ds.rank_offsets([1, 2, 4]) == ([1, 2, 4], 8)
  assert ds.rank_offsets([2, 2]) == ([1, 3], 5)
  bodies = ds.init_group_bodies(
      [2, 2],
      master_address="10.0.0.5",
      master_port=29600,
      group_name="g",
      backend="nccl",
  )
  assert bodies == [
      dict(
          master_address="10.0.0.5",
          master_port=29600,
          rank_offset=1,
          world_size=5,
          group_name="g",
          backend="nccl",
      ),
      dict(
          master_address="10.0.0.5",
          master_port=29600,
          rank_offset=3,
          world_size=5,
          group_name="g",
          backend="nccl",
      ),
  ]
  with pytest.raises(ValueError, match="backend"):
    ds.init_group_bodies(
        [1], master_address="a", master_port=1, group_name="g", backend="mpi"
    )
  with pytest.raises(ValueError, match="tp size"):
    ds.rank_offsets([1, 0])


def test_batches_keep_order_and_bound_bytes():
  a = np.zeros(10, np.float32)  # 40 bytes
  b = np.zeros((2, 5), np.float32)  # 40
  c = np.zeros(25, np.float32)  # 100: alone, over the bound
  d = np.zeros(4, ml_dtypes.bfloat16)  # 8
  named = [("a", a), ("b", b), ("c", c), ("d", d)]
  got = [[n for n, _ in batch] for batch in ds.batches(iter(named), 96)]
  assert got == [["a", "b"], ["c"], ["d"]]
  assert [[n for n, _ in x] for x in ds.batches(named, 10**6)] == [
      ["a", "b", "c", "d"]
  ]
  assert not list(ds.batches([], 96))
  assert list(ds.with_last("xyz")) == [("x", False), ("y", False), ("z", True)]
  assert not list(ds.with_last([]))


def test_update_bodies_name_dtype_shape_and_version_on_the_last_batch():
  batch = [
      ("model.norm.weight", np.ones(4, np.float32)),
      ("lm_head.weight", np.ones((6, 4), ml_dtypes.bfloat16)),
  ]
  first = ds.update_body(batch, group_name="g", version=7, last=False)
  assert first == dict(
      names=["model.norm.weight", "lm_head.weight"],
      dtypes=["float32", "bfloat16"],
      shapes=[[4], [6, 4]],
      group_name="g",
      flush_cache=False,
  )
  last = ds.update_body(batch[1:], group_name="g", version=7, last=True)
  assert last == dict(
      names=["lm_head.weight"],
      dtypes=["bfloat16"],
      shapes=[[6, 4]],
      group_name="g",
      flush_cache=True,
      weight_version="7",
  )
  json.dumps(last)  # plain JSON


def test_master_address_is_loopback_for_local_servers():
  assert (
      ds.master_address_for(
          ["http://127.0.0.1:30000", "http://localhost:30001"]
      )
      == "127.0.0.1"
  )


# ------------------------------------------------- configuration and torch


def _cfg(**rollout):
  from configs import toy_grpo  # pylint: disable=g-import-not-at-top

  cfg = toy_grpo.get_config()
  with cfg.unlocked():
    cfg.rollout.update(rollout)
  return cfg


def test_weight_sync_config_selects_the_path():
  assert _cfg().rollout.weight_sync == "disk"
  assert build.make_weight_push(_cfg(engine="sglang")) is None
  # The in-process engine has no servers to broadcast to.
  assert build.make_weight_push(_cfg(weight_sync="distributed")) is None
  with pytest.raises(ConfigError, match="rollout.weight_sync='nfs'"):
    build.make_weight_push(_cfg(weight_sync="nfs"))


@pytest.mark.skipif(_torch_importable(), reason="torch is importable here")
def test_distributed_without_torch_names_the_fix():
  with pytest.raises(
      ImportError,
      match="needs torch in the learner's"
      r" process.*or use rollout.weight_sync='disk'",
  ):
    build.make_weight_push(_cfg(engine="sglang", weight_sync="distributed"))
  with pytest.raises(ImportError, match="needs torch"):
    ds.require_torch()
  with pytest.raises(ImportError, match="needs torch"):
    ds.WeightUpdateGroup(["http://127.0.0.1:1"]).connect()
  # The module itself imports without torch (and without JAX: the sglang
  # test runs its rank 0 in SGLang's venv).
  out = subprocess.run(
      [
          sys.executable,
          "-c",
          "import sys; import rspo_jax.rollout.distributed_sync;"
          " print('jax' in sys.modules, 'torch' in sys.modules)",
      ],
      capture_output=True,
      text=True,
      cwd=REPO,
      check=True,
  )
  assert out.stdout.split() == ["False", "False"]


# --------------------------------------- the real SGLang server (sglang)


class _SGLangVenvGroup:
  """A ``WeightUpdateGroup``'s rank 0 run by ``python -m
  rspo_jax.rollout.distributed_sync`` under SGLang's venv (this venv has no
  torch): each update's (name, array) pairs reach it through an .npz."""

  def __init__(self, python, urls, tmp_path, index, bucket_bytes):
    self.tmp = tmp_path
    self.log_path = str(tmp_path / f"group{index}.log")
    self._log = open(self.log_path, "wb")
    self.proc = subprocess.Popen(
        [
            python,
            "-m",
            "rspo_jax.rollout.distributed_sync",
            "--urls",
            ",".join(urls),
            "--backend",
            "gloo",
            "--group_name",
            f"test_group_{index}",
            "--bucket_bytes",
            str(bucket_bytes),
            "--timeout_s",
            "120",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=self._log,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    self.world_size = self._answer()["world_size"]
    self.sent = []

  def _answer(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      with open(self.log_path, "rb") as f:
        tail = f.read()[-3000:].decode("utf-8", "replace")
      raise RuntimeError(f"rank 0 process ended; log tail:\n{tail}")
    return json.loads(line)

  def update(self, named, version):
    path = str(self.tmp / f"v{version}.npz")
    np.savez(path, **dict(named))
    self.proc.stdin.write(json.dumps({"npz": path, "version": version}) + "\n")
    self.proc.stdin.flush()
    out = self._answer()
    if "error" in out:
      raise ds.DistributedSyncError(out["error"])
    self.sent.append(out)
    return out

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)
    self._log.close()


def _learner(model):
  from rspo_jax import sharding  # pylint: disable=g-import-not-at-top
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner

  return Learner(
      model,
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]),
      rules=sharding.DEFAULT_RULES,
  )


@pytest.mark.parametrize(
    "rollout_server",
    [pytest.param("sglang", marks=pytest.mark.sglang)],
    indirect=True,
)
def test_distributed_sync_updates_the_real_sglang_server(
    rollout_server, tiny_checkpoint, tmp_path
):
  """The run's sync with rollout.weight_sync='distributed' (gloo: SGLang's
  CPU build) on the real SGLang server: after a broadcast the server's
  log-probs are our model's with the new weights; an unchanged second sync
  sends nothing; a later change goes over the same group; no file is
  written."""
  import sglang_fixtures as fx  # pylint: disable=g-import-not-at-top
  from rspo_jax.rollout.engine import SamplingParams
  from rspo_jax.rollout.sglang_client import SGLangClient

  _, server = rollout_server
  ck = tiny_checkpoint
  groups = []

  def connect(urls, index):
    # At most 15 kB a batch: the 26 tensors (379 kB) in 16 requests.
    groups.append(
        _SGLangVenvGroup(fx.sglang_python(), urls, tmp_path, index, 15_000)
    )
    return groups[-1]

  push = ds.DistributedPush(backend="gloo", connect=connect)
  export = tmp_path / "export"
  sync = build.make_sync_engine(
      ck.cfg, ck.tokenizer_dir, str(export), push=push
  )
  client = SGLangClient(
      server.url,
      vocab_size=ck.cfg.vocab_size,
      original_logprobs=True,
      timeout_s=120,
  )
  prompts = [
      ck.tokenizer.encode(t)
      for t in ("the quick brown fox", "click buy now on")
  ]
  greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
  try:
    model = fx.perturbed_model(ck.model, ck.cfg, seed=3)
    learner = _learner(model)
    sync(client, learner, 11)
    sync(client, learner, 12)  # unchanged: nothing sent
    assert (sync.log.broadcasts, sync.log.skipped, sync.log.exports) == (
        1,
        1,
        0,
    )
    (group,) = groups
    assert group.world_size == 2  # the learner and one tp-1 server
    (sent,) = group.sent
    pairs = list(weight_sync.hf_named_arrays(model, ck.cfg))
    assert sent["tensors"] == len(pairs) == 26
    # float32: embedding 320 x 64, per layer q, o 64 x 64, k, v 32 x 64,
    # q, k, v biases 64 + 32 + 32, MLP 3 x 128 x 64, 2 norms of 64; a norm.
    per_layer = 2 * 4096 + 2 * 2048 + 128 + 3 * 8192 + 2 * 64
    assert sent["bytes"] == 4 * (320 * 64 + 2 * per_layer + 64) == 379_136
    assert sent["bytes"] == sum(a.nbytes for _, a in pairs)
    # In the export order: alone (over 15 kB) the embedding and each
    # layer's o, q and 3 MLP weights (11 batches); 5 batches of neighbours:
    # layer 0's k weight + bias; q bias + v weight + bias + input norm (x2);
    # layer 0's post norm + layer 1's k weight + bias; the last post norm +
    # the final norm.
    assert sent["batches"] == 16
    assert client.weight_version == 11
    assert client.model_info()["weight_version"] == "11"
    res = client.generate(prompts, greedy)
    for r, ours, old in zip(
        res,
        fx.our_logprobs(model, prompts, res),
        fx.our_logprobs(ck.model, prompts, res),
    ):
      assert len(r.token_ids) >= 1
      np.testing.assert_allclose(r.logprobs, ours, atol=1e-3, rtol=0)
      assert np.max(np.abs(r.logprobs - old)) > 0.05  # the update took

    model2 = fx.perturbed_model(ck.model, ck.cfg, seed=4)
    sync(client, _learner(model2), 13)  # new weights, the same group
    assert (sync.log.broadcasts, len(groups), len(group.sent)) == (2, 1, 2)
    assert client.model_info()["weight_version"] == "13"
    res = client.generate(
        prompts, SamplingParams(temperature=0.4, max_new_tokens=8)
    )
    for r, ours in zip(res, fx.our_logprobs(model2, prompts, res)):
      np.testing.assert_allclose(r.logprobs, ours, atol=1e-3, rtol=0)
    assert not export.exists()  # no file on the way
    assert [h["bytes"] for h in sync.log.history if "bytes" in h] == [
        sent["bytes"]
    ] * 2
  finally:
    sync.close()
    client.close()
