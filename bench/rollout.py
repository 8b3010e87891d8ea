"""Full multi-turn collection speed: one JSON line per (env, engine, batch).

  python bench/rollout.py [--envs webshop,alfworld] [--batches 16,128]
      [--sglang_url http://127.0.0.1:30000] [--max_steps 4]

Episodes come in groups of 8 sharing a task (GRPO/GiGPO), a tiny random
Qwen2-shaped policy (vocab from a tokenizer trained here on expert episodes)
answers at temperature 1, and the environments step in worker processes
(overlapped with generation). Reported: generated tokens/s (generation time
only), environment steps/s (environment time only) and the wall time of the
whole collection. With ``--sglang_url`` the same collection also runs
against that server (serving a model of the same shape and tokenizer, e.g.
``launch/serve_rollout.py --model_path=<--export_dir>``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


GROUP = 8


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--envs", default="webshop,alfworld")
  p.add_argument("--batches", default="16,128")
  p.add_argument("--max_steps", type=int, default=4)
  p.add_argument("--max_new_tokens", type=int, default=32)
  p.add_argument("--sglang_url", default="")
  p.add_argument("--export_dir", default="", help="write the bench model here")
  p.add_argument("--workers", type=int, default=2)
  args = p.parse_args(argv)

  from configs import base
  from rspo_jax import build, models, sharding
  from rspo_jax.rollout.collect import collect
  from rspo_jax.rollout.engine import SamplingParams
  from third_party_envs import registry
  from third_party_envs.vector import VectorEnv

  for env_name in args.envs.split(","):
    try:
      registry.make_env(env_name).close()
    except ImportError as e:
      print(json.dumps({"env": env_name, "skipped": str(e)}))
      continue
    cfg = base.make_config(env_name, "grpo")
    work = args.export_dir or tempfile.mkdtemp(prefix=f"bench_{env_name}_")
    tokenizer, tok_dir = build.make_tokenizer(cfg, work)
    mcfg = build.model_config(cfg, tokenizer)
    module = models.create_model(mcfg, seed=0)
    models.save_hf_model(module, mcfg, os.path.join(work, "model"),
                         tokenizer_dir=tok_dir)
    mesh = sharding.make_mesh((-1, 1, 1))
    engines = {"jax": build.make_engine(cfg, mcfg, module, tokenizer, mesh)}
    if args.sglang_url:
      from rspo_jax.rollout.sglang_client import SGLangClient

      engines["sglang"] = SGLangClient(args.sglang_url)
    ccfg = build.collect_config(cfg, "train")
    ccfg = type(ccfg)(**{**ccfg.__dict__, "max_steps": args.max_steps})
    sampling = SamplingParams(temperature=1.0,
                              max_new_tokens=args.max_new_tokens,
                              stop_strings=("</action>",))
    for batch in [int(b) for b in args.batches.split(",")]:
      venv = VectorEnv(env_name, {}, batch, num_workers=args.workers)
      try:
        for name, engine in engines.items():
          tasks = list(range(batch // GROUP))
          collect(engine, venv, tokenizer, tasks, GROUP, sampling, ccfg,
                  seed=1)  # warm-up: compiles every bucket
          t0 = time.perf_counter()
          _, stats = collect(engine, venv, tokenizer, tasks, GROUP, sampling,
                             ccfg, seed=2)
          wall = time.perf_counter() - t0
          print(json.dumps({
              "env": env_name, "engine": name, "batch": batch,
              "group": GROUP, "params": mcfg.num_params(),
              "gen_tokens_per_s": round(stats["gen_tokens_per_s"], 1),
              "env_steps_per_s": round(stats["env_steps_per_s"], 1),
              "gen_tokens": stats["gen_tokens"],
              "env_steps": stats["env_steps"], "wall_s": round(wall, 2),
          }), flush=True)
      finally:
        venv.close()


if __name__ == "__main__":
  main()
