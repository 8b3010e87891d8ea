r"""WebShop with the learned PRM: its quality, B's lift on it, the PRM alone
as A's reward, and the gate of the full study (report:
docs/results/prm_webshop.md).

One piece of work per invocation (each fits a few minutes of 2 CPU cores),
every piece resumable, JSON out under ``--root`` (default
runs/prm_webshop/<start>):

  python experiments/prm_quality.py collect --start sparse  # trajectories
  python experiments/prm_quality.py quality --start sparse  # (a) PRM quality
  python experiments/prm_quality.py loop --start sparse --b_reward prm  # (b)
  python experiments/prm_quality.py loop --start sparse \
      --b_reward outcome                                                # (b)
  python experiments/prm_quality.py dense_only --start sparse --steps 12 # (c)
  python experiments/prm_quality.py report --out docs/results/prm_webshop.json

Starts (``--start``): ``sparse``, the WebShop gate's warm start (300
behaviour-cloning steps, 8.2 % greedy held-out success;
docs/results/archive/webshop_sparse_gate/warm_start_webshop), and
``default``, the committed configs/warm_starts/webshop_nano (24.6 %).
The world, batch (16 x 8), alpha (1/8) and every-row training are today's
CPU defaults of configs/webshop_grpo.py, which are the gate's
SPARSE_OVERRIDES.

collect   The loop's own collector (``RSPOTrainer.collect_groups``) plays
          ``--collections`` x 16 groups of 8 with the starting policy at
          T = 1, each collection a fresh task draw, seed ``COLLECT_SEED``
          (not the runs' seed 0, so the PRM never saw the tasks and
          sampling seeds of B's first batch below). The environment's
          oracle d_t stays in each record's dense_reward.
quality   The PRM is trained as the loop trains it (build.make_prm_refresh:
          ``prm.train_prm`` on the starting policy's first 16 groups,
          backbone = the starting policy, rspo.prm_steps Adam steps, its
          own 20 % hold-out for early metrics) and saved in
          ``<root>/prm``; on the other collections (held out) ``prm.quality``
          gives R^2 of its trajectory score against won, AUC of the first t
          steps' sum, and per-step distance from the oracle d_t.
loop      One RSPO+GRPO loop, k = 3 B steps then 1 A step, B on the PRM
          (``rspo.dense_reward=prm`` with ``rspo.prm_dir`` = the PRM above)
          or on the outcome (RSPO_O: ``rspo.data_source=outcome``; its B
          records are still scored by the PRM, so both report B's PRM
          return). Seed 0 for both: B's first batch is the same tasks and
          sampling seeds, so the two lifts are paired. No evaluations.
dense_only  The spell study's dense-only cell (experiments/grid.py DENSE_ONLY,
          on GiGPO as the gate's) with the PRM as A's only reward:
          ``rspo=0,rspo.dense_only=1,rspo.dense_reward=prm``; resumes from
          its checkpoint up to ``--steps`` A steps. A run cut short and
          resumed is the same run; one extended by a larger ``--steps``
          is not, since its last loop ended at the old total
          (loop/driver.py) and the later loops' seeds move. ``--eval``
          evaluates the result greedily on the 256 held-out goals once it
          is there.
report    Gathers every piece's JSON, the gate's archived cells of seed 0
          (same tasks per step) and the gate of item 4(d).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rspo_jax.types import group_trajectories  # noqa: E402

STARTS = {
    "sparse": os.path.join(
        ROOT,
        "docs",
        "results",
        "archive",
        "webshop_sparse_gate",
        "warm_start_webshop",
        "warm_start",
    ),
    "default": os.path.join(ROOT, "configs", "warm_starts", "webshop_nano"),
}
GATE = os.path.join(ROOT, "docs", "results", "archive", "webshop_sparse_gate")
COLLECT_SEED = 1000
GROUPS = 16  # one collection: the batch, and the loop's rspo.prm_train_groups
SEED = 0
# The full study runs if B on the PRM lifts more than on the outcome or
# diverges from A by more than this, in nats a replayed token (item 4d).
GATE_NATS = 0.1


def config(algo: str, start: str, extra: str):
  from configs import base  # noqa: PLC0415

  arg = f"model.checkpoint_dir={STARTS[start]},seed={SEED}"
  return base.make_config(
      "webshop", algo, ",".join(p for p in (arg, extra) if p)
  )


def _write(path: str, obj) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)


def _read(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _traj_file(root: str, c: int) -> str:
  return os.path.join(root, "trajectories", f"collection_{c}.jsonl")


# ---------------------------------------------------------------- collect


def collect(root: str, start: str, collections: int) -> None:
  from rspo_jax import build, prm  # noqa: PLC0415

  todo = [
      c
      for c in range(1, collections + 1)
      if not os.path.exists(_traj_file(root, c))
  ]
  if not todo:
    print("collect: every collection is there")
    return
  cfg = config("grpo", start, f"rspo=0,seed={COLLECT_SEED}")
  run = build.build_run(cfg, os.path.join(root, "collect_work"), progress=False)
  try:
    t = run.trainer
    for c in range(1, collections + 1):
      # The draws depend on the collection counter only: skipped ones are
      # drawn, not played.
      if c not in todo:
        t.state.collections += 1
        continue
      records, stats = t.collect_groups(t.a, GROUPS, "A")
      path = _traj_file(root, c)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path + ".tmp", "w") as f:
        for r in records:
          f.write(json.dumps(prm.record_to_json(r)) + "\n")
      os.replace(path + ".tmp", path)
      print(
          f"collection {c}: {len(records)} steps, success"
          f" {stats['success_rate']:.3f}"
      )
  finally:
    run.close()


def _records(root: str, collections) -> list:
  from rspo_jax import prm  # noqa: PLC0415

  out = []
  for c in collections:
    out += prm.load_trajectory_records(_traj_file(root, c))
  return out


# ---------------------------------------------------------------- quality


def _per_traj(records, r_hat):
  """(r_hat per trajectory, oracle d_t per trajectory, won, task ids)."""
  value = {id(r): float(v) for r, v in zip(records, r_hat)}
  trajs = group_trajectories(list(records))
  return (
      [np.array([value[id(s)] for s in t.steps]) for t in trajs],
      [np.array([s.dense_reward for s in t.steps]) for t in trajs],
      np.array([bool(t.steps[-1].won) for t in trajs]),
      [t.task_id for t in trajs],
  )


def quality(
    root: str, start: str, collections: int, train_collections: int = 1
) -> None:
  """(a); ``train_collections`` > 1 trains a PRM on more of the start's
  groups than the loop does (``quality_train<N>.json``, ``prm_train<N>``)
  and holds out the rest."""
  from rspo_jax import prm  # noqa: PLC0415

  tag = "" if train_collections == 1 else f"_train{train_collections}"
  out_path = os.path.join(root, f"quality{tag}.json")
  if os.path.exists(out_path):
    print(f"quality: {out_path} is there")
    return
  cfg = config("grpo", start, "")
  prm_dir = os.path.join(root, f"prm{tag}")
  train = _records(root, range(1, train_collections + 1))
  held = _records(root, range(train_collections + 1, collections + 1))
  if not os.path.exists(os.path.join(prm_dir, prm.CONFIG_FILE)):
    # As build.make_prm_refresh: backbone and tokenizer = the start.
    prm.train_prm(
        STARTS[start],
        train,
        prm_dir,
        policy_tokenizer_dir=STARTS[start],
        max_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens,
        steps=cfg.rspo.prm_steps,
        seed=cfg.seed,
    )
  scorer = prm.PRMScorer.load(prm_dir)
  result = {
      "start": start,
      "warm_start": STARTS[start],
      "prm_dir": prm_dir,
      "prm_train_metrics": scorer.metrics,
      "collect_seed": COLLECT_SEED,
      "groups_per_collection": GROUPS,
      "train_collections": train_collections,
  }
  for name, records in (("heldout", held), ("train", train)):
    r_hat, oracle, won, tasks = _per_traj(records, scorer.score(records))
    q = prm.quality(r_hat, oracle, won, max_t=cfg.env.max_steps)
    q["num_tasks"] = len(set(tasks))
    result[name] = q
  train_tasks = {r.task_id for r in train}
  result["heldout"]["tasks_also_in_train"] = len(
      {r.task_id for r in held} & train_tasks
  )
  _write(out_path, result)
  h = result["heldout"]
  print(
      f"held out: {h['num_traj']} trajectories, {h['num_wins']} won;"
      f" R^2 {h['r2_traj']}, AUC by t {h['auc_prefix']},"
      f" step MAE {h['step_mae']:.3f}, step r {h['step_pearson']}"
  )


# ------------------------------------------------------------------ runs


def _train(cfg, workdir: str, steps_eval: bool) -> None:
  from rspo_jax import build, compile_cache  # noqa: PLC0415

  compile_cache.enable(compile_cache.cache_dir(cfg, workdir))
  run = build.build_run(cfg, workdir, progress=False)
  try:
    run.trainer.try_resume()
    if run.trainer.state.a_steps < cfg.train.total_steps:
      run.trainer.run()
    final = os.path.join(workdir, "eval_final_greedy.json")
    if steps_eval and not os.path.exists(final):
      _write(final, run.evaluate(run.trainer.a, run.trainer.state.a_steps))
  finally:
    run.close()


def loop(root: str, start: str, b_reward: str) -> None:
  workdir = os.path.join(root, f"loop_{b_reward}")
  source = ",rspo.data_source=outcome" if b_reward == "outcome" else ""
  cfg = config(
      "grpo",
      start,
      "rspo=1,rspo.k=3,steps=1,rspo.dense_reward="
      f"prm,rspo.prm_dir={os.path.join(root, 'prm')}{source}",
  )
  _train(cfg, workdir, False)
  _write(os.path.join(root, f"loop_{b_reward}.json"), loop_summary(workdir))


def loop_summary(workdir: str) -> dict:
  from rspo_jax.metrics import metrics_path, read_metrics  # noqa: PLC0415

  path = metrics_path(workdir)
  b = read_metrics(path, "B")
  (lift,) = read_metrics(path, "B_collect")
  a = read_metrics(path, "A")[0]
  keep = (
      "replay_logp_b_minus_old",
      "replay_logp_b_minus_old_max",
      "replay_logp_b_minus_old_median",
      "replay_kl_b_old_k3",
      "replay_log_c_big_frac",
      "ratio_mean_off",
      "rows_off",
      "n_tokens_off",
      "rollout_success_rate",
  )
  return {
      "b_steps": [
          {
              k: m.get(k)
              for k in (
                  "rollout_success_rate",
                  "dense_reward_mean",
                  "outcome_reward_mean",
              )
          }
          for m in b
      ],
      "b_collect": {
          k: v for k, v in lift.items() if k.startswith("b_") or k == "loop"
      },
      "a_step_1": {k: a.get(k) for k in keep},
  }


def dense_only(root: str, start: str, steps: int, evaluate: bool) -> None:
  workdir = os.path.join(root, "dense_only")
  cfg = config(
      "gigpo",
      start,
      "rspo=0,rspo.dense_only=1,"
      f"rspo.dense_reward=prm,rspo.prm_dir={os.path.join(root, 'prm')}"
      f",steps={steps},rollout.eval_temperature=0",
  )
  _train(cfg, workdir, evaluate)
  _write(os.path.join(root, "dense_only.json"), curve(workdir))


def curve(workdir: str) -> dict:
  """Per A step: rollout success, dense reward per step row, outcome;
  the greedy evaluation when there is one."""
  from rspo_jax.metrics import metrics_path, read_metrics  # noqa: PLC0415

  rows = read_metrics(metrics_path(workdir), "A")
  out = {
      "steps": [
          {
              "step": m["step"],
              "success": m.get("rollout_success_rate"),
              "dense_reward_mean": m.get("dense_reward_mean"),
              "outcome_reward_mean": m.get("outcome_reward_mean"),
          }
          for m in rows
      ]
  }
  final = _read(os.path.join(workdir, "eval_final_greedy.json"))
  if final is not None:
    out["eval_final_greedy"] = {
        k: final[k] for k in ("success_rate", "score", "num_tasks")
    }
  return out


# ---------------------------------------------------------------- report


def _archived_curve(cell: str) -> list:
  """A rows of the gate's archived ``cell`` (its metrics gzipped)."""
  from rspo_jax.metrics import metrics_path, read_metrics  # noqa: PLC0415

  rows = read_metrics(metrics_path(os.path.join(GATE, cell)))
  return [
      {
          "step": m["step"],
          "success": m.get("rollout_success_rate"),
          "dense_reward_mean": m.get("dense_reward_mean"),
      }
      for m in rows
      if m.get("phase") == "A"
  ]


def gate(lift_prm: dict, lift_outcome: dict) -> dict:
  """Item 4(d): run the study if B on the PRM lifts success more than B on
  the outcome, or B diverges from A by more than GATE_NATS a replayed
  token (mean log pi_B - log pi_old, or its k3, at A's first step)."""
  lp = lift_prm["b_collect"]["b_lift_success"]
  lo = lift_outcome["b_collect"]["b_lift_success"]
  a = lift_prm["a_step_1"]
  div = max(
      a.get("replay_logp_b_minus_old") or 0.0,
      a.get("replay_kl_b_old_k3") or 0.0,
  )
  return {
      "b_lift_success_prm": lp,
      "b_lift_success_outcome": lo,
      "lifts_more": bool(lp > lo),
      "divergence_nats": div,
      "diverges": bool(div > GATE_NATS),
      "threshold_nats": GATE_NATS,
      "run_study": bool(lp > lo or div > GATE_NATS),
  }


def figure3(result: dict, out_png: str) -> None:
  """Figure 3's plot, one panel per start that ran the PRM alone: its PRM
  reward a step row (solid) and rollout success (dashed) by A step, and
  from the sparse start GiGPO's success on the same tasks (the gate's
  archived seed 0)."""
  import matplotlib  # noqa: PLC0415 -- only the plotting path needs it

  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from report.common import save_figure  # noqa: PLC0415

  starts = [s for s in STARTS if "dense_only" in result.get(s, {})]
  fig, axes = plt.subplots(
      1, len(starts), figsize=(6.4 * len(starts), 4.0), dpi=120, squeeze=False
  )
  for ax, start in zip(axes[0], starts):
    prm = result[start]["dense_only"]["steps"]
    x = [r["step"] for r in prm]
    ax.plot(x, [r["dense_reward_mean"] for r in prm], "-", color="C3", lw=1.6)
    ax.plot(x, [r["success"] for r in prm], "--", color="C3", lw=1.6)
    legend = ["PRM alone: PRM reward a step row", "PRM alone: rollout success"]
    gigpo = [
        r
        for r in result[start].get("archived_seed0", {}).get("baseline", [])
        if r["step"] <= prm[-1]["step"]
    ]
    if gigpo:
      ax.plot(
          [r["step"] for r in gigpo],
          [r["success"] for r in gigpo],
          "--",
          color="C0",
          lw=1.6,
      )
      legend.append("GiGPO on the outcome: rollout success")
    ax.legend(legend, fontsize="x-small", loc="upper left")
    ax.set_xlabel("A step" + (" (same tasks in both runs)" if gigpo else ""))
    ax.set_ylabel("PRM reward / success")
    ax.set_title(
        f"WebShop, the learned PRM as A's only reward ({start} start, seed 0)",
        fontsize="medium",
    )
    ax.grid(alpha=0.3)
  fig.tight_layout()
  save_figure(fig, out_png)


def report(base: str, out: str) -> None:
  """Gathers the pieces under ``base`` into ``out``. A start with no
  pieces under ``base`` keeps its entry from ``out``: runs/ is not
  committed, so a later session's report keeps an earlier one's start."""
  result = _read(out) or {}
  for start in STARTS:
    root = os.path.join(base, start)
    r = {
        k: _read(os.path.join(root, f"{k}.json"))
        for k in (
            "quality",
            "quality_train3",
            "loop_prm",
            "loop_outcome",
            "dense_only",
        )
    }
    r = {k: v for k, v in r.items() if v is not None}
    if "loop_prm" in r and "loop_outcome" in r:
      r["gate"] = gate(r["loop_prm"], r["loop_outcome"])
    if r:
      result[start] = r
  if "sparse" in result and os.path.isdir(GATE):
    result["sparse"]["archived_seed0"] = {
        cell: _archived_curve(f"webshop_gigpo_{cell}_s0")
        for cell in ("baseline", "dense_only", "grpo")
    }
  _write(out, result)
  if any("dense_only" in result.get(s, {}) for s in STARTS):
    figure3(result, os.path.splitext(out)[0] + "_figure3.png")
  print(json.dumps({s: r.get("gate") for s, r in result.items()}, indent=1))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
      "piece", choices=("collect", "quality", "loop", "dense_only", "report")
  )
  p.add_argument("--start", choices=tuple(STARTS), default="sparse")
  p.add_argument("--root", default=os.path.join(ROOT, "runs", "prm_webshop"))
  p.add_argument(
      "--collections",
      type=int,
      default=4,
      help="collections of 16 groups: the first trains the PRM",
  )
  p.add_argument(
      "--train_collections",
      type=int,
      default=1,
      help="quality: collections the PRM trains on (the loop: 1)",
  )
  p.add_argument("--b_reward", choices=("prm", "outcome"), default="prm")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--eval", action="store_true")
  p.add_argument(
      "--out", default=os.path.join(ROOT, "docs", "results", "prm_webshop.json")
  )
  a = p.parse_args(argv)
  root = os.path.join(a.root, a.start)
  if a.piece == "collect":
    collect(root, a.start, a.collections)
  elif a.piece == "quality":
    quality(root, a.start, a.collections, a.train_collections)
  elif a.piece == "loop":
    loop(root, a.start, a.b_reward)
  elif a.piece == "dense_only":
    dense_only(root, a.start, a.steps, a.eval)
  else:
    report(a.root, a.out)


if __name__ == "__main__":
  main()
