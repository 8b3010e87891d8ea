"""experiments/study_probes.py: the diagnostic table from a run's files;
the diagnostics eval_failures.py and warm_start_probe.py: how they sort
episode endings and decisions."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import study_probes  # noqa: E402


def write_run(d, a_rows, start=None, final=None):
  os.makedirs(d)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for row in a_rows:
      f.write(json.dumps({"phase": "A", **row}) + "\n")
    f.write(json.dumps({"phase": "time", "step": 1, "wall_s": 1.0}) + "\n")
  for name, won in (("eval_start.json", start), ("eval_final.json", final)):
    if won is not None:
      per_task = [
          {"seed": 0, "task_id": g, "won": w, "score": w}
          for g, w in enumerate(won)
      ]
      with open(os.path.join(d, name), "w") as f:
        json.dump({"per_task": per_task}, f)


def test_summary_by_hand(tmp_path):
  rows = [
      dict(
          step=s,
          approx_kl=kl,
          entropy=e,
          adv_nonzero_frac_on=a,
          rollout_success_rate=r,
      )
      for s, kl, e, a, r in (
          (1, 0.5, 0.2, 0.5, 0.0),
          (2, 0.1, 0.3, 1.0, 0.5),
          (3, 0.3, 0.4, 0.0, 1.0),
      )
  ]
  rows.append(dict(rows[-1], approx_kl=0.2))  # step 3 redone: its last row
  d = str(tmp_path / "probe" / "a")
  write_run(d, rows, start=[0, 0, 1, 1], final=[1, 0, 1, 1])
  s = study_probes.summarize(d)
  assert s["run"] == "probe/a" and s["steps"] == 3
  assert s["kl_first"] == 0.5
  assert s["kl_later"] == pytest.approx((0.1 + 0.2) / 2)
  assert s["entropy"] == (0.2, 0.4)
  assert s["signal"] == pytest.approx(0.5)
  assert s["rollouts"] == (pytest.approx(0.5), pytest.approx(0.5))
  assert (s["start"], s["final"]) == (50.0, 75.0)
  assert s["diff"]["mean"] == pytest.approx(0.25)
  assert (s["won"], s["lost"]) == (1, 0)
  table = study_probes.markdown([s])
  assert "| probe/a | 3 | 0.500 | 0.1500 | 0.200 -> 0.400 | 0.50 |" in table
  assert "50.0 -> 75.0 | +25.0 [" in table and table.endswith("| 1 / 0 |\n")


def test_unfinished_run_without_the_signal_metric(tmp_path):
  d = str(tmp_path / "study" / "b")
  write_run(
      d, [dict(step=1, approx_kl=0.0, entropy=0.1, rollout_success_rate=0.25)]
  )
  s = study_probes.summarize(d)
  assert s["signal"] is None and "diff" not in s
  assert (
      "| study/b | 1 | 0.000 | - | 0.100 -> 0.100 | - |"
      " 0.25 -> 0.25 | stopped | - | - |" in study_probes.markdown([s])
  )


def test_pooled_over_training_seeds_by_decoding(tmp_path):
  """Runs differing only in '_s<seed>' pool into one setting; a decoding
  is reported when every seed's workdir holds its files."""
  row = dict(step=1, approx_kl=0.0, entropy=0.1, rollout_success_rate=0.5)
  a = str(tmp_path / "probe" / "x_s0")
  b = str(tmp_path / "probe" / "x_s200")
  write_run(a, [row], start=[0, 0, 1, 1], final=[1, 0, 1, 1])
  write_run(b, [row], start=[0, 0, 1, 1], final=[1, 1, 1, 1])
  # T = 1.0 files in one seed's workdir only: that decoding is left out.
  for name in ("eval_start_t10.json", "eval_final_t10.json"):
    with open(os.path.join(a, name), "w") as f:
      json.dump({"per_task": [{"seed": 0, "task_id": 0, "won": 1}]}, f)
  assert study_probes.setting(b) == "probe/x"
  (r,) = study_probes.pooled([a, b])
  assert (r["setting"], r["seeds"], r["decoding"]) == ("probe/x", 2, "greedy")
  assert r["start"]["mean"] == pytest.approx(0.5)
  assert r["final"]["mean"] == pytest.approx((3 + 4) / 8)
  assert r["diff"]["mean"] == pytest.approx(0.375)
  assert "| probe/x | 2 | greedy | 50.0 [" in study_probes.pooled_markdown([r])


def test_settings_versus_the_first_share_goals(tmp_path):
  """Each later setting's final success minus the first's, per decoding
  both hold: goal 1 won by y only, goal 3 by x only, the rest alike."""
  row = dict(step=1, approx_kl=0.0, entropy=0.1, rollout_success_rate=0.5)
  x = str(tmp_path / "probe" / "x_s0")
  y = str(tmp_path / "probe" / "y_s0")
  write_run(x, [row], start=[0, 0, 1, 1], final=[1, 0, 1, 1])
  write_run(y, [row], start=[0, 0, 1, 1], final=[1, 1, 1, 0])
  (r,) = study_probes.versus_first([x, y])
  assert (r["setting"], r["versus"], r["decoding"]) == (
      "probe/y",
      "probe/x",
      "greedy",
  )
  assert r["diff"]["mean"] == pytest.approx(0.0)
  assert r["diff"]["lo"] < 0 < r["diff"]["hi"]
  assert (
      "| probe/y | probe/x | greedy | +0.0 ["
      in study_probes.versus_markdown([r])
  )


def test_warm_start_probe_decision_kinds():
  import warm_start_probe  # noqa: PLC0415

  kind = warm_start_probe.decision_kind
  assert kind("search[garden hose]") == "search"
  assert kind("click[b0l2nht6p8]") == "product"
  assert kind("click[75 ft]") == "option"
  assert kind("click[next >]") == "option"
  assert kind("click[buy now]") == "buy"


def test_eval_failures_sorts_episode_endings():
  import eval_failures  # noqa: PLC0415

  ending = eval_failures.ending
  bought = ["search[hoodie]", "click[b0ksko17e8]", "click[buy now]"]
  assert ending(bought, won=True, invalid=False) == "won"
  assert ending(bought, won=False, invalid=False) == "wrong_buy"
  looped = ["search[usb c cable]", "click[b02x263k57]"] + ["click[white]"] * 6
  assert ending(looped, won=False, invalid=False) == "no_buy"
  assert ending(looped[:2], won=False, invalid=True) == "invalid"


def test_eval_failures_sorts_alfworld_endings():
  import eval_failures  # noqa: PLC0415

  ending = eval_failures.alfworld_ending
  take = ["go to sidetable 1"] + ["take mug 1 from sidetable 1"] * 4
  rejected = [False, True, True, True, False]  # the last answer is unknown
  assert ending(take, won=True, rejected=[False] * 5) == "won"
  assert ending(take, won=False, rejected=rejected) == "repeats_invalid"
  # The same command accepted by the game, or different rejected ones.
  assert ending(take, won=False, rejected=[False] * 5) == "step_limit"
  mixed = ["open drawer 1", "open drawer 2", "open drawer 3"]
  assert ending(mixed, won=False, rejected=[True, True, False]) == (
      "step_limit"
  )
