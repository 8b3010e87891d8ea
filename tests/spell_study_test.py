"""The spell study (experiments/reproduce.py --grid spell; experiments/grid.py's
spell_grid, experiments/report/spell.py): its cells and overrides, one root and
warm start per word length, the dry run's commands, and the report's
numbers from synthetic runs (seconds; nothing is trained)."""

import json
import os
import sys

import pytest

from configs import spell_gigpo, spell_grpo
from configs.base import last_override
from rspo_jax.metrics import MetricsWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import grid  # noqa: E402
import reproduce as rp  # noqa: E402
import runner  # noqa: E402
import report as reports  # noqa: E402
from report import spell as spell_study  # noqa: E402
from reproduce_test import write_eval  # noqa: E402

VARIANTS = (
    "baseline",
    "rspo",
    "rspo_misaligned",
    "rspo_decoy",
    "rspo_o",
    "dense_only",
    "dense_only_misaligned",
    "dense_only_decoy",
    "rspo_k3",
    "rspo_k30",
    "rspo_decoy_nopen",
    "baseline_nopen",
    "rspo_nopen",
    "dense_only_nopen",
    "dense_only_decoy_nopen",
)
PARTIAL = tuple(grid.partial_variants())  # issue 50 item 3, by name
ADAPTIVE = (  # item 6
    "rspo_adaptive_partial2_nopen",
    "baseline_x3_nopen",
    "dense_only_x3_partial2_nopen",
)

SWITCH = (  # Figure 3 from a policy that wins
    "from_gigpo_baseline_nopen",
    "from_gigpo_dense_only_partial2_nopen",
    "from_gigpo_dense_only_partial3_nopen",
    "from_gigpo_rspo_partial3_nopen",
    "from_gigpo_baseline_long_nopen",
)


def parse(spec, extra):
  path, arg = spec.config_arg(extra).split(":", 1)
  assert path == os.path.join(ROOT, "configs", "spell_gigpo.py")
  return spell_gigpo.get_config(arg)


def test_grid_cells_seeds_and_order():
  specs = grid.spell_grid()
  default = ("baseline", "rspo", "rspo_o", "dense_only", "rspo_k3")
  assert len(specs) == 5 * 5 and len({s.name for s in specs}) == 25
  assert tuple(grid.SPELL_VARIANTS) == VARIANTS + PARTIAL + ADAPTIVE + SWITCH
  assert grid.SPELL_DEFAULT_VARIANTS == default  # misaligned: by name
  assert {s.seed for s in specs} == {0, 200, 400, 600, 800}
  assert {(s.env, s.algo) for s in specs} == {("spell", "gigpo")}
  # Seed-major: a cut-short pass leaves whole seeds of every cell.
  assert [s.variant for s in specs[:5]] == list(default)
  assert {s.seed for s in specs[:5]} == {0}
  assert specs[0].name == "spell_gigpo_baseline_s0"
  (one,) = grid.spell_grid(["spell"], ["gigpo"], [400], ["rspo_o"])
  assert one.name == "spell_gigpo_rspo_o_s400"
  for bad in (
      {"envs": ["webshop"]},
      {"algos": ["grpo"]},
      {"variants": ["sample_random"]},
  ):
    with pytest.raises(ValueError, match="unknown"):
      grid.spell_grid(**bad)


def test_every_cell_parses_to_its_recipe():
  extra = grid.spell_extra()
  by = {
      s.variant: parse(s, extra)
      for s in grid.spell_grid(seeds=[200], variants=VARIANTS)
  }
  for v, c in by.items():
    assert c.seed == 200 and c.env.name == "spell" and c.algo.name == "gigpo"
    assert c.model.preset == "nano" and c.env.history_length == 0
    assert c.model.lora_rank == 0 and c.train.lr == 3e-4
    assert c.env.kwargs.word_length == 4 and c.env.max_steps == 4
    assert c.env.kwargs.expert_digits == 0 and c.env.eval_split == (
        "valid_seen"
    )
    assert c.env.kwargs.cipher_digits == 1  # one letter to find
    assert (c.train.batch_tasks, c.train.group_size) == (8, 8)
    assert c.rspo.alpha == 0.125 and c.train.total_steps == 30
    if c.rspo.enabled:
      assert c.rspo.k == {"rspo_k3": 3, "rspo_k30": 30}.get(v, 10)
    assert c.algo.invalid_action_penalty == (
        0.0 if v.endswith("nopen") else -0.1
    )
    assert c.train.max_train_rows == 0 and c.env.num_eval_tasks == 256
    assert c.rspo.dense_reward == "oracle"
    assert c.env.kwargs.dense == next(
        (d for d in ("misaligned", "decoy") if d in v), "aligned"
    )
  assert not by["baseline"].rspo.enabled and not by["baseline"].rspo.dense_only
  assert not by["baseline_nopen"].rspo.enabled
  for v in (
      "rspo",
      "rspo_misaligned",
      "rspo_decoy",
      "rspo_k3",
      "rspo_k30",
      "rspo_decoy_nopen",
      "rspo_nopen",
  ):
    assert by[v].rspo.enabled and by[v].rspo.data_source == "rspo"
    assert by[v].rspo.sampling == "reward"
  assert by["rspo_o"].rspo.enabled
  assert by["rspo_o"].rspo.data_source == "outcome"
  for v in (
      "dense_only",
      "dense_only_misaligned",
      "dense_only_decoy",
      "dense_only_nopen",
      "dense_only_decoy_nopen",
  ):
    assert by[v].rspo.dense_only and not by[v].rspo.enabled


def test_partial_study_cells_parse_to_their_recipe():
  m1, m2, m3 = grid.PARTIAL_M
  assert grid.partial_study() == (
      "baseline_nopen",
      "baseline_long_nopen",
      "rspo_o_nopen",
      f"dense_only_partial{m1}_nopen",
      f"rspo_partial{m1}_nopen",
      f"dense_only_partial{m2}_nopen",
      f"rspo_partial{m2}_nopen",
      f"dense_only_partial{m3}_nopen",
      f"rspo_partial{m3}_nopen",
  )
  check = grid.partial_study(penalty=True)
  assert check[:3] == ("baseline", "baseline_long", "rspo_o")
  assert set(PARTIAL) == set(grid.partial_study()[1:] + check[1:]) - {
      "rspo_o"
  }  # rspo_o and the 30-step GiGPOs were there before
  extra = grid.spell_extra("env.kwargs.word_length=6")
  by = {
      s.variant: parse(s, extra)
      for s in grid.spell_grid(seeds=[0], variants=grid.partial_study() + check)
  }
  for v, c in by.items():
    assert c.env.kwargs.word_length == 6 and c.env.kwargs.cipher_digits == 1
    assert c.algo.invalid_action_penalty == (
        0.0 if v.endswith("_nopen") else -0.1
    )
    m = next((m for m in grid.PARTIAL_M if f"partial{m}" in v), 0)
    assert c.env.kwargs.decoy_positions == m
    assert c.env.kwargs.dense == ("partial" if m else "aligned")
    assert c.train.total_steps == (60 if "long" in v else 30)
    assert c.rspo.enabled == v.startswith("rspo")
    assert c.rspo.dense_only == v.startswith("dense_only")
    if c.rspo.enabled:
      assert c.rspo.k == 10 and c.rspo.data_source == (
          "outcome" if "rspo_o" in v else "rspo"
      )
  # GiGPO at RSPO's environment steps: RSPO's A collects 7 fresh groups
  # of 8 a step (alpha 1/8), B 11 collections of 8 x 8 a loop; per L
  # turns an episode, 30 x 7 x 8 + 3 x 11 x 64 = 3792 episodes = 59.25
  # x GiGPO's 64 a step, at any L; 60 steps give 3840 (1.3 % more).
  assert 30 * 7 * 8 + 3 * 11 * 64 == 3792 and 3792 / 64 == 59.25
  assert grid.EQUAL_ENV_STEPS == 60
  # Its steps come after --extra (the recipe's steps=30 would win over a
  # variant's); every other cell's config string is what it was.
  (long,) = grid.spell_grid(seeds=[0], variants=["baseline_long"])
  assert long.config_arg(extra).endswith(f",{extra},steps=60")
  (base,) = grid.spell_grid(seeds=[0], variants=["baseline"])
  assert base.late_overrides == "" and base.config_arg(extra).endswith(
      f"rspo=0,rspo.dense_reward=oracle,seed=0,{extra}"
  )
  assert not (set(PARTIAL) - {"rspo_o_nopen"}) & set(grid.SPARSE_VARIANTS)


def test_adaptive_b_cells_parse_to_their_recipe():
  """Item 6: RSPO+GiGPO on m = 2 with B up to B_K_MAX steps, and GiGPO at
  its largest cost: 3 x (B_K_MAX + 1) B collections of 8 x 8 and 30 x 7
  x 8 of A's episodes = 89.25 x GiGPO's 64 a step; 90 steps."""
  extra = grid.spell_extra("env.kwargs.word_length=6")
  by = {
      s.variant: parse(s, extra)
      for s in grid.spell_grid(seeds=[0], variants=ADAPTIVE)
  }
  rspo, base = by["rspo_adaptive_partial2_nopen"], by["baseline_x3_nopen"]
  dense = by["dense_only_x3_partial2_nopen"]
  assert dense.rspo.dense_only and dense.train.total_steps == 90
  assert dense.env.kwargs.decoy_positions == 2
  assert rspo.rspo.enabled and rspo.rspo.k == 10
  assert rspo.rspo.b_k_max == grid.B_K_MAX == 20
  assert rspo.env.kwargs.dense == "partial"
  assert rspo.env.kwargs.decoy_positions == 2
  assert rspo.train.total_steps == 30
  assert not base.rspo.enabled and base.train.total_steps == 90
  for c in (rspo, base, dense):
    assert c.algo.invalid_action_penalty == 0.0
    assert c.env.kwargs.word_length == 6
  assert (30 * 7 * 8 + 3 * (grid.B_K_MAX + 1) * 64) / 64 == 89.25
  assert not set(ADAPTIVE) & set(grid.SPARSE_VARIANTS)


def test_switch_cells_start_from_gigpos_final_policy(tmp_path):
  """Figure 3 from a policy that wins: each cell is its base variant's
  recipe, started from the same seed's baseline_nopen final policy, whose
  held-out evaluation is its start; the policy's path comes last, so it
  wins over the shared warm start's (which reproduce.py adds first)."""
  extra = grid.spell_extra("")
  specs = grid.spell_grid(seeds=[400], variants=("baseline_nopen",) + SWITCH)
  dep, *switched = specs
  assert dep.start_from == "" and grid.start_run(dep) is None
  root = str(tmp_path)
  policy = os.path.join(root, dep.name, "final_policy")
  for s in switched:
    base = s.variant.removeprefix("from_gigpo_")
    assert s.overrides == grid.SPELL_VARIANTS[base]
    assert s.start_from == "baseline_nopen"
    assert grid.start_run(s) == "spell_gigpo_baseline_nopen_s400"
    r = runner.from_start_run(grid.from_warm_start(s, "/ws/warm_start"), root)
    arg = r.config_arg(extra)
    assert arg.count("model.checkpoint_dir=") == 2
    assert last_override(arg, "model.checkpoint_dir") == policy
    assert r.start_eval == os.path.join(root, dep.name, "eval_final.json")
    c = parse(r, extra)
    assert c.model.checkpoint_dir == policy
    assert c.train.total_steps == (60 if "long" in base else 30)
    assert c.algo.invalid_action_penalty == 0.0
    m = next((m for m in (2, 3) if f"partial{m}" in base), 0)
    assert c.rspo.dense_only == base.startswith("dense_only")
    assert c.rspo.enabled == base.startswith("rspo")
    assert c.env.kwargs.decoy_positions == m
  assert runner.from_start_run(dep, root) == dep


def test_switch_cell_waits_for_its_start_and_says_what_is_missing(tmp_path):
  """The runs that start from another's policy run after every other
  run; without that policy, one clear error and nothing started. With it,
  the run's command starts from it and its evaluation is the run's
  start (a fake python that only records its arguments)."""
  root = tmp_path / "runs"
  dep, switched = grid.spell_grid(
      seeds=[0],
      variants=["from_gigpo_dense_only_partial3_nopen", "baseline_nopen"],
  )[::-1]
  fake = tmp_path / "python"
  fake.write_text(
      '#!/bin/sh\necho "$@" >> ' + str(tmp_path / "calls.txt") + "\n"
  )
  fake.chmod(0o755)
  res = runner.run_grid(
      [switched, dep], str(root), python=str(fake), echo=False
  )
  assert [r["run"] for r in res] == [switched.name, dep.name]
  assert res[0]["status"] == "failed"
  assert "spell_gigpo_baseline_nopen_s0's final policy" in res[0]["error"]
  assert not (root / switched.name).exists()
  # Only the start ran, and first.
  (call,) = (tmp_path / "calls.txt").read_text().splitlines()
  assert f"--workdir={root / dep.name}" in call
  policy = root / dep.name / "final_policy"
  policy.mkdir(parents=True)
  (policy / "model.safetensors").write_bytes(b"weights")
  write_eval(root / dep.name / "eval_final.json", [1, 0, 1])
  (res,) = runner.run_grid([switched], str(root), python=str(fake), echo=False)
  assert res["status"] == "failed" and "exit code 0" in res["error"]
  last = (tmp_path / "calls.txt").read_text().splitlines()[-1]
  assert f"model.checkpoint_dir={policy} " in last
  assert json.loads((root / switched.name / "eval_start.json").read_text())[
      "success_rate"
  ] == pytest.approx(2 / 3)


def test_word_length_comes_from_extra_and_picks_the_root():
  assert grid.spell_length() == grid.spell_length("steps=2") == 4
  assert grid.spell_length("env.kwargs.word_length=6") == 6
  assert (
      grid.spell_length(
          "env.kwargs.word_length=3,x=1," "env.kwargs.word_length=5"
      )
      == 5
  )  # the last
  assert grid.spell_root("env.kwargs.word_length=6") == os.path.join(
      grid.SPELL_ROOT, "L6_D1"
  )
  assert grid.spell_root() == os.path.join(grid.SPELL_ROOT, "L4_D1")
  # The full cipher (the pilot's world) keeps the plain name.
  assert grid.spell_name("env.kwargs.cipher_digits=10") == "L4"
  assert (
      grid.spell_name("env.kwargs.cipher_digits=2," "env.kwargs.word_length=3")
      == "L3_D2"
  )
  for bad in ("env.kwargs.word_length=six", "env.kwargs.word_length=0"):
    with pytest.raises(ValueError, match="word_length"):
      grid.spell_length(bad)
  extra = grid.spell_extra("env.kwargs.word_length=6,steps=2")
  assert extra.startswith(grid.SPELL_OVERRIDES + ",")
  (spec,) = grid.spell_grid(seeds=[0], variants=["rspo"])
  c = parse(spec, extra)
  assert c.env.kwargs.word_length == 6 and c.env.max_steps == 6
  assert c.train.total_steps == 2  # --extra after the recipe wins
  # The warm start's config (launch/sft.py) has the recipe and L too.
  import runner  # noqa: PLC0415

  sft = runner.sft_config_arg("spell", extra)
  path, arg = sft.split(":", 1)
  assert path.endswith("configs/spell_grpo.py")
  w = spell_grpo.get_config(arg)
  assert w.model.preset == "nano" and w.env.kwargs.expert_digits == 0
  assert w.env.kwargs.word_length == 6 and w.sft.enabled


def dry_run(capsys, *args):
  assert rp.main(["--dry_run", *args]) == 0
  return capsys.readouterr().out.splitlines()


def test_dry_run_one_warm_start_per_world(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(grid, "SPELL_ROOT", str(tmp_path / "spell"))
  cmds = dry_run(capsys, "--grid", "spell", "--seeds", "0")
  root = tmp_path / "spell" / "L4_D1"
  assert len(cmds) == 1 + 5 and "launch/sft.py" in cmds[0]
  assert f"--workdir={root}/warm_start_spell" in cmds[0]
  assert ":seed=0," + grid.SPELL_OVERRIDES + " " in cmds[0]
  policy = f"{root}/warm_start_spell/warm_start"
  assert [c.split("--workdir=")[1].split()[0] for c in cmds[1:]] == [
      f"{root}/spell_gigpo_{v}_s0" for v in grid.SPELL_DEFAULT_VARIANTS
  ]
  assert all(
      "launch/train.py" in c
      and f"model.checkpoint_dir={policy}," in c
      and "configs/spell_gigpo.py:" in c
      for c in cmds[1:]
  )
  # L = 6: its own root and warm start, the length in every command.
  six = dry_run(
      capsys,
      "--grid",
      "spell",
      "--seeds",
      "0",
      "--variants",
      "baseline",
      "--extra",
      "env.kwargs.word_length=6",
  )
  assert len(six) == 2
  assert f"--workdir={tmp_path}/spell/L6_D1/warm_start_spell" in six[0]
  assert all(",env.kwargs.word_length=6 " in c for c in six)
  # --grid study --envs spell is the same grid; other envs are refused.
  assert (
      dry_run(capsys, "--grid", "study", "--envs", "spell", "--seeds", "0")
      == cmds
  )
  assert (
      dry_run(
          capsys,
          "--grid",
          "spell",
          "--envs",
          "spell",
          "--seeds",
          "0",
          "--root",
          str(root),
      )
      == cmds
  )
  assert rp.main(["--grid", "spell", "--envs", "webshop", "--dry_run"]) == 2
  assert (
      rp.main(
          [
              "--grid",
              "spell",
              "--extra",
              "env.kwargs.word_length=x",
              "--dry_run",
          ]
      )
      == 2
  )
  # --rl_extra reaches the runs, not the warm start.
  rl = dry_run(
      capsys,
      "--grid",
      "spell",
      "--seeds",
      "0",
      "--variants",
      "rspo",
      "--root",
      str(root),
      "--rl_extra",
      "rspo.dense_scale=10",
  )
  assert rl[0] == cmds[0] and "dense_scale" in rl[1]


# --------------------------------------------------------------------------
# WebShop's sparse study: the spell study's cells on WebShop
# --------------------------------------------------------------------------


def test_sparse_grid_parses_to_its_recipe_and_the_gate_shortens_it(
    tmp_path, capsys, monkeypatch
):
  from configs import webshop_gigpo, webshop_grpo  # noqa: PLC0415
  import runner  # noqa: PLC0415

  specs = grid.sparse_grid()
  assert [s.variant for s in specs[:5]] == list(grid.SPELL_DEFAULT_VARIANTS)
  assert {s.seed for s in specs} == set(grid.SEEDS) and len(specs) == 15
  assert "rspo_misaligned" not in grid.SPARSE_VARIANTS
  with pytest.raises(ValueError, match="unknown"):
    grid.sparse_grid(variants=["dense_only_misaligned"])
  extra = grid.sparse_extra()

  def cfg(spec, rl_extra=""):
    path, arg = (
        grid.with_rl_extra(spec, rl_extra).config_arg(extra).split(":", 1)
    )
    assert path.endswith("configs/webshop_gigpo.py")
    return webshop_gigpo.get_config(arg)

  by = {
      s.variant: cfg(s)
      for s in grid.sparse_grid(seeds=[0], variants=VARIANTS[:2])
  }
  for v, c in by.items():
    assert c.train.total_steps == 30 and c.rspo.alpha == 0.125
    assert (c.train.batch_tasks, c.train.group_size) == (16, 8)
    assert c.train.max_train_rows == 0 and c.env.num_eval_tasks == 256
  assert by["rspo"].rspo.enabled and by["rspo"].rspo.k == 10
  # LoRA (issue 39), by name: rank 16, lr 1e-3 against full's 3e-4.
  lora = {
      s.variant: cfg(s)
      for s in grid.sparse_grid(
          seeds=[0],
          variants=[
              "baseline",
              "baseline_lora",
              "rspo_lora",
              "baseline_lora3e3",
          ],
      )
  }
  assert [c.model.lora_rank for c in lora.values()] == [0, 16, 16, 16]
  assert [c.train.lr for c in lora.values()] == [3e-4, 1e-3, 1e-3, 3e-3]
  assert lora["rspo_lora"].rspo.enabled and lora["rspo_lora"].rspo.k == 10
  assert not lora["baseline_lora"].rspo.enabled
  assert "baseline_lora" not in grid.SPELL_VARIANTS
  # GRPO's cells (issue 39) are configs/webshop_grpo.py's algorithm.
  grpo = {
      s.variant: cfg(s)
      for s in grid.sparse_grid(
          seeds=[0],
          variants=["grpo", "grpo_lora", "rspo_grpo", "rspo_grpo_lora"],
      )
  }
  want = webshop_grpo.get_config("").algo
  assert webshop_gigpo.get_config("").algo != want
  for v, c in grpo.items():
    assert c.algo == want, v
  assert [c.model.lora_rank for c in grpo.values()] == [0, 16, 0, 16]
  assert [c.rspo.enabled for c in grpo.values()] == [False, False, True, True]
  # The gate: --rl_extra steps=12 comes after the run's own 30 steps.
  (base,) = grid.sparse_grid(seeds=[0], variants=["baseline"])
  assert cfg(base, "steps=12").train.total_steps == 12
  # The warm start: 300 cloning steps, no A steps in its config.
  sft = runner.sft_config_arg("webshop", extra)
  assert ",steps=30" not in sft
  w = webshop_grpo.get_config(sft.split(":", 1)[1])
  assert w.sft.steps == 300 and w.env.kwargs.num_test_goals == 256
  # Dry run: the default root, then the gate's own root.
  monkeypatch.setattr(grid, "SPARSE_ROOT", str(tmp_path / "ws"))
  monkeypatch.setattr(rp, "SPARSE_ROOT", str(tmp_path / "ws"))
  cmds = dry_run(capsys, "--grid", "sparse", "--seeds", "0")
  assert len(cmds) == 6 and f"--workdir={tmp_path}/ws/warm_start" in cmds[0]
  gate = dry_run(
      capsys,
      "--grid",
      "sparse",
      "--seeds",
      "0",
      "--variants",
      "baseline,dense_only",
      "--rl_extra",
      "steps=12",
      "--root",
      str(tmp_path / "gate"),
  )
  assert len(gate) == 3 and all(",steps=30,steps=12," in c for c in gate[1:])


def test_sparse_report_names_webshop_cells(tmp_path, monkeypatch):
  monkeypatch.setattr(spell_study, "plot_atomic", lambda *a, **k: True)
  root, out = tmp_path / "webshop_sparse_gate", str(tmp_path / "results")
  write_eval(root / "warm_start_webshop" / "eval_start.json", [0, 0, 0, 0])
  extra = grid.sparse_extra()
  for v, wins in (
      ("baseline", [0, 0, 0, 0]),
      ("dense_only", [1, 1, 0, 0]),
      ("baseline_nopen", [1, 1, 1, 1]),
      ("rspo_nopen", [1, 1, 1, 0]),
  ):
    (spec,) = grid.sparse_grid(seeds=[0], variants=[v])
    fake_spell_run(
        root,
        v,
        0,
        wins,
        grid.with_rl_extra(spec, "steps=12").config_arg(extra),
        success=[0.0, 0.5] * 3,
        dense=[0.1] * 6,
        env="webshop",
    )
  report = reports.spell_report(
      str(root), out, env="webshop", extra=extra, rl_extra="steps=12"
  )
  assert report["markdown"].endswith("study_webshop_sparse_gate.md")
  cells = {c["variant"]: c for c in report["cells"]}
  assert tuple(cells) == grid.SPARSE_VARIANTS
  assert cells["dense_only"]["greedy"]["minus_baseline"]["mean"] == 50.0
  # Like for like: without the penalty RSPO is taken against GiGPO
  # without it (75 % - 100 %), not against GiGPO with it (+75).
  assert cells["rspo_nopen"]["greedy"]["minus_baseline"]["mean"] == -25.0
  assert cells["rspo_nopen"]["base"] == "baseline_nopen"
  assert spell_study.base_of("rspo_grpo") == "grpo"
  # GRPO is not run here: RSPO+GRPO's column stays empty rather than
  # falling back on GiGPO.
  assert cells["rspo_grpo"]["greedy"]["minus_baseline"] is None
  assert spell_study.base_of("rspo") == "baseline"
  assert cells["dense_only"]["other_config_seeds"] == []
  assert cells["dense_only"]["early_success"]["mean"] == pytest.approx(25.0)
  assert report["decodings"] == [
      "greedy",
      "T = 0.4, 3 seeds",
      "T = 1.0 (training), 3 seeds",
  ]
  md = open(report["markdown"]).read()
  assert md.startswith("# WebShop, sparse outcomes")
  assert "--grid sparse --root runs/webshop_sparse_gate" in md
  assert "held-out goals" in md and "Dense per turn first" in md
  assert "misaligned" not in md


# --------------------------------------------------------------------------
# The report, from synthetic runs
# --------------------------------------------------------------------------


def fake_spell_run(
    root,
    variant,
    seed,
    wins,
    config=None,
    success=(),
    dense=(),
    lifts=(),
    env="spell",
):
  wd = os.path.join(str(root), f"{env}_gigpo_{variant}_s{seed}")
  w = MetricsWriter(wd, tensorboard=False)
  for i, (s, d) in enumerate(zip(success, dense), start=1):
    w.write(
        i,
        "A",
        {
            "rollout_success_rate": s,
            "dense_reward_mean": d,
            "env_steps": 10 * i,
        },
    )
  for loop, (ls, ld) in enumerate(lifts):
    w.write(
        3 * loop,
        "B_collect",
        {"loop": loop, "b_lift_success": ls, "b_lift_dense_return": ld},
    )
  w.close()
  with open(os.path.join(wd, "run.json"), "w") as f:
    json.dump({"config": config or "cfg"}, f)
  write_eval(os.path.join(wd, "eval_start.json"), [0] * len(wins))
  write_eval(os.path.join(wd, "eval_final.json"), wins)
  return wd


def test_nested_interval():
  ci = reports.nested_interval([[1.0, 1.0], [3.0, 3.0, 3.0, 3.0]])
  assert ci["mean"] == 2.0 and ci["n_groups"] == 2 and ci["n_values"] == 6
  assert 1.0 <= ci["lo"] <= ci["hi"] <= 3.0
  one = reports.nested_interval([[0.5, 0.5, 0.5]])
  assert (one["mean"], one["lo"], one["hi"]) == (0.5, 0.5, 0.5)
  assert reports.nested_interval([[], []]) is None


def test_report_numbers_by_hand(tmp_path, monkeypatch):
  plots = []
  monkeypatch.setattr(
      spell_study,
      "plot_atomic",
      lambda groups, metric, x, path, **kw: plots.append(
          (sorted(groups), metric, x)
      )
      or True,
  )
  root, out = tmp_path / "runs", str(tmp_path / "results")
  ws = root / "warm_start_spell"
  write_eval(ws / "eval_start.json", [0, 0, 0, 0])
  write_eval(ws / "eval_start_t10.json", [1, 0, 0, 0], seeds=(0, 1, 2))
  extra = grid.spell_extra()
  spec = lambda v, s: grid.spell_grid(seeds=[s], variants=[v])[0]  # noqa
  # GiGPO wins word 0 (seeds 0, 200); RSPO words 0 and 1 (seed 0).
  for seed in (0, 200):
    fake_spell_run(
        root,
        "baseline",
        seed,
        [1, 0, 0, 0],
        spec("baseline", seed).config_arg(extra),
        success=[0.0] * 6,
        dense=[0.25] * 6,
    )
  fake_spell_run(
      root,
      "rspo",
      0,
      [1, 1, 0, 0],
      spec("rspo", 0).config_arg(extra),
      lifts=[(0.25, 0.5), (0.75, 0.5)],
  )
  fake_spell_run(
      root, "rspo_o", 0, [1, 0, 0, 0], "another config", lifts=[(0.0, -0.1)]
  )
  # The misaligned dense reward farmed: success 0.5 -> 0, dense return up.
  fake_spell_run(
      root,
      "dense_only_misaligned",
      0,
      [0, 0, 0, 0],
      success=[0.5, 0.5, 0.5, 0.0, 0.0, 0.0],
      dense=[0.25, 0.25, 0.25, 0.5, 0.5, 0.5],
  )
  report = reports.spell_report(str(root), out, extra=extra)
  cells = {c["variant"]: c for c in report["cells"]}
  assert report["word_length"] == 4 and report["markdown"].endswith(
      "study_spell_L4_D1.md"
  )
  assert [cells[v]["n"] for v in VARIANTS] == [
      2,
      1,
      0,
      0,
      1,
      0,
      1,
      0,
      0,
      0,
      0,
      0,
      0,
      0,
      0,
  ]
  base, rspo = cells["baseline"]["greedy"], cells["rspo"]["greedy"]
  assert base["success"]["mean"] == pytest.approx(25.0)
  assert base["final_minus_start"]["mean"] == pytest.approx(25.0)
  assert base["minus_baseline"] is None
  assert rspo["minus_baseline"]["mean"] == pytest.approx(25.0)
  assert cells["rspo_misaligned"]["greedy"]["success"] is None
  assert report["start"]["greedy"]["mean"] == 0.0
  assert report["start"]["T = 1.0 (training), 3 seeds"]["mean"] == 25.0
  assert cells["rspo_o"]["other_config_seeds"] == [0]
  assert cells["rspo"]["other_config_seeds"] == []
  # B's lift: loops 0.25 and 0.75 -> +50 points; dense return +0.5.
  lift = cells["rspo"]["b_lift"]
  assert lift["b_lift_success"]["mean"] == pytest.approx(50.0)
  assert lift["b_lift_success"]["n_values"] == 2
  assert lift["b_lift_dense_return"]["mean"] == pytest.approx(0.5)
  assert cells["rspo_misaligned"]["b_lift"]["b_lift_success"] is None
  # Hacking: success 50 -> 0 %, dense return (L x per turn) 1 -> 2.
  h = cells["dense_only_misaligned"]["hacking"]
  assert h["success"]["first"]["mean"] == pytest.approx(50.0)
  assert h["success"]["change"]["mean"] == pytest.approx(-50.0)
  assert h["dense_return"]["first"]["mean"] == pytest.approx(1.0)
  assert h["dense_return"]["change"]["mean"] == pytest.approx(1.0)
  assert cells["baseline"]["hacking"]["success"]["change"]["mean"] == 0.0
  assert cells["dense_only"]["hacking"]["success"]["first"] is None
  assert cells["dense_only_misaligned"]["early_success"]["mean"] == (
      pytest.approx(25.0)
  )
  # Contrasts: RSPO - RSPO_O = +25 on the greedy words.
  (c,) = [
      k for k in report["contrasts"] if (k["a"], k["b"]) == ("rspo", "rspo_o")
  ]
  assert c["greedy"]["mean"] == pytest.approx(25.0)
  md = open(report["markdown"]).read()
  assert "| GiGPO | 2 | 25.0 [0.0, 75.0] | +25.0 [+0.0, +75.0] | — |" in md
  assert "| RSPO+GiGPO (aligned), k = 10 | 2 | +50.0 [" in md
  assert "| Dense only (misaligned) | 1 | 50.0 [50.0, 50.0] | 0.0 [0.0," in md
  assert "Trained with other overrides" in md and "seeds 0" in md
  assert (
      json.load(open(os.path.join(out, "study_spell_L4_D1.json")))[
          "word_length"
      ]
      == 4
  )
  assert ("rollout_success_rate", "step") == plots[0][1:]
  assert plots[-1][1] == "dense_reward_mean" and plots[-1][0] == sorted(
      ["GiGPO", "Dense only (misaligned)"]
  )  # only cells that ran
  assert report["curves"] == [
      "study_spell_L4_D1_success_step.png",
      "study_spell_L4_D1_success_env_steps.png",
      "study_spell_L4_D1_dense_step.png",
  ]


def test_report_equal_cost_peak_and_figure3(tmp_path, monkeypatch):
  """RSPO (partial, the middle m, no penalty) wins 4 of 4 words; GiGPO 1 (30
  steps), 2 (60 steps); the dense reward alone 3: RSPO − GiGPO +75,
  − GiGPO at equal environment steps +50, − dense alone +25, and the
  stronger of those two is the dense reward alone (75 > 50 %)."""
  monkeypatch.setattr(spell_study, "plot_atomic", lambda *a, **k: True)
  root, out = tmp_path / "runs", str(tmp_path / "results")
  write_eval(root / "warm_start_spell" / "eval_start.json", [0, 0, 0, 0])
  extra = grid.spell_extra()
  m = grid.PARTIAL_M[1]
  spec = lambda v: grid.spell_grid(seeds=[0], variants=[v])[0]  # noqa
  # Rise then fall: 3-step means 0, .25, .5, .667, .5, .167 -> peak
  # 66.7 % at A step 4; the dense return (L x per turn) rises 0.5 -> 1.
  runs = {
      "baseline_nopen": ([1, 0, 0, 0], [0.0] * 6),
      "baseline_long_nopen": ([1, 1, 0, 0], [0.0] * 6),
      f"dense_only_partial{m}_nopen": (
          [1, 1, 1, 0],
          [0.0, 0.5, 1.0, 0.5, 0.0, 0.0],
      ),
      f"rspo_partial{m}_nopen": ([1, 1, 1, 1], [0.0] * 6),
  }
  for v, (wins, success) in runs.items():
    fake_spell_run(
        root,
        v,
        0,
        wins,
        spec(v).config_arg(extra),
        success=success,
        dense=[0.125, 0.125, 0.125, 0.25, 0.25, 0.25],
    )
  report = reports.spell_report(str(root), out, extra=extra)
  cells = {c["variant"]: c for c in report["cells"]}
  rspo = cells[f"rspo_partial{m}_nopen"]
  assert rspo["base"] == "baseline_nopen"
  assert rspo["greedy"]["minus_baseline"]["mean"] == pytest.approx(75.0)
  assert rspo["other_config_seeds"] == []
  assert cells["baseline_long_nopen"]["other_config_seeds"] == []
  (cost,) = [
      k
      for k in report["equal_cost"]
      if k["variant"] == f"rspo_partial{m}_nopen"
  ]
  assert (cost["long"], cost["dense"]) == (
      "baseline_long_nopen",
      f"dense_only_partial{m}_nopen",
  )
  g = cost["greedy"]
  assert g["minus_long"]["mean"] == pytest.approx(50.0)
  assert g["minus_dense"]["mean"] == pytest.approx(25.0)
  assert g["best"] == f"dense_only_partial{m}_nopen"
  assert g["minus_best"]["mean"] == pytest.approx(25.0)
  h = cells[f"dense_only_partial{m}_nopen"]["hacking"]
  assert h["success"]["peak"]["mean"] == pytest.approx(200 / 3)
  assert h["success"]["peak_step"] == 4.0
  # first 3 steps 0, .5, 1 (mean 50 %), last 3 .5, 0, 0 (16.7 %)
  assert h["success"]["change"]["mean"] == pytest.approx(-100 / 3)
  assert h["dense_return"]["change"]["mean"] == pytest.approx(0.5)
  assert spell_study.peak([0.0, 1.0, 1.0, 1.0], window=2) == (1.0, 3)
  (c,) = [k for k in report["contrasts"] if k["a"] == f"rspo_partial{m}_nopen"]
  assert c["b"] == "rspo_o_nopen" and c["greedy"] is None  # not run
  png = "study_spell_L4_D1_figure3_step.png"
  assert report["curves"][-1] == png
  assert os.path.getsize(os.path.join(out, png)) > 1000
  md = open(report["markdown"]).read()
  assert "## Equal cost, and the dense reward alone" in md
  label = spell_study.LABELS[f"rspo_partial{m}_nopen"]
  row = next(
      line
      for line in md.splitlines()
      if line.startswith(f"| {label} | +75.0 [")
  )
  cols = [c.strip().split(" ")[0] for c in row.strip("|").split("|")]
  assert cols == [label.split(" ")[0], "+75.0", "+50.0", "+25.0", "+25.0"]
  assert row.endswith("(dense alone) |")
  assert "| 66.7 [66.7, 66.7] | 4 |" in md


def test_divergence_on_replayed_tokens_by_hand(tmp_path):
  """B - A on replayed tokens: the mean of the steps' means, the median
  of their medians, the largest token, the mean k3; a step that did not
  replay is skipped, a statistic no step logged is None."""
  run = tmp_path / "run"
  run.mkdir()
  rows = [
      {
          "phase": "A",
          "step": 1,
          "replay_logp_b_minus_old": 0.1,
          "replay_logp_b_minus_old_median": 0.0,
          "replay_logp_b_minus_old_max": 0.5,
          "replay_kl_b_old_k3": 0.02,
      },
      {"phase": "A", "step": 2},  # nothing replayed
      {
          "phase": "A",
          "step": 3,
          "replay_logp_b_minus_old": -0.3,
          "replay_logp_b_minus_old_median": 0.2,
          "replay_logp_b_minus_old_max": 2.0,
          "replay_kl_b_old_k3": 0.06,
      },
      {
          "phase": "A",
          "step": 4,
          "replay_logp_b_minus_old": 0.5,
          "replay_logp_b_minus_old_median": 0.1,
          "replay_logp_b_minus_old_max": 1.0,
          "replay_kl_b_old_k3": 0.04,
      },
      {"phase": "B", "step": 1, "replay_logp_b_minus_old": 9.0},
  ]
  (run / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows)
  )
  d = spell_study.divergence([str(run)])
  assert d["steps"] == 3
  assert d["mean"] == pytest.approx(0.1)  # (0.1 - 0.3 + 0.5) / 3
  assert d["median"] == pytest.approx(0.1)
  assert d["max"] == 2.0 and d["k3"] == pytest.approx(0.04)
  old = tmp_path / "old"
  old.mkdir()
  (old / "metrics.jsonl").write_text(
      json.dumps({"phase": "A", "step": 1, "replay_logp_b_minus_old": 0.2})
      + "\n"
  )
  d = spell_study.divergence([str(old)])
  assert d == {"steps": 1, "mean": 0.2, "median": None, "max": None, "k3": None}
  assert spell_study.divergence([str(tmp_path / "missing")]) is None


def test_b_by_loop_reads_the_archived_runs():
  """The figure's numbers, read from an archived run: spell L = 4, m = 3,
  seed 600, where B's success on its first batch fell from 48.4 to 0 %
  in loop 3 (docs/results.md, "The knob at three values")."""
  import figure_b_by_loop as fig  # noqa: PLC0415

  run = os.path.join(fig.ARCHIVE, fig.RUN.format(m=3, seed=600))
  got = [(loop, round(a, 1), round(b, 1)) for loop, a, b in fig.loops(run)]
  assert got == [(1, 0.0, 0.0), (2, 1.6, 9.4), (3, 48.4, 0.0)]


def test_switch_figure_reads_the_archived_runs(tmp_path):
  """Figure 3 on spell, read from the archive: at seed 600 the dense
  reward alone (m = 3) from GiGPO's 30-step policy takes A's rollouts
  from 72.9 % (its first 3 steps) to 0 % (its last 3) while its dense
  return rises 0.243 -> 0.542; the control goes on to 96.4 %. The figure
  is drawn from the same files."""
  import figure_switch as fig  # noqa: PLC0415

  got = fig.summary()
  hacked = got["from_gigpo_dense_only_partial3_nopen"][600]
  assert hacked == {
      "start_success": 74.5,
      "first_success": 72.9,
      "last_success": 0.0,
      "first_dense": 0.243,
      "last_dense": 0.542,
  }
  assert got["from_gigpo_baseline_nopen"][600]["last_success"] == 96.4
  out = tmp_path / "f.png"
  fig.main(["--out", str(out)])
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
