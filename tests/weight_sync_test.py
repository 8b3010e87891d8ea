"""Weight sync (issue 17 item 2): the streamed export writes what
save_hf_model writes; a sync with unchanged weights exports nothing (SGLang
client against our SGLang-API server, and the in-process engine); the export
directory is node-local when the servers are."""

import json
import os
import threading

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from rspo_jax import build, distributed, sharding, train_step as ts
from rspo_jax import weight_sync
from rspo_jax.learner import Learner
from rspo_jax.models import hf_io
from rspo_jax.models.config import get_model_config
from rspo_jax.models.transformer import token_logprobs
from rspo_jax.rollout import http_server
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine
from rspo_jax.rollout.sglang_client import SGLangClient

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position_embeddings=128,
    eos_token_id=1,
    bos_token_id=None,
)


def _learner(**overrides):
  cfg = get_model_config("tiny", **dict(TINY, **overrides))
  module = hf_io.create_model(cfg, seed=0)
  learner = Learner(
      module,
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh((1, -1, 1)),
      rules=sharding.DEFAULT_RULES,
  )
  return cfg, learner


def _changed(learner):
  """What a train step does to the learner: new parameter arrays."""
  learner.state = learner.state.replace(
      params=jax.tree.map(lambda x: x * 1.25, learner.state.params)
  )


def _tensors(path) -> dict:
  index = os.path.join(path, hf_io.SAFE_INDEX)
  files = (
      sorted(set(json.load(open(index))["weight_map"].values()))
      if os.path.exists(index)
      else [hf_io.SAFE_SINGLE]
  )
  out = {}
  for f in files:
    out.update(load_file(os.path.join(path, f)))
  return out


@pytest.mark.parametrize("scan_layers", [False, True])
def test_streamed_export_writes_what_save_hf_model_writes(
    tmp_path, scan_layers
):
  cfg, learner = _learner(scan_layers=scan_layers)
  module = learner.module()
  ref = str(tmp_path / "ref")
  hf_io.save_hf_model(module, cfg, ref, dtype="bfloat16")
  for threads in (1, 4):
    out = str(tmp_path / f"streamed{threads}")
    nbytes = weight_sync.export_hf(
        module, cfg, out, dtype="bfloat16", threads=threads
    )
    want, got = _tensors(ref), _tensors(out)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
      assert got[name].dtype == t.dtype == np.dtype(jnp.bfloat16), name
      np.testing.assert_array_equal(got[name], t, err_msg=name)
    assert nbytes == sum(t.nbytes for t in want.values())
    for f in ("config.json", "generation_config.json"):
      assert json.load(open(os.path.join(out, f))) == json.load(
          open(os.path.join(ref, f))
      )
    # One file a layer, plus the embedding's and the head's.
    index = json.load(open(os.path.join(out, hf_io.SAFE_INDEX)))
    assert len(set(index["weight_map"].values())) == cfg.num_layers + 2
    # Readable as open() would make them (safetensors alone makes 0o600:
    # servers running as another user could not load a shared export).
    mask = os.umask(0)
    os.umask(mask)
    for d in (ref, out):
      for f in os.listdir(d):
        if f.endswith(".safetensors"):
          assert os.stat(os.path.join(d, f)).st_mode & 0o777 == (
              0o666 & ~mask
          ), f


@pytest.fixture
def server():
  """Our SGLang-API server over a JaxEngine of the tiny model."""
  cfg = get_model_config("tiny", **TINY)
  engine = JaxEngine(
      hf_io.create_model(cfg, seed=5),
      cfg,
      pad_id=0,
      eos_ids=(1,),
      batch_buckets=(2,),
      prompt_buckets=(8,),
  )
  srv = http_server.make_server(engine, port=0, vocab_size=cfg.vocab_size)
  threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
  host, port = srv.server_address[:2]
  yield f"http://{host}:{port}"
  srv.shutdown()
  srv.server_close()


def _logprobs(learner, prompts, results):
  """The learner's log pi of each result's tokens (one unsharded forward)."""
  module = nnx.merge(
      learner.graphdef,
      distributed.global_to_host(learner.params),
      distributed.global_to_host(learner.frozen),
  )
  out = []
  for p, r in zip(prompts, results):
    tokens = jnp.asarray([list(p) + r.token_ids.tolist()], jnp.int32)
    t = tokens.shape[1]
    logits, _, _ = module(tokens, jnp.arange(t)[None], jnp.ones((1, t), bool))
    out.append(np.asarray(token_logprobs(logits, tokens)[0, len(p) :]))
  return out


@pytest.mark.slow
def test_sync_with_unchanged_weights_costs_no_export(server, tmp_path):
  cfg, learner = _learner()
  export = str(tmp_path / "export")
  sync = build.make_sync_engine(cfg, None, export, threads=2)
  client = SGLangClient(server)
  prompts, params = [[3, 4, 5], [6]], SamplingParams(max_new_tokens=4, seed=0)

  sync(client, learner, 1)
  assert (sync.log.exports, sync.log.skipped) == (1, 0)
  assert client.weight_version == 1 and os.listdir(export) == ["v1"]
  first = client.generate(prompts, params)
  for r, ours in zip(first, _logprobs(learner, prompts, first)):
    np.testing.assert_allclose(r.logprobs, ours, atol=1e-5)

  sync(client, learner, 2)  # nothing trained: no export, no reload
  assert (sync.log.exports, sync.log.skipped) == (1, 1)
  assert client.weight_version == 1 and os.listdir(export) == ["v1"]
  again = client.generate(prompts, params)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)

  _changed(learner)
  sync(client, learner, 4)
  assert (sync.log.exports, sync.log.skipped) == (2, 1)
  assert client.weight_version == 4
  assert os.listdir(export) == ["v0"]  # v1 removed once v0 was loaded
  new = client.generate(prompts, params)
  for r, ours in zip(new, _logprobs(learner, prompts, new)):
    np.testing.assert_allclose(r.logprobs, ours, atol=1e-5)
  entries = [e for e in sync.log.history if not e.get("skipped")]
  assert all(
      e["total_s"] >= e["export_s"] > 0 and e["load_s"] > 0 for e in entries
  )
  assert [e["version"] for e in sync.log.history] == [1, 2, 4]
  client.close()


def test_in_process_engine_sync_skips_unchanged_weights():
  cfg, learner = _learner()
  engine = JaxEngine(
      build.inference_model(learner.module(), cfg),
      build.engine_config(cfg),
      pad_id=0,
      eos_ids=(1,),
  )
  sync = build.make_sync_engine(cfg, None, "/nonexistent")
  sync(engine, learner, 1)
  sync(engine, learner, 2)
  assert engine.weight_version == 1 and sync.log.skipped == 1
  other = JaxEngine(
      build.inference_model(learner.module(), cfg),
      build.engine_config(cfg),
      pad_id=0,
      eos_ids=(1,),
  )
  sync(other, learner, 3)  # another engine: its own record
  assert other.weight_version == 3
  _changed(learner)
  sync(engine, learner, 5)
  assert engine.weight_version == 5 and sync.log.skipped == 1
  assert sync.log.exports == 0  # the in-process engine never exports


def test_engine_with_its_own_tensor_axis_decodes_as_the_learners_layout():
  """rollout.engine_tensor = 2 under an FSDP-only (1, 8, 1) learner: the
  engine's mesh is (1, 4, 2) over the same devices, its weights split over
  'tensor' (whole over the 4 row shards), and after a sync of trained
  weights it decodes the tokens and log-probs of an engine on the
  learner's mesh fed the same sync."""
  cfg, learner = _learner(num_heads=4, num_kv_heads=2)
  assert learner.mesh.devices.shape == (1, 8, 1)
  run = ml_collections.ConfigDict({"rollout": {"engine_tensor": 2}})
  mesh = build.make_engine_mesh(run, learner.mesh)
  assert mesh.devices.shape == (1, 4, 2)
  assert set(mesh.devices.flat) == set(learner.mesh.devices.flat)
  run.rollout.engine_tensor = 0
  assert build.make_engine_mesh(run, learner.mesh) is learner.mesh
  run.rollout.engine_tensor = 3
  with pytest.raises(build.ConfigError, match="engine_tensor=3"):
    build.make_engine_mesh(run, learner.mesh)

  engines = [
      JaxEngine(
          build.inference_model(learner.module(), cfg),
          build.engine_config(cfg),
          mesh=m,
          pad_id=0,
          eos_ids=(1,),
          batch_buckets=(8,),
      )
      for m in (learner.mesh, mesh)
  ]
  _changed(learner)
  sync = build.make_sync_engine(cfg, None, "/nonexistent")
  prompts = [[3, 4, 5], [6], [7, 8], [9, 10, 11, 12]] * 2
  params = SamplingParams(max_new_tokens=6, temperature=0.0, seed=0)
  out = []
  for e in engines:
    sync(e, learner, 1)
    out.append(e.generate(prompts, params))
  emb = engines[1]._params["embedding"].get_value()
  assert emb.sharding.mesh.devices.shape == (1, 4, 2)
  assert emb.sharding.spec[0] == "tensor"
  for a, b in zip(*out):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _rollout_cfg(**kw):
  c = ml_collections.ConfigDict(
      {"rollout": dict(server_urls="", b_server_urls="", export_dir="")}
  )
  c.rollout.update(kw)
  return c


def test_export_dir_is_node_local_when_the_servers_are(tmp_path):
  work = str(tmp_path / "run")
  local = weight_sync.export_dir(
      _rollout_cfg(server_urls="http://127.0.0.1:30000,http://localhost:1"),
      work,
  )
  if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    assert local.startswith("/dev/shm/rspo_export_")
    assert local == weight_sync.export_dir(
        _rollout_cfg(server_urls="http://127.0.0.1:2"), work
    )  # per workdir
  else:
    assert local == os.path.join(work, "export")
  remote = _rollout_cfg(
      server_urls="http://127.0.0.1:1", b_server_urls="http://node7:30000"
  )
  assert weight_sync.export_dir(remote, work) == os.path.join(work, "export")
  assert weight_sync.export_dir(
      _rollout_cfg(), work, multihost=True
  ) == os.path.join(work, "export")
  given = _rollout_cfg(export_dir=str(tmp_path / "mine"))
  assert weight_sync.export_dir(given, work) == str(tmp_path / "mine")
