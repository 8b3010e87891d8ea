"""Weights & Biases beside JSONL and TensorBoard, in W&B's offline mode.

Skipped when wandb is not installed (it is an extra: pip install
'rspo_jax[wandb]'; CI installs it for this file). What a run logged is read
back from W&B's own offline files (``<dir>/wandb/offline-run-*/run-<id>.wandb``:
a LevelDB-style log of ``wandb_internal_pb2.Record`` protos).
"""

import glob
import json
import os
import struct
import time

import ml_collections
import pytest

from rspo_jax import metrics

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")


def read_records(path: str) -> list:
  """The records of one ``.wandb`` file: a 7-byte file header, then 32 KiB
  blocks of chunks ``crc32 (4) | length (2, LE) | kind (1) | data``; kind
  1 = a whole record, 2 / 3 / 4 = its first / middle / last part."""
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  pos, block, records, part = 7, 32768, [], b""
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # the block's zero trailer
      pos += left
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if kind == 0:
      pos += left
      continue
    if pos + 7 + length > len(data):  # a chunk still being written
      break
    part += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(part)
      records.append(record)
      part = b""
  return records


def finished_records(path: str, timeout_s: float = 60.0) -> list:
  """``read_records`` once the file holds the run's ``exit`` record: W&B's
  service may still be writing the file when ``finish()`` returns."""
  deadline = time.monotonic() + timeout_s
  while True:
    records = read_records(path)
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      return records
    assert time.monotonic() < deadline, f"{path}: no exit record"
    time.sleep(0.1)


def offline_runs(workdir: str) -> list[tuple[str, list[dict]]]:
  """``(run id, [history row, ...])`` of each offline run, oldest first."""
  runs = []
  for path in sorted(
      glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb")),
      key=lambda p: os.path.getmtime(p),
  ):
    run_id, rows = None, []
    for r in finished_records(path):
      kind = r.WhichOneof("record_type")
      if kind == "run":
        run_id = r.run.run_id
      elif kind == "history":
        items = {
            (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
            for i in r.history.item
        }
        rows.append({k: v for k, v in items.items() if not k.startswith("_")})
    runs.append((run_id, rows))
  return runs


def test_same_keys_as_tensorboard_and_a_resume_continues_the_run(tmp_path):
  wd = str(tmp_path)
  info = metrics.setup_wandb(wd, "rspo-test", config={"seed": 3})
  assert info["name"] == os.path.basename(wd) and len(info["id"]) == 12
  w = metrics.MetricsWriter(wd, tensorboard=False)
  w.write(0, "sft", {"nll": 2.5, "note": "text"})
  w.write(1, "sft", {"nll": 2.0})
  w.write(
      1,
      "A",
      {
          "loss": 0.5,
          "rollout": {"success_rate": 0.25},
          "ok": True,
          "lens": [1, 2],
      },
  )
  w.close()
  # Started again (a resumed run): the id is kept, the run continues.
  assert metrics.setup_wandb(wd, "rspo-test")["id"] == info["id"]
  w = metrics.MetricsWriter(wd, tensorboard=False)
  w.write(2, "A", {"loss": 0.25, "rollout": {"success_rate": 0.5}})
  w.close()
  (id1, first), (id2, second) = offline_runs(wd)
  assert id1 == id2 == info["id"]
  assert first == [
      {"sft/step": 0, "sft/nll": 2.5},
      {"sft/step": 1, "sft/nll": 2.0},
      {
          "A/step": 1,
          "A/loss": 0.5,
          "A/rollout.success_rate": 0.25,
          "A/ok": True,
      },
  ]
  assert second == [
      {"A/step": 2, "A/loss": 0.25, "A/rollout.success_rate": 0.5}
  ]
  # The keys are TensorBoard's: <phase>/<name> of the numeric fields.
  rows = metrics.read_metrics(os.path.join(wd, "metrics.jsonl"))
  for row, logged in zip(rows, first + second):
    tb = metrics.scalars(row)
    assert {f"{row['phase']}/step": row["step"], **tb} == logged


def test_writers_of_one_workdir_share_one_run(tmp_path):
  wd = str(tmp_path)
  metrics.setup_wandb(wd, "rspo-test")
  a = metrics.MetricsWriter(wd, tensorboard=False)
  b = metrics.MetricsWriter(wd, tensorboard=False)
  a.write(1, "A", {"loss": 1.0})
  b.write(1, "B", {"loss": 2.0})
  a.close()
  b.write(2, "B", {"loss": 3.0})  # still open: the run lives on
  b.close()
  [(_, rows)] = offline_runs(wd)
  assert rows == [
      {"A/step": 1, "A/loss": 1.0},
      {"B/step": 1, "B/loss": 2.0},
      {"B/step": 2, "B/loss": 3.0},
  ]


def test_config_keys_turn_it_on_and_off(tmp_path):
  wd = str(tmp_path)
  cfg = ml_collections.ConfigDict(
      {
          "seed": 0,
          "metrics": dict(
              wandb_project="", wandb_entity="", wandb_name="run-7"
          ),
      }
  )
  assert metrics.setup_wandb_from_config(wd, cfg) is None  # never on
  assert not os.path.exists(os.path.join(wd, metrics.WANDB_FILE))
  cfg.metrics.wandb_project = "rspo-test"
  on = metrics.setup_wandb_from_config(wd, cfg)
  assert (on["project"], on["name"], on["config"]["seed"]) == (
      "rspo-test",
      "run-7",
      0,
  )
  cfg.metrics.wandb_project = ""
  off = metrics.setup_wandb_from_config(wd, cfg)
  assert (off["project"], off["id"]) == ("", on["id"])  # id kept
  w = metrics.MetricsWriter(wd, tensorboard=False)
  w.write(1, "A", {"loss": 1.0})
  w.close()
  assert offline_runs(wd) == []  # nothing logged to W&B
  assert len(metrics.read_metrics(os.path.join(wd, "metrics.jsonl"))) == 1


@pytest.mark.slow
def test_a_training_run_and_its_resume_log_to_one_wandb_run(tmp_path):
  """build_run with metrics.wandb_project: the warm start, B's and A's
  phases in one W&B run; the same workdir built again continues it."""
  from configs import toy_grpo
  from rspo_jax import build

  micro = (
      "model.overrides=num_layers=1;hidden_size=64;"
      "intermediate_size=128;num_heads=2;num_kv_heads=1;head_dim=32,"
      "model.tokenizer_vocab=300,sft.steps=4,sft.num_episodes=16,"
      "sft.batch_rows=16,train.batch_tasks=2,train.group_size=2,"
      "rspo.alpha=0.5,rspo.k=1,env.max_steps=4,env.num_eval_tasks=4,"
      "env.num_workers=1,rollout.max_new_tokens=16,"
      "rollout.max_prompt_tokens=256"
  )
  wd = str(tmp_path)
  for steps in (1, 2):  # then started again with one step more
    cfg = toy_grpo.get_config(f"{micro},steps={steps}")
    with cfg.unlocked():
      cfg.metrics = ml_collections.ConfigDict(
          dict(wandb_project="rspo-test", wandb_entity="", wandb_name="")
      )
    run = build.build_run(cfg, wd, progress=False)
    try:
      assert run.trainer.try_resume() == (steps == 2)
      run.trainer.run()
    finally:
      run.close()
  runs = offline_runs(wd)
  run_id = json.load(open(os.path.join(wd, metrics.WANDB_FILE)))["id"]
  assert {r for r, _ in runs} == {run_id}
  rows = [row for _, rows in runs for row in rows]
  steps = {
      p: [row[f"{p}/step"] for row in rows if f"{p}/step" in row]
      for p in ("sft", "B", "A")
  }
  assert steps["sft"] == [0, 1, 2, 3]  # sft.steps=4, the first start only
  assert steps["A"] == [1, 2] and len(steps["B"]) == 2
  jsonl = metrics.read_metrics(os.path.join(wd, "metrics.jsonl"), "A")
  logged = [row for row in rows if "A/step" in row]
  assert [{"A/step": r["step"], **metrics.scalars(r)} for r in jsonl] == logged
