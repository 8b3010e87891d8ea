"""experiments/mechanism.py: B's lift and replayed wins by loop position from
metrics.jsonl rows written by hand."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
import mechanism  # noqa: E402


def write_rows(workdir, rows):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def test_lift_and_replay_by_position(tmp_path):
  a, b, old = (str(tmp_path / n) for n in ("s0", "s200", "old"))
  write_rows(
      a,
      [
          {
              "step": 0,
              "phase": "B_collect",
              "b_lift_success": 0.1,
              "b_lift_dense_return": 0.05,
          },
          {
              "step": 1,
              "phase": "A",
              "loop_step": 0,
              "replay_trajectories": 16,
              "replay_success_frac": 1.0,
          },
          {
              "step": 2,
              "phase": "A",
              "loop_step": 1,
              "replay_trajectories": 16,
              "replay_success_frac": 0.5,
          },
          {
              "step": 3,
              "phase": "B_collect",
              "b_lift_success": 0.3,
              "b_lift_dense_return": 0.15,
          },
      ],
  )
  write_rows(
      b,
      [
          {
              "step": 0,
              "phase": "B_collect",
              "b_lift_success": 0.2,
              "b_lift_dense_return": 0.1,
          },
          {
              "step": 1,
              "phase": "A",
              "loop_step": 0,
              "replay_trajectories": 16,
              "replay_success_frac": 0.5,
          },
          {
              "step": 2,
              "phase": "A",
              "loop_step": 1,
              "replay_trajectories": 0,
              "replay_success_frac": 0.0,
          },
      ],
  )  # nothing replayed: not counted
  write_rows(
      old,
      [
          {"step": 0, "phase": "B_collect"},
          {"step": 1, "phase": "A", "replay_success_frac": 1.0},
      ],
  )
  lift = mechanism.b_lift([a, b, old])
  assert lift["samples"] == 3
  assert lift["b_lift_success"]["mean"] == pytest.approx(0.2)
  assert lift["b_lift_success"]["lo"] >= 0.1 - 1e-9
  assert lift["b_lift_success"]["hi"] <= 0.3 + 1e-9
  assert lift["b_lift_dense_return"]["mean"] == pytest.approx(0.1)
  assert mechanism.replay_by_position([a, b, old]) == [0.75, 0.5]
  assert mechanism.b_lift([old]) is None
  assert mechanism.replay_by_position([old, str(tmp_path / "none")]) is None
  assert np.isnan(mechanism.replay_by_position([write_one(tmp_path)])[0])


def write_one(tmp_path):
  w = str(tmp_path / "late")
  write_rows(
      w,
      [
          {
              "step": 2,
              "phase": "A",
              "loop_step": 1,
              "replay_trajectories": 4,
              "replay_success_frac": 0.25,
          }
      ],
  )
  return w
