"""Multi-host SGLang export (``weight_sync.export_hf_multihost``): no host
holds the whole model and each host writes its own files.

The 2-process test starts two copies of this file as workers
(``multihost_test._launch``: ``jax.distributed`` on localhost, 2 x 4 CPU
devices, gloo). Each builds the same small learner and exports it twice:

  * 'gather': 3 unrolled layers, no q/k/v bias (the export adds zeros),
    FSDP over a (1, 4, 2) mesh that spans both processes, so the tensors
    split between them (all but the norms) are all-gathered;
  * 'local': 3 scanned layers on a (2, 2, 2) mesh whose data axis is the
    process: each host holds every tensor whole on its own devices, so
    owners read their shards and nothing moves.

Each worker records every safetensors file it writes (a hook around
``save_safetensors``: the file's inode and mtime right after the write) and runs
with its own umask (0o022 / 0o077), so the mode of the files written with
``open`` (index, json, tokenizer) says which process created them. The
test compares each directory, file for file and byte for byte, with a
one-process ``export_hf`` of the same weights, each group file with its
owner's record, and the workers' ``GatherMeter``s with the files' group
sizes. Last, each worker runs the run's sync (``build.make_sync_engine``)
with a stand-in SGLang client that records the directory it is told to
load.

    python tests/multihost_export_test.py export_worker OUT_DIR PROCESS_ID \\
        NUM_PROC PORT
"""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

UMASKS = (0o022, 0o077)  # process p creates files 0o666 & ~UMASKS[p]
CASES = {  # name -> (model overrides, mesh shape)
    "gather": (dict(scan_layers=False, qkv_bias=False), (1, 4, 2)),
    "local": (dict(scan_layers=True, qkv_bias=True), (2, 2, 2)),
}
TOKENIZER = {"tokenizer_config.json": '{"model_max_length": 64}\n'}


def make_learner(case: str):
  """A 3-layer model, weights from seed 0 (as in every process), placed on
  the case's mesh over all devices of the job."""
  from rspo_jax import models, sharding
  from rspo_jax import train_step as ts
  from rspo_jax.learner import Learner

  overrides, mesh_shape = CASES[case]
  cfg = models.get_model_config(
      "tiny",
      vocab_size=128,
      num_layers=3,
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      tie_word_embeddings=False,
      eos_token_id=1,
      **overrides,
  )
  learner = Learner(
      models.create_model(cfg, seed=0),
      ts.make_optimizer(1e-3),
      ts.make_sft_loss(),
      mesh=sharding.make_mesh(mesh_shape),
      rules=sharding.DEFAULT_RULES,
  )
  return cfg, learner


def write_tokenizer(out_dir: str) -> str:
  path = os.path.join(out_dir, "tokenizer")
  os.makedirs(path, exist_ok=True)
  for name, text in TOKENIZER.items():
    with open(os.path.join(path, name), "w") as f:
      f.write(text)
  return path


def export_worker(out_dir: str, process_id: int, num_processes: int, port: int):
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import distributed, weight_sync

  os.umask(UMASKS[process_id])
  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  tokenizer_dir = os.path.join(out_dir, "tokenizer")
  # Every safetensors file this process writes, as the filesystem has it
  # right after the write: (path, inode, mtime). safetensors 0.8 writes a
  # new file (a new inode) each time, so a later write would show.
  created, save_file = [], weight_sync.save_safetensors

  def save_and_record(tensors, filename, **kw):
    save_file(tensors, filename, **kw)
    st = os.stat(filename)
    created.append(
        (os.path.relpath(filename, out_dir), st.st_ino, st.st_mtime_ns)
    )

  weight_sync.save_safetensors = save_and_record
  result = {"created": created}
  for case in CASES:
    cfg, learner = make_learner(case)
    leaves = jax.tree.leaves(learner.params)
    meter = weight_sync.GatherMeter()
    total = weight_sync.export_hf_multihost(
        learner.module(),
        cfg,
        os.path.join(out_dir, case),
        tokenizer_dir=tokenizer_dir,
        dtype="bfloat16",
        meter=meter,
    )
    result[case] = {
        "total": total,
        "peak": meter.peak,
        "received": meter.received,
        "exchanged": meter.exchanged,
        "held_after": meter.held,
        "written": meter.written,
        # Parameters whose shards are spread over both processes.
        "spanning": sum(not x.is_fully_addressable for x in leaves),
        # Parameters this process holds only in part.
        "partial": sum(not _covers(x) for x in leaves),
    }
  # The run's sync (build.make_sync_engine) with an SGLang client's part
  # of it: load the directory once it is complete.
  from rspo_jax import build

  class Loads:
    calls = []

    def update_weights(self, path, version):
      self.calls.append(
          [os.path.relpath(path, out_dir), version, sorted(os.listdir(path))]
      )

  cfg, learner = make_learner("gather")
  sync = build.make_sync_engine(
      cfg, tokenizer_dir, os.path.join(out_dir, "sync")
  )
  sync(Loads(), learner, 3)
  result["sync"] = {"loads": Loads.calls, "exports": sync.log.exports}
  with open(os.path.join(out_dir, f"export{process_id}.json"), "w") as f:
    json.dump(result, f)
  distributed.barrier("done")
  distributed.shutdown()


def failing_export_worker(
    out_dir: str, process_id: int, num_processes: int, port: int
):
  """Three exports that fail on one process: process 1's first weight file
  write raises (it still owns a later group), then the leader's index
  write does, then the leader's removal of stale weights (before any
  gather). Each worker records what its ``export_hf_multihost`` raised
  (a hang fails the test's timeout)."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from rspo_jax import distributed, weight_sync

  assert distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  save_file, writes = weight_sync.save_safetensors, []

  def save_or_fail(tensors, filename, **kw):
    writes.append(filename)
    if process_id == 1 and len(writes) == 1:
      raise OSError(28, "No space left on device", filename)
    save_file(tensors, filename, **kw)

  def meta_fails(*a, **kw):
    raise OSError(13, "Permission denied", "model.safetensors.index.json")

  def stale_fails(*a, **kw):
    raise OSError(30, "Read-only file system", "model-00001-of-00005")

  weight_sync.save_safetensors = save_or_fail
  cfg, learner = make_learner("gather")
  result = {}
  for name in ("weights", "meta", "stale"):
    if name == "meta":
      weight_sync.save_safetensors = save_file
      weight_sync._write_meta = meta_fails  # the leader's alone calls it  # pylint: disable=protected-access
    if name == "stale":
      weight_sync._remove_stale = stale_fails  # the leader's alone too  # pylint: disable=protected-access
    try:
      weight_sync.export_hf_multihost(
          learner.module(), cfg, os.path.join(out_dir, name)
      )
      result[name] = None
    except Exception as e:  # pylint: disable=broad-except
      result[name] = [type(e).__name__, str(e)]
  result["writes"] = len(writes)
  with open(os.path.join(out_dir, f"failed{process_id}.json"), "w") as f:
    json.dump(result, f)
  distributed.barrier("done")
  distributed.shutdown()


def _covers(x) -> bool:
  """This process's shards cover all of ``x``."""
  blocks = {
      tuple(s.indices(n)[:2] for s, n in zip(sh.index, x.shape))
      for sh in x.addressable_shards
  }
  every = {
      tuple(s.indices(n)[:2] for s, n in zip(i, x.shape))
      for i in x.sharding.devices_indices_map(x.shape).values()
  }
  return blocks == every


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


def _file_bytes(path: str) -> dict:
  return {
      f: open(os.path.join(path, f), "rb").read()
      for f in sorted(os.listdir(path))
  }


def _group_bytes(path: str, cfg) -> dict:
  """safetensors file -> (bytes of its tensors, of its largest tensor, of
  the zero biases the export adds to a model without q/k/v bias: never
  gathered)."""
  from safetensors.numpy import load_file

  out = {}
  for f in sorted(os.listdir(path)):
    if f.endswith(".safetensors"):
      ts = load_file(os.path.join(path, f))
      zeros = (
          0
          if cfg.qkv_bias
          else sum(t.nbytes for k, t in ts.items() if k.endswith("_proj.bias"))
      )
      out[f] = (
          sum(t.nbytes for t in ts.values()),
          max(t.nbytes for t in ts.values()),
          zeros,
      )
  return out


def test_stack_to_owners_sends_each_host_its_own_row_only():
  """The layer exchange on 8 devices, as 2 hosts x 4 (one process here):
  two [256, 512] weights FSDP x tensor over a (1, 4, 2) mesh go to rows
  of a [2, 256, 512] array, row p on 'host' p's 4 devices, split over
  them. The compiled reshard moves each device's share of its own row
  only: no all-gather, at most 2 x 256 x 512 / 4 elements received per
  device (the stack in one jit all-gathered both rows: 4x that)."""
  import re

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from rspo_jax import sharding, weight_sync

  learner = sharding.make_mesh((1, 4, 2))
  mesh = Mesh(np.asarray(learner.devices).reshape(2, 4), ("procs", "local"))
  values = [
      np.arange(256 * 512, dtype=np.float32).reshape(256, 512) + i
      for i in range(2)
  ]
  xs = [
      jax.device_put(v, NamedSharding(learner, P("fsdp", "tensor")))
      for v in values
  ]
  rows = weight_sync.stack_to_owners(xs, jnp.bfloat16, mesh)
  assert rows.sharding.spec == P("procs", "local")
  for p in range(2):
    for d in mesh.devices[p]:
      (shard,) = [s for s in rows.addressable_shards if s.device == d]
      assert shard.index[0] == slice(p, p + 1)
  np.testing.assert_array_equal(
      np.asarray(rows, np.float32),
      np.stack(values).astype(jnp.bfloat16).astype(np.float32),
  )

  stacker = weight_sync._stacker(  # pylint: disable=protected-access
      jnp.dtype(jnp.bfloat16), NamedSharding(learner, P(None, "fsdp", "tensor"))
  )
  ops = r"(all-gather|all-to-all|collective-permute|all-reduce)\("
  assert not re.search(ops, stacker.lower(xs).compile().as_text())
  stacked = stacker(xs)
  hlo = (
      jax.jit(lambda x: x, out_shardings=rows.sharding)
      .lower(stacked)
      .compile()
      .as_text()
  )
  received = 0
  for line in hlo.splitlines():
    m = re.search(r"= (.*?) (all-gather|all-to-all|collective-permute)\(", line)
    if m:
      assert m.group(2) != "all-gather", line
      received += sum(
          np.prod([int(d) for d in dims.split(",") if d])
          for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1))
      )
  assert 0 < received <= 2 * 256 * 512 // 4


def test_multihost_export_in_one_process_is_export_hf(tmp_path):
  """One process: ``export_hf_multihost`` writes ``export_hf``'s bytes
  and, owning every group, never holds more than one group."""
  from rspo_jax import weight_sync

  tok = write_tokenizer(str(tmp_path))
  for case in CASES:
    cfg, learner = make_learner(case)
    ref, out = str(tmp_path / f"ref_{case}"), str(tmp_path / case)
    want = weight_sync.export_hf(
        learner.module(), cfg, ref, tokenizer_dir=tok, dtype="bfloat16"
    )
    meter = weight_sync.GatherMeter()
    got = weight_sync.export_hf_multihost(
        learner.module(),
        cfg,
        out,
        tokenizer_dir=tok,
        dtype="bfloat16",
        meter=meter,
    )
    assert got == want
    assert _file_bytes(out) == _file_bytes(ref)
    groups = _group_bytes(ref, cfg)
    assert meter.written == sorted(groups)
    assert meter.received == want - sum(z for _, _, z in groups.values())
    assert meter.peak <= max(b for b, _, _ in groups.values()) and (
        meter.held == 0
    )


@pytest.mark.slow
def test_two_processes_write_their_own_groups(tmp_path):
  """2 processes x 4 CPU devices: each directory equals a one-process
  export of the same weights byte for byte; process p created exactly the
  files of groups p, p + 2, ... (the final files are its writes; the other
  process wrote none of them) and the leader the index, json and tokenizer
  files (their mode: its umask); build.make_sync_engine's sync exports
  the same way, and both hosts load the complete directory; a host never
  held more than one group
  plus one tensor; with the weights sharded over hosts ('gather') it
  received other hosts' tensors too, with them whole on every host
  ('local') only its own groups."""
  import multihost_test

  from rspo_jax import weight_sync

  tok = write_tokenizer(str(tmp_path))
  multihost_test._launch(
      str(tmp_path),
      role="export_worker",  # pylint: disable=protected-access
      script=__file__,
  )
  res = [json.load(open(tmp_path / f"export{p}.json")) for p in (0, 1)]
  for case in CASES:
    cfg, learner = make_learner(case)  # one process, 8 devices
    ref = str(tmp_path / f"ref_{case}")
    total = weight_sync.export_hf(
        learner.module(), cfg, ref, tokenizer_dir=tok, dtype="bfloat16"
    )
    out = str(tmp_path / case)
    got, want = _file_bytes(out), _file_bytes(ref)
    assert sorted(got) == sorted(want), case
    for f in want:
      assert got[f] == want[f], (case, f)
    groups = _group_bytes(ref, cfg)
    files = sorted(groups)  # model-00001-of-00005 ... in group order
    assert len(files) == cfg.num_layers + 2
    own = [files[p::2] for p in (0, 1)]
    zeros = sum(z for _, _, z in groups.values())
    largest_tensor = max(t for _, t, _ in groups.values())
    for p, r in enumerate(res):
      r = r[case]
      assert r["total"] == total, (case, p)
      assert r["written"] == own[p], (case, p)
      assert r["held_after"] == 0
      mine = [groups[f][0] for f in own[p]]
      assert r["peak"] <= max(mine) + largest_tensor < total, (case, p)
      if case == "gather":  # sharded over hosts: the others' too
        assert r["spanning"] and r["partial"], r
        # ... but not the other's layer of the exchanged block (layers 0
        # and 1, files 1 and 2: each host gets its own alone).
        other = groups[files[1 + p]]  # process 0 owns file 2, 1 file 1
        assert (
            sum(mine) < r["received"] <= (total - zeros - (other[0] - other[2]))
        ), (case, p)
        # its layer's 7 matrices (its 2 norms are whole on every host)
        assert r["exchanged"] == 7
      else:
        assert r["spanning"] and not r["partial"], r
        assert r["received"] == sum(mine)  # its own groups only
        assert r["exchanged"] == 0  # read from its own shards
        assert r["peak"] <= max(mine)
    for f in want:  # who created which file
      st = os.stat(os.path.join(out, f))
      if f in groups:  # its owner's write is the file; nobody else wrote it
        by = [[c for c in r["created"] if c[0] == f"{case}/{f}"] for r in res]
        owner = 0 if f in own[0] else 1
        assert by[owner] == [[f"{case}/{f}", st.st_ino, st.st_mtime_ns]]
        assert by[1 - owner] == [], (case, f)
      else:  # the leader's (its umask)
        assert stat.S_IMODE(st.st_mode) == 0o666 & ~UMASKS[0], (case, f)

  # build.make_sync_engine's multi-host export: slot v1 of version 3, in the
  # compute dtype, complete when each host's client loaded it.
  cfg, learner = make_learner("gather")
  ref = str(tmp_path / "ref_sync")
  weight_sync.export_hf(learner.module(), cfg, ref, tokenizer_dir=tok)
  assert _file_bytes(str(tmp_path / "sync" / "v1")) == _file_bytes(ref)
  for r in res:
    assert r["sync"] == {
        "loads": [["sync/v1", 3, sorted(os.listdir(ref))]],
        "exports": 1,
    }


@pytest.mark.slow
def test_a_failed_write_on_one_host_fails_the_export_on_every_host(tmp_path):
  """A weight file that one host cannot write, an index the leader cannot
  write, or stale weights the leader cannot remove, ends
  ``export_hf_multihost`` with an error on every host
  (the failing one's own error, a RuntimeError naming it on the others)
  instead of leaving the others blocked at the next collective; the failed
  host wrote nothing after its failure but kept taking part in the
  gathers."""
  import multihost_test

  multihost_test._launch(
      str(tmp_path),
      role="failing_export_worker",  # pylint: disable=protected-access
      script=__file__,
      timeout=300,
  )
  res = [json.load(open(tmp_path / f"failed{p}.json")) for p in (0, 1)]
  assert res[1]["weights"][0] == "OSError", res[1]
  assert "No space left" in res[1]["weights"][1]
  assert res[0]["weights"][0] == "RuntimeError", res[0]
  assert "process(es) [1] failed writing its weight files" in (
      res[0]["weights"][1]
  )
  assert res[0]["meta"][0] == "PermissionError"
  assert "index" in res[0]["meta"][1]
  assert res[1]["meta"][0] == "RuntimeError", res[1]
  assert "process(es) [0] failed writing the index" in res[1]["meta"][1]
  assert res[0]["stale"][0] == "OSError" and "Read-only" in res[0]["stale"][1]
  assert res[1]["stale"][0] == "RuntimeError", res[1]
  assert "process(es) [0] failed preparing the directory" in (
      res[1]["stale"][1]
  )
  # 'gather' has 5 groups: process 1 owns groups 1 and 3, its write of 1
  # failed and it took part in group 3's gathers without writing it;
  # process 0 wrote its three (the 'meta' export is not counted).
  assert res[1]["writes"] == 1 and res[0]["writes"] == 3


if __name__ == "__main__":
  roles = {
      "export_worker": export_worker,
      "failing_export_worker": failing_export_worker,
  }
  if len(sys.argv) == 6 and sys.argv[1] in roles:
    roles[sys.argv[1]](
        sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    )
  else:
    sys.exit(__doc__)
