"""Builds a run's parts from its config: mesh, tokenizer, policy (warm-started
on first use), reference policy, critic, engine, environments, trainer.

``launch/train.py`` is a thin shell over ``build_run``; tests call it too.

Multi-host (after ``distributed.initialize``): the leader trains the local
tokenizer and the warm start (on its own devices) while the others wait at
a barrier, then every process loads them; the learners live on the global
mesh, and each process's rollout engine on a mesh of its *local* devices
(``distributed.host_mesh``), fed with the learner's weights resharded
device to device onto it (``distributed.to_host_mesh``: no host copy). The
leader fits the PRM on its own devices; decoupled placement is refused with
more than one process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Optional

import jax
import numpy as np
from flax import nnx

from rspo_jax import compile_cache, distributed, losses, models, plan, sharding

# The engine's weights and their sync, re-exported as build's API.
from rspo_jax.engine_weights import (  # pylint: disable=unused-import
    WEIGHT_SYNCS as WEIGHT_SYNCS,
    base_model as base_model,
    cast_floating as cast_floating,
    engine_config as engine_config,
    engine_params as engine_params,
    inference_model as inference_model,
    inference_params as inference_params,
    make_sync_engine as make_sync_engine,
    make_weight_push as make_weight_push,
    merged as merged,
)
from rspo_jax import train_step as ts
from rspo_jax.errors import ConfigError
from rspo_jax.learner import Learner
from rspo_jax.models import lora
from rspo_jax.metrics import MetricsWriter, setup_wandb_from_config
from rspo_jax.rollout.collect import CollectConfig
from rspo_jax.rollout.jax_engine import JaxEngine
from rspo_jax.rspo import RSPOTrainer
from rspo_jax import warm_start, weight_sync
from third_party_envs import contract, registry
from third_party_envs.vector import VectorEnv

log = logging.getLogger(__name__)


def env_kwargs(cfg) -> dict:
  return dict(cfg.env.kwargs)


def num_tasks(cfg, split: str) -> int:
  env = registry.make_env(cfg.env.name, **env_kwargs(cfg))
  try:
    return env.num_tasks(split)
  finally:
    env.close()


def num_train_tasks(cfg) -> int:
  """Task ids ``0 .. n - 1`` of ``env.train_split`` that A and B train on:
  all of them, or the first ``env.train_tasks`` (ConfigError when the split
  has fewer)."""
  n = num_tasks(cfg, cfg.env.train_split)
  want = cfg.env.train_tasks
  if want > n:
    raise ConfigError(
        f"env.train_tasks={want} but split"
        f" {cfg.env.train_split!r} has {n} tasks"
    )
  return want or n


# ------------------------------------------------------------------ tokenizer
def make_tokenizer(cfg, workdir: str):
  """The checkpoint's tokenizer, or one trained locally on expert episodes
  (cached in ``<workdir>/tokenizer``)."""
  path = cfg.model.tokenizer_dir or cfg.model.checkpoint_dir
  if path:
    return models.load_tokenizer(path), path
  path = os.path.join(workdir, "tokenizer")
  if distributed.is_leader():  # multi-host: the leader trains, others wait
    _train_tokenizer(cfg, path)
  distributed.barrier("rspo_tokenizer")
  return models.load_tokenizer(path), path


def _train_tokenizer(cfg, path: str) -> None:
  if not os.path.exists(os.path.join(path, "tokenizer.json")):
    log.info(
        "training a %d-token tokenizer on expert episodes",
        cfg.model.tokenizer_vocab,
    )
    eps = warm_start.expert_episodes(
        cfg.env.name,
        env_kwargs(cfg),
        range(min(64, num_tasks(cfg, "train"))),
        split=cfg.env.train_split,
        max_steps=cfg.env.max_steps,
    )
    texts = [
        t
        for pair in warm_start.episode_texts(
            eps, cfg.env.name, cfg.env.history_length
        )
        for t in pair
    ]
    env = registry.make_env(cfg.env.name, **env_kwargs(cfg))
    try:
      words = env.tokenizer_words()
    finally:
      env.close()
    models.train_tokenizer(
        texts, cfg.model.tokenizer_vocab, path, whole_words=words
    )


# ------------------------------------------------------------------ models
def param_dtype(cfg) -> str:
  """The master weights' dtype: ``model.param_dtype``, float32 when unset.

  ``model.dtype`` is the compute dtype only. The optimizer state and the
  train step's gradient sums follow the parameters (optax and the step
  allocate them like the params), so they are float32 too.
  """
  return str(cfg.model.param_dtype or "float32")


def model_numerics(cfg) -> dict:
  """ModelConfig fields a run sets whatever the checkpoint says: dtypes,
  remat, scanned layers, attention implementation, activation sharding
  rules."""
  return {
      "dtype": cfg.model.dtype,
      "param_dtype": param_dtype(cfg),
      "remat": plan.remat_of(cfg),
      "scan_layers": bool(cfg.model.scan_layers),
      "attention": cfg.model.attention,
      "logical_axis_rules": cfg.logical_axis_rules,
  }


def model_config(cfg, tokenizer):
  overrides = model_numerics(cfg)
  for item in filter(None, cfg.model.overrides.split(";")):
    key, value = item.split("=")
    overrides[key.strip()] = int(value)
  if cfg.model.preset in models.LOCAL_TOKENIZER_PRESETS:
    overrides["vocab_size"] = models.local_vocab_size(len(tokenizer))
  return models.get_model_config(cfg.model.preset, **overrides)


def policy_loss_config(cfg, *, rspo: bool) -> losses.LossConfig:
  """The policy loss's knobs from ``algo``, ``rspo`` and ``rollout``, under
  the config's names; ``rspo=False`` (B, the baseline): no off-policy
  term, no centre cap."""
  a = cfg.algo
  return losses.LossConfig(
      alpha=cfg.rspo.alpha if rspo else 0.0,
      clip_eps=a.clip_eps,
      clip_eps_high=a.clip_eps_high,
      clip_window=a.clip_window,
      kl_coef=a.kl_coef,
      kl_kind=a.kl_kind,
      entropy_coef=a.entropy_coef,
      loss_agg=a.loss_agg,
      centre_cap=cfg.rspo.centre_cap if rspo else 0.0,
      centre_cap_mode=cfg.rspo.centre_cap_mode,
      clip_ratio_c=a.clip_ratio_c,
      overlap=bool(cfg.rollout.overlap),
  )


def critic_optimizer(cfg):
  """PPO critic's AdamW: ``algo.critic_lr``, the actor's grad clip and
  weight decay (verl's critic.optim: weight_decay 0.01, grad_clip 1.0);
  its LoRA adapters at critic_lr x ``lora.lr_multiplier``, its value head
  at critic_lr."""
  return ts.make_optimizer(
      cfg.algo.critic_lr,
      grad_clip=cfg.train.grad_clip,
      weight_decay=cfg.train.weight_decay,
      adapter_lr_multiplier=lora.lr_multiplier(cfg),
  )


def make_policy_learner(cfg, module, mesh, *, lr: float, loss_fn) -> Learner:
  """A policy Learner: AdamW at ``lr``, LoRA adapters at lr x
  ``lora.lr_multiplier`` (the warm start's module has none)."""
  tx = ts.make_optimizer(
      lr,
      grad_clip=cfg.train.grad_clip,
      weight_decay=cfg.train.weight_decay,
      warmup_steps=cfg.train.warmup_steps,
      adapter_lr_multiplier=lora.lr_multiplier(cfg),
  )
  return Learner(
      module,
      tx,
      loss_fn,
      mesh=mesh,
      rules=cfg.logical_axis_rules,
      micro_batch_rows=cfg.train.micro_batch_rows,
  )


def load_policy(cfg, path: str, mesh):
  """(ModelConfig, module) of the HF directory ``path`` with the run's
  numerics: compute in ``model.dtype``, ``param_dtype(cfg)`` masters
  whatever the files store, ``model.remat``."""
  return models.load_hf_model(
      path, mesh=mesh, rules=cfg.logical_axis_rules, **model_numerics(cfg)
  )


def lora_config(cfg, mcfg):
  """``mcfg`` with the run's LoRA fields (``model.lora_rank``, ``lora_alpha``,
  ``lora_targets``); ConfigError naming a bad one."""
  rank = int(cfg.model.lora_rank or 0)
  if not rank:
    return mcfg
  try:
    out = dataclasses.replace(
        mcfg,
        lora_rank=rank,
        lora_alpha=float(cfg.model.lora_alpha),
        lora_targets=lora.parse_targets(cfg.model.lora_targets),
    )
    lora.check(out)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  return out


def with_lora(cfg, mcfg, module, mesh):
  """(ModelConfig, module): the starting policy with fresh LoRA adapters
  on its frozen base when ``model.lora_rank`` > 0 (``lora.add_adapters``;
  the base in the compute dtype); else as it is."""
  lcfg = lora_config(cfg, mcfg)
  if not lora.enabled(lcfg):
    return mcfg, module
  return lcfg, lora.add_adapters(
      module, lcfg, seed=cfg.seed, mesh=mesh, rules=cfg.logical_axis_rules
  )


def reference_params(policy: Learner, mcfg):
  """pi_ref's params for ``policy.apply``: a copy of the starting params in
  the inference dtype; with LoRA the adapters off (all zero: the frozen
  base itself, no copy of it; ``lora.adapters_off``)."""
  if lora.enabled(mcfg):
    return lora.adapters_off(policy.params, policy.state_sh.params)
  return inference_params(policy.params, mcfg, policy.state_sh.params)


def warm_started_policy(
    cfg,
    tokenizer,
    tokenizer_dir,
    mesh,
    workdir,
    metrics: Optional[MetricsWriter] = None,
    progress: bool = True,
):
  """(ModelConfig, module): a checkpoint, the cached warm start, or a fresh
  tiny model behaviour-cloned on expert episodes (then cached)."""
  if cfg.model.checkpoint_dir:
    return load_policy(cfg, cfg.model.checkpoint_dir, mesh)
  ws_dir = os.path.join(workdir, "warm_start")
  if distributed.is_multihost():
    # The leader behaviour-clones on one of its devices (a jitted step may
    # take numpy input only when it is replicated); then every process
    # loads the result onto the global mesh.
    if distributed.is_leader():
      one = sharding.make_mesh((1, 1, 1), devices=jax.local_devices()[:1])
      _warm_start_here(
          cfg, tokenizer, tokenizer_dir, one, ws_dir, metrics, progress
      )
    distributed.barrier("rspo_warm_start")
    return load_policy(cfg, ws_dir, mesh)
  return _warm_start_here(
      cfg, tokenizer, tokenizer_dir, mesh, ws_dir, metrics, progress
  )


def _warm_start_here(
    cfg, tokenizer, tokenizer_dir, mesh, ws_dir, metrics, progress
):
  if os.path.exists(os.path.join(ws_dir, "config.json")):
    return load_policy(cfg, ws_dir, mesh)
  mcfg = model_config(cfg, tokenizer)
  module = models.create_model(mcfg, seed=cfg.seed)
  if cfg.sft.enabled:
    n_train = num_tasks(cfg, cfg.env.train_split)
    tasks = np.random.default_rng(cfg.seed).choice(
        n_train, size=min(cfg.sft.num_episodes, n_train), replace=False
    )
    eps = warm_start.expert_episodes(
        cfg.env.name,
        env_kwargs(cfg),
        tasks,
        split=cfg.env.train_split,
        max_steps=cfg.env.max_steps,
    )
    records = warm_start.sft_records(
        eps,
        tokenizer,
        cfg.env.name,
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
    )
    learner = make_policy_learner(
        cfg,
        module,
        mesh,
        lr=cfg.sft.lr,
        loss_fn=ts.make_sft_loss(cfg.sft.prompt_loss_weight),
    )
    warm_start.train_sft(
        learner,
        records,
        steps=cfg.sft.steps,
        batch_rows=cfg.sft.batch_rows,
        seed=cfg.seed,
        metrics_writer=metrics,
        progress=progress,
        max_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens,
    )
    module = learner.module()
  tmp = ws_dir + ".tmp"
  # The master weights exactly: a later run starts from the same values.
  models.save_hf_model(
      module, mcfg, tmp, tokenizer_dir=tokenizer_dir, dtype=mcfg.param_dtype
  )
  os.replace(tmp, ws_dir) if not os.path.exists(ws_dir) else None
  return mcfg, module


def make_sglang_client(cfg, key: str = "rollout.server_urls"):
  """SGLangClient of the servers ``key`` lists (comma-separated URLs);
  ConfigError naming ``key`` and what to pass when it lists none or a server
  gives no HTTP answer to ``GET /health``. Requests time out after
  ``rollout.server_timeout_s``; ``rollout.server_original_logprobs`` (the
  servers run with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) allows sampling at
  temperatures other than 0 and 1 (evaluation at T = 0.4)."""
  from rspo_jax.rollout.sglang_client import SGLangClient

  text = cfg.rollout[key.split(".")[-1]]
  urls = [u for u in re.split(r"[,;\s]+", text) if u]
  if not urls:
    raise ConfigError(
        f"rollout.engine=sglang needs {key}=http://HOST:PORT"
        "[,...] (the SGLang servers), got none"
    )
  if any(not u.startswith(("http://", "https://")) for u in urls):
    raise ConfigError(
        f"{key}={text!r}: each URL must look like" " http://HOST:PORT"
    )
  client = SGLangClient(
      urls,
      timeout_s=float(cfg.rollout.server_timeout_s),
      original_logprobs=bool(cfg.rollout.server_original_logprobs),
  )
  down = client.unreachable_urls()
  if down:
    client.close()
    raise ConfigError(
        f"{key}={text!r}: no SGLang server answers at {', '.join(down)};"
        " start one (SGLANG_RETURN_ORIGINAL_LOGPROB=1 python -m"
        " sglang.launch_server --model-path DIR --port PORT, or"
        " rspo-serve-rollout) and pass its URL in"
        f" {key}=http://HOST:PORT[,...]"
    )
  return client


def make_engine(cfg, mcfg, module, tokenizer, mesh):
  if cfg.rollout.engine == "sglang":
    return make_sglang_client(cfg)
  eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>",)]
  eos += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
  return JaxEngine(
      inference_model(module, mcfg),
      engine_config(mcfg),
      mesh=mesh,
      rules=cfg.logical_axis_rules,
      pad_id=pad,
      eos_ids=sorted(set(eos)),
      decode_fn=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
      shared_prefix_prefill=bool(cfg.rollout.shared_prefix_prefill),
      prefill_chunk=(
          None
          if cfg.rollout.prefill_chunk is None
          else int(cfg.rollout.prefill_chunk)
      ),
      max_rows=int(cfg.rollout.engine_max_rows or 0),
      seed=cfg.seed,
  )


def engine_module(module, mcfg, mesh, engine_mesh, rules):
  """What ``make_engine`` takes: the module itself with one process; with
  several, its (graphdef, params, rest) on this host's ``engine_mesh``
  (params cast to ``mcfg.inference_dtype`` first, laid out as the engine
  lays them out; ``distributed.to_host_mesh``: resharded device to device
  from ``mesh``, the learner's)."""
  if not distributed.is_multihost():
    return module
  mcfg, module = merged(module, mcfg)  # LoRA: merged weights
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params = cast_floating(params, mcfg.inference_dtype)
  rules = sharding.inference_rules(rules)
  return (
      graphdef,
      *(
          distributed.to_host_mesh(
              x, mesh, sharding.state_shardings(engine_mesh, x, rules)
          )
          for x in (params, rest)
      ),
  )


def make_engine_mesh(cfg, mesh):
  """The in-process engine's mesh: with one process the learner's, or,
  with ``rollout.engine_tensor`` = T > 0 different from the learner's
  tensor axis, (1, n / T, T) over the learner's devices; with several,
  this host's devices of the learner's mesh (``distributed.host_mesh``,
  its tensor axis T when set). Rows split over ('data', 'fsdp'), weights
  over 'tensor' only (``sharding.inference_rules``)."""
  tensor = int(cfg.rollout.engine_tensor)
  n = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
  if tensor and n % tensor:
    raise ConfigError(
        f"rollout.engine_tensor={tensor} does not divide the"
        f" {n} devices of this process"
    )
  if distributed.is_multihost():
    return distributed.host_mesh(mesh, tensor)
  if tensor in (0, mesh.shape["tensor"]):
    return mesh
  return sharding.make_mesh((1, -1, tensor), list(mesh.devices.flat))


def collect_config(cfg, split: str) -> CollectConfig:
  return CollectConfig(
      env_name=cfg.env.name,
      max_steps=cfg.env.max_steps,
      history_length=cfg.env.history_length,
      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
      invalid_action_penalty=cfg.algo.invalid_action_penalty,
      split=split,
  )


@dataclasses.dataclass
class Run:
  cfg: object
  trainer: RSPOTrainer
  engine: object
  venv: VectorEnv
  tokenizer: object
  mcfg: object
  mesh: object

  def evaluate(self, learner: Learner, step: int = 0, seeds=(0,)) -> dict:
    from rspo_jax.evaluate import evaluate

    c = self.cfg
    self.trainer.sync_engine(self.engine, learner, 10**6 + step)
    n = min(c.env.num_eval_tasks, num_tasks(c, c.env.eval_split))
    return evaluate(
        self.engine,
        self.venv,
        self.tokenizer,
        collect_config(c, c.env.eval_split),
        list(range(n)),
        temperature=c.rollout.eval_temperature,
        max_new_tokens=c.rollout.max_new_tokens,
        seeds=seeds,
        max_failed_frac=c.rollout.max_failed_episode_frac,
    )

  def close(self) -> None:
    if self.trainer.b_job is not None:
      self.trainer.b_job.cancel()
      try:
        self.trainer.b_job.join(60)
      except Exception:  # closing anyway; the error was reported by the run
        pass
    if self.trainer.b_rollout is not None:
      self.trainer.b_rollout[1].close()
      self.trainer.b_rollout[0].close()
    self.venv.close()
    getattr(self.trainer.sync_engine, "close", lambda: None)()
    self.engine.close()
    self.trainer.metrics.close()
    self.trainer.ckpt.close()


def check_multihost(cfg) -> None:
  """ValueError naming what a multi-process run does not support."""
  if not distributed.is_multihost():
    return
  n = jax.process_count()
  if cfg.rollout.placement == "decoupled":
    raise ValueError(
        f"rollout.placement='decoupled' with {n} processes:"
        " multi-host runs use 'colocated'"
    )
  if (
      cfg.rollout.engine == "sglang"
      and cfg.rollout.weight_sync == "distributed"
  ):
    raise ValueError(
        f"rollout.weight_sync='distributed' with {n} processes:"
        " the broadcast runs from one process only; use 'disk'"
    )


def build_run(cfg, workdir: str, *, progress: bool = True) -> Run:
  check_multihost(cfg)
  # model.remat=auto, rollout.prefill_chunk=None and
  # rollout.engine_max_rows=None: the plan's choices
  # (the ones --dry_run shows), written into cfg before anything is built.
  chosen = plan.resolve_run(cfg)
  log.info(
      "plan: %s",
      ", ".join(
          f"{k}={v['value']} ({v['by']})"
          for k, v in chosen.items()
          if k != "warning"
      ),
  )
  if chosen.get("warning"):
    log.warning("the memory plan does not fit: %s", chosen["warning"])
  push = make_weight_push(cfg)  # before any work: needs torch if distributed
  compile_log = compile_cache.CompileLog()  # from the warm start on
  # rspo.dense_reward=package.module:function, resolved before any work.
  user_dense_fn = (
      registry.import_function(cfg.rspo.dense_reward, "rspo.dense_reward")
      if registry.is_import_path(cfg.rspo.dense_reward)
      else None
  )
  os.makedirs(workdir, exist_ok=True)
  if distributed.is_leader():  # W&B for this workdir's metrics writers
    setup_wandb_from_config(workdir, cfg)
  mesh = sharding.make_mesh(tuple(cfg.mesh.shape))
  tokenizer, tok_dir = make_tokenizer(cfg, workdir)
  metrics = MetricsWriter(workdir) if distributed.is_leader() else None
  mcfg, module = warm_started_policy(
      cfg, tokenizer, tok_dir, mesh, workdir, metrics, progress=progress
  )
  if metrics is not None:
    metrics.close()
  models.check_tokenizer_matches(tokenizer, mcfg)
  mcfg, module = with_lora(cfg, mcfg, module, mesh)  # model.lora_rank > 0
  policy = make_policy_learner(
      cfg,
      module,
      mesh,
      lr=cfg.train.lr,
      loss_fn=ts.make_policy_loss(
          policy_loss_config(cfg, rspo=cfg.rspo.enabled)
      ),
  )
  # pi_ref is only run forward: kept in the inference dtype (bf16 under
  # bf16 compute), sharded like the policy; with LoRA the base itself.
  ref_params = reference_params(policy, mcfg)
  critic = None
  if cfg.algo.name == "ppo":
    backbone = nnx.merge(
        policy.graphdef, policy.frozen_params(), policy.frozen
    )  # own buffers: A's are donated
    value_module = models.ValueModel(
        mcfg, rngs=nnx.Rngs(cfg.seed + 1), backbone=backbone
    )
    critic = Learner(
        value_module,
        critic_optimizer(cfg),
        ts.make_value_loss(cfg.algo.value_clip_eps),
        mesh=mesh,
        rules=cfg.logical_axis_rules,
        kind="value",
        micro_batch_rows=cfg.train.micro_batch_rows,
    )
  # Multi-host: each host generates on its own devices.
  engine_mesh = module = None
  if cfg.rollout.engine == "jax":  # SGLang servers hold their own weights
    engine_mesh = make_engine_mesh(cfg, mesh)
    module = engine_module(
        policy.module(), mcfg, mesh, engine_mesh, cfg.logical_axis_rules
    )
  engine = make_engine(cfg, mcfg, module, tokenizer, engine_mesh)
  n_envs = cfg.train.batch_tasks * cfg.train.group_size
  n_envs = max(n_envs, min(cfg.env.num_eval_tasks, 32))
  venv = VectorEnv(
      cfg.env.name,
      env_kwargs(cfg),
      n_envs,
      num_workers=cfg.env.num_workers,
      error_log=os.path.join(workdir, "env_errors.log"),
  )
  trainer = RSPOTrainer(
      cfg,
      policy=policy,
      ref_params=ref_params,
      critic=critic,
      engine=engine,
      venv=venv,
      tokenizer=tokenizer,
      workdir=workdir,
      sync_engine=make_sync_engine(
          mcfg,
          tok_dir,
          weight_sync.export_dir(
              cfg, workdir, multihost=distributed.is_multihost()
          ),
          threads=cfg.rollout.export_threads,
          push=push,
          lora_sync=cfg.rollout.sglang_lora_sync,
      ),
      num_train_tasks=num_train_tasks(cfg),
      progress=progress,
  )
  # A 'compile' row (seconds per jitted function) after rows that followed
  # compilations.
  trainer.metrics = compile_cache.CompileMetrics(trainer.metrics, compile_log)
  if cfg.rollout.placement == "decoupled":
    trainer.b_rollout = make_b_rollout(cfg, mcfg, policy, tok_dir)
  if cfg.rspo.dense_reward == "prm":
    attach_prm(trainer, cfg, policy, workdir, tok_dir, mesh)
  if user_dense_fn is not None:  # fills r.dense_reward of B's records
    trainer.dense_fn = contract.checked_dense_fn(
        user_dense_fn, cfg.rspo.dense_reward
    )
  return Run(cfg, trainer, engine, venv, tokenizer, mcfg, mesh)


def attach_prm(
    trainer: RSPOTrainer, cfg, policy: Learner, workdir: str, tok_dir: str, mesh
) -> None:
  """``rspo.dense_reward=prm``: the trainer's PRM refit and its dense
  reward, the PRM of ``rspo.prm_dir`` or one trained now on ``policy``'s
  own trajectories."""
  backbone = (
      cfg.rspo.prm_backbone_dir
      or cfg.model.checkpoint_dir
      or os.path.join(workdir, "warm_start")
  )
  trainer.prm_refresh = make_prm_refresh(cfg, workdir, backbone, tok_dir, mesh)
  prm_dir = cfg.rspo.prm_dir or os.path.join(workdir, "prm")
  have_prm = os.path.exists(os.path.join(prm_dir, "prm_config.json"))
  if distributed.is_multihost():  # the leader's view: every host the same
    have_prm = bool(distributed.allgather_objects(have_prm)[0])
  if not have_prm:
    # The PRM learns from the starting policy's own trajectories (every
    # host's groups).
    records, _ = trainer.collect_groups(policy, cfg.rspo.prm_train_groups, "A")
    trainer.dense_fn = trainer.prm_refresh(gather_records(records))
  else:
    from rspo_jax.prm import make_prm_dense_fn

    trainer.dense_fn = make_prm_dense_fn(
        prm_dir, mesh=prm_mesh(cfg, mesh), rules=cfg.logical_axis_rules
    )


def make_b_rollout(cfg, mcfg, policy: Learner, tok_dir: str):
  """Decoupled placement: B's own engine (SGLang servers, or a JaxEngine on
  the second half of the devices), environments and tokenizer (HF fast
  tokenizers must not be shared across threads)."""
  tokenizer = models.load_tokenizer(tok_dir)
  if cfg.rollout.b_server_urls:
    engine = make_sglang_client(cfg, "rollout.b_server_urls")
  else:
    devices = jax.devices()
    b_devices = devices[len(devices) // 2 :] if len(devices) > 1 else devices
    mesh = sharding.make_mesh((-1, 1, 1), devices=b_devices)
    engine = make_engine(cfg, mcfg, policy.module(), tokenizer, mesh)
  venv = VectorEnv(
      cfg.env.name,
      env_kwargs(cfg),
      cfg.train.batch_tasks * cfg.train.group_size,
      num_workers=cfg.env.num_workers,
  )
  return engine, venv, tokenizer


def make_prm_refresh(cfg, workdir, backbone_dir, tok_dir, mesh):
  """``fn(records) -> dense_fn``: (re)trains the PRM head on ``records``
  (outcome rewards of collected trajectories), saves it to
  ``<workdir>/prm`` and returns the dense-reward function it defines.

  Multi-host: every process calls it together; the leader alone trains,
  on its own devices (``prm_mesh``), from the ``records`` it
  is given (every host's: ``gather_records``; the other processes'
  argument is not read) and saves the head to the shared workdir; then
  every process loads that head and scores its own records on its own
  devices: one PRM for the job, no cross-host traffic per score."""
  from rspo_jax import prm

  out = cfg.rspo.prm_dir or os.path.join(workdir, "prm")
  local = prm_mesh(cfg, mesh)

  def refresh(records):
    if distributed.is_leader():
      metrics = prm.train_prm(
          backbone_dir,
          records,
          out,
          policy_tokenizer_dir=tok_dir,
          max_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens,
          mesh=local,
          rules=cfg.logical_axis_rules,
          steps=cfg.rspo.prm_steps,
          seed=cfg.seed,
      )
      log.info("PRM trained on %d steps: %s", len(records), metrics)
    distributed.barrier("rspo_prm_trained")
    return prm.make_prm_dense_fn(out, mesh=local, rules=cfg.logical_axis_rules)

  return refresh


def prm_mesh(cfg, mesh):
  """The PRM's mesh: the run's with one process; else this process's own
  devices (``distributed.host_mesh`` of the learner's mesh), so that one
  host fits the head alone and every host scores without cross-host
  collectives."""
  return distributed.host_mesh(mesh) if distributed.is_multihost() else mesh


def gather_records(records: list) -> list:
  """Every host's step records, host by host, on every process (the
  records themselves with one process)."""
  if not distributed.is_multihost():
    return records
  from rspo_jax import prm

  hosts = distributed.allgather_objects(
      [prm.record_to_json(r) for r in records]
  )
  return [prm.record_from_json(d) for host in hosts for d in host]
