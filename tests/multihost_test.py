"""Multi-host learner: 2 processes x 4 CPU devices == 1 process x 8 devices.

The test starts two copies of this file as worker processes on localhost
(``jax.distributed`` over a free port, gloo CPU collectives). Each builds
the same tiny policy and ``Learner`` on a (data, fsdp, tensor) = (2, 2, 2)
mesh spanning both processes, feeds only its own rows of a fixed batch,
runs two train steps, saves an orbax checkpoint together with the other
process and restores it. Process 0 writes losses and the all-gathered
parameters; the test compares them with the same two steps run here in one
process over 8 devices, and restores the 2-process checkpoint into the
1-process learner.

    python tests/multihost_test.py worker OUT_DIR PROCESS_ID NUM_PROC PORT

``permuted_worker`` does the same on a mesh whose device order interleaves
the hosts (each host's rows are two blocks, as in a TPU ring order), with
log-probs in chunks of 4 rows.

The RSPO loop test starts ``rspo_worker``s the same way: each builds the
micro toy run (``build.build_run``, as ``launch/train.py`` does) in one
shared workdir and runs it to the end, recording which groups every
update trained on and which replay shards B's collection left.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH_SHAPE = (2, 2, 2)
ROWS, LENGTH, STEPS = 8, 32, 2


# --------------------------------------------------------------------------
# The workload, shared by the workers and the 1-process reference
# --------------------------------------------------------------------------


def make_batch():
  """A fixed synthetic batch of 8 rows: 2 replayed, 1 right-padded."""
  from rspo_jax.types import Batch

  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 128, size=(ROWS, LENGTH)).astype(np.int32)
  attn = np.ones((ROWS, LENGTH), np.int32)
  attn[5, 20:] = 0
  loss_mask = np.zeros((ROWS, LENGTH), np.float32)
  loss_mask[:, 16:] = 1.0
  loss_mask *= attn
  positions = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
  adv = rng.normal(size=(ROWS, 1)).astype(np.float32) * loss_mask
  old = (-4.0 + 0.1 * rng.normal(size=(ROWS, LENGTH))).astype(np.float32)
  off = np.zeros(ROWS, bool)
  off[[3, 7]] = True  # one replayed row in each host's half
  beh = np.where(off[:, None], old + 0.05 * rng.normal(size=old.shape), old)
  return Batch(
      tokens=tokens,
      positions=positions,
      attention_mask=attn,
      loss_mask=loss_mask,
      advantages=adv,
      old_logp=old,
      ref_logp=old - 0.01,
      behavior_logp=beh.astype(np.float32),
      returns=np.zeros_like(old),
      old_values=np.zeros_like(old),
      is_offpolicy=off,
  )


# A mesh over the devices in this order (positions in jax.devices(), process
# 0 owning 0-3): the (data, fsdp) row blocks 0 and 2 on process 0, 1 and 3 on
# process 1 -- each host's rows are two blocks, as in a TPU ring order.
PERMUTED = (0, 1, 4, 5, 2, 3, 6, 7)


def make_learner(order=None, micro_batch_rows=0):
  import jax

  from rspo_jax import models, sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner

  cfg = models.get_model_config(
      "tiny",
      vocab_size=128,
      num_layers=1,
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
  )
  devices = None if order is None else [jax.devices()[i] for i in order]
  mesh = sharding.make_mesh(MESH_SHAPE, devices)
  loss = ts.make_policy_loss(
      ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01, entropy_coef=0.001)
  )
  return Learner(
      models.create_model(cfg, seed=0),
      ts.make_optimizer(1e-3),
      loss,
      mesh=mesh,
      rules=sharding.DEFAULT_RULES,
      micro_batch_rows=micro_batch_rows,
  )


def host_batch(learner):
  """(this process's rows of the fixed batch, their global indices)."""
  import jax

  from rspo_jax import distributed
  from rspo_jax import train_step as ts

  batch = make_batch()
  shardings = ts.batch_shardings(learner.mesh, batch, learner.rules)
  rows = distributed.process_row_indices(ROWS, shardings.tokens)
  return jax.tree.map(lambda x: x[rows], batch), rows


def train_two_steps(learner):
  """Each process feeds its rows; returns the losses of the two steps."""
  import jax

  from rspo_jax import distributed
  from rspo_jax import train_step as ts

  local, _ = host_batch(learner)
  shardings = ts.batch_shardings(learner.mesh, local, learner.rules)
  global_batch = distributed.host_local_to_global(local, shardings)
  assert global_batch.tokens.shape == (ROWS, LENGTH)
  np.testing.assert_array_equal(
      distributed.global_to_host(global_batch.tokens), make_batch().tokens
  )
  return [
      learner.train(global_batch, jax.random.key(i))["loss"]
      for i in range(STEPS)
  ]


def flat_params(params) -> dict:
  import jax

  from rspo_jax import distributed

  host = distributed.global_to_host(params)
  leaves = jax.tree_util.tree_leaves_with_path(host)
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


# --------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------


def worker(out_dir: str, process_id: int, num_processes: int, port: int):
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import distributed
  from rspo_jax.checkpoint import RunCheckpointer

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  assert jax.process_count() == num_processes
  assert len(jax.local_devices()) == 4 and len(jax.devices()) == 8
  learner = make_learner()
  per_process = distributed.global_mesh_devices(learner.mesh)
  losses = train_two_steps(learner)
  params = flat_params(learner.params)

  # Both processes write their shards of one checkpoint, then restore it.
  ckpt = RunCheckpointer(os.path.join(out_dir, "ckpt"))
  ckpt.save(STEPS, {"policy": learner.state}, {"a_steps": STEPS})
  restored, meta = ckpt.restore({"policy": learner.state})
  ckpt.close()
  same = all(
      np.array_equal(params[k], v)
      for k, v in flat_params(restored["policy"].params).items()
  )
  if distributed.is_leader():
    np.savez(os.path.join(out_dir, "params.npz"), **params)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
      json.dump(
          {
              "losses": losses,
              "restored_equal": same,
              "meta": meta,
              "devices_per_process": {
                  str(k): v for k, v in per_process.items()
              },
              "step": learner.step,
          },
          f,
      )
  distributed.barrier("done")
  distributed.shutdown()


def permuted_worker(
    out_dir: str, process_id: int, num_processes: int, port: int
):
  """The learner on a mesh over ``PERMUTED`` devices, forwards in chunks of
  4 rows: each host feeds its two row blocks; log-probs before and after
  two steps, each host's rows (``HostBatches.apply``) and all of them."""
  from types import SimpleNamespace

  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import distributed
  from rspo_jax.host_batches import HostBatches

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  learner = make_learner(PERMUTED, micro_batch_rows=4)
  local, rows = host_batch(learner)
  cfg = SimpleNamespace(
      train=SimpleNamespace(micro_batch_rows=4),
      rollout=SimpleNamespace(max_prompt_tokens=LENGTH, max_new_tokens=0),
  )
  batches = HostBatches(cfg, multihost=True)
  before = batches.apply(learner, local)
  everyone = learner.apply(batches.to_global(learner, local))
  losses = train_two_steps(learner)
  after = batches.apply(learner, local)
  params = flat_params(learner.params)
  engine = engine_on_host_meshes(learner)
  np.savez(
      os.path.join(out_dir, f"permuted{process_id}.npz"),
      rows=rows,
      before=before,
      after=after,
      everyone=everyone,
      losses=np.asarray(losses),
      chunks=learner.apply_chunks(ROWS),
      **engine,
  )
  if distributed.is_leader():
    np.savez(os.path.join(out_dir, "params.npz"), **params)
  distributed.barrier("done")
  distributed.shutdown()


# Tensor groups (0, 4), (1, 5), ... span the two hosts.
ACROSS_HOSTS = (0, 4, 1, 5, 2, 6, 3, 7)
PROMPTS = ([5, 6, 7, 8], [9, 10], [11, 12, 13], [5, 6, 7, 8])


def engine_on_host_meshes(learner) -> dict:
  """The learner's bf16 weights moved onto this host's engine mesh
  (``distributed.to_host_mesh``) with ``global_to_host`` disabled (no
  host copy): from the learner's mesh (tensor groups within hosts: split
  over 'tensor' as there), from a (1, 4, 2) mesh over ACROSS_HOSTS (whole
  on every device), and from that mesh onto an engine mesh with its own
  tensor axis of 2 (``rollout.engine_tensor``: tensor blocks elsewhere than
  on the learner's; the leaf-by-leaf path). Returns each layout's facts, the
  weights, and greedy tokens of a ``JaxEngine`` on the host mesh fed them."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding

  from rspo_jax import build, distributed, sharding
  from rspo_jax.rollout import engine as eng
  from rspo_jax.rollout.jax_engine import JaxEngine

  graphdef, _, rest = nnx.split(learner.module(), nnx.Param, ...)
  bf16 = build.cast_floating(learner.params, jnp.bfloat16)
  host_tree = distributed.global_to_host(bf16)
  host = flat_params(host_tree)
  across = sharding.make_mesh(
      (1, 4, 2), [jax.devices()[i] for i in ACROSS_HOSTS]
  )
  on_across = jax.tree.map(  # the learner's specs, on ACROSS_HOSTS
      lambda x, h: jax.make_array_from_callback(
          x.shape, NamedSharding(across, x.sharding.spec), lambda i, h=h: h[i]
      ),
      bf16,
      host_tree,
  )
  real, out = distributed.global_to_host, {}

  def refuse(tree):
    raise AssertionError("global_to_host called: a host copy")

  distributed.global_to_host = refuse
  try:
    tp = distributed.host_mesh(across, tensor=2)  # not across's blocks
    for name, mesh, params, local, shardings in (
        (
            "learner",
            learner.mesh,
            bf16,
            distributed.host_mesh(learner.mesh),
            None,
        ),
        ("across", across, on_across, distributed.host_mesh(across), None),
        (
            "across_tp",
            across,
            on_across,
            tp,
            sharding.state_shardings(
                tp, bf16, sharding.inference_rules(sharding.DEFAULT_RULES)
            ),
        ),
    ):
      moved = distributed.to_host_mesh(params, mesh, shardings)
      leaves = jax.tree_util.tree_leaves_with_path(moved)
      out[f"{name}_mesh"] = np.asarray(local.devices.shape)
      out[f"{name}_local"] = np.asarray(
          [
              x.is_fully_addressable
              and x.sharding.mesh.devices.shape == local.devices.shape
              and set(x.devices()) == set(local.devices.flat)
              and not {"data", "fsdp"}
              & set(jax.tree.leaves(tuple(x.sharding.spec)))
              and np.array_equal(np.asarray(x), host[jax.tree_util.keystr(k)])
              for k, x in leaves
          ]
      )
      out[f"{name}_split"] = np.asarray(
          sum(
              "tensor" in jax.tree.leaves(tuple(x.sharding.spec))
              for _, x in leaves
          )
      )
      engine = JaxEngine(
          (graphdef, moved, rest),
          learner.module().cfg,
          mesh=local,
          pad_id=0,
          eos_ids=[1],
      )
      res = engine.generate(
          list(PROMPTS),
          eng.SamplingParams(max_new_tokens=6, temperature=0.0, seed=0),
      )
      out[f"{name}_tokens"] = padded_tokens(res)
  finally:
    distributed.global_to_host = real
  return out


def padded_tokens(results, length: int = 6) -> np.ndarray:
  """[rows, length] generated ids, -1 after a row's last."""
  out = np.full((len(results), length), -1)
  for i, r in enumerate(results):
    out[i, : len(r.token_ids)] = r.token_ids
  return out


# --------------------------------------------------------------------------
# Helpers, in this one process (fast)
# --------------------------------------------------------------------------


def test_initialize_is_a_no_op_without_a_multi_process_job():
  import jax

  from rspo_jax import distributed

  assert distributed.initialize(num_processes=1) is False
  assert distributed.initialize(environ={}) is False
  # One SLURM task (salloc + python) is not a multi-process job.
  slurm1 = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
  assert distributed.initialize(environ=slurm1) is False
  assert (
      distributed.initialize(
          environ={"RSPO_NUM_PROCESSES": "1", "SLURM_NTASKS": "4"}
      )
      is False
  )
  assert not jax.distributed.is_initialized()
  assert distributed.is_leader()


def test_host_mesh_keeps_each_device_at_its_tensor_index():
  """One process: the host mesh is the mesh's devices as (1, 4, 2), each
  at its tensor index on the learner's (2, 2, 2) PERMUTED mesh, and
  ``to_host_mesh`` gives the same values, whole over the rows, split over
  'tensor' only, each device holding the block it holds for the
  learner."""
  import jax

  from rspo_jax import distributed

  learner = make_learner(PERMUTED)
  mesh = learner.mesh
  local = distributed.host_mesh(mesh)
  assert local.devices.shape == (1, 4, 2)
  tensor_index = {d: t for (_, _, t), d in np.ndenumerate(mesh.devices)}
  for (_, _, t), d in np.ndenumerate(local.devices):
    assert tensor_index[d] == t
  moved = distributed.to_host_mesh(learner.params, mesh)
  split = 0
  for x, y in zip(jax.tree.leaves(learner.params), jax.tree.leaves(moved)):
    spec = jax.tree.leaves(tuple(y.sharding.spec))
    assert y.sharding.mesh.devices.shape == (1, 4, 2)
    assert not {"data", "fsdp"} & set(spec)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    if "tensor" in spec:
      split += 1
      for shard in y.addressable_shards:  # the block the learner's has
        np.testing.assert_array_equal(
            np.asarray(shard.data), np.asarray(x)[shard.index]
        )
  assert split > 0


def test_initialize_names_bad_settings():
  from rspo_jax import distributed

  with pytest.raises(ValueError, match=r"missing: \['process_id"):
    distributed.initialize("127.0.0.1:1234", 2, environ={})
  env = {
      "RSPO_COORDINATOR": "h:1",
      "RSPO_NUM_PROCESSES": "2",
      "RSPO_PROCESS_ID": "2",
  }
  with pytest.raises(ValueError, match=r"process_id=2 is outside \[0, "):
    distributed.initialize(environ=env)
  with pytest.raises(ValueError, match="RSPO_NUM_PROCESSES='two'"):
    distributed.initialize(environ={"RSPO_NUM_PROCESSES": "two"})
  with pytest.raises(ValueError, match="num_processes must be >= 1"):
    distributed.initialize(num_processes=0, environ={})


def test_detected_cluster():
  from rspo_jax import distributed

  slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
  assert distributed.detected_cluster(slurm) == "slurm"
  assert (
      distributed.detected_cluster({**slurm, "SLURM_STEP_NUM_TASKS": "1"}) == ""
  )
  assert distributed.detected_cluster({"OMPI_COMM_WORLD_SIZE": "4"}) == "ompi"
  assert (
      distributed.detected_cluster({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"})
      == "tpu"
  )
  assert distributed.detected_cluster({"TPU_WORKER_HOSTNAMES": "w0"}) == ""
  assert distributed.detected_cluster({"RSPO_DISTRIBUTED": "auto"}) == "auto"
  assert distributed.detected_cluster({}) == ""


def test_process_row_range_blocks():
  from rspo_jax import distributed

  blocks = [
      distributed.process_row_range(8, process_index=p, process_count=2)
      for p in (0, 1)
  ]
  assert blocks == [(0, 4), (4, 8)]
  rows = list("abcdefgh")
  assert distributed.host_rows(rows, process_index=1, process_count=4) == [
      "c",
      "d",
  ]
  with pytest.raises(ValueError, match="6 rows do not split evenly over 4"):
    distributed.process_row_range(6, process_index=0, process_count=4)
  with pytest.raises(ValueError, match="process_index=2 outside"):
    distributed.process_row_range(8, process_index=2, process_count=2)


def test_host_local_to_global_in_one_process_is_device_put():
  import jax

  from rspo_jax import distributed, sharding
  from rspo_jax import train_step as ts

  mesh = sharding.make_mesh(MESH_SHAPE)
  batch = make_batch()
  shardings = ts.batch_shardings(mesh, batch, sharding.DEFAULT_RULES)
  # One process owns every row.
  assert distributed.process_row_range(ROWS, shardings.tokens) == (0, ROWS)
  out = distributed.host_local_to_global(batch, shardings)
  for name, x, s in zip(batch._fields, out, shardings):
    assert x.sharding == s, name
    np.testing.assert_array_equal(np.asarray(x), getattr(batch, name))
  assert out.tokens.sharding.spec[0] == ("data", "fsdp")
  back = distributed.global_to_host(out)
  np.testing.assert_array_equal(back.advantages, batch.advantages)
  assert distributed.global_mesh_devices(mesh) == {0: 8}
  assert len(jax.devices()) == 8


def test_host_share_tiles_the_items_evenly():
  from rspo_jax import distributed

  shares = [
      distributed.host_share(5, process_index=p, process_count=2)
      for p in (0, 1)
  ]
  assert shares == [(0, 2), (2, 5)]
  # Fewer items than hosts: some shares are empty, none overlap.
  assert [
      distributed.host_share(1, process_index=p, process_count=3)
      for p in range(3)
  ] == [(0, 0), (0, 0), (0, 1)]
  assert distributed.host_share(4) == (0, 4)  # one process: everything
  with pytest.raises(ValueError, match="process_index=3 outside"):
    distributed.host_share(4, process_index=3, process_count=2)


def test_one_process_reductions_are_identities():
  from rspo_jax import distributed

  np.testing.assert_array_equal(distributed.global_sum([1.5, 2]), [1.5, 2])
  assert int(distributed.global_max(np.int64(7))) == 7
  assert distributed.allgather_objects({"a": [1, 2]}) == [{"a": [1, 2]}]
  assert not distributed.is_multihost()


def test_pad_rows_and_length_zero_pads_both_axes():
  from rspo_jax import distributed

  tree = {"x": np.ones((2, 3), np.int32), "flag": np.array([True, False])}
  out = distributed.pad_rows_and_length(tree, 4, 5)
  assert out["x"].shape == (4, 5) and out["x"].dtype == np.int32
  assert out["x"].sum() == 6 and out["x"][:2, :3].all()
  np.testing.assert_array_equal(out["flag"], [True, False, False, False])
  with pytest.raises(ValueError, match=r"shape \(2, 3\) down to \(1, 5\)"):
    distributed.pad_rows_and_length({"x": tree["x"]}, 1, 5)


def test_combine_stats_of_two_hosts():
  from rspo_jax.rollout import collect

  a = dict(
      collect.empty_stats(),
      success_rate=1.0,
      episodes=2,
      env_steps=6,
      invalid_action_rate=0.5,
      collect_time_s=3.0,
      gen_tokens=10,
  )
  b = dict(
      collect.empty_stats(),
      success_rate=0.0,
      episodes=6,
      env_steps=2,
      invalid_action_rate=0.0,
      collect_time_s=5.0,
      gen_tokens=4,
  )
  out = collect.combine_stats([a, b])
  assert out["success_rate"] == pytest.approx(2 / 8)  # per episode
  assert out["invalid_action_rate"] == pytest.approx(3 / 8)  # per step
  assert (out["episodes"], out["env_steps"], out["gen_tokens"]) == (8, 8, 14)
  assert out["collect_time_s"] == 5.0  # the slowest host
  assert collect.combine_stats([a]) == a
  assert collect.empty_stats()["episodes"] == 0
  # The same two as consecutive rounds on one host: times add up,
  # throughputs are time-weighted.
  a["env_steps_per_s"], b["env_steps_per_s"] = 2.0, 4.0
  rounds = collect.combine_rounds([a, b])
  assert rounds["collect_time_s"] == 8.0 and rounds["episodes"] == 8
  assert rounds["env_steps_per_s"] == pytest.approx((2 * 3 + 4 * 5) / 8)
  assert rounds["success_rate"] == pytest.approx(2 / 8)


def test_replay_hosts_write_side_by_side(tmp_path):
  """Two hosts' buffers on one directory: each writes its own prefix, both
  read everything; a crashed writer's temporary is recovered only by its
  own host; clear removes every host's shards."""
  from rspo_jax import replay
  from rspo_jax.types import StepRecord, Trajectory

  def traj(tid, gid):
    return Trajectory(
        [
            StepRecord(
                task_id=1,
                group_id=gid,
                traj_id=tid,
                step_idx=0,
                prompt_ids=np.arange(3, dtype=np.int32),
                response_ids=np.arange(2, dtype=np.int32),
                behavior_logp=np.zeros(2, np.float32),
                outcome_reward=float(tid),
            )
        ]
    )

  d = str(tmp_path)
  h0 = replay.ReplayBuffer(d, prefix="p00000")
  h1 = replay.ReplayBuffer(d, prefix="p00001")
  h0.add_trajectories([traj(0, 0), traj(1, 0)])
  h1.add_trajectories([traj(2, 1)])
  assert h0.shards_by_prefix() == {"p00000": 1, "p00001": 1}
  for h in (h0, h1):
    assert [[t.steps[0].traj_id for t in g] for g in h.groups()] == [
        [0, 1],
        [2],
    ]
  stale = tmp_path / "p00001-000009-0000abcd.array_record.tmp"
  stale.write_bytes(b"")
  replay.ReplayBuffer(d, prefix="p00000")  # not its temporary
  assert stale.exists()
  replay.ReplayBuffer(d, prefix="p00001")
  assert not stale.exists()
  h0.clear()
  assert h1.num_trajectories == 0 and h1.shards_by_prefix() == {}


# --------------------------------------------------------------------------
# Two processes (slow: each compiles the train step)
# --------------------------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(
    out_dir: str,
    num_processes: int = 2,
    timeout: float = 600,
    role: str = "worker",
    script: str = __file__,
):
  """Runs ``python script role out_dir process_id num_processes port`` as
  ``num_processes`` workers; each must exit 0."""
  port = _free_port()
  env = dict(os.environ)
  env.update(
      JAX_PLATFORMS="cpu",
      XLA_FLAGS="--xla_force_host_platform_device_count=4",
      PYTHONPATH=ROOT,
  )
  for k in ("RSPO_COORDINATOR", "RSPO_NUM_PROCESSES", "RSPO_PROCESS_ID"):
    env.pop(k, None)
  procs = [
      subprocess.Popen(
          [
              sys.executable,
              os.path.abspath(script),
              role,
              out_dir,
              str(i),
              str(num_processes),
              str(port),
          ],
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for i in range(num_processes)
  ]
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=timeout)
      outputs.append(out)
  finally:
    for p in procs:  # a hung peer must not outlive the test
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, out) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"worker {i} failed:\n{out[-4000:]}"


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  import jax

  from rspo_jax.checkpoint import RunCheckpointer

  _launch(str(tmp_path))
  with open(tmp_path / "result.json") as f:
    result = json.load(f)
  multi = dict(np.load(tmp_path / "params.npz"))
  assert result["devices_per_process"] == {"0": 4, "1": 4}
  assert result["step"] == STEPS and result["restored_equal"]
  assert result["meta"]["a_steps"] == STEPS

  assert len(jax.devices()) == 8  # conftest: one process, 8 CPU devices
  learner = make_learner()
  losses = train_two_steps(learner)
  single = flat_params(learner.params)
  np.testing.assert_allclose(result["losses"], losses, rtol=1e-5, atol=1e-5)
  assert sorted(multi) == sorted(single)
  for k in single:
    np.testing.assert_allclose(multi[k], single[k], atol=1e-5, err_msg=k)
  # The training moved the weights, so the equality above is not vacuous.
  init = flat_params(make_learner().params)
  assert max(np.abs(single[k] - init[k]).max() for k in single) > 1e-4

  # The checkpoint both processes wrote restores into a 1-process learner.
  fresh = make_learner()
  ckpt = RunCheckpointer(str(tmp_path / "ckpt"))
  restored, _ = ckpt.restore({"policy": fresh.state})
  ckpt.close()
  back = flat_params(restored["policy"].params)
  for k in single:
    np.testing.assert_array_equal(back[k], multi[k], err_msg=k)
  assert int(restored["policy"].step) == STEPS


@pytest.mark.slow
def test_two_processes_on_a_permuted_mesh(tmp_path):
  """Hosts whose rows are not one block (mesh over PERMUTED devices): each
  feeds rows {0, 1, 4, 5} / {2, 3, 6, 7}; the global batch, the losses,
  the parameters and the chunked log-probs (2 calls of 4 rows) equal one
  process on the same mesh, and each host gets its own rows back."""
  _launch(str(tmp_path), role="permuted_worker")
  got = [dict(np.load(tmp_path / f"permuted{p}.npz")) for p in (0, 1)]
  np.testing.assert_array_equal(got[0]["rows"], [0, 1, 4, 5])
  np.testing.assert_array_equal(got[1]["rows"], [2, 3, 6, 7])

  learner = make_learner(PERMUTED, micro_batch_rows=4)
  assert learner.apply_chunks(ROWS) == got[0]["chunks"] == 2
  batch = make_batch()
  before = learner.apply(batch)
  losses = train_two_steps(learner)
  after = learner.apply(batch)
  for g in got:
    np.testing.assert_allclose(g["everyone"], before, atol=1e-6)
    np.testing.assert_allclose(g["before"], before[g["rows"]], atol=1e-6)
    np.testing.assert_allclose(g["after"], after[g["rows"]], atol=1e-5)
    np.testing.assert_allclose(g["losses"], losses, rtol=1e-5, atol=1e-5)
  assert np.abs(after - before).max() > 1e-4  # the steps moved log-probs
  multi, single = dict(np.load(tmp_path / "params.npz")), flat_params(
      learner.params
  )
  for k in single:
    np.testing.assert_allclose(multi[k], single[k], atol=1e-5, err_msg=k)

  # The engine's weights reach each host's devices with no host copy: whole
  # over the rows (split over 'tensor' when the learner's tensor groups lie
  # within hosts), equal to the learner's bf16 weights, and an engine
  # there decodes what one fed the same weights from the host does.
  import jax.numpy as jnp
  from flax import nnx

  from rspo_jax import build
  from rspo_jax.rollout import engine as eng
  from rspo_jax.rollout.jax_engine import JaxEngine

  module = learner.module()
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  reference = JaxEngine(
      (graphdef, build.cast_floating(params, jnp.bfloat16), rest),
      module.cfg,
      pad_id=0,
      eos_ids=[1],
  )
  want = padded_tokens(
      reference.generate(
          list(PROMPTS),
          eng.SamplingParams(max_new_tokens=6, temperature=0.0, seed=0),
      )
  )
  for g in got:
    np.testing.assert_array_equal(g["learner_mesh"], [1, 2, 2])
    np.testing.assert_array_equal(g["across_mesh"], [1, 4, 1])
    np.testing.assert_array_equal(g["across_tp_mesh"], [1, 2, 2])
    assert g["learner_local"].all() and g["across_local"].all()
    assert g["across_tp_local"].all()
    assert g["learner_split"] > 0 and g["across_split"] == 0
    assert g["across_tp_split"] > 0
    for name in ("learner", "across", "across_tp"):
      np.testing.assert_array_equal(g[f"{name}_tokens"], want)


# --------------------------------------------------------------------------
# The RSPO loop over two processes
# --------------------------------------------------------------------------

# rspo_e2e_test's micro toy run, 4 groups of 2 a batch (A's steps: 2 fresh
# groups + 4 replayed trajectories), 2 loops of k = 1.
RSPO_OVERRIDES = (
    "model.overrides=num_layers=1;hidden_size=64;intermediate_size=128;"
    "num_heads=2;num_kv_heads=1;head_dim=32,model.tokenizer_vocab=300,"
    "sft.steps=8,sft.num_episodes=16,sft.batch_rows=16,"
    "train.batch_tasks=4,train.group_size=2,rspo.alpha=0.5,rspo.k=1,"
    "steps=2,env.max_steps=3,env.num_eval_tasks=4,env.num_workers=1,"
    "rollout.max_new_tokens=16,rollout.max_prompt_tokens=256"
)
RSPO_STEPS, RSPO_TASKS = 2, 4


def rspo_worker(out_dir: str, process_id: int, num_processes: int, port: int):
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import build, distributed

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  from configs import toy_grpo

  workdir = os.path.join(out_dir, "run")
  run = build.build_run(
      toy_grpo.get_config(RSPO_OVERRIDES), workdir, progress=False
  )
  t = run.trainer
  updates, stored = [], []
  update, b_phase = t.update, t.b_phase

  def update_spy(learner, critic, on, off, source, step_key, **kw):
    updates.append(
        {
            "step_key": step_key,
            "policy": "A" if learner is t.a else "B",
            "on": sorted({r.group_id for r in on}),
            "off": sorted({r.traj_id for r in off}),
            "off_groups": sorted({r.group_id for r in off}),
        }
    )
    return update(learner, critic, on, off, source, step_key, **kw)

  def b_phase_spy():
    b_phase()
    stored.append(
        {
            "groups": [g[0].group_id for g in t.buffer.groups()],
            "shards": sorted(
                os.path.basename(p)
                for p in distributed_shards(t.buffer.directory)
            ),
        }
    )

  t.update, t.b_phase = update_spy, b_phase_spy
  try:
    t.run(evaluate=run.evaluate)
    final = run.evaluate(t.a, t.state.a_steps)
    left = distributed_shards(t.buffer.directory)
    params = flat_params(t.a.params)
    np.savez(os.path.join(out_dir, f"params{process_id}.npz"), **params)
    with open(os.path.join(out_dir, f"rspo{process_id}.json"), "w") as f:
      json.dump(
          {
              "a_steps": t.state.a_steps,
              "policy_step": t.a.step,
              "loop": t.state.loop,
              "updates": updates,
              "stored": stored,
              "shards_left": len(left),
              "final": final,
              "metrics_file": os.path.exists(
                  os.path.join(workdir, "metrics.jsonl")
              ),
          },
          f,
      )
  finally:
    run.close()
  distributed.barrier("rspo_done")
  distributed.shutdown()


def distributed_shards(directory: str) -> list:
  from rspo_jax import replay

  return replay.list_shards(directory)


@pytest.mark.slow
def test_rspo_loop_on_two_processes(tmp_path):
  """Two processes x 4 CPU devices run the RSPO loop to the end together:
  same step counts and final parameters on both; each host wrote its own
  replay shards; every group of every update was trained exactly once,
  by one host; D is empty at the end; only the leader wrote metrics."""
  _launch(str(tmp_path), role="rspo_worker")
  res = [json.load(open(tmp_path / f"rspo{p}.json")) for p in (0, 1)]
  params = [dict(np.load(tmp_path / f"params{p}.npz")) for p in (0, 1)]
  for r in res:
    assert r["a_steps"] == RSPO_STEPS
  # Optimizer steps: the A steps' updates (train.updates_per_step each).
  rows = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
  a_updates = sum(r["updates"] for r in rows if r["phase"] == "A")
  assert a_updates >= RSPO_STEPS
  for r in res:
    assert r["policy_step"] == a_updates
    assert r["loop"] == RSPO_STEPS  # k = 1: one loop per A step
    assert r["shards_left"] == 0  # D cleared after its loop
  assert res[0]["final"] == res[1]["final"]  # summed over both hosts
  assert 0.0 <= res[0]["final"]["success_rate"] <= 1.0
  assert sorted(params[0]) == sorted(params[1])
  for k in params[0]:
    np.testing.assert_array_equal(params[0][k], params[1][k], err_msg=k)

  # B's stored collection: 4 groups, 2 written by each host, one shard
  # prefix per host, the same D seen from both hosts.
  assert res[0]["stored"] == res[1]["stored"]
  assert len(res[0]["stored"]) == RSPO_STEPS
  for loop in res[0]["stored"]:
    assert len(loop["groups"]) == RSPO_TASKS
    prefixes = sorted({s.split("-")[0] for s in loop["shards"]})
    assert prefixes == ["p00000", "p00001"]

  # Updates happen together (same order, same keys) on both hosts; the
  # fresh groups and the replayed trajectories of each are split between
  # the hosts, each trained once.
  assert [(u["step_key"], u["policy"]) for u in res[0]["updates"]] == [
      (u["step_key"], u["policy"]) for u in res[1]["updates"]
  ]
  a_updates = 0
  for u0, u1 in zip(res[0]["updates"], res[1]["updates"]):
    groups = u0["on"] + u1["on"]
    assert len(groups) == len(set(groups)), (u0, u1)
    assert u0["on"] + u0["off"] and u1["on"] + u1["off"]  # both hosts train
    if u0["policy"] == "A":
      # alpha = 1/2 of 4 x 2 samples: 2 fresh groups, 4 trajectories of D.
      replayed = u0["off"] + u1["off"]
      assert len(groups) == RSPO_TASKS // 2
      assert len(replayed) == len(set(replayed)) == RSPO_TASKS
      assert set(u0["off_groups"] + u1["off_groups"]) <= set(
          res[0]["stored"][a_updates]["groups"]
      )
      a_updates += 1
    else:
      assert len(groups) == RSPO_TASKS and not u0["off"] + u1["off"]
  assert a_updates == RSPO_STEPS

  # Only the leader wrote metrics: one 'A' row per step.
  rows = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["step"] for r in rows if r["phase"] == "A"] == [1, 2]
  a_rows = [r for r in rows if r["phase"] == "A"]
  assert all(r["rows_off"] > 0 and r["rows_on"] > 0 for r in a_rows)
  collect_rows = [r for r in rows if r["phase"] == "B_collect"]
  assert [r["buffer_num_groups"] for r in collect_rows] == [RSPO_TASKS] * 2


# --------------------------------------------------------------------------
# The PRM as B's dense reward over two processes
# --------------------------------------------------------------------------

# 4 groups of 2 for the PRM's first fit (2 played by each host), a refit at
# the end of each of the 2 loops.
PRM_OVERRIDES = (
    ",rspo.dense_reward=prm,rspo.prm_steps=20,"
    "rspo.prm_train_groups=4,rspo.prm_refresh_loops=1"
)


def probe_records(n: int = 6) -> list:
  """The same step records on every process (token ids < the toy vocab)."""
  from rspo_jax.types import StepRecord

  rng = np.random.default_rng(0)
  return [
      StepRecord(
          task_id=i,
          group_id=i,
          traj_id=i,
          step_idx=0,
          prompt_ids=rng.integers(3, 200, 20 + i).astype(np.int32),
          response_ids=rng.integers(3, 200, 5).astype(np.int32),
          behavior_logp=np.zeros(5, np.float32),
      )
      for i in range(n)
  ]


def prm_worker(out_dir: str, process_id: int, num_processes: int, port: int):
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import build, distributed, prm

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  from configs import toy_grpo

  fits, train_prm = [], prm.train_prm

  def train_spy(backbone_dir, records, out, **kw):
    fits.append(sorted({r.group_id for r in records}))
    return train_prm(backbone_dir, records, out, **kw)

  prm.train_prm = train_spy  # build's refresh looks it up at each call
  workdir = os.path.join(out_dir, "run")
  run = build.build_run(
      toy_grpo.get_config(RSPO_OVERRIDES + PRM_OVERRIDES),
      workdir,
      progress=False,
  )
  t = run.trainer
  b_dense = []
  collect = t.collect_groups

  def collect_spy(learner, n_groups, tag, *a, **kw):
    records, stats = collect(learner, n_groups, tag, *a, **kw)
    if tag == "B":
      b_dense.append([r.dense_reward for r in records])
    return records, stats

  t.collect_groups = collect_spy
  local = build.prm_mesh(run.cfg, run.mesh)
  try:
    first_fit = list(fits)
    t.run()
    with open(os.path.join(out_dir, f"prm{process_id}.json"), "w") as f:
      json.dump(
          {
              "first_fit": first_fit,
              "fits": fits,
              "b_dense": b_dense,
              "a_steps": t.state.a_steps,
              "probe": t.dense_fn(probe_records()).tolist(),
              "local_mesh": list(local.devices.shape),
              "local_devices_mine": all(
                  d.process_index == process_id for d in local.devices.flat
              ),
          },
          f,
      )
  finally:
    run.close()
  distributed.barrier("prm_done")
  distributed.shutdown()


def ppo_worker(out_dir: str, process_id: int, num_processes: int, port: int):
  """The micro toy run as the PPO baseline (no RSPO, 2 A steps): each
  host's per-token advantages of every step, as credit returns them."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import build, credit, distributed

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  from configs import toy_grpo

  advantages, compute = [], credit.compute_advantages

  def spy(*a, **kw):
    adv, returns = compute(*a, **kw)
    advantages.append(np.concatenate(adv).tolist() if adv else [])
    return adv, returns

  credit.compute_advantages = spy  # update.py reads it at each call
  run = build.build_run(
      toy_grpo.get_config(RSPO_OVERRIDES + ",algo.name=ppo,rspo=0"),
      os.path.join(out_dir, "run"),
      progress=False,
  )
  try:
    run.trainer.run()
    with open(os.path.join(out_dir, f"ppo{process_id}.json"), "w") as f:
      json.dump(
          {"advantages": advantages, "a_steps": run.trainer.state.a_steps}, f
      )
  finally:
    run.close()
  distributed.barrier("ppo_done")
  distributed.shutdown()


@pytest.mark.slow
def test_ppo_whitens_over_both_processes(tmp_path):
  """PPO on 2 processes: each step's advantages, whitened with the
  statistics of both hosts' tokens (verl whitens its whole batch), have
  mean 0 and unbiased std 1 over the two hosts together."""
  _launch(str(tmp_path), role="ppo_worker")
  res = [json.load(open(tmp_path / f"ppo{p}.json")) for p in (0, 1)]
  assert res[0]["a_steps"] == res[1]["a_steps"] >= 1
  assert len(res[0]["advantages"]) == len(res[1]["advantages"]) >= 1
  for a, b in zip(res[0]["advantages"], res[1]["advantages"]):
    both = np.asarray(a + b)
    assert len(a) and len(b)
    assert abs(both.mean()) < 1e-4
    assert abs(both.std(ddof=1) - 1.0) < 1e-3


@pytest.mark.slow
def test_prm_dense_reward_on_two_processes(tmp_path):
  """rspo.dense_reward=prm on 2 processes x 4 CPU devices: the leader alone
  fits the PRM, on every host's trajectories (the first fit: the 4 groups
  the two hosts played), on its own 4 devices; both hosts then score with
  the one head it saved: the same scores of the same records, equal to
  that head loaded in this process; B's records carry finite PRM rewards
  on both hosts."""
  _launch(str(tmp_path), role="prm_worker")
  res = [json.load(open(tmp_path / f"prm{p}.json")) for p in (0, 1)]
  lead, other = res
  assert lead["a_steps"] == other["a_steps"] == RSPO_STEPS
  (first,) = lead["first_fit"]  # the 4 groups: 2 played by each host
  assert first == list(range(first[0], first[0] + 4))
  assert len(lead["fits"]) == 1 + RSPO_STEPS  # refit at each loop's end
  assert other["fits"] == [] and other["first_fit"] == []
  for r in res:
    assert r["local_mesh"] == [1, 4, 1] and r["local_devices_mine"]
    assert r["b_dense"] and all(
        len(d) and np.isfinite(d).all() and np.abs(d).max() < 10.0
        for d in r["b_dense"]
    )  # r_hat / 0.1, |r_hat| < 1
  np.testing.assert_allclose(lead["probe"], other["probe"], atol=1e-6)

  from rspo_jax import prm
  from rspo_jax import sharding as shd

  here = prm.make_prm_dense_fn(
      str(tmp_path / "run" / "prm"),
      mesh=shd.make_mesh((-1, 1, 1)),
      rules=shd.DEFAULT_RULES,
  )
  np.testing.assert_allclose(here(probe_records()), lead["probe"], atol=1e-4)


if __name__ == "__main__":
  roles = {
      "worker": worker,
      "rspo_worker": rspo_worker,
      "permuted_worker": permuted_worker,
      "prm_worker": prm_worker,
      "ppo_worker": ppo_worker,
  }
  if len(sys.argv) == 6 and sys.argv[1] in roles:
    fn = roles[sys.argv[1]]
    fn(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
  else:
    sys.exit(__doc__)
