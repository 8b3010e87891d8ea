"""Full multi-turn collection speed: one JSON line per (env, engine, batch).

  python bench/rollout.py [--envs webshop,alfworld] [--batches 16,128]
      [--sglang_url http://127.0.0.1:30000] [--max_steps 4]

Episodes come in groups of 8 sharing a task (GRPO/GiGPO), a random policy
of the environment config's preset (WebShop, ALFWorld: nano, 0.63 M
parameters; vocab from a tokenizer trained here on expert episodes), or
with ``--model_path`` a given policy (e.g. a run's behaviour-cloned
``warm_start``, whose replies end at ``</action>`` after varying lengths),
answers at temperature 1, and the environments step in worker processes.
Reported: generated tokens/s (generation time only), environment steps/s
(environment time only), the wall time of the whole collection, episodes/s
(episodes / wall), the generation seconds, the decode steps on the
critical path with and without turn barriers (``decode_paths``) and the
prompt tokens a group shares at later turns (``group_prefixes``), and the
prompt columns the in-process engine prefilled (``--shared_prefix`` adds
the engine with shared prefix blocks, ``--length_group_rows 0`` one chunk a
turn, as on accelerators; ``--engine_max_rows N`` adds the engine with
``rollout.engine_max_rows=N``, its calls cut into chunks of at most N rows,
beside the one that takes a turn's rows at once). With
``--sglang_url`` the same collection also runs against that server (serving
a model of the same shape and tokenizer, e.g. ``launch/serve_rollout.py
--model_path=<--export_dir>``), turn by turn (``collect``) and, as engine
``sglang_unbarriered``, without turn barriers (``collect_unbarriered``).

  python bench/rollout.py --server_steps --sglang_url URL [--batches 1,8,128]

times that server's decode step per number of rows running (does an idle
row cost a step, as on a GPU, or nothing, as on this CPU server?).

  python bench/rollout.py --sync [--presets tiny,small-25m]

times the SGLang weight sync instead: the old export (``save_hf_model``,
one file, float32 here) and the streamed one (``weight_sync.export_hf``,
threads), to /dev/shm and to ``--export_dir`` (disk), then a whole sync
(export + our SGLang-API server loading it) and a second sync of the same
weights (skipped: no export).

  python bench/rollout.py --lora_sync 16 [--presets tiny,small-25m]

compares a weight sync of the whole model with one of LoRA adapters of
that rank (models/lora.py; docs/performance.md, LoRA): the bytes a sync
must move (the model in the engine's dtype; the adapters in float32),
the seconds of an in-process JaxEngine sync (LoRA: merged on device,
W + (alpha / r) A B, then handed over) and of the export an SGLang sync
writes (the HF directory; LoRA: the PEFT adapter directory alone).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

GROUP = 8


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--envs", default="webshop,alfworld")
  p.add_argument("--batches", default="16,128")
  p.add_argument("--max_steps", type=int, default=4)
  p.add_argument("--max_new_tokens", type=int, default=32)
  p.add_argument(
      "--max_prompt_tokens",
      type=int,
      default=0,
      help="0 = the environment config's (WebShop: 768)",
  )
  p.add_argument("--sglang_url", default="")
  p.add_argument("--export_dir", default="", help="write the bench model here")
  p.add_argument(
      "--model_path",
      default="",
      help="an HF policy directory (with its tokenizer) instead of"
      " random weights, e.g. a run's warm_start",
  )
  p.add_argument("--workers", type=int, default=2)
  p.add_argument(
      "--sync",
      action="store_true",
      help="time weight syncs instead of collections",
  )
  p.add_argument("--presets", default="tiny,small-25m")
  p.add_argument(
      "--lora_sync",
      type=int,
      default=0,
      help="a LoRA rank: compare full and LoRA weight syncs",
  )
  p.add_argument(
      "--repeats",
      type=int,
      default=3,
      help="timed runs: collections (engines take turns, median"
      " reported), syncs and server steps (best of)",
  )
  p.add_argument(
      "--server_steps",
      action="store_true",
      help="time the --sglang_url server's decode step per batch"
      " size instead of collections",
  )
  p.add_argument("--prompt_tokens", type=int, default=300)
  p.add_argument(
      "--prefill_share",
      action="store_true",
      help="also time the in-process engine on the collection's"
      " prompts with 1 new token (prefill) against the whole",
  )
  p.add_argument(
      "--shared_prefix",
      action="store_true",
      help="also run the in-process engine with shared prefix"
      " blocks (engine 'jax_shared_prefix'; 'jax' is the"
      " default, without), and report the prompt columns each"
      " prefilled",
  )
  p.add_argument(
      "--engine_max_rows",
      type=int,
      default=0,
      help="also run the in-process engine with"
      " rollout.engine_max_rows=N (engine 'jax_max_rowsN')",
  )
  p.add_argument(
      "--length_group_rows",
      type=int,
      default=-1,
      help="the in-process engine's length_group_rows (-1: its"
      " default, 8 on CPU; 0: one chunk per turn, as on GPUs)",
  )
  p.add_argument(
      "--shared_heads",
      default="",
      help="comma-separated head lengths: time the in-process"
      " engine's prefill (1 new token) of 16 groups x 8 prompts of"
      " ~--prompt_tokens random tokens whose group shares its first"
      " N, with and without shared prefix blocks (one chunk)",
  )
  p.add_argument(
      "--server_log",
      default="",
      help="the --sglang_url server's log: count its prefill"
      " forwards ('Prefill batch' lines) per collection",
  )
  args = p.parse_args(argv)
  if args.lora_sync:
    return bench_lora_sync(args)
  if args.sync:
    return bench_sync(args)
  if args.shared_heads:
    return bench_shared_heads(args)
  if args.server_steps:
    if not args.sglang_url:
      p.error("--server_steps needs --sglang_url")
    return bench_server_steps(args)

  from configs import base
  from rspo_jax import build, models, sharding
  from rspo_jax.rollout.collect import CollectRequest
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
    mesh = sharding.make_mesh((-1, 1, 1))
    if args.model_path:
      with cfg.unlocked():
        cfg.model.checkpoint_dir = args.model_path
      tokenizer, _ = build.make_tokenizer(cfg, "")
      mcfg, module = build.load_policy(cfg, args.model_path, mesh)
    else:
      work = args.export_dir or tempfile.mkdtemp(prefix=f"bench_{env_name}_")
      tokenizer, tok_dir = build.make_tokenizer(cfg, work)
      mcfg = build.model_config(cfg, tokenizer)
      module = models.create_model(mcfg, seed=0)
      models.save_hf_model(
          module, mcfg, os.path.join(work, "model"), tokenizer_dir=tok_dir
      )
    engines = {"jax": build.make_engine(cfg, mcfg, module, tokenizer, mesh)}
    if args.shared_prefix:
      with cfg.unlocked():
        cfg.rollout.shared_prefix_prefill = True
      engines["jax_shared_prefix"] = build.make_engine(
          cfg, mcfg, module, tokenizer, mesh
      )
    if args.engine_max_rows:
      with cfg.unlocked():
        cfg.rollout.shared_prefix_prefill = False
        cfg.rollout.engine_max_rows = args.engine_max_rows
      engines[f"jax_max_rows{args.engine_max_rows}"] = build.make_engine(
          cfg, mcfg, module, tokenizer, mesh
      )
    if args.length_group_rows >= 0:
      for name in engines:
        engines[name]._group_rows = args.length_group_rows  # bench knob
    if args.sglang_url:
      from rspo_jax.rollout.sglang_client import SGLangClient

      engines["sglang"] = SGLangClient(args.sglang_url)
      engines["sglang_unbarriered"] = engines["sglang"]
    ccfg = build.collect_config(cfg, "train")
    ccfg = type(ccfg)(
        **{
            **ccfg.__dict__,
            "max_steps": args.max_steps,
            "max_prompt_tokens": (
                args.max_prompt_tokens or ccfg.max_prompt_tokens
            ),
        }
    )
    sampling = SamplingParams(
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        stop_strings=("</action>",),
    )
    for batch in [int(b) for b in args.batches.split(",")]:
      venv = VectorEnv(env_name, {}, batch, num_workers=args.workers)
      try:
        tasks = list(range(batch // GROUP))
        for name, engine in engines.items():  # warm-up: compiles every bucket
          _play(name)(
              engine,
              venv,
              tokenizer,
              CollectRequest(tasks, GROUP, sampling, seed=1),
              ccfg,
          )
        walls = {name: [] for name in engines}
        for rep in range(args.repeats):  # engines take turns: drift is shared
          for name, engine in engines.items():
            prefills = _prefill_forwards(args.server_log, name)
            columns = getattr(engine, "prefill_columns", None)
            t0 = time.perf_counter()
            records, stats = _play(name)(
                engine,
                venv,
                tokenizer,
                CollectRequest(tasks, GROUP, sampling, seed=2 + rep),
                ccfg,
            )
            wall = time.perf_counter() - t0
            walls[name].append(wall)
            paths = {**decode_paths(records), **group_prefixes(records)}
            if columns is not None:
              done, without = np.subtract(engine.prefill_columns, columns)
              paths["prefill_columns"] = int(done)
              paths["prefill_columns_saved"] = round(1 - done / without, 3)
            if args.prefill_share and name == "jax":
              paths["prefill_share"] = prefill_share(engine, records, sampling)
            if prefills is not None:
              time.sleep(0.5)  # the server logs after it answers
              paths["server_prefill_forwards"] = (
                  _prefill_forwards(args.server_log, name) - prefills
              )
            print(
                json.dumps(
                    {
                        "env": env_name,
                        "engine": name,
                        "batch": batch,
                        "repeat": rep,
                        "group": GROUP,
                        "params": mcfg.num_params(),
                        "gen_tokens_per_s": round(stats["gen_tokens_per_s"], 1),
                        "env_steps_per_s": round(stats["env_steps_per_s"], 1),
                        "gen_tokens": stats["gen_tokens"],
                        "env_steps": stats["env_steps"],
                        "wall_s": round(wall, 2),
                        "episodes_per_s": round(batch / wall, 2),
                        "generation_s": round(
                            stats.get("generation_s", 0.0), 2
                        ),
                        **paths,
                    }
                ),
                flush=True,
            )
        for name, w in walls.items():
          print(
              json.dumps(
                  {
                      "env": env_name,
                      "engine": name,
                      "batch": batch,
                      "summary": True,
                      "walls_s": [round(x, 2) for x in w],
                      "median_wall_s": round(float(np.median(w)), 2),
                      "median_episodes_per_s": round(
                          batch / float(np.median(w)), 2
                      ),
                      "compiled_shapes": getattr(
                          engines[name], "num_compilations", None
                      ),
                  }
              ),
              flush=True,
          )
      finally:
        venv.close()


def _play(engine_name: str):
  from rspo_jax.rollout.collect import collect
  from rspo_jax.rollout.unbarriered import collect_unbarriered

  return (
      collect_unbarriered if engine_name.endswith("_unbarriered") else collect
  )


def _prefill_forwards(server_log: str, engine_name: str):
  """'Prefill batch' lines in an SGLang server's log so far (None: no log
  given, or an engine that is not the server)."""
  if not server_log or not engine_name.startswith("sglang"):
    return None
  with open(server_log, errors="replace") as f:
    return f.read().count("Prefill batch")


def decode_paths(records) -> dict:
  """Decode steps on a collection's critical path, with and without turn
  barriers, from its records (``len(response_ids)`` = reply tokens l_{i,t}
  of episode i at turn t):

    barriered_steps = sum_t max_i l_{i,t}   (turn t + 1 waits for turn t's
                                             longest reply)
    free_steps      = max_i sum_t l_{i,t}   (each episode goes on alone)

  When a decode step costs the same whatever the number of rows running
  (a GPU decoding a few hundred rows: memory-bound on the weights),
  ``barrier_bound = barriered_steps / free_steps`` bounds what dropping the
  barriers can save (prefill and environment time aside). When a step's
  cost grows with the rows running (this CPU server, ``--server_steps``),
  the rows that finished early cost nothing while they wait, and there is
  little to save."""
  turns, episodes = {}, {}
  for r in records:
    n = len(r.response_ids)
    turns[r.step_idx] = max(turns.get(r.step_idx, 0), n)
    episodes[r.traj_id] = episodes.get(r.traj_id, 0) + n
  barriered, free = sum(turns.values()), max(episodes.values(), default=0)
  return {
      "barriered_steps": barriered,
      "free_steps": free,
      "barrier_bound": round(barriered / free, 3) if free else None,
  }


def group_prefixes(records) -> dict:
  """How much a group's prompts share at turns t > 0 (turn 0's are
  identical and prefilled once already): per (group, turn) the longest
  common prefix LCP of its n prompts, and

    group_prefix_share = sum (n - 1) LCP / sum of all prompt tokens

  the prefill tokens that prefilling each group's prefix once would save."""
  prompts = {}
  total = 0
  for r in records:
    total += len(r.prompt_ids)
    if r.step_idx > 0:
      prompts.setdefault((r.group_id, r.step_idx), []).append(r.prompt_ids)
  saved, lcps = 0, []
  for ps in prompts.values():
    if len(ps) < 2:
      continue
    width = min(len(p) for p in ps)
    same = np.all(np.stack([p[:width] for p in ps]) == ps[0][:width], axis=0)
    lcp = int(width if same.all() else np.argmin(same))
    lcps.append(lcp)
    saved += lcp * (len(ps) - 1)
  return {
      "group_prefix_share": round(saved / total, 3) if total else None,
      "median_group_lcp": float(np.median(lcps)) if lcps else None,
  }


def prefill_share(engine, records, sampling) -> float:
  """Seconds generating each turn's recorded prompts with 1 new token (the
  prefill, and one step) over seconds with ``sampling``'s (whole
  generation); compiled first, one timed pass each."""
  from rspo_jax.rollout.engine import SamplingParams

  turns = {}
  for r in records:
    turns.setdefault(r.step_idx, []).append(r.prompt_ids.tolist())
  one = SamplingParams(temperature=1.0, max_new_tokens=1)
  seconds = [0.0, 0.0]
  for timed in (False, True):  # compile, then time
    for k, params in enumerate((one, sampling)):
      for prompts in turns.values():
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        seconds[k] += (time.perf_counter() - t0) * timed
  return round(seconds[0] / seconds[1], 3)


def bench_shared_heads(args):
  """Prefill seconds (best of ``--repeats``, 1 new token) and prompt
  columns of 128 prompts in 16 groups of 8 sharing their first N tokens
  (random tokens, lengths ``--prompt_tokens`` +- 40), the in-process engine
  with and without shared prefix blocks, one chunk (as on accelerators);
  ``--model_path`` or the WebShop preset's random nano policy."""
  from configs import base
  from rspo_jax import build, models, sharding
  from rspo_jax.rollout.engine import SamplingParams
  from rspo_jax.rollout.jax_engine import JaxEngine

  cfg = base.make_config("webshop", "grpo")
  mesh = sharding.make_mesh((-1, 1, 1))
  if args.model_path:
    mcfg, module = build.load_policy(cfg, args.model_path, mesh)
  else:
    tokenizer, _ = build.make_tokenizer(cfg, tempfile.mkdtemp())
    mcfg = build.model_config(cfg, tokenizer)
    module = models.create_model(mcfg, seed=0)
  engines = {
      shared: JaxEngine(
          build.inference_model(module, mcfg),
          build.engine_config(mcfg),
          pad_id=0,
          eos_ids=[1],
          length_group_rows=0,
          shared_prefix_prefill=shared,
      )
      for shared in (True, False)
  }
  rng = np.random.default_rng(0)
  one = SamplingParams(temperature=1.0, max_new_tokens=1, seed=0)
  for head in [int(h) for h in args.shared_heads.split(",")]:
    prompts = []
    for _ in range(16):
      shared = rng.integers(5, mcfg.vocab_size, head).tolist()
      prompts += [
          shared
          + rng.integers(
              5,
              mcfg.vocab_size,
              args.prompt_tokens - head + int(rng.integers(-40, 40)),
          ).tolist()
          for _ in range(GROUP)
      ]
    out = {"shared_head": head, "prompt_tokens": args.prompt_tokens}
    for shared, engine in engines.items():
      engine.generate(prompts, one)  # compile
      before = engine.prefill_columns
      best = _best_seconds(
          lambda e=engine: e.generate(prompts, one), args.repeats
      )
      done = (engine.prefill_columns[0] - before[0]) // args.repeats
      key = "shared_prefix" if shared else "plain"
      out |= {f"{key}_s": best, f"{key}_columns": int(done)}
    out["speedup"] = round(out["plain_s"] / out["shared_prefix_s"], 3)
    print(json.dumps(out), flush=True)


def _best_seconds(fn, repeats: int) -> float:
  """The fastest of ``repeats`` calls of ``fn``, in seconds (3 decimals)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return round(min(times), 3)


def bench_server_steps(args):
  """One JSON line per batch size: the SGLang server's seconds a decode step
  (``ignore_eos`` generations of 1 and 1 + 64 tokens, the difference / 64),
  per step and per row-step. Flat per step: barriers leave rows idle that
  cost a step each; proportional to the rows: idle rows cost nothing."""
  import urllib.request

  rng = np.random.default_rng(0)
  info = json.loads(
      urllib.request.urlopen(
          args.sglang_url + "/get_model_info", timeout=60
      ).read()
  )
  config = os.path.join(info.get("model_path", ""), "config.json")
  vocab = 256  # a model directory this machine cannot read: small ids
  if os.path.isfile(config):
    with open(config) as f:
      vocab = json.load(f)["vocab_size"]

  def seconds(rows, new_tokens):
    body = json.dumps(
        {
            "input_ids": [
                rng.integers(3, vocab, args.prompt_tokens).tolist()
                for _ in range(rows)
            ],
            "sampling_params": {
                "max_new_tokens": new_tokens,
                "temperature": 1.0,
                "ignore_eos": True,
            },
        }
    ).encode()
    req = urllib.request.Request(
        args.sglang_url + "/generate",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    urllib.request.urlopen(req, timeout=600).read()
    return time.perf_counter() - t0

  for rows in [int(b) for b in args.batches.split(",")]:
    seconds(rows, 1)  # warm-up
    first = min(seconds(rows, 1) for _ in range(args.repeats))
    whole = min(seconds(rows, 65) for _ in range(args.repeats))
    step = max(whole - first, 0.0) / 64
    print(
        json.dumps(
            {
                "server": args.sglang_url,
                "rows": rows,
                "prompt_tokens": args.prompt_tokens,
                "decode_step_ms": round(step * 1e3, 2),
                "row_step_ms": round(step * 1e3 / rows, 3),
            }
        ),
        flush=True,
    )


def bench_sync(args):
  """One JSON line per (preset, what): seconds of the exports and syncs."""
  import shutil
  import threading

  from rspo_jax import build, models, sharding, train_step as ts
  from rspo_jax import weight_sync
  from rspo_jax.learner import Learner
  from rspo_jax.rollout import http_server
  from rspo_jax.rollout.jax_engine import JaxEngine
  from rspo_jax.rollout.sglang_client import SGLangClient

  disk = args.export_dir or tempfile.mkdtemp(prefix="bench_sync_")
  shm = (
      tempfile.mkdtemp(prefix="bench_sync_", dir="/dev/shm")
      if os.path.isdir("/dev/shm")
      else None
  )
  for preset in args.presets.split(","):
    mcfg = models.get_model_config(preset)
    module = models.create_model(mcfg, seed=0)
    base = {
        "preset": preset,
        "params": mcfg.num_params(),
        "dtype": models.export_dtype(mcfg),
    }

    best = lambda fn: _best_seconds(fn, args.repeats)

    for where, root in (("disk", disk), ("shm", shm)):
      if root is None:
        continue
      old = best(
          lambda: models.save_hf_model(module, mcfg, os.path.join(root, "old"))
      )
      new = best(
          lambda: weight_sync.export_hf(module, mcfg, os.path.join(root, "new"))
      )
      print(
          json.dumps(
              {
                  **base,
                  "what": f"export_{where}",
                  "save_hf_model_s": old,
                  "export_hf_s": new,
              }
          ),
          flush=True,
      )
    engine = JaxEngine(
        models.create_model(mcfg, seed=1), mcfg, pad_id=0, eos_ids=(0,)
    )
    srv = http_server.make_server(engine, port=0)
    threading.Thread(
        target=srv.serve_forever, args=(0.05,), daemon=True
    ).start()
    client = SGLangClient(f"http://127.0.0.1:{srv.server_address[1]}")
    learner = Learner(
        module,
        ts.make_optimizer(1e-3),
        ts.make_sft_loss(),
        mesh=sharding.make_mesh((1, -1, 1)),
        rules=sharding.DEFAULT_RULES,
    )
    sync = build.make_sync_engine(mcfg, None, shm or disk)
    sync(client, learner, 1)
    t0 = time.perf_counter()
    sync(client, learner, 2)  # unchanged weights
    skip_s = time.perf_counter() - t0
    first, second = sync.log.history
    print(
        json.dumps(
            {
                **base,
                "what": "sync",
                "export_s": round(first["export_s"], 3),
                "load_s": round(first["load_s"], 3),
                "total_s": round(first["total_s"], 3),
                "unchanged_sync_s": round(skip_s, 4),
                "unchanged_sync_exports": sync.log.exports - 1,
                "unchanged_sync_skipped": bool(second.get("skipped")),
            }
        ),
        flush=True,
    )
    client.close()
    srv.shutdown()
    srv.server_close()
  if shm:
    shutil.rmtree(shm, ignore_errors=True)


def bench_lora_sync(args):
  """One JSON line per (preset, full | lora): bytes and seconds of a sync
  (module docstring, ``--lora_sync``)."""
  import dataclasses
  import shutil

  import jax
  import jax.numpy as jnp

  from rspo_jax import build, models, sharding, train_step as ts
  from rspo_jax import weight_sync
  from rspo_jax.learner import Learner
  from rspo_jax.models import lora
  from rspo_jax.rollout.jax_engine import JaxEngine

  root = tempfile.mkdtemp(prefix="bench_lora_sync_")
  rank = args.lora_sync
  for preset in args.presets.split(","):
    mcfg = models.get_model_config(preset)
    module = models.create_model(mcfg, seed=0)
    lcfg = dataclasses.replace(mcfg, lora_rank=rank, lora_alpha=2.0 * rank)
    cases = (
        ("full", mcfg, module),
        ("lora", lcfg, lora.add_adapters(module, lcfg, seed=1)),
    )
    for name, cfg, mod in cases:
      learner = Learner(
          mod,
          ts.make_optimizer(1e-3),
          ts.make_sft_loss(),
          mesh=sharding.make_mesh((1, -1, 1)),
          rules=sharding.DEFAULT_RULES,
      )
      engine = JaxEngine(
          build.inference_model(learner.module(), cfg),
          build.engine_config(cfg),
          pad_id=0,
          eos_ids=(0,),
      )
      sync = build.make_sync_engine(cfg, None, root)
      version = [0]

      def one():  # new trained arrays each time (no skip), then the sync
        learner.state = jax.tree.map(jnp.copy, learner.state)
        version[0] += 1
        sync(engine, learner, version[0])
        jax.block_until_ready(engine._params)  # pylint: disable=protected-access

      one()  # compiles the cast / merge
      seconds = _best_seconds(one, args.repeats)
      out = os.path.join(root, name)
      if name == "lora":
        export = lambda: lora.save_peft(learner.module(), cfg, out)
      else:
        export = lambda: weight_sync.export_hf(learner.module(), cfg, out)
      nbytes = export()
      export_s = _best_seconds(export, args.repeats)
      moved = (
          lora.nbytes(learner.params)
          if name == "lora"
          else lora.nbytes(build.inference_model(learner.module(), cfg)[1])
      )
      print(
          json.dumps(
              {
                  "preset": preset,
                  "what": name,
                  "rank": rank if name == "lora" else 0,
                  "params": mcfg.num_params(),
                  "trainable": int(
                      sum(x.size for x in jax.tree.leaves(learner.params))
                  ),
                  "sync_bytes": moved,
                  "jax_engine_sync_s": seconds,
                  "export_bytes": int(nbytes),
                  "export_s": export_s,
              }
          ),
          flush=True,
      )
      getattr(engine, "close", lambda: None)()
  shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()
