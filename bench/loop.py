"""Wall seconds per phase of an A step, before and after, as JSON lines.

  python bench/loop.py [--envs webshop,alfworld] [--steps 2] [--warmup 1]
      [--before 647c592] [--sft_steps 100] [--bc_steps 5] [--eval_tasks 32]

For each environment, one shared starting policy (the nano preset,
behaviour-cloned ``--sft_steps`` steps by the working tree, or random with
0; cached under ``--cache_dir``) is loaded by two subprocesses, each running
the RSPO loop's A step (GRPO: every group fresh) at the paper's batch shape,
``--tasks`` x ``--group`` episodes (16 x 8):

  * ``before``: the code of commit ``--before`` (a ``git worktree`` checkout
    under /tmp, first on ``PYTHONPATH``),
  * ``after``: the working tree.

``--before=.`` runs the working tree on both sides, and
``--before_overrides`` / ``--after_overrides`` give each side its own
config overrides: one setting measured side by side in one run, e.g. pi_old
recomputed (before) against taken from sampling (after)::

  python bench/loop.py --envs webshop --before=. --eval_tasks 0 \
      --bc_steps 0 --before_overrides algo.recompute_old_logprobs=True

Both run the same settings (``--overrides`` on top of the config; each
worker echoes the resolved values) and are timed from outside, by wrapping
the loop's parts, so old and new code are measured alike. Phases
(exclusive wall seconds per timed step, their mean over ``--steps`` steps
after ``--warmup`` untimed ones, which compile):

  weight_sync   trainer.sync_engine
  generation    engine.generate
  environment   venv.reset, venv.step_async, waiting for the step results
  prompts       the rest of a collection: prompt building, tokenization,
                reply decoding and parsing, records
  batching      records -> padded batches
  logprobs      Learner.apply (old and reference log-probs)
  update        Learner.train
  checkpoint    trainer.save
  other         the rest of the A step (advantages, metrics)
  evaluation    one greedy evaluation on ``--eval_tasks`` held-out tasks
                (timed once; its own breakdown under ``evaluation_phases``)

Also: episodes/s (episodes of a step / its wall time, checkpoint included),
the XLA compilations per phase during the timed steps and ``steady_*``
numbers without their seconds (a step that meets a new shape bucket
compiles; both sides do), the collection's statistics (so the two sides'
work can be compared), and the seconds of one behaviour-cloning step of the
config's SFT batch (``--bc_steps``). Per side one JSON line; the last line
is {"env": ..., "before": ..., "after": ..., "speedup": before / after}.
``--lock FILE`` holds ``flock FILE`` around each subprocess (a shared
machine: time nothing while something else runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = (
    "weight_sync",
    "generation",
    "environment",
    "prompts",
    "batching",
    "logprobs",
    "update",
    "checkpoint",
    "other",
)
# Per environment: the CPU recipe's episode settings (explicit, so both
# sides run the same ones whatever their config defaults).
ENV_OVERRIDES = {
    "webshop": "env.history_length=1,env.max_steps=8",
    "alfworld": "env.history_length=2,env.max_steps=20",
}
COMMON = (
    "model=nano,rspo=0,rollout.max_new_tokens=64,"
    "rollout.max_prompt_tokens=768,train.max_train_rows=64"
)
ECHO = (
    "train.batch_tasks",
    "train.group_size",
    "train.max_train_rows",
    "rollout.max_new_tokens",
    "rollout.max_prompt_tokens",
    "rollout.temperature",
    "env.history_length",
    "env.max_steps",
    "env.num_workers",
    "env.kwargs",
    "sft.batch_rows",
    "model.dtype",
)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--envs", default="webshop,alfworld")
  p.add_argument("--steps", type=int, default=2, help="timed A steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed A steps")
  p.add_argument("--tasks", type=int, default=16)
  p.add_argument("--group", type=int, default=8)
  p.add_argument(
      "--before",
      default="647c592",
      help="commit to compare against ('' = after only)",
  )
  p.add_argument("--sides", default="before,after")
  p.add_argument(
      "--sft_steps",
      type=int,
      default=100,
      help="behaviour-cloning steps of the shared start (0: random)",
  )
  p.add_argument(
      "--bc_steps",
      type=int,
      default=5,
      help="timed behaviour-cloning steps (0: skip)",
  )
  p.add_argument("--eval_tasks", type=int, default=32, help="0: skip")
  p.add_argument("--overrides", default="", help="more config overrides")
  p.add_argument(
      "--before_overrides",
      default="",
      help="config overrides of the before side only",
  )
  p.add_argument(
      "--after_overrides",
      default="",
      help="config overrides of the after side only",
  )
  p.add_argument(
      "--cache_dir",
      default=os.path.join(tempfile.gettempdir(), "rspo_bench_loop"),
  )
  p.add_argument(
      "--lock",
      default="",
      help="flock this file around each timed subprocess (a"
      " shared machine: nothing else CPU-heavy runs meanwhile)",
  )
  p.add_argument("--role", default="main", choices=("main", "init", "worker"))
  p.add_argument("--env", default="")
  p.add_argument("--init_dir", default="")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  if args.role == "init":
    return _init(args)
  if args.role == "worker":
    return _worker(args)
  sides = [s for s in args.sides.split(",") if s]
  if not args.before:
    sides = [s for s in sides if s != "before"]
  for env in args.envs.split(","):
    init_dir = _shared_start(args, env)
    row = {
        "env": env,
        "episodes_per_step": args.tasks * args.group,
        "start": init_dir,
    }
    for side in sides:
      root = (
          _checkout(args.before)
          if side == "before" and args.before != "."
          else ROOT
      )
      row[side] = _run_side(
          args, env, init_dir, root, getattr(args, f"{side}_overrides")
      )
      row[side]["side_overrides"] = getattr(args, f"{side}_overrides")
      print(json.dumps({"env": env, "side": side, **row[side]}), flush=True)
    if "before" in row and "after" in row:
      row["speedup"] = _speedup(row["before"], row["after"])
    print(json.dumps(row), flush=True)


# ------------------------------------------------------------------ main side
def _speedup(before: dict, after: dict) -> dict:
  out = {}
  for key in ("step_s", "steady_step_s", "evaluation_s", "bc_step_s"):
    b, a = before.get(key), after.get(key)
    if b and a:
      out[key] = round(b / a, 2)
  if before.get("config") != after.get("config"):
    out["warning"] = "the two sides resolved different settings"
  return out


def _checkout(commit: str) -> str:
  """A worktree of ``commit`` under the temp dir (made once, reused)."""
  path = os.path.join(tempfile.gettempdir(), f"rspo_before_{commit}")
  if not os.path.isdir(path):
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "--detach", path, commit],
        check=True,
        capture_output=True,
    )
  return path


def _overrides(args, env: str, side: str = "") -> str:
  parts = [
      COMMON,
      ENV_OVERRIDES.get(env, ""),
      f"train.batch_tasks={args.tasks},train.group_size={args.group}",
      args.overrides,
      side,
  ]
  return ",".join(p for p in parts if p)


def _subprocess(args, root: str, extra: list[str]) -> dict:
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
  with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--out",
        out.name,
        "--cache_dir",
        args.cache_dir,
        *extra,
    ]
    if args.lock:
      cmd = ["flock", args.lock] + cmd
    subprocess.run(cmd, env=env, cwd=root, check=True)
    return json.load(open(out.name))


def _shared_start(args, env: str) -> str:
  path = os.path.join(
      args.cache_dir, f"{env}_sft{args.sft_steps}", "warm_start"
  )
  if not os.path.exists(os.path.join(path, "config.json")):
    _subprocess(
        args,
        ROOT,
        [
            "--role",
            "init",
            "--env",
            env,
            "--sft_steps",
            str(args.sft_steps),
            "--overrides",
            args.overrides,
        ],
    )
  return path


def _run_side(
    args, env: str, init_dir: str, root: str, side_overrides: str = ""
) -> dict:
  return _subprocess(
      args,
      root,
      [
          "--role",
          "worker",
          "--env",
          env,
          "--init_dir",
          init_dir,
          "--steps",
          str(args.steps),
          "--warmup",
          str(args.warmup),
          "--tasks",
          str(args.tasks),
          "--group",
          str(args.group),
          "--bc_steps",
          str(args.bc_steps),
          "--eval_tasks",
          str(args.eval_tasks),
          "--overrides",
          _overrides(args, env, side_overrides),
      ],
  )


# ------------------------------------------------------------------ init
def _init(args):
  """The shared start: the config's tokenizer and a nano policy cloned for
  ``--sft_steps`` steps (cached like a run's warm start)."""
  from configs import base
  from rspo_jax import build, sharding

  sft = f"sft.steps={args.sft_steps}" if args.sft_steps else "sft.enabled=0"
  cfg = base.make_config(
      args.env,
      "grpo",
      ",".join(p for p in ("model=nano", sft, args.overrides) if p),
  )
  with cfg.unlocked():  # clone here, not from a committed warm start
    cfg.model.checkpoint_dir = ""
  workdir = os.path.join(args.cache_dir, f"{args.env}_sft{args.sft_steps}")
  mesh = sharding.make_mesh(tuple(cfg.mesh.shape))
  tokenizer, tok_dir = build.make_tokenizer(cfg, workdir)
  t0 = time.perf_counter()
  build.warm_started_policy(
      cfg, tokenizer, tok_dir, mesh, workdir, progress=False
  )
  _write(args.out, {"seconds": time.perf_counter() - t0})


# ------------------------------------------------------------------ worker
def _load_timer():
  """The working tree's ``rspo_jax/timing.py`` (the 'before' side's
  package may not have it), counting compilations."""
  path = os.path.join(ROOT, "rspo_jax", "timing.py")
  spec = importlib.util.spec_from_file_location("_bench_timing", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.PhaseTimer(count_compiles=True)


def _instrument(run, timer) -> None:
  """Wraps the loop's parts in phases."""
  from rspo_jax import batching
  from rspo_jax.learner import Learner

  trainer = run.trainer
  run.engine.generate = timer.wrap(run.engine.generate, "generation")
  venv = run.venv
  step_async = venv.step_async

  def timed_step_async(actions):
    with timer.phase("environment"):
      handle = step_async(actions)
    handle.wait = timer.wrap(handle.wait, "environment")
    return handle

  venv.step_async = timed_step_async
  venv.reset = timer.wrap(venv.reset, "environment")
  trainer.collect_groups = timer.wrap(trainer.collect_groups, "prompts")
  trainer.sync_engine = timer.wrap(trainer.sync_engine, "weight_sync")
  trainer.save = timer.wrap(trainer.save, "checkpoint")
  Learner.apply = timer.wrap(Learner.apply, "logprobs")
  Learner.train = timer.wrap(Learner.train, "update")
  batching.records_to_batch = timer.wrap(batching.records_to_batch, "batching")


def _worker(args):
  import numpy as np
  from configs import base
  from rspo_jax import build

  cfg = base.make_config(
      args.env,
      "grpo",
      ",".join([args.overrides, f"model.checkpoint_dir={args.init_dir}"]),
  )
  out = {"root": os.getcwd(), "config": {k: _get(cfg, k) for k in ECHO}}
  workdir = tempfile.mkdtemp(prefix=f"bench_loop_{args.env}_")
  run = build.build_run(cfg, workdir, progress=False)
  timer = _load_timer()
  _instrument(run, timer)
  trainer = run.trainer
  trainer.state.phase = "A"

  def a_step():
    t0 = time.perf_counter()
    with timer.phase("other"):
      m = trainer.a_step()
      trainer.state.a_steps += 1
      trainer.save()
    return time.perf_counter() - t0, m

  first = [a_step()[0] for _ in range(args.warmup)]
  timer.reset()
  walls, phases, stats, compiles, compile_s = [], [], [], {}, []
  for _ in range(args.steps):
    wall, m = a_step()
    walls.append(wall)
    for k, n in timer.compiles().items():
      compiles[k] = compiles.get(k, 0) + n
    compile_s.append(sum(timer.compile_seconds().values()))
    phases.append(timer.reset())
    stats.append(
        {
            k[len("rollout_") :]: v
            for k, v in m.items()
            if k.startswith("rollout_")
        }
    )
  n_eps = args.tasks * args.group
  step_s = float(np.mean(walls))
  # Steady state: less the seconds of compilations that happened in the
  # timed steps (new shape buckets; both sides meet some).
  steady_s = step_s - float(np.mean(compile_s))
  out.update(
      {
          "warmup_step_s": [round(x, 2) for x in first],
          "step_s": round(step_s, 3),
          "steady_step_s": round(steady_s, 3),
          "episode_s": round(step_s / n_eps, 4),
          "episodes_per_s": round(n_eps / step_s, 4),
          "steady_episodes_per_s": round(n_eps / steady_s, 4),
          "phases_s": {
              k: round(float(np.mean([p.get(k, 0.0) for p in phases])), 3)
              for k in PHASES
          },
          "compiles_in_timed_steps": compiles,
          "compile_s_per_step": round(float(np.mean(compile_s)), 2),
          "rollout": {
              k: round(float(np.mean([s.get(k, 0.0) for s in stats])), 3)
              for k in (
                  "success_rate",
                  "episode_length",
                  "env_steps",
                  "gen_tokens",
                  "invalid_action_rate",
              )
          },
      }
  )
  if args.eval_tasks:
    t0 = time.perf_counter()
    with timer.phase("evaluation"):
      ev = run.evaluate(trainer.a, trainer.state.a_steps)
    out["evaluation_s"] = round(time.perf_counter() - t0, 2)
    out["evaluation_compiles"] = timer.compiles()
    out["evaluation_phases"] = {
        k: round(v, 3) for k, v in timer.reset().items()
    }
    out["evaluation_success"] = ev.get("success_rate")
  if args.bc_steps:
    out.update(_bc_timing(cfg, run, args.bc_steps))
  run.close()
  _write(args.out, out)


def _bc_timing(cfg, run, steps: int) -> dict:
  """Seconds of one behaviour-cloning step (the config's SFT batch and
  loss, on expert rows of 128 tasks), after 2 untimed steps."""
  from rspo_jax import build, train_step as ts, warm_start

  eps = warm_start.expert_episodes(
      cfg.env.name,
      build.env_kwargs(cfg),
      range(128),
      split=cfg.env.train_split,
      max_steps=cfg.env.max_steps,
  )
  records = warm_start.sft_records(
      eps,
      run.tokenizer,
      cfg.env.name,
      history_length=cfg.env.history_length,
      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
  )
  learner = build.make_policy_learner(
      cfg,
      run.trainer.a.module(),
      run.mesh,
      lr=1e-4,
      loss_fn=ts.make_sft_loss(float(cfg.sft.prompt_loss_weight)),
  )
  max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
  kw = dict(batch_rows=cfg.sft.batch_rows, max_len=max_len, progress=False)
  warm_start.train_sft(learner, records, steps=2, seed=0, **kw)
  t0 = time.perf_counter()
  warm_start.train_sft(learner, records, steps=steps, seed=1, **kw)
  return {
      "bc_step_s": round((time.perf_counter() - t0) / steps, 3),
      "bc_rows": len(records),
  }


def _get(cfg, key: str):
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node.to_dict() if hasattr(node, "to_dict") else node


def _write(path: str, obj: dict) -> None:
  if path:
    with open(path, "w") as f:
      json.dump(obj, f)
  else:
    print(json.dumps(obj))


if __name__ == "__main__":
  main()
