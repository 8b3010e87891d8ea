"""experiments/reproduce.py and the modules under it (grid, runner,
sampled_eval, the reports) and experiments/ablations.py: the grid, skipping
and resuming runs, and the reports (numbers worked out by hand from
synthetic runs)."""

import ast
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from configs import alfworld_grpo, toy_grpo, webshop_grpo
from rspo_jax.metrics import MetricsWriter, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import ablations  # noqa: E402
import grid  # noqa: E402
import report as reports  # noqa: E402
import reproduce as rp  # noqa: E402
import run_archive as ra  # noqa: E402
import run_files  # noqa: E402
import runner  # noqa: E402
import sampled_eval  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def no_policy_export(monkeypatch):
  """No test starts launch/export.py (JAX): a fake run's checkpoint is not
  one; test_final_policy_* put in a fake exporter."""
  monkeypatch.setattr(
      ra,
      "export_policy",
      lambda *a, **k: {"exported": False, "reason": "no export in these tests"},
  )


def fake_run(
    root,
    name,
    success=None,
    score=0.0,
    start=0.1,
    repeats=(1.0, 3.0),
    config=None,
):
  """A run dir as launch/train.py leaves it; unfinished when success=None."""
  wd = os.path.join(str(root), name)
  w = MetricsWriter(wd, tensorboard=False)
  w.write(0, "eval", {"success_rate": start})
  for s, r in enumerate(repeats, start=1):
    w.write(
        s,
        "A",
        {
            "rollout_success_rate": 0.1 * s,
            "env_steps": 10 * s,
            "rollout_repeated_states": r,
            "dense_reward_mean": 0.5 * s,
        },
    )
  w.close()
  with open(os.path.join(wd, "eval_start.json"), "w") as f:
    json.dump({"success_rate": start, "score": start}, f)
  if config is not None:
    with open(os.path.join(wd, "run.json"), "w") as f:
      json.dump({"config": config}, f)
  if success is not None:
    with open(os.path.join(wd, "eval_final.json"), "w") as f:
      json.dump({"success_rate": success, "score": score}, f)
  return wd


def is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == PNG_MAGIC


def no_tmp_files(d):
  return not [n for n in os.listdir(d) if n.endswith(".tmp")]


# --------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------


def test_main_grid_is_the_papers_table():
  specs = grid.main_grid()
  assert len(specs) == 2 * 3 * 2 * 3
  assert len({s.name for s in specs}) == len(specs)
  assert {s.seed for s in specs} == {0, 200, 400}
  (one,) = grid.main_grid(["webshop"], ["gigpo"], [200], ["baseline"])
  assert one.name == "webshop_gigpo_baseline_s200"
  arg = one.config_arg("train.lr=0.001")
  assert arg == (
      os.path.join(ROOT, "configs", "webshop_gigpo.py")
      + ":rspo=0,seed=200,train.lr=0.001"
  )
  with pytest.raises(ValueError, match=r"unknown env \['webshp'\]"):
    grid.main_grid(envs=["webshp"])
  with pytest.raises(ValueError, match="unknown variant"):
    grid.main_grid(variants=["rspo_h"])


def test_config_args_parse_to_the_intended_configs():
  def cfg_of(spec, extra=""):
    path, arg = spec.config_arg(extra).split(":", 1)
    mod = toy_grpo if path.endswith("toy_grpo.py") else webshop_grpo
    return mod.get_config(arg)

  by_variant = {s.variant: s for s in grid.ablation_grid(seeds=[400])}
  c = cfg_of(by_variant["sample_variance"])
  assert c.rspo.enabled and c.rspo.sampling == "variance" and c.seed == 400
  c = cfg_of(by_variant["rspo_h"])
  assert c.rspo.enabled and c.rspo.data_source == "history"
  c = cfg_of(by_variant["rspo_o"])
  assert c.rspo.data_source == "outcome" and c.rspo.sampling == "reward"
  c = cfg_of(by_variant["dense_only"])
  assert c.rspo.dense_only and not c.rspo.enabled
  c = cfg_of(by_variant["baseline"], "steps=4")
  assert not c.rspo.enabled and c.train.total_steps == 4
  (toy_ppo,) = grid.main_grid(["toy"], ["ppo"], [0], ["rspo"])
  c = cfg_of(toy_ppo)
  assert c.env.name == "toy" and c.algo.name == "ppo" and c.rspo.enabled


def test_ablations_share_the_main_grids_runs():
  abl = {s.variant: s for s in grid.ablation_grid(seeds=[0])}
  assert len(grid.ablation_grid()) == 7 * 3
  main = {s.variant: s for s in grid.main_grid(["webshop"], ["grpo"], [0])}
  for v in ("rspo", "baseline"):
    assert abl[v].name == main[v].name
    assert abl[v].config_arg("x=1") == main[v].config_arg("x=1")


def test_ablations_cli_is_reproduce_grid_ablations(tmp_path, capsys):
  flags = ["--seeds", "0", "--dry_run", "--root", str(tmp_path)]
  assert ablations.main(flags) == 0
  mine = capsys.readouterr().out
  assert rp.main(["--grid", "ablations", *flags]) == 0
  assert mine == capsys.readouterr().out
  assert mine.count("launch/train.py") == 7  # the 7 variants at seed 0


def test_no_experiments_module_imports_one_that_imports_it_back():
  """experiments/'s imports (top level or in functions) form no cycle; a
  package (report/) is one node, its files' imports together."""
  folder = os.path.join(ROOT, "experiments")
  files = {
      f[:-3]: [os.path.join(folder, f)]
      for f in os.listdir(folder)
      if f.endswith(".py")
  }
  files.update(
      {
          d: [
              os.path.join(folder, d, f)
              for f in os.listdir(os.path.join(folder, d))
              if f.endswith(".py")
          ]
          for d in os.listdir(folder)
          if os.path.isfile(os.path.join(folder, d, "__init__.py"))
      }
  )
  names = set(files)
  graph = {}
  for name, paths in files.items():
    graph[name] = set()
    for path in paths:
      tree = ast.parse(open(path).read())
      graph[name] |= {
          a.name.split(".")[0]
          for n in ast.walk(tree)
          if isinstance(n, ast.Import)
          for a in n.names
      } | {
          n.module.split(".")[0]
          for n in ast.walk(tree)
          if isinstance(n, ast.ImportFrom) and n.module
      }
    graph[name] &= names - {name}
  assert {"grid", "runner", "reproduce", "report"} <= names  # found them

  def reaches(start, goal, seen):
    return any(
        n == goal or (n not in seen and reaches(n, goal, seen | {n}))
        for n in graph[start]
    )

  assert [m for m in sorted(names) if reaches(m, m, set())] == []


# --------------------------------------------------------------------------
# Running: skip, refuse, fail
# --------------------------------------------------------------------------


def test_finished_runs_are_skipped_without_starting_anything(tmp_path):
  specs = grid.main_grid(["toy"], ["grpo"], [0])
  for s in specs:
    fake_run(tmp_path, s.name, success=0.5)
  # A nonexistent interpreter: any launch would fail the run.
  res = runner.run_grid(
      specs, str(tmp_path), python="/nonexistent/python", parallel=2, echo=False
  )
  assert [r["status"] for r in res] == ["skipped", "skipped"]
  assert not os.path.exists(tmp_path / specs[0].name / "train.log")
  # An unfinished one is started: with that interpreter it fails, named.
  (seed1,) = grid.main_grid(["toy"], ["grpo"], [1], ["rspo"])
  res = runner.run_grid(
      specs + [seed1], str(tmp_path), python="/nonexistent/python", echo=False
  )
  assert [r["status"] for r in res] == ["skipped", "skipped", "failed"]
  assert "/nonexistent/python" in res[2]["error"]


def test_workdir_of_another_config_is_refused(tmp_path):
  (spec,) = grid.main_grid(["toy"], ["grpo"], [0], ["rspo"])
  fake_run(tmp_path, spec.name, config="something else")
  (res,) = runner.run_grid(
      [spec], str(tmp_path), python="/nonexistent/python", echo=False
  )
  assert res["status"] == "failed"
  assert "something else" in res["error"] and "--root" in res["error"]


def test_code_version_names_the_commit_and_a_dirty_tree(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()

  def git(*args):
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()

  git("init", "-q")
  (repo / "a.py").write_text("x = 1\n")
  git("add", "a.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
  sha = git("rev-parse", "HEAD")
  assert run_files.code_version(str(repo)) == {"commit": sha, "dirty": False}
  (repo / "new.txt").write_text("untracked files do not count\n")
  (repo / "docs").mkdir()
  (repo / "docs" / "report.md").write_text("a\n")
  git("add", "docs")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "d")
  sha = git("rev-parse", "HEAD")
  (repo / "docs" / "report.md").write_text("a study's report changed\n")
  assert run_files.code_version(str(repo)) == {"commit": sha, "dirty": False}
  (repo / "a.py").write_text("x = 2\n")
  assert run_files.code_version(str(repo)) == {"commit": sha, "dirty": True}
  assert run_files.code_version(str(tmp_path / "not_a_repo")) == {}


def test_run_json_records_the_code_and_a_resume_on_other_code(tmp_path):
  (spec,) = grid.main_grid(["toy"], ["grpo"], [0], ["rspo"])
  code = run_files.code_version(runner.ROOT)
  if not code:
    pytest.skip("the checkout is not a git repository")
  run = lambda: runner.run_grid(  # noqa: E731
      [spec], str(tmp_path), python="/nonexistent/python", echo=False
  )
  run()  # cannot start, but its run.json is written first
  meta_path = tmp_path / spec.name / "run.json"
  meta = json.loads(meta_path.read_text())
  assert {k: meta[k] for k in ("commit", "dirty")} == code
  run()  # resumed on the same code: nothing added
  assert "resumed_with" not in json.loads(meta_path.read_text())
  meta["commit"] = "0" * 40
  meta_path.write_text(json.dumps(meta))
  run()  # resumed on other code: recorded
  assert json.loads(meta_path.read_text())["resumed_with"] == [code]
  run()  # and again on that code: recorded once
  assert json.loads(meta_path.read_text())["resumed_with"] == [code]


def test_failed_run_is_reported_and_the_report_still_written(tmp_path, capsys):
  root, out = tmp_path / "runs", tmp_path / "results"
  rc = rp.main(
      [
          "--envs",
          "toy",
          "--algos",
          "grpo",
          "--seeds",
          "0",
          "--variants",
          "baseline",
          "--extra",
          "no.such_key=1",
          "--root",
          str(root),
          "--out",
          str(out),
      ]
  )
  assert rc == 1
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  # The shared warm start fails first; the run is reported, not started.
  assert lines[0]["run"] == "warm_start_toy" and lines[0]["rc"] != 0
  assert "no.such_key" in (root / "warm_start_toy" / "train.log").read_text()
  assert not os.path.exists(root / "warm_start_toy" / "done.json")
  assert not os.path.exists(root / "toy_grpo_baseline_s0")
  report = json.loads((out / "toy.json").read_text())
  assert all(c["n"] == 0 for c in report["cells"])
  assert not os.path.exists(out / "toy_grpo_step.png")
  # Each run making its own warm start: the run itself fails, named.
  rc = rp.main(
      [
          "--envs",
          "toy",
          "--algos",
          "grpo",
          "--seeds",
          "0",
          "--variants",
          "baseline",
          "--extra",
          "no.such_key=1",
          "--root",
          str(root),
          "--out",
          str(out),
          "--own_warm_start",
      ]
  )
  assert rc == 1
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert lines[0]["status"] == "failed" and lines[0]["rc"] != 0
  log = (root / "toy_grpo_baseline_s0" / "train.log").read_text()
  assert "no.such_key" in log


def test_runs_start_from_one_shared_warm_start(tmp_path, capsys):
  root = tmp_path / "runs"
  args = [
      "--envs",
      "toy",
      "--algos",
      "grpo,ppo",
      "--seeds",
      "0",
      "--root",
      str(root),
      "--dry_run",
  ]
  assert rp.main(args) == 0
  cmds = capsys.readouterr().out.splitlines()
  policy = os.path.join(str(root), "warm_start_toy", "warm_start")
  assert len(cmds) == 1 + 4 and "launch/sft.py" in cmds[0]
  assert ":seed=0 " in cmds[0] + " "
  assert all(f"model.checkpoint_dir={policy}" in c for c in cmds[1:])
  # A warm start made with another config is refused, and names both.
  os.makedirs(root / "warm_start_toy")
  (root / "warm_start_toy" / "done.json").write_text(
      json.dumps({"config": "other"})
  )
  r = runner.shared_warm_start("toy", str(root), python="/nonexistent/python")
  assert r["status"] == "failed" and "other" in r["error"]
  # The same config: finished, nothing started (the interpreter is bogus).
  (root / "warm_start_toy" / "done.json").write_text(
      json.dumps({"config": runner.sft_config_arg("toy")})
  )
  r = runner.shared_warm_start("toy", str(root), python="/nonexistent/python")
  assert r["status"] == "skipped" and r["policy"] == policy
  # A user's own checkpoint wins: no shared warm start at all.
  assert rp.main(args + ["--extra", "model.checkpoint_dir=/x"]) == 0
  cmds = capsys.readouterr().out.splitlines()
  assert len(cmds) == 4 and all("sft.py" not in c for c in cmds)
  # Reports only: nothing is made.
  other = tmp_path / "other"
  assert (
      rp.main(
          [
              "--envs",
              "toy",
              "--root",
              str(other),
              "--out",
              str(tmp_path / "out"),
              "--report_only",
          ]
      )
      == 0
  )
  assert not os.path.exists(other / "warm_start_toy")


def test_evaluation_of_a_finished_run_uses_its_trained_config(tmp_path):
  """A finished run is evaluated with the --config in its run.json (here
  naming the shared warm start), not the spec's config of today (made
  without the warm start once every run is finished: launch/eval.py would
  first behaviour-clone a policy of its own)."""
  (spec,) = grid.study_grid(["alfworld"], ["grpo"], [0], ["baseline"])
  trained = spec.config_arg("x=1") + ",model.checkpoint_dir=/ws/warm_start"
  wd = fake_run(tmp_path, spec.name, success=0.05, config=trained)
  r = sampled_eval.sampled_final_eval(
      spec, str(tmp_path), "x=1", python="/bin/true"
  )
  assert r["status"] == "failed"  # /bin/true writes no evaluation
  (line,) = [l for l in open(os.path.join(wd, "train.log")) if "--config" in l]
  assert f"--config={trained} " in line
  # No run.json (e.g. a run dir made by hand): the spec's config.
  os.remove(os.path.join(wd, "run.json"))
  sampled_eval.sampled_final_eval(
      spec, str(tmp_path), "x=1", python="/bin/true", tag="t10", temperature=1.0
  )
  last = open(os.path.join(wd, "train.log")).read().splitlines()[-1]
  assert f"--config={spec.config_arg('x=1')} " in last


# --------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------


def test_env_report_numbers_table_and_curves(tmp_path):
  root, out = tmp_path / "runs", str(tmp_path / "results")
  fake_run(
      root, "webshop_grpo_baseline_s0", success=0.5, score=0.6, config="cfg-b"
  )
  fake_run(root, "webshop_grpo_baseline_s200", success=0.7, score=0.8)
  fake_run(
      root,
      "webshop_grpo_rspo_s0",
      success=0.8,
      score=0.9,
      start=0.2,
      config=os.path.join(grid.ROOT, "configs", "webshop_grpo.py:rspo=1"),
  )
  fake_run(root, "webshop_grpo_rspo_s400")  # unfinished: not counted
  fake_run(root, "webshop_grpo_rspo_h_s0", success=1.0)  # another cell
  reports.env_report(str(root), "webshop", out, echo=False)
  report = json.load(open(os.path.join(out, "webshop.json")))
  # B's reward, read from the RSPO run's config (the CPU preset's oracle).
  assert report["dense_reward"] == ["oracle"]
  cells = {(c["algo"], c["variant"]): c for c in report["cells"]}
  assert [c["label"] for c in report["cells"]] == [
      "GRPO",
      "RSPO+GRPO",
      "PPO",
      "RSPO+PPO",
      "GiGPO",
      "RSPO+GiGPO",
  ]
  b = cells["grpo", "baseline"]
  assert b["n"] == 2 and b["seeds"] == [0, 200]
  assert b["success"] == pytest.approx({"mean": 60.0, "std": 10.0})
  assert b["score"] == pytest.approx({"mean": 70.0, "std": 10.0})
  assert b["start_success"] == pytest.approx({"mean": 10.0, "std": 0.0})
  assert b["paper_success"] == 65.1 and b["configs"] == ["cfg-b"]
  r = cells["grpo", "rspo"]
  assert r["n"] == 1 and r["seeds"] == [0]
  assert r["success"] == pytest.approx({"mean": 80.0, "std": 0.0})
  assert r["paper_success"] == 70.6
  assert cells["ppo", "baseline"]["n"] == 0
  assert cells["ppo", "baseline"]["success"] == {"mean": None, "std": None}
  md = open(os.path.join(out, "webshop.md")).read()
  assert "| GRPO | 60.0 ± 10.0 | 70.0 ± 10.0 | 2 | 10.0 ± 0.0 | 65.1 |" in md
  assert "| RSPO+GRPO | 80.0 ± 0.0 | 90.0 ± 0.0 | 1 | 20.0 ± 0.0 | 70.6 |" in md
  assert "| PPO | — | — | 0 | — | 57.3 |" in md
  assert "dense reward `rspo.dense_reward=oracle`" in md
  assert report["curves"] == {
      "grpo": ["webshop_grpo_step.png", "webshop_grpo_env_steps.png"]
  }
  for x in ("step", "env_steps"):
    assert is_png(os.path.join(out, f"webshop_grpo_{x}.png"))
    assert not os.path.exists(os.path.join(out, f"webshop_ppo_{x}.png"))
  assert no_tmp_files(out)


def test_ablation_report_rows_repeats_and_dense_plot(tmp_path):
  root, out = tmp_path / "runs", str(tmp_path / "results")
  fake_run(root, "webshop_grpo_rspo_s0", success=0.7, repeats=(1.0, 3.0))
  fake_run(root, "webshop_grpo_rspo_s200", success=0.5, repeats=(2.0, 4.0))
  fake_run(root, "webshop_grpo_sample_random_s0", success=0.1)
  fake_run(root, "webshop_grpo_dense_only_s0", success=0.0)
  fake_run(root, "webshop_grpo_dense_only_s200", success=0.2)
  path = reports.ablation_report(str(root), "webshop", "grpo", out, echo=False)
  assert path == os.path.join(out, "ablations.md")
  report = json.load(open(os.path.join(out, "ablations.json")))
  rows = {(r["group"], r["setting"]): r for r in report["rows"]}
  for key in (("sampling", "reward"), ("data source", "RSPO")):
    assert rows[key]["n"] == 2
    assert rows[key]["success"] == pytest.approx({"mean": 60.0, "std": 10.0})
    # per run: mean(1, 3) = 2 and mean(2, 4) = 3 -> 2.5 +- 0.5
    assert rows[key]["repeated_states"] == pytest.approx(
        {"mean": 2.5, "std": 0.5}
    )
    assert rows[key]["paper_success"] == 70.6
  assert rows["sampling", "random"]["paper_success"] == 12.8
  assert rows["sampling", "variance"]["n"] == 0
  assert rows["data source", "RSPO_H"]["paper_success"] == 57.0
  assert rows["data source", "RSPO_O"]["paper_success"] == 64.1
  assert rows["dense only", "dense reward alone"]["n"] == 2
  md = open(path).read()
  assert (
      "| sampling | reward | 60.0 ± 10.0 | 0.0 ± 0.0 | 2 | 2.50 ± 0.50"
      " | 70.6 |"
  ) in md
  assert "| sampling | variance | — | — | 0 | — | 63.0 |" in md
  assert report["dense_only_plot"] == "ablations_dense_only.png"
  assert is_png(os.path.join(out, "ablations_dense_only.png"))
  assert no_tmp_files(out)
  # Another cell than the paper's: own file names, no paper numbers.
  fake_run(root, "toy_grpo_dense_only_s0", success=0.0)
  path = reports.ablation_report(str(root), "toy", "grpo", out, echo=False)
  assert path == os.path.join(out, "ablations_toy_grpo.md")
  report = json.load(open(os.path.join(out, "ablations_toy_grpo.json")))
  assert all(r["paper_success"] is None for r in report["rows"])
  assert is_png(os.path.join(out, "ablations_toy_grpo_dense_only.png"))


# --------------------------------------------------------------------------
# End to end: real runs of the micro toy config
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_run_grid_end_to_end_then_skips(tmp_path, capsys, monkeypatch):
  from rspo_e2e_test import MICRO  # noqa: PLC0415

  monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device in the runs
  root, out = tmp_path / "runs", tmp_path / "results"
  args = [
      "--envs",
      "toy",
      "--algos",
      "grpo",
      "--seeds",
      "0",
      "--extra",
      MICRO,
      "--root",
      str(root),
      "--out",
      str(out),
      "--parallel",
      "2",
  ]
  assert rp.main(args) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  # One shared warm start first, then both runs start from it.
  assert lines[0]["run"] == "warm_start_toy" and lines[0]["status"] == "done"
  # ... evaluated once; each run takes that evaluation as its start.
  assert lines[1]["run"] == "start_eval_toy" and lines[1]["status"] == "done"
  shared_eval = json.loads(
      (root / "warm_start_toy" / "eval_start.json").read_text()
  )
  assert sorted(l["status"] for l in lines[2:] if "status" in l) == [
      "done",
      "done",
  ]
  for d in ("toy_grpo_baseline_s0", "toy_grpo_rspo_s0"):
    config = json.loads((root / d / "run.json").read_text())["config"]
    assert f"model.checkpoint_dir={lines[0]['policy']}" in config
    assert json.loads((root / d / "eval_start.json").read_text()) == (
        shared_eval
    )
    evals = [r for r in read_metrics(str(root / d / "metrics.jsonl"), "eval")]
    assert [r["step"] for r in evals] == [0, 2]
    assert evals[0]["success_rate"] == shared_eval["success_rate"]
  report = json.loads((out / "toy.json").read_text())
  grpo = [c for c in report["cells"] if c["algo"] == "grpo"]
  assert [c["n"] for c in grpo] == [1, 1]
  for c in grpo:
    assert 0.0 <= c["success"]["mean"] <= 100.0
    assert c["start_success"]["mean"] is not None
  assert "| RSPO+GRPO |" in (out / "toy.md").read_text()
  for x in ("step", "env_steps"):
    assert is_png(out / f"toy_grpo_{x}.png")
  logs = {d: (root / d / "train.log").stat().st_size for d in os.listdir(root)}
  # Second invocation: both runs finished, nothing is started again.
  assert rp.main(args) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert sorted(l["status"] for l in lines if "status" in l) == [
      "skipped",
      "skipped",
  ]  # the warm start is not even looked at
  assert logs == {
      d: (root / d / "train.log").stat().st_size for d in os.listdir(root)
  }


# --------------------------------------------------------------------------
# The CPU study (--grid study)
# --------------------------------------------------------------------------


def write_eval(path, wins, seeds=(0,)):
  """An evaluation file with per_task: ``wins[g]`` the same at every seed."""
  per_task = [
      {"seed": s, "task_id": g, "won": int(w), "score": float(w)}
      for s in seeds
      for g, w in enumerate(wins)
  ]
  os.makedirs(os.path.dirname(str(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(
        {
            "success_rate": sum(wins) / len(wins),
            "score": 0.0,
            "per_task": per_task,
        },
        f,
    )


def test_study_grid_cells_and_overrides():
  specs = grid.study_grid()
  assert len(specs) == (4 + 4) * 3 and {s.env for s in specs} == {"webshop"}
  assert {(s.algo, s.variant) for s in specs} == {
      (algo, variant)
      for algo in ("grpo", "gigpo")
      for variant in ("baseline", "rspo", "sample_variance", "sample_random")
  }
  assert all("rspo.dense_reward=oracle" in s.overrides for s in specs)
  by = {(s.algo, s.variant): s for s in grid.study_grid(seeds=[0])}
  path, arg = (
      by["grpo", "sample_random"]
      .config_arg(grid.study_extra("webshop"))
      .split(":", 1)
  )
  c = webshop_grpo.get_config(arg)
  assert (c.train.batch_tasks, c.train.group_size) == (16, 8)
  assert c.train.total_steps == 30 and c.env.num_eval_tasks == 256
  assert c.env.kwargs.num_test_goals == 256
  assert c.rspo.enabled and c.rspo.sampling == "random"
  assert c.rspo.dense_reward == "oracle"
  assert grid.study_extra("webshop", "steps=2").endswith(",steps=2")
  assert rp.main(["--grid", "study", "--envs", "webshop,toy", "--dry_run"]) == 2


def test_study_runs_evaluate_greedy_though_webshop_defaults_to_t04(tmp_path):
  """CPU WebShop evaluates at the paper's T = 0.4; a study's own start and
  end evaluations stay greedy (its "greedy" column), by a flag beside
  --config, so its runs' config arguments are those trained before."""
  extra = grid.study_extra("webshop")
  (spec,) = grid.study_grid(["webshop"], ["grpo"], [0], ["baseline"])
  arg = spec.config_arg(extra)
  assert (
      webshop_grpo.get_config(arg.split(":", 1)[1]).rollout.eval_temperature
      == 0.4
  )
  assert "eval_temperature" not in arg
  cmd = runner.command(spec, str(tmp_path), extra)
  assert cmd.index(f"--config={arg}") < cmd.index(
      "--config.rollout.eval_temperature=0.0"
  )
  # The warm start's shared evaluation: greedy, unless told otherwise
  # (/bin/echo writes the command line it was given into the log).
  ws = tmp_path / "warm_start_webshop"
  ws.mkdir()
  for flags, want in (
      ((), "--temperature=0"),
      (("--seeds=0,1,2", "--temperature=0.4"), "--temperature=0.4"),
  ):
    runner.shared_start_eval(
        "webshop", str(tmp_path), python="/bin/echo", eval_flags=flags
    )
    last = (ws / runner.LOG).read_text().splitlines()[-1].split()
    assert [f for f in last if f.startswith("--temperature")] == [want]


def test_rl_extra_reaches_the_rl_runs_not_the_warm_start(tmp_path, capsys):
  """--rl_extra: another RL recipe from the same shared warm start (its
  behaviour cloning and evaluation commands unchanged)."""
  root = tmp_path / "runs"
  args = [
      "--grid",
      "study",
      "--algos",
      "grpo",
      "--variants",
      "baseline",
      "--seeds",
      "0",
      "--root",
      str(root),
      "--dry_run",
  ]
  assert rp.main(args) == 0
  plain = capsys.readouterr().out.splitlines()
  assert rp.main(args + ["--rl_extra", "train.max_train_rows=0"]) == 0
  sft, run = capsys.readouterr().out.splitlines()
  assert sft == plain[0] and "max_train_rows" not in sft
  path, arg = run.split("--config=")[1].split()[0].split(":", 1)
  c = webshop_grpo.get_config(arg)
  assert c.train.max_train_rows == 0 and c.train.batch_tasks == 16
  assert run.replace(",train.max_train_rows=0", "") == plain[1]


def test_alfworld_study_cells_overrides_and_dry_run(
    tmp_path, capsys, monkeypatch
):
  """ALFWorld's study: GRPO baseline and RSPO only, 16 x 8, 30 A steps,
  140 valid_seen tasks, from the searching expert's warm start."""
  specs = grid.study_grid(envs=["alfworld"])
  assert len(specs) == 2 * 3 and {s.env for s in specs} == {"alfworld"}
  assert {(s.algo, s.variant) for s in specs} == {
      ("grpo", "baseline"),
      ("grpo", "rspo"),
  }
  assert grid.study_grid(envs=["alfworld"], algos=["gigpo"]) == []
  by = {
      (s.algo, s.variant): s for s in grid.study_grid(["alfworld"], seeds=[0])
  }
  path, arg = (
      by["grpo", "rspo"].config_arg(grid.study_extra("alfworld")).split(":", 1)
  )
  assert path.endswith("configs/alfworld_grpo.py")
  c = alfworld_grpo.get_config(arg)
  assert (c.train.batch_tasks, c.train.group_size) == (16, 8)
  assert c.train.total_steps == 30 and c.env.num_eval_tasks == 140
  assert c.env.eval_split == "valid_seen"
  assert c.env.kwargs.expert == "search"  # the warm start's demonstrations
  assert c.env.kwargs.num_tasks.valid_seen == 420  # 140 of 2 of 6 types
  assert c.rspo.enabled and c.rspo.dense_reward == "oracle"
  pytest.importorskip("alfworld")
  from rspo_jax import build  # noqa: PLC0415

  assert build.num_tasks(c, "valid_seen") == 140
  # The commands: the shared warm start (study overrides), then 2 runs.
  root = tmp_path / "runs"
  assert (
      rp.main(
          [
              "--grid",
              "study",
              "--envs",
              "alfworld",
              "--seeds",
              "0",
              "--root",
              str(root),
              "--dry_run",
          ]
      )
      == 0
  )
  cmds = capsys.readouterr().out.splitlines()
  assert len(cmds) == 1 + 2 and "launch/sft.py" in cmds[0]
  assert ":seed=0," + grid.STUDY_OVERRIDES["alfworld"] + " " in cmds[0]
  assert f"--workdir={root}/warm_start_alfworld" in cmds[0]
  policy = os.path.join(str(root), "warm_start_alfworld", "warm_start")
  assert [c.split("--workdir=")[1].split()[0] for c in cmds[1:]] == [
      f"{root}/alfworld_grpo_baseline_s0",
      f"{root}/alfworld_grpo_rspo_s0",
  ]
  assert all(
      f"model.checkpoint_dir={policy}" in c and "env.num_eval_tasks=140" in c
      for c in cmds[1:]
  )
  # GiGPO has no ALFWorld study cell: nothing to run.
  assert (
      rp.main(
          [
              "--grid",
              "study",
              "--envs",
              "alfworld",
              "--algos",
              "gigpo",
              "--root",
              str(root),
              "--dry_run",
          ]
      )
      == 2
  )
  # The report lists the two cells (none finished here).
  report = reports.study_report(
      str(root), "alfworld", str(tmp_path / "out"), echo=False
  )
  assert [(c["label"], c["n"]) for c in report["cells"]] == [
      ("GRPO", 0),
      ("RSPO+GRPO", 0),
  ]
  assert report["overrides"] == grid.STUDY_OVERRIDES["alfworld"]
  # An env without a study recipe is refused.
  monkeypatch.delitem(grid.STUDY_OVERRIDES, "alfworld")
  with pytest.raises(ValueError, match="no study recipe"):
    grid.study_grid(envs=["alfworld"])


def test_study_report_intervals_by_hand(tmp_path):
  root, out = tmp_path / "runs", str(tmp_path / "results")
  ws = root / "warm_start_webshop"
  write_eval(ws / "eval_start.json", [0, 0, 0, 0])
  write_eval(ws / "eval_start_t04.json", [0, 0, 0, 0], seeds=(0, 1, 2))
  # GRPO wins goal 0 (seeds 0 and 200); RSPO+GRPO wins goals 0 and 1.
  for name, wins in (
      ("webshop_grpo_baseline_s0", [1, 0, 0, 0]),
      ("webshop_grpo_baseline_s200", [1, 0, 0, 0]),
      ("webshop_grpo_rspo_s0", [1, 1, 0, 0]),
  ):
    wd = fake_run(root, name, success=sum(wins) / 4, config="cfg")
    write_eval(os.path.join(wd, "eval_final.json"), wins)
  # T = 0.4 only for the baseline: the RSPO cell's intervals there are "—".
  for name in ("webshop_grpo_baseline_s0", "webshop_grpo_baseline_s200"):
    write_eval(
        root / name / "eval_final_t04.json", [1, 1, 1, 1], seeds=(0, 1, 2)
    )
  report = reports.study_report(str(root), "webshop", out, echo=False)
  cells = {(c["algo"], c["variant"]): c for c in report["cells"]}
  base, rspo = cells["grpo", "baseline"], cells["grpo", "rspo"]
  assert base["n"] == 2 and rspo["n"] == 1
  assert base["paper_success"] == 65.1 and rspo["paper_vs_baseline"] == 5.5
  assert cells["grpo", "sample_random"]["paper_success"] == 12.8
  assert cells["grpo", "sample_random"]["paper_vs_baseline"] == -52.3
  g = base["greedy"]
  # 1 of 4 goals won by both runs: 25 %; a resample of 4 goals holds the
  # won goal 0..4 times (the 2.5 / 97.5 % quantiles: 0 and 3 of 4).
  assert g["success"]["mean"] == pytest.approx(25.0)
  assert (g["success"]["lo"], g["success"]["hi"]) == (0.0, 75.0)
  assert g["final_minus_start"]["mean"] == pytest.approx(25.0)
  assert g["minus_baseline"] is None
  r = rspo["greedy"]
  assert r["minus_baseline"]["mean"] == pytest.approx(25.0)
  assert r["minus_baseline"]["lo"] <= 25.0 <= r["minus_baseline"]["hi"]
  # Every goal won at T = 0.4 from none at the start: exactly +100.
  t = base["T = 0.4, 3 seeds"]["final_minus_start"]
  assert (t["mean"], t["lo"], t["hi"]) == (100.0, 100.0, 100.0)
  assert rspo["T = 0.4, 3 seeds"]["success"] is None
  assert report["start"]["greedy"]["mean"] == 0.0
  md = open(os.path.join(out, "study_webshop.md")).read()
  assert (
      "| GRPO | 2 | 25.0 [0.0, 75.0] | +25.0 [+0.0, +75.0] | — | 65.1" " | — |"
  ) in md
  assert "| RSPO+GRPO | 1 | 50.0 [" in md and "| 70.6 | +5.5 |" in md
  assert "rspo.dense_reward=oracle" in md
  assert "| GRPO | 2 | 100.0 [100.0, 100.0] | +100.0 [+100.0, +100.0]" in md
  assert is_png(os.path.join(out, "study_webshop_grpo_step.png"))
  assert no_tmp_files(out)


@pytest.mark.slow
def test_study_cell_end_to_end(tmp_path, capsys, monkeypatch):
  """One study cell (toy, micro model): warm start, its greedy, T = 0.4
  and T = 1.0 evaluations, the run and its own, the report; then a rerun
  starts nothing."""
  from rspo_e2e_test import MICRO  # noqa: PLC0415

  monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device in the runs
  root, out = tmp_path / "runs", tmp_path / "results"
  args = [
      "--grid",
      "study",
      "--envs",
      "toy",
      "--algos",
      "grpo",
      "--variants",
      "rspo",
      "--seeds",
      "0",
      "--extra",
      MICRO,
      "--root",
      str(root),
      "--out",
      str(out),
  ]
  assert rp.main(args) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert [(l["run"], l["status"]) for l in lines if "run" in l] == [
      ("warm_start_toy", "done"),
      ("start_eval_toy", "done"),
      ("toy_grpo_rspo_s0", "done"),
      ("start_eval_t04_toy", "done"),
      ("toy_grpo_rspo_s0_t04", "done"),
      ("start_eval_t10_toy", "done"),
      ("toy_grpo_rspo_s0_t10", "done"),
  ]
  wd = root / "toy_grpo_rspo_s0"
  final = json.loads((wd / "eval_final.json").read_text())
  t04 = json.loads((wd / "eval_final_t04.json").read_text())
  # per_task: one entry per (seed, task), their mean the success rate.
  assert len(final["per_task"]) == 4 and len(t04["per_task"]) == 4 * 3
  assert [e["seed"] for e in t04["per_task"]] == [0] * 4 + [1] * 4 + [2] * 4
  assert [e["task_id"] for e in t04["per_task"]] == [0, 1, 2, 3] * 3
  assert sum(e["won"] for e in t04["per_task"]) / 12 == pytest.approx(
      t04["success_rate"]
  )
  assert t04["seeds"] == [0, 1, 2]
  # ... of the final policy: the run's last checkpoint, after its 2 steps.
  assert t04["from_checkpoint"] is True and t04["a_steps"] == 2
  t10 = json.loads((wd / "eval_final_t10.json").read_text())
  assert t10["temperature"] == 1.0 and t04["temperature"] == 0.4
  assert len(t10["per_task"]) == 4 * 3 and t10["a_steps"] == 2
  report = json.loads((out / "study_toy.json").read_text())
  (cell,) = [c for c in report["cells"] if c["n"]]
  for name in ("greedy", "T = 0.4, 3 seeds", "T = 1.0 (training), 3 seeds"):
    for key in ("success", "final_minus_start"):
      ci = cell[name][key]
      assert ci["lo"] <= ci["mean"] <= ci["hi"] and ci["level"] == 0.95
  md = (out / "study_toy.md").read_text()
  assert "| RSPO+GRPO | 1 | " in md and " [" in md
  assert rp.main(args) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert {l["status"] for l in lines if "status" in l} == {"skipped"}


# --------------------------------------------------------------------------
# The archive of finished runs (--archive, experiments/run_archive.py)
# --------------------------------------------------------------------------


def files_under(d):
  return sorted(
      os.path.relpath(os.path.join(p, n), str(d))
      for p, _, names in os.walk(str(d))
      for n in names
  )


def study_config(name, rl_extra=""):
  """The --config the study grid gives the run ``name`` (no warm start)."""
  env, algo, rest = name.split("_", 2)
  variant, seed = rest.rsplit("_s", 1)
  spec = grid.RunSpec(
      env, algo, variant, int(seed), grid.STUDY_VARIANTS[variant]
  )
  return grid.with_rl_extra(spec, rl_extra).config_arg(grid.study_extra(env))


def study_run(root, name, wins, t04=None, t10=None, rl_extra=""):
  """A finished study run: greedy (and sampled) evaluations with per_task."""
  wd = fake_run(
      root,
      name,
      success=sum(wins) / len(wins),
      config=study_config(name, rl_extra),
  )
  write_eval(os.path.join(wd, "eval_final.json"), wins)
  for tag, w in (("t04", t04), ("t10", t10)):
    if w is not None:
      write_eval(os.path.join(wd, f"eval_final_{tag}.json"), w, seeds=(0, 1, 2))
  return wd


def test_archive_copies_exactly_the_small_files(tmp_path):
  root, arch = tmp_path / "runs", tmp_path / "archive"
  wd = study_run(root, "webshop_grpo_rspo_s0", [1, 0], t04=[1, 1])
  w = MetricsWriter(wd, tensorboard=False)  # rows the archive drops
  w.write(2, "time", {"rollout": 1.0})
  w.write(2, "compile", {"n": 3})
  w.write(2, "B", {"rollout_success_rate": 0.5})
  w.close()
  for big in (
      "checkpoints/2/state.bin",
      "replay/loop_0/shard.bin",
      "tb/events.out",
      "train.log",
      "tokenizer/vocab.json",
  ):
    os.makedirs(os.path.dirname(os.path.join(wd, big)), exist_ok=True)
    open(os.path.join(wd, big), "w").write("x")
  open(os.path.join(wd, "command.txt"), "w").write("python launch/train.py")
  open(os.path.join(wd, "eval_final.json.tmp"), "w").write("{")
  fake_run(root, "webshop_grpo_rspo_s200")  # unfinished: not archived
  ws = root / "warm_start_webshop"
  write_eval(ws / "eval_start.json", [0, 1])
  (ws / "done.json").write_text(json.dumps({"config": "sft"}))
  os.makedirs(ws / "warm_start")
  (ws / "warm_start" / "params.bin").write_text("x")
  MetricsWriter(str(ws), tensorboard=False).write(0, "sft", {"loss": 1.0})
  written = ra.archive_root(str(root), str(arch))
  assert sorted(written) == ["warm_start_webshop", "webshop_grpo_rspo_s0"]
  assert files_under(arch) == [
      "warm_start_webshop/done.json",
      "warm_start_webshop/eval_start.json",
      "webshop_grpo_rspo_s0/command.txt",
      "webshop_grpo_rspo_s0/eval_final.json",
      "webshop_grpo_rspo_s0/eval_final_t04.json",
      "webshop_grpo_rspo_s0/eval_start.json",
      "webshop_grpo_rspo_s0/metrics.jsonl.gz",
      "webshop_grpo_rspo_s0/run.json",
  ]
  a = arch / "webshop_grpo_rspo_s0"
  assert (a / "run.json").read_bytes() == open(wd + "/run.json", "rb").read()
  for n in ("eval_final.json", "eval_final_t04.json"):  # the same values,
    source = json.load(open(os.path.join(wd, n)))  # without indentation
    assert (a / n).read_bytes() == json.dumps(
        source, separators=(",", ":")
    ).encode()
  rows = read_metrics(str(a / "metrics.jsonl.gz"))
  assert [r["phase"] for r in rows] == ["eval", "A", "A", "B"]
  assert rows == [
      r
      for r in read_metrics(os.path.join(wd, "metrics.jsonl"))
      if r["phase"] in ("A", "B", "eval")
  ]
  assert ra.archive_root(str(root), str(arch)) == {}  # up to date
  # Another training of the same run replaces the archived one whole.
  os.remove(os.path.join(wd, "eval_final_t04.json"))
  write_eval(os.path.join(wd, "eval_final.json"), [0, 0])
  ra.archive_run(wd, str(arch))
  assert not os.path.exists(a / "eval_final_t04.json")
  assert json.loads((a / "eval_final.json").read_bytes()) == json.load(
      open(os.path.join(wd, "eval_final.json"))
  )
  # An archived copy's indented evaluation (the older format) is made
  # compact when its run is archived again, and is still the same run.
  (a / "eval_final.json").write_text(
      json.dumps(json.load(open(os.path.join(wd, "eval_final.json"))), indent=1)
  )
  assert ra.same_run(wd, str(arch))
  assert ra.archive_run(wd, str(arch)) == ["eval_final.json"]
  assert b"\n" not in (a / "eval_final.json").read_bytes()


def test_archived_metrics_gzip_is_deterministic(tmp_path, monkeypatch):
  """The same rows give the same metrics.jsonl.gz bytes whenever and
  wherever archived (mtime 0, no file name in the gzip header): an
  unchanged run is not written again."""
  wd = study_run(tmp_path / "runs", "webshop_grpo_rspo_s0", [1, 0])
  ra.archive_run(wd, str(tmp_path / "a1"))
  monkeypatch.setattr(time, "time", lambda: 2e9)  # another moment
  ra.archive_run(wd, str(tmp_path / "a2"))
  first, second = (
      (tmp_path / a / "webshop_grpo_rspo_s0" / "metrics.jsonl.gz").read_bytes()
      for a in ("a1", "a2")
  )
  assert first == second
  assert first[3] == 0 and first[4:8] == bytes(4)  # no FNAME, mtime 0
  plain = os.path.join(wd, "metrics.jsonl")
  assert gzip.decompress(first) == ra.kept_metrics(plain)
  assert ra.archive_run(wd, str(tmp_path / "a2")) == []


def test_archived_plain_metrics_become_the_gzip(tmp_path):
  """An archived copy in the format before metrics.jsonl.gz (a plain
  metrics.jsonl) is left with the gzip only: the run's, or its own rows
  gzipped when there is no run to archive."""
  root, arch = tmp_path / "runs", tmp_path / "archive"
  wd = study_run(root, "webshop_grpo_rspo_s0", [1, 0])
  ra.archive_run(wd, str(arch))
  dst = arch / "webshop_grpo_rspo_s0"
  gz = (dst / "metrics.jsonl.gz").read_bytes()

  def old_format():
    (dst / "metrics.jsonl").write_bytes(gzip.decompress(gz))
    os.remove(dst / "metrics.jsonl.gz")

  old_format()
  assert ra.archive_run(wd, str(arch)) == ["metrics.jsonl.gz", "metrics.jsonl"]
  assert (dst / "metrics.jsonl.gz").read_bytes() == gz
  assert not (dst / "metrics.jsonl").exists()
  old_format()
  assert ra.gzip_plain_metrics(str(dst)) == [
      "metrics.jsonl.gz",
      "metrics.jsonl",
  ]
  assert (dst / "metrics.jsonl.gz").read_bytes() == gz
  assert not (dst / "metrics.jsonl").exists()
  assert ra.gzip_plain_metrics(str(dst)) == []


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
def test_archived_gzipped_metrics_feed_the_readers(tmp_path):
  """An archived run holds metrics.jsonl.gz only, and the readers of a
  run's metrics read it: study_probes, mechanism, the spell report's B
  lift and experiments/intervals_record."""
  import mechanism  # noqa: PLC0415
  import study_probes  # noqa: PLC0415
  from intervals_record import common  # noqa: PLC0415
  from report import spell  # noqa: PLC0415

  root, arch = tmp_path / "runs", tmp_path / "archive"
  wd = study_run(root, "webshop_grpo_rspo_s0", [1, 0])
  w = MetricsWriter(wd, tensorboard=False)
  lift = {"b_lift_success": 0.25, "b_lift_dense_return": 0.5, "loop": 0}
  w.write(2, "B_collect", lift)
  w.close()
  ra.archive_run(wd, str(arch))
  dst = str(arch / "webshop_grpo_rspo_s0")
  assert not os.path.exists(os.path.join(dst, "metrics.jsonl"))
  assert os.path.isfile(os.path.join(dst, "metrics.jsonl.gz"))
  s = study_probes.summarize(dst)
  assert s["steps"] == 2 and s["rollouts"] == pytest.approx((0.15, 0.15))
  assert study_probes.rspo_summary(dst)["a_own"] == pytest.approx(0.15)
  assert mechanism.b_lift([dst])["samples"] == 1
  assert spell.lift_values(dst) == {
      "b_lift_success": [0.25],
      "b_lift_dense_return": [0.5],
  }
  (row,) = common.phase_rows(dst, "B_collect")
  assert row["b_lift_success"] == 0.25


def test_archived_run_counts_as_finished_and_is_not_rerun(tmp_path, capsys):
  root, arch = tmp_path / "runs", tmp_path / "archive"
  specs = grid.main_grid(["toy"], ["grpo"], [0], ["baseline"])
  # Trained from an earlier session's shared warm start, in a clone
  # elsewhere: the same config (config_key).
  cfg_a = (
      grid.from_warm_start(
          specs[0], "/old/clone/runs/warm_start_toy/" "warm_start"
      )
      .config_arg()
      .replace(grid.ROOT, "/old/clone")
  )
  fake_run(arch, specs[0].name, success=0.5, config=cfg_a)
  # Archived metrics are gzipped (the curve below reads them).
  assert ra.gzip_plain_metrics(str(arch / specs[0].name)) == [
      "metrics.jsonl.gz",
      "metrics.jsonl",
  ]
  fake_run(root, specs[0].name)  # started here, unfinished: the archive's
  (res,) = runner.run_grid(
      specs,
      str(root),
      python="/nonexistent/python",
      echo=False,
      archive=str(arch),
  )
  assert res["status"] == "skipped"
  assert res["archived"] == str(arch / specs[0].name)
  assert not os.path.exists(root / specs[0].name / "train.log")
  assert run_files.finished_runs(str(root), "toy", "grpo", "baseline") == []
  assert run_files.finished_runs(
      str(root), "toy", "grpo", "baseline", str(arch)
  ) == [(0, str(arch / specs[0].name))]
  # Nothing to do: no warm start, no run command.
  args = [
      "--envs",
      "toy",
      "--algos",
      "grpo",
      "--variants",
      "baseline",
      "--seeds",
      "0",
      "--root",
      str(root),
      "--archive",
      str(arch),
  ]
  assert rp.main(args + ["--dry_run"]) == 0
  assert capsys.readouterr().out == ""
  # Reported with its numbers (and its curve, from the archived metrics).
  out = tmp_path / "out"
  assert (
      rp.main(args + ["--out", str(out), "--python", "/nonexistent/python"])
      == 0
  )
  (b,) = [
      c for c in json.loads((out / "toy.json").read_text())["cells"] if c["n"]
  ]
  assert b["success"]["mean"] == 50.0 and b["configs"] == [cfg_a]
  assert is_png(out / "toy_grpo_step.png")
  assert str(arch) in (out / "toy.md").read_text()


def test_root_overrides_the_archive(tmp_path):
  root, arch, out = tmp_path / "runs", tmp_path / "archive", tmp_path / "o"
  fake_run(arch, "webshop_grpo_baseline_s0", success=0.5)
  fake_run(arch, "webshop_grpo_baseline_s200", success=0.3)
  fake_run(root, "webshop_grpo_baseline_s0", success=0.9)
  assert run_files.finished_runs(
      str(root), "webshop", "grpo", "baseline", str(arch)
  ) == [
      (0, str(root / "webshop_grpo_baseline_s0")),
      (200, str(arch / "webshop_grpo_baseline_s200")),
  ]
  report = reports.env_report(
      str(root), "webshop", str(out), echo=False, archive=str(arch)
  )
  b = report["cells"][0]
  assert b["n"] == 2 and b["per_seed_success"] == [90.0, 30.0]
  # The warm start's evaluations: root's file, else the archive's.
  ws, aws = root / "warm_start_webshop", arch / "warm_start_webshop"
  write_eval(aws / "eval_start.json", [0, 0])
  write_eval(aws / "eval_start_t04.json", [1, 1], seeds=(0, 1, 2))
  write_eval(ws / "eval_start.json", [1, 0])
  report = reports.study_report(
      str(root), "webshop", str(out), echo=False, archive=str(arch)
  )
  assert report["start"]["greedy"]["mean"] == 50.0
  assert report["start"]["T = 0.4, 3 seeds"]["mean"] == 100.0


def test_report_from_the_archive_alone_equals_the_report_before(tmp_path):
  """A later session: root wiped (a fresh clone), the archive committed."""
  root, arch = tmp_path / "runs", tmp_path / "archive"
  ws = root / "warm_start_webshop"
  write_eval(ws / "eval_start.json", [0, 0, 0, 0])
  write_eval(ws / "eval_start_t04.json", [0, 0, 1, 0], seeds=(0, 1, 2))
  (ws / "done.json").write_text(json.dumps({"config": "sft"}))
  study_run(root, "webshop_grpo_baseline_s0", [1, 0, 0, 0], t04=[1, 1, 0, 0])
  study_run(root, "webshop_grpo_baseline_s200", [1, 0, 1, 0], t04=[1, 0, 1, 1])
  study_run(root, "webshop_grpo_rspo_s0", [1, 1, 0, 0], t04=[1, 1, 1, 0])
  fake_run(root, "webshop_grpo_rspo_s200")  # unfinished
  args = [
      "--grid",
      "study",
      "--root",
      str(root),
      "--archive",
      str(arch),
      "--report_only",
  ]
  written = []
  for i in (1, 2):
    out = tmp_path / f"out{i}"
    assert rp.main(args + ["--out", str(out)]) == 0
    written.append(json.loads((out / "study_webshop.json").read_text()))
    md = (out / "study_webshop.md").read_text().split("\n", 3)[3]
    written[-1]["md_body"] = md
    if i == 1:
      shutil.rmtree(root)
  before, after = written
  assert before["cells"] == after["cells"]
  assert (
      before["start"] == after["start"] and before["curves"] == after["curves"]
  )
  assert before["md_body"] == after["md_body"]
  cells = {(c["algo"], c["variant"]): c for c in after["cells"]}
  assert cells["grpo", "baseline"]["n"] == 2 and cells["grpo", "rspo"]["n"] == 1
  assert cells["grpo", "rspo"]["T = 0.4, 3 seeds"]["minus_baseline"] is not None
  assert after["curves"] == {
      "grpo": [
          "study_webshop_grpo_step.png",
          "study_webshop_grpo_env_steps.png",
      ]
  }
  assert no_tmp_files(arch / "webshop_grpo_rspo_s0")


def test_study_with_an_archive_retrains_only_the_missing(tmp_path, capsys):
  """Archived runs and their evaluations are skipped; a run still to train
  re-creates the warm start (its checkpoint is not archived) and takes the
  archived evaluations of it instead of recomputing them."""
  root, arch, out = tmp_path / "runs", tmp_path / "archive", tmp_path / "o"
  aws = arch / "warm_start_webshop"
  for n in ("eval_start.json", "eval_start_t04.json"):
    write_eval(aws / n, [0, 1])
  sft = runner.sft_config_arg("webshop", grid.study_extra("webshop"))
  (aws / "done.json").write_text(json.dumps({"config": sft}))
  study_run(arch, "webshop_grpo_baseline_s0", [1, 1], t04=[1, 0], t10=[0, 0])
  study_run(arch, "webshop_grpo_baseline_s200", [1, 0])  # no sampled evals
  args = [
      "--grid",
      "study",
      "--algos",
      "grpo",
      "--variants",
      "baseline",
      "--root",
      str(root),
      "--archive",
      str(arch),
      "--out",
      str(out),
      "--python",
      "/bin/false",
  ]
  assert rp.main(args + ["--seeds", "0,200"]) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  by = {(l["run"], l["status"]) for l in lines if "run" in l}
  assert by == {
      ("webshop_grpo_baseline_s0", "skipped"),
      ("webshop_grpo_baseline_s200", "skipped"),
      ("webshop_grpo_baseline_s0_t04", "skipped"),
      ("webshop_grpo_baseline_s0_t10", "skipped"),
      ("webshop_grpo_baseline_s200_t04", "unavailable"),
      ("webshop_grpo_baseline_s200_t10", "unavailable"),
  }
  assert not os.path.exists(root / "warm_start_webshop")  # no SFT
  # Seed 400 is new: the warm start is behaviour-cloned again (/bin/true
  # "succeeds"); its archived evaluations are copied, not recomputed.
  assert rp.main(args[:-1] + ["/bin/true", "--seeds", "0,400"]) == 1
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert (lines[0]["run"], lines[0]["status"]) == ("warm_start_webshop", "done")
  assert lines[1]["run"] == "start_eval_webshop"
  assert (lines[1]["status"], lines[1]["from_archive"]) == (
      "skipped",
      str(arch),
  )
  ws = str(root / "warm_start_webshop")
  assert json.load(open(os.path.join(ws, "eval_start.json"))) == json.loads(
      (aws / "eval_start.json").read_text()
  )
  assert "eval.py" not in open(os.path.join(ws, "train.log")).read()
  r = runner.shared_start_eval(
      "webshop",
      str(root),
      python="/bin/false",
      out_name="eval_start_t04.json",
      archive=str(arch),
  )
  assert r["status"] == "skipped" and r["from_archive"] == str(arch)
  r = runner.shared_start_eval(
      "webshop",
      str(root),
      python="/bin/false",
      out_name="eval_start_t10.json",
      archive=str(arch),
  )
  assert r["status"] == "failed"  # not archived: computed (here: fails)
  # A warm start of another config than the archived one is refused.
  r = runner.shared_warm_start(
      "webshop",
      str(tmp_path / "root2"),
      "other=1",
      python="/bin/false",
      archive=str(arch),
  )
  assert r["status"] == "failed" and "--archive" in r["error"]


def test_sampled_eval_of_a_root_run_taken_from_its_archived_copy(tmp_path):
  root, arch = tmp_path / "runs", tmp_path / "archive"
  (spec,) = grid.study_grid(["webshop"], ["grpo"], [0], ["baseline"])
  wd = study_run(root, spec.name, [1, 0])
  ra.archive_run(wd, str(arch))
  write_eval(arch / spec.name / "eval_final_t04.json", [1, 1], seeds=(0, 1, 2))
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python="/bin/false", archive=str(arch)
  )
  assert r["status"] == "skipped" and r["from_archive"] == str(arch)
  assert os.path.isfile(os.path.join(wd, "eval_final_t04.json"))
  # Another training under root (another eval_final.json): evaluated.
  os.remove(os.path.join(wd, "eval_final_t04.json"))
  write_eval(os.path.join(wd, "eval_final.json"), [0, 0])
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python="/bin/false", archive=str(arch)
  )
  assert r["status"] == "failed" and r["rc"] == 1


def test_archive_of_another_rl_extra_is_refused_and_flagged(tmp_path, capsys):
  """Run names do not hold the overrides: a later session asking for an
  archived run with another --rl_extra gets a failure naming --archive (not
  the other recipe's run), and the report names the cells trained with
  other overrides than its own. A clone elsewhere (another repository
  directory in run.json and done.json) is the same config."""
  root, arch, out = tmp_path / "runs", tmp_path / "archive", tmp_path / "o"
  rl = "train.max_train_rows=0,train.micro_batch_rows=32"
  aws = arch / "warm_start_webshop"
  for n in ("eval_start.json", "eval_start_t04.json", "eval_start_t10.json"):
    write_eval(aws / n, [0, 1])
  sft = runner.sft_config_arg("webshop", grid.study_extra("webshop"))
  (aws / "done.json").write_text(
      json.dumps({"config": sft.replace(grid.ROOT, "/old/clone")})
  )
  for v in ("baseline", "rspo"):
    wd = study_run(
        arch,
        f"webshop_gigpo_{v}_s0",
        [1, 0],
        t04=[1, 0],
        t10=[0, 0],
        rl_extra=rl,
    )
    meta = json.loads(open(os.path.join(wd, "run.json")).read())
    meta["config"] = meta["config"].replace(grid.ROOT, "/old/clone")
    open(os.path.join(wd, "run.json"), "w").write(json.dumps(meta))
  args = [
      "--grid",
      "study",
      "--root",
      str(root),
      "--archive",
      str(arch),
      "--out",
      str(out),
      "--seeds",
      "0",
      "--python",
      "/bin/true",
  ]
  gigpo = ["--algos", "gigpo", "--variants", "baseline,rspo"]
  # The same recipe: skipped, nothing made.
  assert rp.main(args + gigpo + ["--rl_extra", rl]) == 0
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert {(l["run"], l["status"]) for l in lines if "run" in l} == {
      (f"webshop_gigpo_{v}_s0{t}", "skipped")
      for v in ("baseline", "rspo")
      for t in ("", "_t04", "_t10")
  }
  assert not os.path.exists(root / "warm_start_webshop")
  md = (out / "study_webshop.md").read_text()
  assert "other overrides" not in md
  # Another recipe: refused, named, not trained, no warm start made.
  other = rl + ",rspo.centre_cap=2"
  assert rp.main(args + gigpo + ["--rl_extra", other]) == 1
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  failed = [l for l in lines if l.get("status") == "failed"]
  assert sorted(l["run"] for l in failed) == [
      "webshop_gigpo_baseline_s0",
      "webshop_gigpo_rspo_s0",
  ]
  assert all(
      "--archive" in l["error"] and "centre_cap" in l["error"] for l in failed
  )
  assert not os.path.exists(root / "warm_start_webshop")
  assert not os.path.exists(root / "webshop_gigpo_rspo_s0")
  # New cells with that recipe: the warm start is re-created (the archived
  # one's config, from a clone elsewhere), the report holds all cells and
  # names the archived ones as trained with other overrides.
  assert (
      rp.main(
          args
          + [
              "--algos",
              "grpo",
              "--variants",
              "baseline,rspo",
              "--rl_extra",
              other,
          ]
      )
      == 1
  )  # /bin/true trains none
  lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert (lines[0]["run"], lines[0]["status"]) == ("warm_start_webshop", "done")
  assert lines[1]["from_archive"] == str(arch)
  report = json.loads((out / "study_webshop.json").read_text())
  cells = {(c["algo"], c["variant"]): c for c in report["cells"]}
  assert cells["gigpo", "rspo"]["n"] == 1
  assert cells["gigpo", "rspo"]["other_config_seeds"] == [0]
  assert cells["grpo", "rspo"]["other_config_seeds"] == []
  md = (out / "study_webshop.md").read_text()
  assert "other overrides than these" in md and "RSPO+GiGPO (seeds 0)" in md
  # A finished run under root of another config is refused too.
  study_run(root, "webshop_grpo_baseline_s200", [1, 0])
  (spec,) = [
      grid.with_rl_extra(s, other)
      for s in grid.study_grid(["webshop"], ["grpo"], [200], ["baseline"])
  ]
  (res,) = runner.run_grid(
      [spec],
      str(root),
      grid.study_extra("webshop"),
      python="/nonexistent/python",
      echo=False,
      archive=str(arch),
  )
  assert res["status"] == "failed" and "--root" in res["error"]


def test_archive_copy_cut_short_is_not_a_finished_run(tmp_path, monkeypatch):
  """eval_final.json (the finished mark) is written last and removed first:
  an interrupted copy is redone whole, never read as a finished run
  missing its run.json or metrics."""
  root, arch = tmp_path / "runs", tmp_path / "archive"
  wd = study_run(root, "webshop_grpo_rspo_s0", [1, 0], t04=[1, 1])
  dst = arch / "webshop_grpo_rspo_s0"
  write_atomic = ra._write_atomic

  def cut_at(name):
    def write(path, data):
      if os.path.basename(path) == name:
        raise KeyboardInterrupt
      return write_atomic(path, data)

    monkeypatch.setattr(ra, "_write_atomic", write)

  cut_at("run.json")
  with pytest.raises(KeyboardInterrupt):
    ra.archive_run(wd, str(arch))
  assert not ra.is_finished(str(dst))
  assert (
      run_files.finished_runs(
          str(tmp_path / "none"), "webshop", "grpo", "rspo", str(arch)
      )
      == []
  )
  monkeypatch.setattr(ra, "_write_atomic", write_atomic)
  ra.archive_run(wd, str(arch))
  assert set(files_under(dst)) >= {
      "eval_final.json",
      "run.json",
      "metrics.jsonl.gz",
      "eval_final_t04.json",
  }
  # Another training, cut short while replacing: not finished either, and
  # the next copy leaves none of the old training's files.
  os.remove(os.path.join(wd, "eval_final_t04.json"))
  write_eval(os.path.join(wd, "eval_final.json"), [0, 0])
  cut_at("metrics.jsonl.gz")
  with pytest.raises(KeyboardInterrupt):
    ra.archive_run(wd, str(arch))
  assert not ra.is_finished(str(dst))
  monkeypatch.setattr(ra, "_write_atomic", write_atomic)
  ra.archive_run(wd, str(arch))
  assert ra.same_run(wd, str(arch))
  assert not os.path.exists(dst / "eval_final_t04.json")


def fake_sft_python(tmp_path, weights):
  """A --python whose launch/sft.py writes a policy of ``weights`` into
  ``--workdir``/warm_start."""
  fake = tmp_path / "fake_sft"
  fake.write_text(
      f"#!{sys.executable}\nimport os, sys\n"
      "wd = [a.split('=', 1)[1] for a in sys.argv if a.startswith("
      "'--workdir=')][0]\n"
      "os.makedirs(os.path.join(wd, 'warm_start'), exist_ok=True)\n"
      "open(os.path.join(wd, 'warm_start', 'config.json'), 'w').write('{}')\n"
      "open(os.path.join(wd, 'warm_start', 'model.safetensors'), 'wb')"
      f".write({weights!r})\n"
  )
  fake.chmod(0o755)
  return str(fake)


def test_archived_warm_start_is_described_not_kept(tmp_path, monkeypatch):
  """The archive keeps a warm start's sha256s and the launch/sft.py line
  that regenerates it, never its weights; a fresh root re-makes it by SFT
  and says whether it is the archived policy: its archived evaluation is
  taken only then (the same policy gives the same numbers)."""
  root, arch = tmp_path / "runs", tmp_path / "archive"
  ws = root / "warm_start_webshop"
  sft = runner.sft_config_arg("webshop", grid.study_extra("webshop"))
  os.makedirs(ws / "warm_start")
  (ws / "done.json").write_text(json.dumps({"config": sft}))
  (ws / "warm_start" / "config.json").write_text("{}")
  (ws / "warm_start" / "model.safetensors").write_bytes(b"w" * 100)
  write_eval(ws / "eval_start.json", [1, 0])
  written = ra.archive_root(str(root), str(arch))
  assert written["warm_start_webshop"] == [
      "policy.json",
      "done.json",
      "eval_start.json",
  ]
  assert files_under(arch) == [
      "warm_start_webshop/done.json",
      "warm_start_webshop/eval_start.json",
      "warm_start_webshop/policy.json",
  ]
  record = json.load(open(arch / "warm_start_webshop" / "policy.json"))
  assert record["policy"] == "warm_start" and record["bytes"] == 102
  assert record["sha256"]["model.safetensors"] == (
      hashlib.sha256(b"w" * 100).hexdigest()
  )
  assert record["command"] == (
      f"python launch/sft.py --config={ra.relative(sft)}" f" --workdir={ws}"
  )  # outside the clone: absolute
  monkeypatch.setattr(ra, "code_commit", lambda: "a later commit")
  assert ra.archive_root(str(root), str(arch)) == {}  # the same policy
  for weights, matches in ((b"w" * 100, True), (b"v" * 100, False)):
    fresh = tmp_path / f"fresh_{matches}"
    r = runner.shared_warm_start(
        "webshop",
        str(fresh),
        grid.study_extra("webshop"),
        python=fake_sft_python(tmp_path, weights),
        archive=str(arch),
    )
    assert r["status"] == "done" and r["matches_archive"] is matches
    r = runner.shared_start_eval(
        "webshop",
        str(fresh),
        grid.study_extra("webshop"),
        python="/bin/false",
        archive=str(arch),
    )
    # The archived evaluation when it is the same policy, else a new one
    # (which /bin/false fails).
    assert r["status"] == ("skipped" if matches else "failed")


def fake_export(calls):
  """An exporter writing a 100-byte 'policy' (the real one, launch/export.py,
  is checked on a real run: its evaluation equals the checkpoint's)."""

  def export(workdir, config, out, python=sys.executable):
    calls.append((workdir, config, out))
    os.makedirs(out)
    for n, data in (
        ("config.json", b"{}"),
        ("tokenizer.json", b"{}"),
        ("export.json", b'{"a_steps": 30}'),
        ("model.safetensors", b"w" * 100),
    ):
      with open(os.path.join(out, n), "wb") as f:
        f.write(data)
    return {"exported": True, "bytes": 100, "step": 60, "a_steps": 30}

  return export


def fake_eval_python(tmp_path):
  """A --python whose launch/eval.py records its argv and writes --out."""
  fake = tmp_path / "fake_python"
  fake.write_text(
      f"#!{sys.executable}\nimport json, sys\n"
      "out = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--out=')]\n"
      f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n"
      "json.dump({'success_rate': 0.5, 'a_steps': 0, 'per_task': [{'seed': 0,"
      " 'task_id': 0, 'won': 1, 'score': 1.0}]}, open(out[0], 'w'))\n"
  )
  fake.chmod(0o755)
  return str(fake)


def test_final_policy_described_and_evaluated_from_a_local_copy(
    tmp_path, monkeypatch
):
  """A finished run's policy A is exported once into its workdir's
  final_policy/ (the local copy) and described in the archive's
  policy.json (sha256s, the command that regenerates it), no weights
  archived. A later session without the run evaluates the local copy for a
  sampled evaluation the run missed (the trained config, model.checkpoint_dir
  replaced by it, an empty --workdir) and archives the file; without one the
  evaluation is 'unavailable' with that command; a local copy of other
  weights is refused; over MAX_POLICY_BYTES nothing is recorded."""
  root, arch = tmp_path / "runs", tmp_path / "archive"
  (spec,) = grid.study_grid(["webshop"], ["grpo"], [0], ["baseline"])
  wd = study_run(root, spec.name, [1, 0])
  trained = (
      study_config(spec.name).replace(grid.ROOT, "/old/clone")
      + ",model.checkpoint_dir=/old/clone/runs/ws/warm_start"
  )
  with open(os.path.join(wd, "run.json"), "w") as f:
    json.dump({"config": trained}, f)
  os.makedirs(os.path.join(wd, "checkpoints", "60"))
  calls = []
  monkeypatch.setattr(ra, "export_policy", fake_export(calls))
  written = ra.archive_root(str(root), str(arch))[spec.name]
  assert written[0] == "policy.json"
  assert written[-1] == "eval_final.json" and calls == [
      (wd, trained, os.path.join(wd, "final_policy.tmp"))
  ]
  assert not [n for n in files_under(arch) if "safetensors" in n]
  local = os.path.join(wd, "final_policy")
  assert ra.local_policy(str(root), spec.name) == local
  record = json.load(open(arch / spec.name / "policy.json"))
  assert record["sha256"]["model.safetensors"] == (
      hashlib.sha256(b"w" * 100).hexdigest()
  )
  assert record["export"] == {"a_steps": 30} and record["bytes"] == 119
  assert record["command"] == (
      f"python launch/train.py --config={trained} --workdir={wd} && python"
      f" launch/export.py --config={trained} --workdir={wd}"
      f" --out={local}"
  )
  assert ra.archive_root(str(root), str(arch)) == {}  # not exported again
  assert len(calls) == 1
  # A later session: the run is gone, its local policy kept; the T = 0.4
  # evaluation was never made.
  saved = tmp_path / "saved_policy"
  shutil.copytree(local, saved)
  shutil.rmtree(root)
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python="/bin/false", archive=str(arch)
  )
  assert r["status"] == "unavailable" and r["error"] == (
      f"no policy at {local}; regenerate it (code of commit"
      f" {record['code']}): {record['command']}"
  )
  shutil.copytree(saved, local)
  python = fake_eval_python(tmp_path)
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python=python, archive=str(arch)
  )
  assert r["status"] == "done" and local in r["evaluated"]
  argv = json.load(open(tmp_path / "argv.json"))
  config = [a for a in argv if a.startswith("--config=")][0]
  assert config == "--config=" + study_config(spec.name) + (
      f",model.checkpoint_dir={local}"
  )
  scratch = os.path.join(str(root), f"{spec.name}.final_policy_eval_t04")
  assert f"--workdir={scratch}" in argv and not os.path.exists(scratch)
  got = json.load(open(arch / spec.name / "eval_final_t04.json"))
  assert got["a_steps"] == 30 and got["policy"] == "final_policy"
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python="/bin/false", archive=str(arch)
  )
  assert r["status"] == "skipped" and r["archived"] == str(arch / spec.name)
  # Other weights at the local path: not the archived policy, refused.
  with open(os.path.join(local, "model.safetensors"), "wb") as f:
    f.write(b"v" * 100)
  r = sampled_eval.sampled_final_eval(
      spec,
      str(root),
      python=python,
      tag="t10",
      temperature=1.0,
      archive=str(arch),
  )
  assert r["status"] == "failed" and "not the archived policy" in r["error"]
  shutil.rmtree(root)
  # Over the size limit: nothing recorded, no evaluation possible.
  monkeypatch.setattr(ra, "MAX_POLICY_BYTES", 99)
  wd = study_run(root, spec.name, [1, 0])
  os.makedirs(os.path.join(wd, "checkpoints", "60"))
  arch2 = tmp_path / "archive2"
  n = len(calls)
  ra.archive_root(str(root), str(arch2))
  assert not os.path.exists(arch2 / spec.name / "policy.json")
  assert json.load(open(arch2 / spec.name / ra.TOO_LARGE)) == {
      "bytes": 119,
      "max_bytes": 99,
  }  # the exported files' bytes
  ra.archive_root(str(root), str(arch2))
  assert len(calls) == n + 1  # exported once, not on every pass
  # launch/export.py itself declines params over --max_bytes: marked too.
  arch3 = tmp_path / "archive3"
  monkeypatch.setattr(
      ra,
      "export_policy",
      lambda *a, **k: calls.append(a)
      or {"exported": False, "bytes": 5000, "reason": "> max_bytes"},
  )
  ra.archive_root(str(root), str(arch3))
  ra.archive_root(str(root), str(arch3))
  assert len(calls) == n + 2
  assert json.load(open(arch3 / spec.name / ra.TOO_LARGE))["bytes"] == 5000
  monkeypatch.setattr(ra, "export_policy", fake_export(calls))
  # The limit grew past it: exported on the next pass, the mark removed.
  monkeypatch.setattr(ra, "MAX_POLICY_BYTES", 6000)
  ra.archive_root(str(root), str(arch3))
  assert len(calls) == n + 3
  assert os.path.exists(arch3 / spec.name / "policy.json")
  assert not os.path.exists(arch3 / spec.name / ra.TOO_LARGE)
  monkeypatch.setattr(ra, "MAX_POLICY_BYTES", 99)
  shutil.rmtree(root)
  r = sampled_eval.sampled_final_eval(
      spec, str(root), python="/bin/false", archive=str(arch2)
  )
  assert r["status"] == "unavailable" and "policy.json" in r["error"]
  # Another training of the run: its policy.json is replaced.
  monkeypatch.setattr(ra, "MAX_POLICY_BYTES", 32 << 20)
  wd = study_run(root, spec.name, [0, 0])
  os.makedirs(os.path.join(wd, "checkpoints", "60"))
  n = len(calls)
  ra.archive_run(wd, str(arch))
  assert len(calls) == n + 1 and ra.same_run(wd, str(arch))
  assert not os.path.exists(arch / spec.name / "eval_final_t04.json")
  assert os.path.exists(arch / spec.name / "policy.json")


def test_with_policy_points_the_trained_config_at_the_archived_policy():
  """The trained config, from another clone, evaluated from an exported
  policy: this clone's config file, the policy as checkpoint, no stale
  tokenizer path (the policy holds its tokenizer), other overrides kept."""
  trained = (
      "/old/clone/configs/webshop_gigpo.py:rspo=1,seed=200,"
      "model.checkpoint_dir=/old/clone/runs/ws/warm_start,"
      "model.tokenizer_dir=/old/clone/runs/ws/tokenizer,train.lr=0.001"
  )
  assert sampled_eval.with_policy(trained, "/arch/final_policy") == (
      os.path.join(ROOT, "configs", "webshop_gigpo.py")
      + ":rspo=1,seed=200,train.lr=0.001,"
      "model.checkpoint_dir=/arch/final_policy"
  )


def test_runs_import_this_checkouts_code_first(tmp_path, monkeypatch):
  """A study run from a pinned worktree runs that worktree's rspo_jax and
  launch/ (installed as rspo_launch), not an editable install's:
  run_logged gives it experiments/checkout.py's PYTHONPATH (python
  launch/train.py adds only launch/ to sys.path). Session 8's pinned
  runs crashed importing the other checkout's launch/plot.py."""
  # Another checkout's launch/, found before the editable install's as
  # PYTHONPATH is: without the link to this one's, it would be imported.
  other = tmp_path / "other" / "rspo_launch"
  other.mkdir(parents=True)
  (other / "__init__.py").write_text("")
  (other / "plot.py").write_text("")
  monkeypatch.setenv("PYTHONPATH", str(tmp_path / "other"))
  rc, _ = runner.run_logged(
      [
          sys.executable,
          "-c",
          "import os, rspo_jax, rspo_launch.plot as p;"
          " print(rspo_jax.__file__); print(os.path.realpath(p.__file__))",
      ],
      str(tmp_path),
      None,
  )
  assert rc == 0, open(tmp_path / runner.LOG).read()
  lines = open(tmp_path / runner.LOG).read().splitlines()
  assert lines[1] == os.path.join(runner.ROOT, "rspo_jax", "__init__.py")
  assert lines[2] == os.path.realpath(
      os.path.join(runner.ROOT, "launch", "plot.py")
  )
