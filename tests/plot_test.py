"""launch/plot.py: series loading, seed aggregation, PNG output, CLI errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rspo_jax.metrics import MetricsWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT_PY = os.path.join(ROOT, "launch", "plot.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

from rspo_launch import plot  # noqa: E402


def write_run(path, success, env_per_step=10, eval_every=2, extra=None):
  """A run whose A step s (1-based) has rollout_success_rate success[s-1]."""
  w = MetricsWriter(str(path), tensorboard=False)
  w.write(0, "eval", {"success_rate": 0.0})
  for s, v in enumerate(success, start=1):
    row = {
        "rollout_success_rate": v,
        "env_steps": s * env_per_step,
        "loss": 1.0 / s,
    }
    row.update(extra or {})
    w.write(s, "A", row)
    if s % eval_every == 0:
      w.write(
          s, "eval", {"success_rate": v + 0.5, "success_by_type": {"pick": v}}
      )
  w.close()
  return str(path)


def assert_png(path):
  assert os.path.isfile(path)
  with open(path, "rb") as f:
    data = f.read()
  assert data[:8] == PNG_MAGIC
  assert len(data) > 5000, len(data)
  # IHDR: width, height big-endian after the 8-byte magic and 8-byte header.
  w = int.from_bytes(data[16:20], "big")
  h = int.from_bytes(data[20:24], "big")
  assert w >= 300 and h >= 200, (w, h)


def test_load_series_step_and_env_steps(tmp_path):
  run = write_run(tmp_path / "r", [0.1, 0.2, 0.3, 0.4])
  xs, ys = plot.load_series(run, "rollout_success_rate", "step", "A")
  np.testing.assert_array_equal(xs, [1, 2, 3, 4])
  np.testing.assert_allclose(ys, [0.1, 0.2, 0.3, 0.4])
  xs, ys = plot.load_series(run, "rollout_success_rate", "env_steps", "A")
  np.testing.assert_array_equal(xs, [10, 20, 30, 40])
  # eval rows: step 0 -> 0 env steps, step s -> env_steps of A's step s.
  xs, ys = plot.load_series(run, "success_rate", "env_steps", "eval")
  np.testing.assert_array_equal(xs, [0, 20, 40])
  np.testing.assert_allclose(ys, [0.0, 0.7, 0.9])
  xs, ys = plot.load_series(run, "success_by_type.pick", "step", "eval")
  np.testing.assert_array_equal(xs, [2, 4])
  np.testing.assert_allclose(ys, [0.2, 0.4])


def test_repeated_step_keeps_last_row_and_drops_nan(tmp_path):
  run = write_run(tmp_path / "r", [0.1, 0.2, 0.3])
  w = MetricsWriter(run, tensorboard=False)
  w.write(3, "A", {"rollout_success_rate": 0.9, "env_steps": 30})  # resumed
  w.write(4, "A", {"rollout_success_rate": float("nan"), "env_steps": 40})
  w.close()
  xs, ys = plot.load_series(run, "rollout_success_rate", "step", "A")
  np.testing.assert_array_equal(xs, [1, 2, 3])
  np.testing.assert_allclose(ys, [0.1, 0.2, 0.9])


def _b_run(path, b_steps):
  """Two loops of 3 B steps each, written (as the trainer does) at A's step
  of the loop: 0, then 3; ``b_steps`` adds B's own counter."""
  w = MetricsWriter(str(path), tensorboard=False)
  for i in range(6):
    row = {"loss": 10.0 - i}
    if b_steps:
      row["b_step"] = i + 1
    w.write(3 * (i // 3), "B", row)
  w.close()
  return str(path)


def test_phase_b_is_drawn_over_b_step(tmp_path, capsys):
  run = _b_run(tmp_path / "r", b_steps=True)
  xs, ys = plot.load_series(run, "loss", "step", "B")
  np.testing.assert_array_equal(xs, [1, 2, 3, 4, 5, 6])
  np.testing.assert_allclose(ys, [10, 9, 8, 7, 6, 5])
  assert capsys.readouterr().err == ""


def test_old_phase_b_rows_on_one_step_warn_in_one_line(tmp_path, capsys):
  w = MetricsWriter(str(tmp_path / "old"), tensorboard=False)
  for i in range(3):  # one loop, before b_step: every row at step 0
    w.write(0, "B", {"loss": 3.0 - i})
  w.close()
  xs, ys = plot.load_series(str(tmp_path / "old"), "loss", "step", "B")
  np.testing.assert_array_equal(xs, [0])
  np.testing.assert_allclose(ys, [1.0])  # the last row of the step
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "warning" in err
  assert "all 3 rows of phase 'B' carry step 0 and no b_step" in err
  # Two loops without b_step: two steps, no warning (and two points).
  xs, _ = plot.load_series(
      _b_run(tmp_path / "two", b_steps=False), "loss", "step", "B"
  )
  np.testing.assert_array_equal(xs, [0, 3])
  assert capsys.readouterr().err == ""


def test_aggregate_runs_mean_and_bands():
  a = (np.array([0.0, 1.0, 2.0]), np.array([0.0, 2.0, 4.0]))
  b = (np.array([0.0, 1.0, 2.0]), np.array([2.0, 4.0, 0.0]))
  c = plot.aggregate_runs([a, b], "minmax")
  np.testing.assert_allclose(c.mean, [1.0, 3.0, 2.0])
  np.testing.assert_allclose(c.lo, [0.0, 2.0, 0.0])
  np.testing.assert_allclose(c.hi, [2.0, 4.0, 4.0])
  s = plot.aggregate_runs([a, b], "std")
  np.testing.assert_allclose(s.lo, [0.0, 2.0, 0.0])  # std = 1, 1, 2
  np.testing.assert_allclose(s.hi, [2.0, 4.0, 4.0])
  assert c.n_runs == 2


def test_aggregate_interpolates_onto_shared_range():
  # Run b is shorter and sampled at other x: grid = union within [0, 2].
  a = (np.array([0.0, 2.0, 4.0]), np.array([0.0, 2.0, 4.0]))
  b = (np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0]))
  c = plot.aggregate_runs([a, b], "none")
  np.testing.assert_array_equal(c.x, [0.0, 1.0, 2.0])
  np.testing.assert_allclose(c.mean, [0.5, 1.0, 1.5])
  with pytest.raises(ValueError, match="share no x range"):
    plot.aggregate_runs(
        [(np.array([0.0, 1.0]), np.ones(2)), (np.array([5.0, 6.0]), np.ones(2))]
    )


def test_smooth_trailing_mean():
  np.testing.assert_allclose(
      plot.smooth(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1.0, 2.0, 4.0, 6.0]
  )
  np.testing.assert_array_equal(
      plot.smooth(np.array([1.0, 2.0]), 0), [1.0, 2.0]
  )


def test_parse_groups():
  assert plot.parse_groups("x/a,y/b", "p,q") == {"p": ["x/a"], "q": ["y/b"]}
  assert plot.parse_groups("a0,a1;b0,b1", "a,b") == {
      "a": ["a0", "a1"],
      "b": ["b0", "b1"],
  }
  assert plot.parse_groups("runs/g0;runs/r0/") == {
      "g0": ["runs/g0"],
      "r0": ["runs/r0/"],
  }
  with pytest.raises(ValueError, match="2 labels for 3"):
    plot.parse_groups("a,b,c", "x,y")


def test_plot_curves_writes_png_and_returns_curves(tmp_path):
  g = [
      write_run(tmp_path / f"g{s}", list(np.linspace(0, 0.5, 6) + 0.1 * i))
      for i, s in enumerate((0, 200, 400))
  ]
  r = [
      write_run(tmp_path / f"r{s}", list(np.linspace(0, 0.8, 6)))
      for s in (0, 200)
  ]
  out = str(tmp_path / "figs" / "train.png")
  curves = plot.plot_curves(
      {"grpo": g, "rspo": r}, "rollout_success_rate", "step", out, "A"
  )
  assert_png(out)
  np.testing.assert_allclose(curves["grpo"].mean, np.linspace(0, 0.5, 6) + 0.1)
  np.testing.assert_allclose(curves["grpo"].hi - curves["grpo"].lo, 0.2)
  assert curves["rspo"].n_runs == 2
  out2 = str(tmp_path / "eval.png")
  curves = plot.plot_curves(
      {"grpo": g}, "success_rate", "env_steps", out2, "eval", band="std"
  )
  assert_png(out2)
  np.testing.assert_array_equal(curves["grpo"].x, [0, 20, 40, 60])


def test_bad_metric_names_metric_and_lists_available(tmp_path):
  run = write_run(tmp_path / "r", [0.1, 0.2])
  with pytest.raises(ValueError) as e:
    plot.plot_curves(
        {"a": [run]}, "sucess_rate", "step", str(tmp_path / "x.png"), "A"
    )
  msg = str(e.value)
  assert "'sucess_rate'" in msg and "rollout_success_rate" in msg
  assert not os.path.exists(tmp_path / "x.png")
  with pytest.raises(ValueError, match="phases present"):
    plot.load_series(run, "loss", "step", "B")
  with pytest.raises(ValueError, match="no metrics file"):
    plot.load_series(str(tmp_path / "missing"), "loss", "step", "A")
  with pytest.raises(ValueError, match="x axis"):
    plot.load_series(run, "loss", "time", "A")


def _cli(*args):
  return subprocess.run(
      [sys.executable, PLOT_PY, *args],
      capture_output=True,
      text=True,
      timeout=120,
      cwd=ROOT,
  )


def test_cli_writes_png(tmp_path):
  runs = [
      write_run(tmp_path / f"{n}{s}", [0.1 * s / 200, 0.3, 0.5])
      for n in "ab"
      for s in (0, 200)
  ]
  out = str(tmp_path / "fig.png")
  groups = f"{runs[0]},{runs[1]};{runs[2]},{runs[3]}"
  res = _cli(
      "--runs",
      groups,
      "--labels",
      "base,rspo",
      "--metric",
      "rollout_success_rate",
      "--x",
      "env_steps",
      "--out",
      out,
  )
  assert res.returncode == 0, res.stderr
  assert "wrote" in res.stdout and "base: n=2" in res.stdout
  assert_png(out)


def test_cli_bad_metric_is_clear_error(tmp_path):
  run = write_run(tmp_path / "r", [0.1, 0.2])
  out = str(tmp_path / "fig.png")
  res = _cli("--runs", run, "--metric", "no_such_metric", "--out", out)
  assert res.returncode == 2
  assert "unknown metric 'no_such_metric'" in res.stderr
  assert "Traceback" not in res.stderr
  assert not os.path.exists(out)


def test_metrics_file_format_is_what_plot_reads(tmp_path):
  # Guards the contract with rspo_jax.metrics: one JSON object per line.
  run = write_run(tmp_path / "r", [0.25])
  with open(os.path.join(run, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert {r["phase"] for r in rows} == {"A", "eval"}
  xs, ys = plot.load_series(run, "rollout_success_rate")
  assert xs.tolist() == [1.0] and ys.tolist() == [0.25]


def test_per_task_outcomes_stay_out_of_the_metrics_stream(tmp_path):
  from rspo_jax.metrics import MetricsWriter, read_metrics

  w = MetricsWriter(str(tmp_path))
  w.write(
      3,
      "eval",
      {
          "success_rate": 0.5,
          "seeds": [0],
          "per_task": [{"seed": 0, "task_id": 1, "won": 1}],
      },
  )
  w.close()
  (row,) = read_metrics(os.path.join(str(tmp_path), "metrics.jsonl"))
  assert row["success_rate"] == 0.5 and row["seeds"] == [0]
  assert "per_task" not in row


def test_gzipped_metrics_read_like_the_plain_file(tmp_path):
  """An archived run keeps its metrics gzipped (experiments/run_archive.py):
  read_metrics, metrics_path and the curves take either form, the plain
  file winning where both exist."""
  import gzip  # noqa: PLC0415

  from rspo_jax.metrics import (  # noqa: PLC0415
      has_metrics,
      metrics_path,
      read_metrics,
  )

  run = write_run(tmp_path / "r", [0.1, 0.2, 0.3])
  plain = os.path.join(run, "metrics.jsonl")
  rows = read_metrics(plain)
  with open(plain, "rb") as f:
    data = f.read()
  os.remove(plain)
  assert not has_metrics(run) and metrics_path(run) == plain
  with open(plain + ".gz", "wb") as f:
    f.write(gzip.compress(data, mtime=0))
  assert has_metrics(run) and metrics_path(run) == plain + ".gz"
  assert read_metrics(plain + ".gz") == rows
  assert read_metrics(plain) == rows  # the missing plain: its .gz
  assert read_metrics(plain, "A") == [r for r in rows if r["phase"] == "A"]
  for source in (run, plain + ".gz"):
    xs, ys = plot.load_series(source, "rollout_success_rate")
    assert xs.tolist() == [1, 2, 3]
    np.testing.assert_allclose(ys, [0.1, 0.2, 0.3])
  with open(plain, "w") as f:  # a live run's file wins over the archive's
    f.write(json.dumps({"phase": "A", "step": 1}) + "\n")
  assert metrics_path(run) == plain and len(read_metrics(plain)) == 1
