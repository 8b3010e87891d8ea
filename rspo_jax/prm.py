"""Process reward model: frozen backbone features, head training, scoring.

  h_t     = f_pre(s_t, a_t)   backbone final-norm hidden state at the LAST
                              token of step t's row (prompt + response)
  r_hat_t = tanh(w2 . silu(h_t W1 + b1) + b2)          (models.PRMHead)
  R_hat_i = sum_t r_hat_t                              trajectory score
  L_P     = mean_i (R_hat_i - s * R_i)^2               R_i: outcome reward

``s`` is ``reward_scale`` (default 0.1): outcome rewards are ``10 * won``,
while a sum of tanh values over a short episode cannot reach 10, so the
head learns ``s * R`` (0.1 * 10 = 1 for a win). The backbone is frozen:
hidden states are computed once per row by a jitted forward and cached, and
only the head is trained, on the cached features (a jitted ``lax.scan`` of
Adam steps over minibatches of trajectories). Features are standardised for
training and the standardisation is folded into ``W1, b1`` afterwards, so
the saved head reads raw hidden states.

A checkpoint directory holds ``head.safetensors`` (fc1/fc2 kernel and bias)
and ``prm_config.json`` (backbone path, sizes, reward scale, metrics); the
backbone is read with ``models.load_hf_model`` from its own HF directory.
When the policy's tokenizer differs from the backbone's (e.g. a Qwen policy
scored by a Llama PRM), ``policy_tokenizer_dir`` names the policy tokenizer
and every row is decoded with it and re-encoded with the backbone's.

Dense rewards (``make_prm_dense_fn``) are in outcome-reward units by
default: ``dense_reward_t = r_hat_t / s`` so that ``sum_t dense_reward_t``
estimates ``R``; ``units='raw'`` stores ``r_hat_t`` itself. Noise for the
robustness ablation is added by ``credit.step_rewards``, not here, with
sigma in tanh units: ``sigma / s`` on rewards in outcome units.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from safetensors.numpy import load_file

from rspo_jax import batching, models
from rspo_jax import sharding as shd
from rspo_jax.models.hf_io import save_safetensors
from rspo_jax.types import StepRecord, group_trajectories

HEAD_FILE = "head.safetensors"
CONFIG_FILE = "prm_config.json"
FORMAT = "rspo_jax.prm/1"
UNITS = ("reward", "raw")


# ------------------------------------------------------------------ ranks


def rankdata(x) -> np.ndarray:
  """Ranks 1..n, ties get the mean of their ranks (as scipy's 'average')."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  sx = x[order]
  starts = np.r_[0, np.flatnonzero(sx[1:] != sx[:-1]) + 1]
  ends = np.r_[starts[1:], len(x)]
  ranks = np.empty(len(x), np.float64)
  for s, e in zip(starts, ends):
    ranks[order[s:e]] = 0.5 * (s + e - 1) + 1.0
  return ranks


def spearman(x, y) -> float:
  """Pearson correlation of average ranks; NaN when either side is
  constant or there are fewer than 2 points."""
  x, y = np.asarray(x), np.asarray(y)
  if len(x) != len(y):
    raise ValueError(f"spearman: {len(x)} vs {len(y)} values")
  if len(x) < 2:
    return float("nan")
  rx, ry = rankdata(x), rankdata(y)
  rx, ry = rx - rx.mean(), ry - ry.mean()
  den = np.sqrt((rx**2).sum() * (ry**2).sum())
  return float((rx * ry).sum() / den) if den > 0 else float("nan")


# ---------------------------------------------------------------- quality


def r_squared(pred, target) -> float:
  """1 - sum_i (y_i - p_i)^2 / sum_i (y_i - mean y)^2: the share of the
  target's variance the prediction explains (negative when it is worse
  than the mean); NaN when the target is constant or n < 2."""
  p, y = np.asarray(pred, np.float64), np.asarray(target, np.float64)
  if len(p) != len(y):
    raise ValueError(f"r_squared: {len(p)} predictions vs {len(y)} targets")
  tot = ((y - y.mean()) ** 2).sum() if len(y) >= 2 else 0.0
  return float(1.0 - ((y - p) ** 2).sum() / tot) if tot > 0 else float("nan")


def auc(scores, labels) -> float:
  """Area under the ROC curve of ``scores`` for boolean ``labels``:
  P(score of a positive > score of a negative) + P(tie) / 2, i.e.
  (sum of the positives' average ranks - n1 (n1 + 1) / 2) / (n1 n0)
  (Mann-Whitney). NaN when either class is empty."""
  x, lab = np.asarray(scores, np.float64), np.asarray(labels, bool)
  if len(x) != len(lab):
    raise ValueError(f"auc: {len(x)} scores vs {len(lab)} labels")
  n1, n0 = int(lab.sum()), int((~lab).sum())
  if not n1 or not n0:
    return float("nan")
  return float((rankdata(x)[lab].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def pearson(x, y) -> float:
  """Pearson correlation; NaN when either side is constant or n < 2."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if len(x) != len(y):
    raise ValueError(f"pearson: {len(x)} vs {len(y)} values")
  if len(x) < 2:
    return float("nan")
  x, y = x - x.mean(), y - y.mean()
  den = np.sqrt((x**2).sum() * (y**2).sum())
  return float((x * y).sum() / den) if den > 0 else float("nan")


def prefix_sums(per_step: Sequence[np.ndarray], t: int) -> np.ndarray:
  """[N]: sum of each trajectory's first min(t, T_i) per-step values (an
  episode that ended before step t keeps its whole sum)."""
  return np.array([float(np.sum(v[:t])) for v in per_step], np.float64)


def _nan_to_none(x: float):
  return None if x is None or np.isnan(x) else float(x)


def quality(
    r_hat: Sequence[np.ndarray],
    oracle: Sequence[np.ndarray],
    won,
    *,
    max_t: int = 8,
) -> dict:
  """How well per-step PRM rewards ``r_hat`` (tanh units, one array per
  trajectory) predict the outcome, and how far they are from the
  telescoped oracle ``oracle`` (WebShop's d_t = Phi(s_t+1) - Phi(s_t),
  summing to the score, 1 on a win: the same units as r_hat, whose sum is
  trained towards 0.1 x 10 x won = won):

    r2_traj        R^2 of R_hat_i = sum_t r_hat_t against won_i
    spearman_traj  rank correlation of the same
    auc_prefix[t]  AUC of sum_{s <= t} r_hat_s for predicting won, t = 1..
                   max_t (oracle_auc_prefix: the oracle's prefix sum,
                   Phi(s_t+1) - Phi(s_0))
    per_step[t]    over trajectories still running at step t: n, mean
                   |r_hat_t - d_t|, Pearson(r_hat_t, d_t), mean r_hat_t
                   and mean d_t
  plus the same over all steps (step_mae, step_pearson) and the oracle's
  own R^2 of its sum (the score) against won. NaN values are None."""
  won = np.asarray(won, bool)
  if not (len(r_hat) == len(oracle) == len(won)):
    raise ValueError(
        f"quality: {len(r_hat)} PRM, {len(oracle)} oracle and"
        f" {len(won)} outcome trajectories"
    )
  for i, (a, b) in enumerate(zip(r_hat, oracle)):
    if len(a) != len(b):
      raise ValueError(
          f"quality: trajectory {i} has {len(a)} PRM and"
          f" {len(b)} oracle steps"
      )
  score = np.array([float(np.sum(v)) for v in r_hat])
  oracle_sum = np.array([float(np.sum(v)) for v in oracle])
  target = won.astype(np.float64)
  flat_p = np.concatenate([np.asarray(v, np.float64) for v in r_hat])
  flat_o = np.concatenate([np.asarray(v, np.float64) for v in oracle])
  out = {
      "num_traj": int(len(won)),
      "num_wins": int(won.sum()),
      "num_steps": int(len(flat_p)),
      "r2_traj": r_squared(score, target),
      "spearman_traj": spearman(score, target),
      "oracle_r2_traj": r_squared(oracle_sum, target),
      "mse_traj": float(np.mean((score - target) ** 2)),
      "step_mae": float(np.mean(np.abs(flat_p - flat_o))),
      "step_pearson": pearson(flat_p, flat_o),
      "auc_prefix": {},
      "oracle_auc_prefix": {},
      "per_step": {},
  }
  for t in range(1, max_t + 1):
    out["auc_prefix"][t] = auc(prefix_sums(r_hat, t), won)
    out["oracle_auc_prefix"][t] = auc(prefix_sums(oracle, t), won)
    live = [i for i, v in enumerate(r_hat) if len(v) >= t]
    if not live:
      continue
    p = np.array([r_hat[i][t - 1] for i in live], np.float64)
    o = np.array([oracle[i][t - 1] for i in live], np.float64)
    out["per_step"][t] = {
        "n": len(live),
        "mae": float(np.mean(np.abs(p - o))),
        "pearson": pearson(p, o),
        "prm_mean": float(p.mean()),
        "oracle_mean": float(o.mean()),
    }
  return _clean(out)


def _clean(x):
  """NaN -> None, recursively (valid JSON)."""
  if isinstance(x, dict):
    return {k: _clean(v) for k, v in x.items()}
  if isinstance(x, float):
    return _nan_to_none(x)
  return x


# --------------------------------------------------------------- features


def _batch_shards(mesh, rules) -> int:
  spec = shd.logical_to_mesh_spec(("batch",), rules)[0]
  names = (spec,) if isinstance(spec, str) else tuple(spec or ())
  return int(np.prod([mesh.shape[a] for a in names])) if names else 1


@functools.lru_cache(maxsize=16)
def _last_hidden_fn(graphdef, out_sharding):
  """Jitted ``(state, tokens, positions, mask, last [B]) -> h [B, D] f32``."""

  def fn(state, tokens, positions, mask, last):
    model = nnx.merge(graphdef, state)
    _, h, _ = model(tokens, positions, mask, return_logits=False)
    h = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    return h.astype(jnp.float32)

  return jax.jit(fn, out_shardings=out_sharding)


def extract_step_features(
    backbone: models.Transformer,
    records: Sequence[StepRecord],
    *,
    batch_rows: int = 32,
    length_multiple: int = 64,
    max_len: Optional[int] = None,
    mesh=None,
    rules=shd.DEFAULT_RULES,
) -> np.ndarray:
  """[S, D] float32: the backbone's hidden state at each row's last token.

  Rows are ``batching.records_to_batch`` rows (prompt then response; over
  ``max_len`` the oldest prompt tokens go), sorted by length and run in
  chunks of ``batch_rows`` so each length bucket compiles once. With a mesh,
  the rows are split over the mesh's batch axes (the backbone should be
  loaded on the same mesh).
  """
  if not records:
    raise ValueError("extract_step_features: no records")
  vocab = backbone.cfg.vocab_size
  for r in records:
    top = max(
        int(np.max(r.prompt_ids, initial=-1)),
        int(np.max(r.response_ids, initial=-1)),
    )
    if top >= vocab:
      raise ValueError(
          f"step record (traj {r.traj_id}, step {r.step_idx}) has token id"
          f" {top} >= backbone vocab_size {vocab}: the policy tokenizer"
          " differs from the backbone's; set policy_tokenizer_dir"
      )
  rows = batch_rows
  out_sh = in_sh = last_sh = None
  if mesh is not None:
    rows = batching.round_up(batch_rows, _batch_shards(mesh, rules))
    out_sh = shd.replicated(mesh)
    in_sh = shd.batch_sharding(mesh, rules, 2)
    last_sh = shd.named_sharding(mesh, ("batch",), rules)
  graphdef, state = nnx.split(backbone)
  fn = _last_hidden_fn(graphdef, out_sh)
  lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
  order = np.argsort(lengths, kind="stable")
  feats = np.zeros((len(records), backbone.cfg.hidden_size), np.float32)
  put = (
      (lambda x, s: jax.device_put(x, s))
      if mesh is not None
      else (lambda x, s: jnp.asarray(x))
  )
  for start in range(0, len(records), rows):
    idx = order[start : start + rows]
    chunk = [_for_batch(records[i]) for i in idx]
    batch = batching.records_to_batch(
        chunk,
        np.zeros(len(chunk)),
        length_multiple=length_multiple,
        row_multiple=rows,
        max_len=max_len,
    )
    last = batching.last_token_index(batch).astype(np.int32)
    h = fn(
        state,
        put(batch.tokens, in_sh),
        put(batch.positions, in_sh),
        put(batch.attention_mask, in_sh),
        put(last, last_sh),
    )
    feats[idx] = np.asarray(h)[: len(idx)]
  return feats


def _for_batch(r: StepRecord) -> StepRecord:
  """The record with a behaviour log-prob array that fits its response
  (records_to_batch copies it; the PRM does not use it)."""
  if len(r.behavior_logp) == len(r.response_ids):
    return r
  return dataclasses.replace(
      r, behavior_logp=np.zeros(len(r.response_ids), np.float32)
  )


def retokenize(records, src_tokenizer, dst_tokenizer) -> list[StepRecord]:
  """Copies of records with prompt/response decoded by ``src_tokenizer``
  (special tokens kept as text) and encoded by ``dst_tokenizer``."""

  def enc(ids):
    text = src_tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)
    return np.asarray(
        dst_tokenizer.encode(text, add_special_tokens=False), np.int32
    )

  out = []
  for r in records:
    resp = enc(r.response_ids)
    out.append(
        dataclasses.replace(
            r,
            prompt_ids=enc(r.prompt_ids),
            response_ids=resp,
            behavior_logp=np.zeros(len(resp), np.float32),
        )
    )
  return out


# ------------------------------------------------------------ head training


def _traj_table(records: Sequence[StepRecord]):
  """(index [N, T] into records, mask [N, T], outcome [N]) per trajectory."""
  pos = {id(r): i for i, r in enumerate(records)}
  trajs = group_trajectories(list(records))
  t_max = max(len(t.steps) for t in trajs)
  index = np.zeros((len(trajs), t_max), np.int32)
  mask = np.zeros((len(trajs), t_max), np.float32)
  for n, t in enumerate(trajs):
    index[n, : len(t.steps)] = [pos[id(s)] for s in t.steps]
    mask[n, : len(t.steps)] = 1.0
  outcome = np.array([t.outcome_reward for t in trajs], np.float64)
  return index, mask, outcome


def make_head(dim: int, hidden: int, params=None, seed: int = 0):
  """A PRMHead; with ``params`` (an nnx.State or flat name -> array dict)
  its values replace the random init."""
  if params is None:
    return models.PRMHead(dim, hidden, rngs=nnx.Rngs(seed))
  abstract = nnx.eval_shape(
      lambda: models.PRMHead(dim, hidden, rngs=nnx.Rngs(0))
  )
  graphdef, astate = nnx.split(abstract)
  if not isinstance(params, dict):
    params = head_tensors(params)
  flat = []
  for p, var in nnx.to_flat_state(astate):
    name = ".".join(map(str, p))
    if name not in params:
      raise ValueError(f"PRM head parameters lack {name!r}")
    arr = np.asarray(params[name], np.float32)
    if arr.shape != tuple(var.value.shape):
      raise ValueError(
          f"PRM head {name!r} has shape {arr.shape}, expected"
          f" {tuple(var.value.shape)} (dim={dim}, hidden={hidden})"
      )
    flat.append((p, var.replace(jnp.asarray(arr))))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def head_tensors(state) -> dict:
  """Flat ``'fc1.kernel' -> np.ndarray`` of a head's nnx.State."""
  return {
      ".".join(map(str, p)): np.asarray(jax.device_get(v.value), np.float32)
      for p, v in nnx.to_flat_state(state)
  }


@functools.lru_cache(maxsize=8)
def _score_fn(graphdef):
  return jax.jit(lambda st, h: nnx.merge(graphdef, st)(h))


def score_features(head_state, features, dim: int, hidden: int) -> np.ndarray:
  """r_hat [S] of raw features [S, D] (rows padded to a multiple of 256 so
  the jitted head compiles for few shapes)."""
  features = np.asarray(features, np.float32)
  graphdef, _ = nnx.split(
      nnx.eval_shape(lambda: models.PRMHead(dim, hidden, rngs=nnx.Rngs(0)))
  )
  s = len(features)
  pad = np.zeros((batching.round_up(s, 256) - s, dim), np.float32)
  out = _score_fn(graphdef)(
      head_state, jnp.asarray(np.concatenate([features, pad]))
  )
  return np.asarray(out)[:s]


def train_prm_head(
    features: np.ndarray,
    records: Sequence[StepRecord],
    *,
    hidden: int = 256,
    steps: int = 500,
    lr: float = 1e-3,
    seed: int = 0,
    holdout_frac: float = 0.2,
    reward_scale: float = 0.1,
    batch_trajs: int = 64,
    weight_decay: float = 0.0,
) -> tuple[nnx.State, dict]:
  """Fits the head by  min mean_i (sum_t r_hat_t - reward_scale * R_i)^2.

  ``features[k]`` belongs to ``records[k]``; trajectories are grouped by
  traj_id and their outcome R is the last step's ``outcome_reward``. A
  seeded ``holdout_frac`` of the trajectories is held out. Each of the
  ``steps`` Adam steps uses ``batch_trajs`` random training trajectories
  (all when fewer). Pure: same inputs and seed, same head.

  Returns (head nnx.State reading raw features, metrics): train/held-out MSE
  of R_hat against ``reward_scale * R`` and Spearman of R_hat vs R.
  """
  features = np.asarray(features, np.float32)
  if features.ndim != 2 or len(features) != len(records):
    raise ValueError(
        f"features shape {features.shape} does not match {len(records)}"
        " records (expected [S, D])"
    )
  if not 0.0 <= holdout_frac < 1.0:
    raise ValueError(f"holdout_frac must be in [0, 1), got {holdout_frac}")
  if steps < 1 or reward_scale <= 0:
    raise ValueError(
        f"steps ({steps}) must be >= 1 and reward_scale ({reward_scale}) > 0"
    )
  index, mask, outcome = _traj_table(records)
  n, dim = len(outcome), features.shape[1]
  n_hold = int(round(holdout_frac * n)) if n >= 2 else 0
  n_hold = min(max(n_hold, 1 if holdout_frac > 0 and n >= 2 else 0), n - 1)
  perm = np.random.default_rng(seed).permutation(n)
  hold, train = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
  used = index[train][mask[train] > 0]
  mu = features[used].mean(0)
  sd = np.sqrt(features[used].var(0) + 1e-5)
  graphdef, params = nnx.split(make_head(dim, hidden, seed=seed))
  tx = optax.adamw(lr, weight_decay=weight_decay)
  b = min(batch_trajs, len(train))

  def loss_fn(p, feats, idx, m, tgt):
    head = nnx.merge(graphdef, p)
    z = (feats[idx] - mu) / sd
    r_hat = jnp.sum(head(z) * m, axis=-1)
    return jnp.mean((r_hat - tgt) ** 2)

  @jax.jit
  def fit(p, feats, idx, m, tgt, key):
    def body(carry, k):
      p, opt = carry
      sel = (
          jax.random.choice(k, idx.shape[0], (b,), replace=False)
          if b < idx.shape[0]
          else jnp.arange(b)
      )
      loss, g = jax.value_and_grad(loss_fn)(
          p, feats, idx[sel], m[sel], tgt[sel]
      )
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), loss

    (p, _), losses = jax.lax.scan(
        body, (p, tx.init(p)), jax.random.split(key, steps)
    )
    return p, losses

  params, losses = fit(
      params,
      jnp.asarray(features),
      jnp.asarray(index[train]),
      jnp.asarray(mask[train]),
      jnp.asarray(reward_scale * outcome[train], jnp.float32),
      jax.random.key(seed),
  )
  params = _fold_standardization(params, mu, sd)
  r_hat = score_features(params, features, dim, hidden)
  traj_score = (r_hat[index] * mask).sum(-1)
  losses = np.asarray(losses)
  metrics = {
      "num_steps": int(len(records)),
      "num_train_traj": int(len(train)),
      "num_heldout_traj": int(len(hold)),
      "reward_scale": float(reward_scale),
      "loss_first": float(losses[0]),
      "loss_last": float(losses[-min(10, steps) :].mean()),
  }
  for name, ids in (("train", train), ("heldout", hold)):
    err = traj_score[ids] - reward_scale * outcome[ids]
    metrics[f"{name}_mse"] = float(np.mean(err**2)) if len(ids) else None
    rho = spearman(traj_score[ids], outcome[ids]) if len(ids) else None
    # Undefined (constant outcomes) is None, so the metrics stay valid JSON.
    metrics[f"{name}_spearman"] = None if rho is None or np.isnan(rho) else rho
  return params, metrics


def _fold_standardization(params, mu, sd):
  """fc1(z), z = (h - mu) / sd  ==  h (W / sd) + (b - (mu / sd) W)."""
  t = head_tensors(params)
  w, bias = t["fc1.kernel"], t["fc1.bias"]
  t["fc1.kernel"] = (w / sd[:, None]).astype(np.float32)
  t["fc1.bias"] = (bias - (mu / sd) @ w).astype(np.float32)
  dim, hidden = w.shape
  return nnx.state(make_head(dim, hidden, t))


# ------------------------------------------------------------------ scorer


class PRMScorer:
  """Frozen backbone + trained head: ``score(records) -> r_hat [S]``."""

  def __init__(
      self,
      backbone: models.Transformer,
      head_state,
      *,
      backbone_dir: str,
      head_hidden: int,
      reward_scale: float = 0.1,
      max_len: Optional[int] = None,
      policy_tokenizer_dir: Optional[str] = None,
      mesh=None,
      rules=shd.DEFAULT_RULES,
      metrics: Optional[dict] = None,
  ):
    self.backbone, self.head_state = backbone, head_state
    self.backbone_dir = os.path.abspath(backbone_dir)
    self.dim, self.head_hidden = backbone.cfg.hidden_size, head_hidden
    self.reward_scale, self.max_len = reward_scale, max_len
    self.policy_tokenizer_dir = policy_tokenizer_dir
    self.mesh, self.rules, self.metrics = mesh, rules, metrics or {}
    self._tokenizers = None

  def _prepare(self, records):
    if not self.policy_tokenizer_dir:
      return records
    if self._tokenizers is None:
      self._tokenizers = (
          models.load_tokenizer(self.policy_tokenizer_dir),
          models.load_tokenizer(self.backbone_dir),
      )
    return retokenize(records, *self._tokenizers)

  def features(self, records: Sequence[StepRecord], **kw) -> np.ndarray:
    return extract_step_features(
        self.backbone,
        self._prepare(records),
        max_len=self.max_len,
        mesh=self.mesh,
        rules=self.rules,
        **kw,
    )

  def score(self, records: Sequence[StepRecord]) -> np.ndarray:
    """r_hat_t in (-1, 1) for every record, [S] float32."""
    return score_features(
        self.head_state, self.features(records), self.dim, self.head_hidden
    )

  def save(self, prm_dir: str) -> None:
    os.makedirs(prm_dir, exist_ok=True)
    # A temporary, then a rename: a kill mid-write (a PRM refresh) leaves
    # the previous head, never a torn file the resumed run cannot load. The
    # mode of prm_config.json (safetensors alone makes 0o600: a PRM in a
    # shared directory another user could not load).
    head_tmp = os.path.join(prm_dir, HEAD_FILE + ".tmp")
    save_safetensors(
        head_tensors(self.head_state), head_tmp, metadata={"format": FORMAT}
    )
    os.replace(head_tmp, os.path.join(prm_dir, HEAD_FILE))
    cfg = {
        "format": FORMAT,
        "backbone_dir": self.backbone_dir,
        "hidden_size": self.dim,
        "head_hidden": self.head_hidden,
        "reward_scale": self.reward_scale,
        "max_len": self.max_len,
        "policy_tokenizer_dir": self.policy_tokenizer_dir,
        "metrics": self.metrics,
    }
    tmp = os.path.join(prm_dir, CONFIG_FILE + ".tmp")
    with open(tmp, "w") as f:
      json.dump(cfg, f, indent=2, sort_keys=True)
      f.write("\n")
    os.replace(tmp, os.path.join(prm_dir, CONFIG_FILE))

  @classmethod
  def load(
      cls,
      prm_dir: str,
      *,
      mesh=None,
      rules=shd.DEFAULT_RULES,
      dtype: Optional[str] = None,
      backbone_dir: Optional[str] = None,
  ) -> "PRMScorer":
    """Reads a saved PRM; ``backbone_dir`` overrides the stored path (a
    relative stored path is taken relative to ``prm_dir``)."""
    path = os.path.join(prm_dir, CONFIG_FILE)
    if not os.path.exists(path) or not os.path.exists(
        os.path.join(prm_dir, HEAD_FILE)
    ):
      raise ValueError(
          f"no PRM in {prm_dir!r}: needs {CONFIG_FILE} and"
          f" {HEAD_FILE} (train one with launch/train_prm.py)"
      )
    with open(path) as f:
      cfg = json.load(f)
    if cfg.get("format") != FORMAT:
      raise ValueError(f"{path}: format {cfg.get('format')!r}, want {FORMAT}")
    bdir = backbone_dir or cfg["backbone_dir"]
    if not os.path.isabs(bdir):
      bdir = os.path.join(prm_dir, bdir)
    mcfg, backbone = models.load_hf_model(
        bdir, mesh=mesh, rules=rules, dtype=dtype, param_dtype=dtype
    )
    if mcfg.hidden_size != cfg["hidden_size"]:
      raise ValueError(
          f"backbone {bdir} has hidden_size {mcfg.hidden_size}; the PRM head"
          f" in {prm_dir} was trained on {cfg['hidden_size']}"
      )
    head = make_head(
        cfg["hidden_size"],
        cfg["head_hidden"],
        load_file(os.path.join(prm_dir, HEAD_FILE)),
    )
    return cls(
        backbone,
        nnx.state(head),
        backbone_dir=bdir,
        head_hidden=cfg["head_hidden"],
        reward_scale=cfg["reward_scale"],
        max_len=cfg.get("max_len"),
        policy_tokenizer_dir=cfg.get("policy_tokenizer_dir"),
        mesh=mesh,
        rules=rules,
        metrics=cfg.get("metrics"),
    )


def make_prm_dense_fn(prm_dir: str, *, mesh, rules, units: str = "reward"):
  """``fn(records)`` that sets each ``record.dense_reward`` in place:
  ``r_hat_t / reward_scale`` (units='reward') or ``r_hat_t`` ('raw').
  Nothing else of a record changes. Returns the values it wrote.

  ``fn.tanh_unit``: one unit of ``r_hat_t`` (the tanh's) in the values
  written, ``1 / reward_scale`` or 1; the dense-reward noise sigma is given
  in tanh units (the paper's) and scaled by it (``RSPOTrainer``)."""
  if units not in UNITS:
    raise ValueError(f"unknown PRM dense-reward units {units!r}; use {UNITS}")
  scorer = PRMScorer.load(prm_dir, mesh=mesh, rules=rules)
  div = scorer.reward_scale if units == "reward" else 1.0

  def fn(records: Sequence[StepRecord]) -> np.ndarray:
    if not records:
      return np.zeros((0,), np.float32)
    values = scorer.score(records) / div
    for r, v in zip(records, values):
      r.dense_reward = float(v)
    return values

  fn.tanh_unit = 1.0 / div
  return fn


# ------------------------------------------------------------- data & CLI


def record_from_json(d: dict) -> StepRecord:
  """A StepRecord from a JSON object of its fields (arrays as lists;
  ``behavior_logp`` may be omitted)."""
  fields = {f.name for f in dataclasses.fields(StepRecord)}
  unknown = sorted(set(d) - fields)
  if unknown:
    raise ValueError(f"unknown StepRecord fields {unknown}")
  d = dict(d)
  for k in ("prompt_ids", "response_ids"):
    if k not in d:
      raise ValueError(f"step record JSON lacks {k!r}")
    d[k] = np.asarray(d[k], np.int32)
  d["behavior_logp"] = np.asarray(
      d.get("behavior_logp", np.zeros(len(d["response_ids"]))), np.float32
  )
  if d.get("dense_reward") is None:
    d["dense_reward"] = float("nan")
  return StepRecord(**d)


def record_to_json(r: StepRecord) -> dict:
  d = dataclasses.asdict(r)
  for k in ("prompt_ids", "response_ids", "behavior_logp"):
    d[k] = np.asarray(d[k]).tolist()
  for k, v in d.items():  # numpy scalars (np.int64 ids, np.bool_ flags)
    if isinstance(v, np.generic):
      d[k] = v.item()
  if np.isnan(d["dense_reward"]):
    d["dense_reward"] = None
  return d


def load_trajectory_records(path: str) -> list[StepRecord]:
  """Step records of a replay-shard directory (read only) or a JSONL file
  (one ``record_to_json`` object a line). Episodes with a failed step are
  dropped."""
  from rspo_jax import replay

  if os.path.isdir(path):
    shards = replay.list_shards(path)
    if not shards:
      raise ValueError(f"no closed replay shards in directory {path!r}")
    records = [r for s in shards for r in replay.read_shard(s)]
  elif os.path.isfile(path):
    records = []
    with open(path) as f:
      for i, line in enumerate(f):
        if line.strip():
          try:
            records.append(record_from_json(json.loads(line)))
          except (ValueError, TypeError) as e:
            raise ValueError(f"{path} line {i + 1}: {e}") from None
  else:
    raise ValueError(f"trajectories path {path!r} does not exist")
  failed = {r.traj_id for r in records if r.failed}
  records = [r for r in records if r.traj_id not in failed]
  if not records:
    raise ValueError(f"{path}: no step records (after dropping failed ones)")
  return records


def train_prm(
    backbone_dir: str,
    records: Sequence[StepRecord],
    out_dir: str,
    *,
    policy_tokenizer_dir: Optional[str] = None,
    max_len: Optional[int] = None,
    batch_rows: int = 32,
    mesh=None,
    rules=shd.DEFAULT_RULES,
    **train_kw,
) -> dict:
  """Loads the backbone, caches features, trains the head, saves the PRM
  to ``out_dir``; returns the metrics (``train_kw`` go to train_prm_head)."""
  _, backbone = models.load_hf_model(backbone_dir, mesh=mesh, rules=rules)
  scorer = PRMScorer(
      backbone,
      None,
      backbone_dir=backbone_dir,
      head_hidden=train_kw.get("hidden", 256),
      reward_scale=train_kw.get("reward_scale", 0.1),
      max_len=max_len,
      policy_tokenizer_dir=policy_tokenizer_dir,
      mesh=mesh,
      rules=rules,
  )
  feats = scorer.features(records, batch_rows=batch_rows)
  scorer.head_state, metrics = train_prm_head(feats, records, **train_kw)
  scorer.metrics = metrics
  scorer.save(out_dir)
  return metrics
