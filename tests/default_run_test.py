"""The embedded default (README's first command): its config, its summary,
its figure, and (slow) a shortened run of it through launch/train.py."""

import json
import math
import os
import subprocess
import sys

import pytest

from configs import base, scales, webshop_grpo, webshop_ppo
from rspo_launch import plot, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = b"\x89PNG\r\n\x1a\n"


def test_default_starts_from_the_committed_warm_start():
  cfg = webshop_grpo.get_config()
  ws = cfg.model.checkpoint_dir
  assert ws == scales.WEBSHOP_WARM_START and os.path.isabs(ws)
  for name in (
      "config.json",
      "model.safetensors",
      "tokenizer.json",
      "MAKE.txt",
  ):
    assert os.path.isfile(os.path.join(ws, name)), name
  assert not cfg.sft.enabled and cfg.model.preset == "nano"
  # The world it was cloned on; every held-out goal evaluated.
  assert (
      cfg.env.kwargs.goals_per_product,
      cfg.env.kwargs.num_test_goals,
      cfg.env.num_eval_tasks,
  ) == (20, 256, 256)
  # The recipe the CPU study found to learn: the paper's batch, every row.
  assert (
      cfg.train.batch_tasks,
      cfg.train.group_size,
      cfg.rspo.alpha,
      cfg.rspo.k,
      cfg.train.max_train_rows,
      cfg.train.micro_batch_rows,
  ) == (16, 8, 0.125, 3, 0, 32)
  assert webshop_ppo.get_config().train.batch_tasks == 128  # tasks x 1


def test_behaviour_cloning_is_one_override_away():
  cfg = webshop_grpo.get_config("sft.enabled=True,model.checkpoint_dir=")
  assert cfg.sft.enabled and cfg.model.checkpoint_dir == ""
  # Another model than the one the warm start holds clones its own.
  for arg in ("model=tiny", "model.overrides=num_layers=1"):
    cfg = webshop_grpo.get_config(arg)
    assert cfg.sft.enabled and cfg.model.checkpoint_dir == "", arg
  # A checkpoint of one's own is kept whatever the preset.
  cfg = webshop_grpo.get_config("model=tiny,model.checkpoint_dir=/ck")
  assert cfg.model.checkpoint_dir == "/ck"
  base.validate(cfg)
  assert cfg.model.checkpoint_dir == "/ck"


def _eval(won, score):
  per_task = [
      {"seed": 0, "task_id": t, "won": w, "score": s}
      for t, (w, s) in enumerate(zip(won, score))
  ]
  return {
      "success_rate": sum(won) / len(won),
      "score": sum(score) / len(score),
      "num_tasks": len(won),
      "per_task": per_task,
  }


class _State:
  a_steps = 6


def test_summary_reads_start_to_end_with_a_paired_interval(tmp_path):
  cfg = webshop_grpo.get_config()
  # 8 goals: 2 won at the start, the same 2 and 2 more at the end.
  start = _eval([1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
  final = _eval([1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5])
  text = train.summary(
      cfg, "runs/x", start, final, _State(), 754.0, "runs/x/curves.png"
  )
  lines = text.splitlines()
  assert lines[0] == (
      "RSPO+GRPO on webshop: 6 A steps (2 loops of k = 3)," " 12.6 min"
  )
  assert lines[1] == "held-out test goals: 8, temperature 0.4"
  # +25 points; a paired bootstrap over the 8 goals cannot go below 0 (no
  # goal got worse): 2 goals of +100 and 6 of 0 resampled.
  success = lines[2].split()
  assert success[:8] == [
      "success",
      "25.0",
      "%",
      "->",
      "50.0",
      "%",
      "+25.0",
      "points",
  ]
  lo, hi = (float(v.strip("[],")) for v in success[8:10])
  assert 0.0 <= lo < 25.0 < hi <= 100.0
  assert lines[3].split()[:5] == ["score", "0.625", "->", "0.750", "+0.125"]
  assert "paired 95 % interval" in lines[4]
  assert "curves.png" in text and "eval_start.json" in text
  assert "per_task" not in text
  # No metrics.jsonl under runs/x: nothing about B.
  assert "B lift" not in text and "replay" not in text
  # RSPO's mechanism from the run's metrics: B's lift averaged over its
  # 2 loops ((20 + 30) / 2 -> (40 + 50) / 2 %), the wins among replayed
  # trajectories of the steps that replayed any ((4 + 2) / (4 + 4));
  # step 5 replayed nothing and logs a share of 0 (replayed.metrics).
  _write_rows(
      tmp_path / "metrics.jsonl",
      [
          {
              "step": 0,
              "phase": "B_collect",
              "b_first_success": 0.2,
              "b_stored_success": 0.4,
          },
          {
              "step": 1,
              "phase": "A",
              "replay_success_frac": 1.0,
              "replay_trajectories": 4.0,
          },
          {
              "step": 3,
              "phase": "B_collect",
              "b_first_success": 0.3,
              "b_stored_success": 0.5,
          },
          {
              "step": 4,
              "phase": "A",
              "replay_success_frac": 0.5,
              "replay_trajectories": 4.0,
          },
          {
              "step": 5,
              "phase": "A",
              "replay_success_frac": 0.0,
              "replay_trajectories": 0.0,
          },
          {"step": 6, "phase": "A"},
      ],
  )
  text = train.summary(cfg, str(tmp_path), start, final, _State(), 754.0)
  b_lift, replay = text.splitlines()[5:7]
  assert b_lift.split()[:9] == [
      "B",
      "lift",
      "25.0",
      "%",
      "->",
      "45.0",
      "%",
      "+20.0",
      "points",
  ]
  assert b_lift.endswith("2 loops")
  assert replay.split()[:3] == ["replay", "75", "%"]
  assert replay.endswith("2 A steps")
  # Adaptive B logs B_stop rows: its steps a loop and how often it
  # reached its target.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    for step, n, reached in ((0, 17, True), (3, 20, False)):
      f.write(
          json.dumps(
              {
                  "step": step,
                  "phase": "B_stop",
                  "b_steps": n,
                  "b_target_reached": reached,
              }
          )
          + "\n"
      )
  text = train.summary(cfg, str(tmp_path), start, final, _State(), 754.0)
  assert text.splitlines()[6] == (
      "  B steps  17, 20 a loop; target reached in 1 of 2"
  )
  # Without per-task outcomes: the means, no interval.
  del start["per_task"]
  text = train.summary(cfg, "runs/x", start, final, _State(), 1.0)
  assert "interval" not in text and "25.0 % -> 50.0 %" in text


def _write_rows(path, rows):
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def test_plot_run_draws_a_and_b(tmp_path):
  rows = [{"step": 0, "phase": "eval", "success_rate": 0.25}]
  for loop in range(2):
    for i in range(3):
      rows.append(
          {
              "step": 3 * loop,
              "phase": "B",
              "b_step": 3 * loop + i + 1,
              "rollout_success_rate": 0.2 + 0.01 * i,
              "dense_reward_mean": 0.5 + 0.1 * i,
          }
      )
    rows.append(
        {
            "step": 3 * loop,
            "phase": "B_collect",
            "b_first_success": 0.2,
            "b_stored_success": 0.3 + loop / 10,
        }
    )
    for i in range(3):
      rows.append(
          {
              "step": 3 * loop + i + 1,
              "phase": "A",
              "rollout_success_rate": 0.2 + 0.02 * i,
              "env_steps": 10,
          }
      )
  rows.append({"step": 6, "phase": "eval", "success_rate": 0.3})
  _write_rows(tmp_path / "metrics.jsonl", rows)
  out = tmp_path / "curves.png"
  drawn = plot.plot_run(str(tmp_path), str(out))
  assert open(out, "rb").read(8) == PNG
  assert list(drawn["eval success"][0]) == [0.0, 6.0]
  assert list(drawn["B dense reward"][0]) == [1, 2, 3, 4, 5, 6]
  assert list(drawn["A success"][0]) == [1, 2, 3, 4, 5, 6]
  # B's lift, a loop at a time: from its first step to its last, a gap
  # (nan) between loops.
  xs, ys = drawn["B lift"]
  assert xs[:2] + xs[3:] == [1, 3, 4, 6] and math.isnan(xs[2])
  assert ys[:2] + ys[3:] == [0.2, 0.3, 0.2, 0.4]
  # A baseline (no B rows) draws A alone; nothing to draw is an error.
  _write_rows(
      tmp_path / "metrics.jsonl", [r for r in rows if r["phase"] != "B"]
  )
  assert "B success" not in plot.plot_run(str(tmp_path), str(out))
  _write_rows(tmp_path / "metrics.jsonl", [{"step": 0, "phase": "sft"}])
  with pytest.raises(ValueError, match="no A steps or evaluations"):
    plot.plot_run(str(tmp_path), str(out))


# A shortened default: one loop (a B step, B's collection, an A step) of
# 2 x 2 episodes of at most 2 turns on the committed warm start, one update
# a step, one environment worker, evaluated on 4 held-out goals; everything
# else the default's. ~80 s of CPU, most of it compiling (6 turns and 4
# updates a step: ~145 s).
SHORT = (
    "steps=1,train.batch_tasks=2,train.group_size=2,rspo.k=1,"
    "env.num_eval_tasks=4,env.max_steps=2,train.updates_per_step=1,"
    "env.num_workers=1"
)


@pytest.mark.slow
def test_shortened_default_run_ends_with_summary_plot_and_evaluations(tmp_path):
  workdir = str(tmp_path / "run")
  cmd = [
      sys.executable,
      os.path.join(ROOT, "launch/train.py"),
      f"--config={ROOT}/configs/webshop_grpo.py:{SHORT}",
      f"--workdir={workdir}",
      "--no_progress",
  ]
  out = subprocess.run(
      cmd,
      capture_output=True,
      text=True,
      timeout=600,
      env=dict(os.environ, XLA_FLAGS=""),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  for name in ("eval_start.json", "eval_final.json"):
    result = json.load(open(os.path.join(workdir, name)))
    assert result["num_tasks"] == 4 and len(result["per_task"]) == 4
  assert open(os.path.join(workdir, "curves.png"), "rb").read(8) == PNG
  # The terminal ends with the summary, not the evaluations' JSON.
  summary = open(os.path.join(workdir, "summary.txt")).read()
  assert out.stdout.strip().endswith(summary.strip())
  assert summary.startswith("RSPO+GRPO on webshop: 1 A step (1 loop of k = 1)")
  assert "paired 95 % interval" in summary and "per_task" not in out.stdout
  assert "B lift" in summary and "replay" in summary
  # Library logs at WARNING: orbax's and JAX's INFO lines are not shown;
  # this script's own are, naming the committed warm start.
  assert "CheckpointManager" not in out.stderr
  assert "xla_bridge" not in out.stderr
  assert "Building index" not in out.stderr
  assert scales.WEBSHOP_WARM_START in out.stderr


def test_progress_bar_counts_b_steps_beside_a_steps():
  from rspo_jax.rspo import progress_counts  # noqa: PLC0415

  # The default: 1 loop, 3 B steps then 3 A steps.
  assert progress_counts(3, 0, "B", 3, 3) == (6, 0)  # fresh start
  assert progress_counts(3, 0, "A", 3, 3) == (6, 3)  # B done, no A step
  assert progress_counts(3, 2, "A", 3, 3) == (6, 5)
  assert progress_counts(3, 3, "B", 3, 3) == (6, 6)  # finished
  # 12 A steps at k = 10: loops of 10 and 2 A steps, 10 B steps each.
  assert progress_counts(12, 10, "B", 10, 10) == (32, 20)
  assert progress_counts(12, 10, "A", 10, 10) == (32, 30)
  assert progress_counts(12, 12, "A", 10, 10) == (32, 32)
  # Without B (rspo=0, RSPO_H, the dense reward alone): A's steps only.
  assert progress_counts(6, 4, "A", 3, 0) == (6, 4)
