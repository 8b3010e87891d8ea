r"""Runs the paper's results grid, resumably, and writes its tables and curves.

  python experiments/reproduce.py --grid main          # 2 x 3 x 2 x 3 runs
  python experiments/reproduce.py --grid main --envs webshop --algos grpo \
      --seeds 0
  python experiments/reproduce.py --grid ablations --parallel 2  # WebShop GRPO
  python experiments/reproduce.py --grid main --report_only      # tables only
  python experiments/reproduce.py --grid study --seeds 0         # CPU study
  python experiments/reproduce.py --grid study --envs alfworld --seeds 0
  python experiments/reproduce.py --grid spell --seeds 0     # spell, L4_D1
  python experiments/reproduce.py --grid spell --seeds 0 \
      --extra env.kwargs.word_length=6                     # L = 6
  python experiments/reproduce.py --grid sparse --seeds 0    # WebShop, sparse
  python experiments/reproduce.py --envs toy --algos grpo --seeds 0 \
      --extra 'steps=2,train.batch_tasks=2'                # smoke test

Grids (``--envs/--algos/--variants/--seeds`` filter them):
  main       env {webshop, alfworld} x algo {grpo, ppo, gigpo} x variant
             {baseline (``rspo=0``), rspo (``rspo=1``)} x seed {0, 200, 400}.
  ablations  WebShop GRPO: replay sampling {reward, variance, random}, data
             source {RSPO_H, RSPO_O, RSPO}, the dense-only run, and the
             baseline (see experiments/ablations.py).
  study      the CPU study (docs/results.md, "CPU study recipe"): one env
             (default WebShop) at STUDY_OVERRIDES (the paper's batch shape
             16 x 8, 30 A steps = 10 RSPO loops, 256 held-out goals),
             GRPO and GiGPO x {baseline, rspo, sample_variance,
             sample_random}, each naming its dense reward
             (rspo.dense_reward=oracle), seeds {0, 200, 400}; ``--envs
             alfworld``: 16 x 8, 30 A steps, 140 valid_seen tasks, GRPO
             {baseline, rspo} (STUDY_ENV_CELLS); root
             runs/study. Besides the greedy evaluations every finished run
             and the shared warm start are evaluated at T = 0.4 and at
             the training temperature T = 1.0, 3 sampling seeds each
             (launch/eval.py into eval_final_t04.json /
             eval_start_t04.json, _t10; resumable); report
             ``study_<env>.{json,md}`` with 95 % bootstrap intervals
             (rspo_jax/intervals.py).
  spell      the spell task (third_party_envs/spell.py,
             experiments/report/spell.py):
             GiGPO x {baseline, rspo, rspo_o, dense_only, rspo_k3} (and
             by name rspo_misaligned, dense_only_misaligned, rspo_decoy,
             dense_only_decoy) x seeds {0,
             200, 400, 600, 800} at SPELL_OVERRIDES (one hidden letter,
             L = 4), from one warm start per world (``--extra
             env.kwargs.word_length=L``; root runs/spell/L<L>_D1);
             greedy and T = 1.0 (3 seeds) on 256 held-out tasks; report
             ``study_spell_L<L>_D1.{json,md}`` (intervals, B's lift, the
             dense-only runs' dense return against success). ``--grid
             study --envs spell`` is the same.
  sparse     WebShop where outcomes are sparse (experiments/grid.py,
             SPARSE_OVERRIDES): the study's world and 16 x 8 batch, every
             row trained, alpha 1/8, from a 300-step warm start (5 % at
             T = 1); the spell study's cells (GiGPO x {baseline, rspo,
             rspo_o, dense_only, rspo_k3}; by name baseline_lora and
             rspo_lora, LoRA r = 16) x seeds {0, 200, 400}; greedy,
             T = 0.4 and T = 1.0 (3 seeds); root runs/webshop_sparse;
             report ``study_webshop_sparse.{json,md}`` (as spell's). The
             gate: ``--variants baseline,dense_only --rl_extra steps=12
             --root runs/webshop_sparse_gate``.
``toy`` is accepted by ``--envs`` (configs/toy_grpo.py, ``algo.name=<algo>``)
for tests and smoke runs; it is in no default grid.

Each run is ``python launch/train.py --config=configs/<env>_<algo>.py:
<variant overrides>,seed=<seed>,<--extra> --workdir=<root>/<env>_<algo>_
<variant>_s<seed> --no_progress [--mesh=<--mesh>]``, logged to
``<workdir>/train.log``. A run whose ``eval_final.json`` exists is finished
and skipped; any other run is (re)started and launch/train.py resumes it
from its checkpoints. The config
argument is kept in ``<workdir>/run.json``; a workdir started with another
one is refused (use another ``--root``), and so is a finished run (under
root or in ``--archive``) trained with another (config_key: the run names
do not hold ``--extra``/``--rl_extra``). run.json also names the git
commit the run started on and whether tracked files had changed
(``commit``, ``dirty``), and each resume on other code
(``resumed_with``). One run at a time, or ``--parallel
N`` subprocesses. One JSON line is printed per run.

Every run of an env starts from one shared warm start, made first (once) by
``python launch/sft.py --config=configs/<env>_grpo.py:seed=0,<--extra>
--workdir=<root>/warm_start_<env>``, as the paper's runs all start from one
instruct model: the cells differ in RL only, and the grid does not repeat
the SFT (most of a CPU run's time) in every run. It is evaluated once too
(``launch/eval.py`` into ``<root>/warm_start_<env>/eval_start.json``), and
every run copies that as its start-of-RL evaluation. ``--own_warm_start`` (or a
``model.checkpoint_dir`` in ``--extra``) turns this off. A cell with a
``start_from`` (grid.START_FROM: the spell study's ``from_gigpo_*`` cells)
starts instead from the final policy of the same seed's run of that
variant under ``--root`` (exported there by ``--archive``), after every
other run, taking that run's final evaluation as its start's. ``--rl_extra``
overrides go to the RL runs only: another RL recipe from the same warm
start (a new ``--root`` whose ``warm_start_<env>`` links to the first's is
not behaviour-cloned again), e.g. the WebShop study training every row:

  python experiments/reproduce.py --grid study --root runs/study_allrows \
      --rl_extra train.max_train_rows=0,train.micro_batch_rows=32 \
      --out docs/results/study_allrows --seeds 0

Reports (after the runs, or alone with ``--report_only``) count finished runs
only, of any seed found under ``--root``, and are written atomically (tmp +
rename) into ``--out`` (default docs/results):
  <env>.json, <env>.md          per (algo, variant): success rate and score
                                (%) on the evaluation split, mean +- std
                                (ddof 0) over seeds, n, start-of-RL success;
                                the paper's success rate beside ours.
  <env>_<algo>_{step,env_steps}.png
                                rollout success rate of A's training batches
                                (phase 'A' rows) vs A's step and vs
                                environment steps, baseline and RSPO
                                overlaid, mean +- std band over seeds.

Runs live under ``--root`` (runs/ is git-ignored: a fresh clone has none).
``--archive DIR`` (e.g. docs/results/archive/study_allrows, committed) keeps
each finished run's small files there -- run.json, every eval*.json with
its per_task, metrics.jsonl's A/B/eval rows (gzipped: metrics.jsonl.gz),
command.txt, and policy.json: its final policy A's sha256 per file and the
command that regenerates it
(the policy itself is exported by launch/export.py with --python into
``<root>/<name>/final_policy/``, the local copy); the warm start's
done.json, evaluations and policy.json; never weights or checkpoints
(experiments/run_archive.py) -- after each run or evaluation finishes and again
before the reports (``--report_only --archive DIR`` archives what root
holds). The reports, the curves and the skipping read root and archive,
root winning: a run finished in the archive only is reported and skipped,
not trained again, and so is its archived sampled evaluation; one it lacks
is made of its local final_policy/ when that is the archived policy
(``model.checkpoint_dir``, an empty --workdir), else it is 'unavailable'
with the command that regenerates it. A run still to train starts from a
warm start made by SFT under root (its result says whether it matches the
archived one's sha256), taking the archived evaluations of the warm start
instead of recomputing them.

Modules (imports point down the list): grid.py (the grids: RunSpec, names,
overrides), run_files.py (what a run directory holds, finished runs),
runner.py (shared warm start, training runs), sampled_eval.py (the
study's sampled evaluations), report/ (the reports, one entry per grid:
report/__init__.py); this file is the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

import run_archive as ra
from grid import (
    ROOT,
    SAMPLED,
    SPARSE_ENV,
    SPARSE_ROOT,
    SPELL_ENV,
    SPELL_SAMPLED,
    STUDY_ROOT,
    RunSpec,
    ablation_grid,
    from_warm_start,
    main_grid,
    sampled_flags,
    sampled_names,
    sparse_extra,
    sparse_grid,
    spell_extra,
    spell_grid,
    spell_root,
    study_extra,
    study_grid,
    with_rl_extra,
)
from report import (ablation_report, env_report, spell_report, study_report)
from checkout import use_this_checkout
from run_files import START, is_finished, warm_start_workdir
from runner import (
    command,
    from_start_run,
    run_grid,
    sft_command,
    shared_start_eval,
    shared_warm_start,
)
from sampled_eval import sampled_final_eval


def _run_study(
    specs: list[RunSpec], args, failed: list, sampled=SAMPLED
) -> None:
  """The study's extra evaluations: the warm start and every finished run
  at each ``sampled`` temperature, 3 seeds (each skipped once written,
  under root or in --archive)."""
  envs = dict.fromkeys(s.env for s in specs)
  results = []
  for _, tag, temperature in sampled:
    for env in envs:
      if os.path.isdir(
          os.path.join(warm_start_workdir(args.root, env), "warm_start")
      ):
        results.append(
            shared_start_eval(
                env,
                args.root,
                args.extra,
                args.python,
                out_name=sampled_names(tag)[0],
                eval_flags=sampled_flags(temperature),
                archive=args.archive,
            )
        )
        print(json.dumps(results[-1]), flush=True)
    for s in specs:
      if is_finished(ra.run_dir(args.root, args.archive, s.name)):
        results.append(
            sampled_final_eval(
                s,
                args.root,
                args.extra,
                args.python,
                tag=tag,
                temperature=temperature,
                archive=args.archive,
            )
        )
        print(json.dumps(results[-1]), flush=True)
  failed += [r for r in results if r["status"] == "failed"]


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _csv(s: Optional[str]) -> Optional[list[str]]:
  if s is None:
    return None
  return [p.strip() for p in s.split(",") if p.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description="Run the results grid (resumable) and write its reports."
  )
  p.add_argument(
      "--grid",
      default="main",
      choices=("main", "ablations", "study", "spell", "sparse"),
  )
  p.add_argument("--envs", default=None, help="e.g. webshop,alfworld (toy)")
  p.add_argument("--algos", default=None, help="e.g. grpo,ppo,gigpo")
  p.add_argument(
      "--variants",
      default=None,
      help="main: baseline,rspo; ablations: see " "experiments/ablations.py",
  )
  p.add_argument("--seeds", default=None, help="e.g. 0,200,400")
  p.add_argument(
      "--extra",
      default="",
      help="'key=val,...' appended to every run's overrides",
  )
  p.add_argument(
      "--rl_extra",
      default="",
      help="'key=val,...' for the RL runs only, not the shared"
      " warm start (e.g. train.max_train_rows=0: another RL"
      " recipe from the same warm start; use its own --root)",
  )
  p.add_argument(
      "--root",
      default=None,
      help="runs directory (one workdir per run; default"
      " runs/reproduce, --grid study: runs/study)",
  )
  p.add_argument(
      "--out",
      default=os.path.join(ROOT, "docs", "results"),
      help="report directory",
  )
  p.add_argument(
      "--archive",
      default="",
      help="keep finished runs' small files here (e.g."
      " docs/results/archive/<study>, committed) and read runs"
      " from it too (experiments/run_archive.py)",
  )
  p.add_argument(
      "--mesh", default="", help="mesh config for every run (configs/mesh/*.py)"
  )
  p.add_argument("--parallel", type=int, default=1)
  p.add_argument("--report_only", action="store_true")
  p.add_argument(
      "--dry_run",
      action="store_true",
      help="print the commands of the unfinished runs and exit",
  )
  p.add_argument(
      "--python", default=sys.executable, help="interpreter for launch/train.py"
  )
  p.add_argument(
      "--own_warm_start",
      action="store_true",
      help="every run behaviour-clones its own starting policy"
      " (default: one per env, <root>/warm_start_<env>, shared)",
  )
  return p.parse_args(argv)


def _start_from_shared_warm_starts(specs, args):
  """Makes (or, with --dry_run, names) each env's shared warm start for its
  unfinished runs. Returns the specs, now starting from it, and the runs
  not started because their env's warm start failed."""
  todo = [
      s
      for s in specs
      if not is_finished(ra.run_dir(args.root, args.archive, s.name))
  ]
  policies, failed = {}, []
  for env in dict.fromkeys(s.env for s in todo):
    if args.dry_run:
      policies[env] = os.path.join(
          warm_start_workdir(args.root, env), "warm_start"
      )
      print(
          " ".join(
              sft_command(env, args.root, args.extra, args.python, args.mesh)
          )
      )
      continue
    r = shared_warm_start(
        env, args.root, args.extra, args.python, args.mesh, archive=args.archive
    )
    print(json.dumps(r), flush=True)
    if r["status"] != "failed":
      r = shared_start_eval(
          env, args.root, args.extra, args.python, archive=args.archive
      )
      print(json.dumps(r), flush=True)
    if r["status"] == "failed":
      failed += [
          {
              "run": s.name,
              "status": "failed",
              "error": f"{r['run']}: {r['error']}",
          }
          for s in todo
          if s.env == env
      ]
    policies[env] = os.path.join(
        warm_start_workdir(args.root, env), "warm_start"
    )
  bad = {f["run"] for f in failed}
  evals = {
      env: os.path.join(os.path.dirname(p), START)
      for env, p in policies.items()
  }
  return [
      from_warm_start(s, policies[s.env], evals[s.env])
      if s.env in policies
      else s
      for s in specs
      if s.name not in bad
  ], failed


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  use_this_checkout()  # a pinned worktree's reports plot with its launch/
  if args.grid == "study" and _csv(args.envs) == [SPELL_ENV]:
    args.grid = "spell"  # the spell task's study is its own grid
  try:
    if args.root is None and args.grid == "spell":
      args.root = spell_root(args.extra)  # one root per world
  except ValueError as e:
    print(f"reproduce.py: error: {e}", file=sys.stderr)
    return 2
  if args.root is None:
    args.root = {"study": STUDY_ROOT, "sparse": SPARSE_ROOT}.get(
        args.grid, os.path.join(ROOT, "runs", "reproduce")
    )
  args.root = os.path.abspath(args.root)
  args.archive = os.path.abspath(args.archive) if args.archive else ""
  if args.parallel < 1:
    print(
        f"reproduce.py: error: --parallel must be >= 1, got"
        f" {args.parallel}",
        file=sys.stderr,
    )
    return 2
  try:
    seeds = [int(s) for s in _csv(args.seeds) or []]
  except ValueError:
    print(
        f"reproduce.py: error: --seeds wants integers, got {args.seeds!r}",
        file=sys.stderr,
    )
    return 2
  try:
    if args.grid == "main":
      specs = main_grid(
          _csv(args.envs), _csv(args.algos), seeds, _csv(args.variants)
      )
    elif args.grid == "study":
      specs = study_grid(
          _csv(args.envs), _csv(args.algos), seeds, _csv(args.variants)
      )
      envs = list(dict.fromkeys(s.env for s in specs))
      if len(envs) != 1:
        raise ValueError(f"--grid study runs one env at a time, got {envs}")
      args.extra = study_extra(envs[0], args.extra)
    elif args.grid == "spell":
      specs = spell_grid(
          _csv(args.envs), _csv(args.algos), seeds, _csv(args.variants)
      )
      args.extra = spell_extra(args.extra)
    elif args.grid == "sparse":
      specs = sparse_grid(
          _csv(args.envs), _csv(args.algos), seeds, _csv(args.variants)
      )
      args.extra = sparse_extra(args.extra)
    else:
      specs = ablation_grid(
          _csv(args.envs), _csv(args.algos), seeds, _csv(args.variants)
      )
  except ValueError as e:
    print(f"reproduce.py: error: {e}", file=sys.stderr)
    return 2
  specs = [with_rl_extra(s, args.rl_extra) for s in specs]
  failed, pairs = [], list(dict.fromkeys((s.env, s.algo) for s in specs))
  if (
      not args.own_warm_start
      and not args.report_only
      and "model.checkpoint_dir=" not in args.extra
  ):
    specs, failed = _start_from_shared_warm_starts(specs, args)
  if args.dry_run:
    for s in specs:
      if not is_finished(ra.run_dir(args.root, args.archive, s.name)):
        print(
            " ".join(
                command(
                    from_start_run(s, args.root),
                    args.root,
                    args.extra,
                    args.python,
                    args.mesh,
                )
            )
        )
    return 0
  if not args.report_only:
    results = run_grid(
        specs,
        args.root,
        args.extra,
        args.parallel,
        args.python,
        mesh=args.mesh,
        archive=args.archive,
    )
    failed += [r for r in results if r["status"] == "failed"]
    if args.grid in ("study", "sparse"):
      _run_study(specs, args, failed)
    elif args.grid == "spell":
      _run_study(specs, args, failed, SPELL_SAMPLED)
  if args.archive:
    print(
        json.dumps(
            {
                "archive": args.archive,
                "written": ra.archive_root(
                    args.root, args.archive, args.python
                ),
            }
        ),
        flush=True,
    )
  if args.grid in ("spell", "sparse"):
    env = SPELL_ENV if args.grid == "spell" else SPARSE_ENV
    report = spell_report(
        args.root,
        args.out,
        env=env,
        extra=args.extra,
        rl_extra=args.rl_extra,
        archive=args.archive,
    )
    print(json.dumps({"report": report["markdown"]}))
  elif args.grid == "study":
    for env in dict.fromkeys(e for e, _ in pairs):
      study_report(
          args.root,
          env,
          args.out,
          rl_extra=args.rl_extra,
          archive=args.archive,
          extra=args.extra,
      )
      print(json.dumps({"report": os.path.join(args.out, f"study_{env}.md")}))
  elif args.grid == "main":
    for env in dict.fromkeys(e for e, _ in pairs):
      env_report(args.root, env, args.out, archive=args.archive)
      print(json.dumps({"report": os.path.join(args.out, f"{env}.md")}))
  else:
    for env, algo in pairs:
      path = ablation_report(
          args.root, env, algo, args.out, archive=args.archive
      )
      print(json.dumps({"report": path}))
  if failed:
    print(
        f"reproduce.py: {len(failed)} run(s) failed: "
        f"{[r['run'] for r in failed]}",
        file=sys.stderr,
    )
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
