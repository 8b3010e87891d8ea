r"""Trains the process reward model's head on collected trajectories.

  python launch/train_prm.py --backbone_dir=/ckpt/Llama-3.2-3B-Instruct \
      --trajectories=/runs/webshop/replay --out=/runs/prm --steps=2000

``--trajectories`` is a directory of replay shards (rspo_jax.replay) or a
JSONL file of step records (``rspo_jax.prm.record_to_json``). The backbone
stays frozen; its hidden states are computed once and cached, then only the
MLP head is fitted (see rspo_jax/prm.py). Targets are ``reward_scale * R``.
Prints one JSON line of metrics (train / held-out MSE and Spearman). Use the
result with ``rspo.dense_reward=prm, rspo.prm_dir=<out>``.
"""

import json
import logging
import math
import os

from absl import app, flags

from rspo_jax.errors import ConfigError

_BACKBONE = flags.DEFINE_string(
    "backbone_dir", None, "Local HF directory of the frozen backbone."
)
_TRAJ = flags.DEFINE_string(
    "trajectories", None, "Replay-shard directory or JSONL file."
)
_OUT = flags.DEFINE_string("out", None, "Output PRM directory.")
_STEPS = flags.DEFINE_integer("steps", 1000, "Adam steps of the head.")
_LR = flags.DEFINE_float("lr", 1e-3, "Head learning rate.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Head MLP width.")
_SCALE = flags.DEFINE_float(
    "reward_scale", 0.1, "Targets are reward_scale * outcome reward."
)
_HOLDOUT = flags.DEFINE_float(
    "holdout_frac", 0.2, "Fraction of trajectories held out."
)
_BATCH_TRAJS = flags.DEFINE_integer(
    "batch_trajs", 64, "Trajectories per head step."
)
_BATCH_ROWS = flags.DEFINE_integer(
    "batch_rows", 32, "Rows per backbone forward."
)
_MAX_LEN = flags.DEFINE_integer(
    "max_len", None, "Truncate rows (oldest prompt tokens first)."
)
_POLICY_TOK = flags.DEFINE_string(
    "policy_tokenizer_dir",
    None,
    "The policy's tokenizer when it differs from the backbone's (rows are"
    " re-tokenised).",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed (hold-out split, init, batches).")
_MESH = flags.DEFINE_string(
    "mesh_shape", "-1,1,1", "data,fsdp,tensor mesh shape."
)


def _clean(x):
  return None if isinstance(x, float) and math.isnan(x) else x


def main(argv):
  del argv
  logging.basicConfig(
      level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
  )
  for f in (_BACKBONE, _TRAJ, _OUT):
    if not f.value:
      raise app.UsageError(f"--{f.name} is required")
  if not os.path.isfile(os.path.join(_BACKBONE.value, "config.json")):
    raise ConfigError(
        f"--backbone_dir={_BACKBONE.value!r}: no Hugging Face model there;"
        " pass --backbone_dir=<a directory with config.json, *.safetensors"
        " and the tokenizer>"
    )
  if not os.path.exists(_TRAJ.value):
    raise ConfigError(
        f"--trajectories={_TRAJ.value!r}: no such file or directory; pass"
        " --trajectories=<a replay-shard directory or a JSONL file of step"
        " records>"
    )
  from rspo_jax import prm, sharding

  mesh = sharding.make_mesh(tuple(int(s) for s in _MESH.value.split(",")))
  records = prm.load_trajectory_records(_TRAJ.value)
  logging.info("%d step records from %s", len(records), _TRAJ.value)
  metrics = prm.train_prm(
      _BACKBONE.value,
      records,
      _OUT.value,
      policy_tokenizer_dir=_POLICY_TOK.value,
      max_len=_MAX_LEN.value,
      batch_rows=_BATCH_ROWS.value,
      mesh=mesh,
      hidden=_HIDDEN.value,
      steps=_STEPS.value,
      lr=_LR.value,
      seed=_SEED.value,
      holdout_frac=_HOLDOUT.value,
      reward_scale=_SCALE.value,
      batch_trajs=_BATCH_TRAJS.value,
  )
  print(
      json.dumps({k: _clean(v) for k, v in metrics.items()}, sort_keys=True),
      flush=True,
  )


def cli():
  """The ``rspo-train-prm`` console script."""
  from rspo_launch import run_absl

  run_absl(main, __name__)


if __name__ == "__main__":
  cli()
