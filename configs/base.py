"""Shared base config. Per-experiment files (`webshop_grpo.py`, ...) call
`make_config(env, algo, arg)`.

  config = _base (structure, scale-neutral defaults)
           + one scale table of `configs/scales.py` (PAPER or CPU: every
             scale-dependent key, explicitly; neither leaks into the other)
           + the overrides of `arg`

`arg` is a comma-separated list of `key=value` overrides (big_vision style,
`--config=configs/webshop_grpo.py:model=qwen2.5-1.5b`):
  * `model=<preset>` selects a model preset, and with it the scale: a
    released model (qwen/llama) the paper's table, a from-scratch one
    (nano/tiny) the CPU table. The scale is set first; every other override
    is applied after it, wherever it stands in `arg`, so
    `model=qwen2.5-1.5b,rspo.alpha=0.25` trains the paper's setup at
    alpha 1/4,
  * `rspo=0` turns RSPO off (the baseline), `seed=N`, `steps=N`,
  * any other `a.b=value` sets that key (must exist; type is checked).
`--config.a.b=value` flags (launch/train.py) apply after all of these.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from configs import scales
from rspo_jax import sharding
from rspo_jax.errors import ConfigError, did_you_mean
from third_party_envs import registry
from rspo_jax.models.config import (
    ATTENTION,
    LOCAL_TOKENIZER_PRESETS,
    LORA_SYNCS,
)

# The from-scratch presets (a locally trained tokenizer; CPU recipe).
CPU_PRESETS = LOCAL_TOKENIZER_PRESETS
PAPER_PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.2-3b")
ALGOS = ("grpo", "grpo_nostd", "ppo", "gigpo")
ENVS = ("webshop", "alfworld", "toy", "spell")


def _base(env: str, algo: str) -> ml_collections.ConfigDict:
  """Structure and scale-neutral defaults; no key of `scales.SCALE_KEYS`."""
  c = ml_collections.ConfigDict()
  c.workdir = f"runs/{env}_{algo}"
  c.seed = 0
  _model(c)
  _env(c, env)
  _algo(c, env, algo)
  _rspo(c)
  _rollout(c)
  _train(c)
  _sft(c)
  _metrics(c)
  _mesh(c)
  return c


def _model(c: ml_collections.ConfigDict) -> None:
  """c.model: the policy model: tokenizer, attention kernel, LoRA."""
  # scales.py: preset, checkpoint_dir (HF dir: config.json + safetensors;
  # "" = init, then behaviour cloning when sft.enabled), dtype (compute),
  # param_dtype (master weights and Adam state), remat.
  c.model = ml_collections.ConfigDict()
  c.model.tokenizer_dir = ""  # "" = the checkpoint's, or a locally trained one
  c.model.tokenizer_vocab = 2048  # vocab of the locally trained tokenizer
  # Preset field overrides, e.g. "num_layers=1;hidden_size=64" (tests).
  c.model.overrides = ""
  # The learner's attention kernel (docs/scale_out.md "Attention kernels"):
  # auto = splash on TPU, cuDNN on GPU where it applies, XLA otherwise.
  c.model.attention = "auto"
  # LoRA (rspo_jax/models/lora.py, docs/usage.md "LoRA"): rank 0 = full
  # fine-tuning. With a rank, A, B and the critic train adapters on one
  # frozen base (compute dtype); pi_ref is the base with the adapters off.
  c.model.lora_rank = 0
  c.model.lora_alpha = 32.0
  c.model.lora_targets = "q,k,v,o,gate,up,down"  # attention, MLP


def _env(c: ml_collections.ConfigDict, env: str) -> None:
  """c.env: the environment and its task splits."""
  # scales.py: max_steps (turns), history_length (past obs/action pairs in
  # the prompt), num_eval_tasks, num_workers, kwargs (env constructor).
  c.env = ml_collections.ConfigDict()
  c.env.name = env
  c.env.train_split = "train"
  c.env.eval_split = "test" if env == "webshop" else "valid_seen"
  # Training tasks are drawn from the first N task ids of train_split (0 =
  # all). A small N trains on the same few tasks every step: whether the
  # update raises success on tasks it sees (launch/eval.py --split=train
  # --num_tasks=N), apart from whether that carries to held-out ones.
  c.env.train_tasks = 0


def _algo(c: ml_collections.ConfigDict, env: str, algo: str) -> None:
  """c.algo: the advantage estimator and the clipped policy loss."""
  # scales.py: clip_eps, kl_coef, kl_kind, entropy_coef,
  # invalid_action_penalty, critic_lr (PPO).
  c.algo = ml_collections.ConfigDict()
  c.algo.name = "grpo" if algo == "grpo_nostd" else algo
  # Divide group-centred scores by the group std: GRPO's
  # norm_adv_by_std_in_grpo (True); GiGPO's gigpo.mode, which verl-agent's
  # examples/gigpo_trainer/run_webshop.sh sets to mean_norm (no std) and
  # run_alfworld.sh to mean_std_norm.
  c.algo.normalize_std = not (
      algo == "grpo_nostd" or (algo == "gigpo" and env == "webshop")
  )
  c.algo.gamma = 0.95  # GiGPO's step-return discount only
  # Credit (docs/credit.md): 'verl_agent' = penalty on the offending step
  # row, group statistics over step rows, PPO GAE per row; 'trajectory' =
  # penalty summed into R(tau), statistics per trajectory, GAE across steps.
  c.algo.credit_mode = "verl_agent"
  c.algo.gae_gamma = 1.0  # PPO's GAE (verl ppo_trainer.yaml algorithm.gamma)
  c.algo.gae_lambda = 1.0  # verl's algorithm.lam
  c.algo.gae_whiten = True  # verl masked_whiten over response tokens
  c.algo.omega = 1.0  # GiGPO step-advantage weight
  c.algo.anchor_similarity = config_dict.placeholder(float)  # None = exact
  c.algo.clip_eps_high = config_dict.placeholder(float)  # None = clip_eps
  c.algo.clip_window = "additive"  # or "multiplicative" (AReaL decoupled)
  # Dual clip of fresh tokens with A < 0 (losses.dual_clip): verl's
  # actor.clip_ratio_c, 3.0 in dp_actor.py; 0 = off.
  c.algo.clip_ratio_c = 3.0
  c.algo.loss_agg = "token_mean"
  c.algo.value_clip_eps = 0.5  # verl ppo_trainer.yaml critic.cliprange_value
  # pi_old of fresh rows (the ratio's denominator). False: with the
  # in-process engine, the log-probs it sampled them with (the learner's
  # weights, synced before the collection; temperature 1 whatever
  # rollout.temperature; float32 log-softmax), so only replayed, stale
  # (overlap) and cut rows are recomputed (AReaL's recompute_logprob=False;
  # rspo_jax/update.py). True: the learner recomputes every row. SGLang
  # rows are always recomputed.
  c.algo.recompute_old_logprobs = False


def _rspo(c: ml_collections.ConfigDict) -> None:
  """c.rspo: agent B, the replay buffer D, the dense reward, the PRM."""
  # scales.py: alpha (replayed share of A's training samples), k (steps of
  # B, then of A, per loop), dense_reward (oracle = the environment's
  # progress signal | prm).
  c.rspo = ml_collections.ConfigDict()
  c.rspo.enabled = True
  c.rspo.sampling = "reward"  # reward | variance | random
  c.rspo.data_source = "rspo"  # rspo | history (RSPO_H) | outcome (RSPO_O)
  # Gaussian noise on the dense reward, in the PRM's tanh units (the
  # paper's; the environments' progress: their own units, also ~[-1, 1]).
  c.rspo.dense_noise_sigma = 0.0
  c.rspo.copy_optimizer_state = False  # B := A also copies A's Adam moments
  # B's own AdamW learning rate and linear warm-up (0 = A's: train.lr,
  # train.warmup_steps); docs/method.md "B's optimizer".
  c.rspo.b_lr = 0.0
  c.rspo.b_warmup_steps = 0
  # Adaptive B (beyond the paper; loop/adaptive_b.py). 0: B trains k steps.
  # > k: after its k steps B goes on while its win rate on a fresh batch
  # is below the target set by b_win_multiple (B's odds of a win that many
  # times A's), up to b_k_max steps.
  c.rspo.b_k_max = 0
  c.rspo.b_win_multiple = 10.0
  # Multiplier of the dense reward r_t (credit.step_rewards): 10 puts the
  # environments' progress signals (which sum to ~1 on a win) into the
  # outcome's units (10 * won), as the PRM's are.
  c.rspo.dense_scale = 1.0
  # B's stored collection plays the tasks, with the sampling seeds, of its
  # first training collection ('first': B's lift, b_lift_success /
  # b_lift_dense, is a paired difference) or a fresh draw ('fresh').
  c.rspo.b_lift_tasks = "first"
  # Reward-based replay in a loop's later A steps: 'wins' = unused wins,
  # then wins already replayed, then the rest; 'pass' = unused first over
  # all of D (the earlier rule). replay/selection.py.
  c.rspo.replay_reuse = "wins"
  # B's learner recomputes log pi_B of the tokens it stores in D (as verl
  # recomputes old log-probs with the actor); False: the engine's values.
  c.rspo.recompute_behavior_logp = True
  c.rspo.dense_only = False  # train B alone on the dense reward (hacking)
  # Cap on a replayed token's weight c = pi_old / pi_B (its gradient at
  # r = c is c * A * grad log pi): 0 = off (the paper's objective);
  # truncate = weight min(c, cap) (truncated IS); mask = tokens with
  # c > cap contribute nothing (AReaL's behav_imp_weight_cap). Logged:
  # centre_cap_frac_off. centre_cap.centre_cap_factor, docs/method.md.
  c.rspo.centre_cap = 0.0
  c.rspo.centre_cap_mode = "truncate"  # truncate | mask
  c.rspo.prm_dir = ""  # trained PRM; "" = train one at start (<workdir>/prm)
  c.rspo.prm_backbone_dir = ""  # frozen f_pre; "" = the starting policy
  c.rspo.prm_train_groups = 16  # warm-start policy groups the PRM learns from
  c.rspo.prm_steps = 300  # Adam steps of the PRM head
  c.rspo.prm_refresh_loops = 0  # retrain the head every N loops (0 = never)


def _rollout(c: ml_collections.ConfigDict) -> None:
  """c.rollout: the rollout engine, its weight syncs and the collections."""
  # scales.py: temperature (behaviour log-probs are taken at T=1),
  # eval_temperature (0 = greedy), max_new_tokens, max_prompt_tokens.
  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "jax"  # jax (in-process) | sglang (HTTP servers)
  c.rollout.server_urls = ""  # comma-separated, for engine=sglang
  # Seconds one HTTP request to a server may take (a turn's /generate of a
  # paper-scale batch: 128 prompts of up to 4096 tokens, 512 new tokens).
  c.rollout.server_timeout_s = 600.0
  # The servers run with SGLANG_RETURN_ORIGINAL_LOGPROB=1 (launch/cluster
  # starts them so): log-probs at T=1 whatever the sampling temperature, so
  # evaluation at rollout.eval_temperature=0.4 is allowed. False: only
  # T in {0, 1} (sglang_client's module docstring).
  c.rollout.server_original_logprobs = True
  # SGLang weight syncs: the HF export's directory ("" = /dev/shm when
  # present, one process and every server on this host, else
  # <workdir>/export; servers must see it) and its writer threads
  # (rspo_jax/weight_sync.py).
  c.rollout.export_dir = ""
  c.rollout.export_threads = 8
  # disk: the HF export above, loaded by /update_weights_from_disk.
  # distributed: no file; the learner (torch needed in its process) joins a
  # torch.distributed group with the servers as rank 0 and broadcasts each
  # tensor (/init_weights_update_group + /update_weights_from_distributed;
  # rollout/distributed_sync.py). Backend "" = nccl on CUDA, else gloo; the
  # servers must reach master_address:master_port ("" / 0: this host's
  # address toward them / a free port); at most bucket_mb a request.
  c.rollout.weight_sync = "disk"
  c.rollout.weight_sync_backend = ""
  c.rollout.weight_sync_master_address = ""
  c.rollout.weight_sync_master_port = 0
  c.rollout.weight_sync_bucket_mb = 512
  # LoRA policies (model.lora_rank > 0) on SGLang servers, disk sync:
  # adapter: each sync writes and loads only the PEFT adapter (the servers
  # run with --enable-lora --max-lora-rank R --lora-target-modules ...; the
  # base is loaded once); merged: the full merged export every sync; auto:
  # adapter, or merged from the first sync on when a server refuses it.
  c.rollout.sglang_lora_sync = "auto"
  c.rollout.top_p = 1.0
  # colocated: B's stored collection finishes before A's phase starts.
  # decoupled: B's collection runs on its own engine (second half of the
  # devices, or rollout.b_server_urls) while A's phase starts as soon as the
  # groups it replays exist.
  c.rollout.placement = "colocated"
  # 1: A's next collection (step t + 1) plays in a background thread on the
  # weights of step t while step t's update runs (rspo_jax/overlap.py): its
  # rows are one A step stale, their clip centred on pi_old / pi_behaviour
  # (losses.LossConfig.overlap) and the lag is logged; never
  # across a B phase. 0 (default): collection, then update. On the 2-core
  # CPU both share the cores (docs/performance.md, "Overlap").
  c.rollout.overlap = 0
  # The training collections (A's, colocated B's) turn by turn, one batched
  # request a turn (True), or, with SGLang, each episode's next request sent
  # as soon as its environment step returns (False: rollout/unbarriered.py;
  # slower on the CPU server, whose idle rows cost nothing; docs/
  # performance.md).
  c.rollout.turn_barriers = True
  # The in-process engine's tensor parallelism: 0 = the learner mesh's
  # tensor axis; T > 0: weights split over T devices, rows over the rest
  # (e.g. an FSDP-only learner with a 7B engine split in 2 on 16 GB chips;
  # build.make_engine_mesh).
  c.rollout.engine_tensor = 0
  # The in-process engine prefills the leading prompt blocks that different
  # prompts of a generation chunk share once (rollout/jax_engine.py, step
  # 2). Off: WebShop's groups share ~120 tokens at later turns, 4-8 % of
  # the prefill's columns and no measurable time here; it pays with long
  # shared heads (256 of 700 tokens: ~1.3x prefill; docs/performance.md).
  c.rollout.shared_prefix_prefill = False
  # The in-process engine prefills a prompt's columns in blocks of this
  # many (each attending the slots written so far: float32 scores of
  # [rows, heads, block, prompt] instead of [rows, heads, prompt, prompt +
  # new]; rollout/jax_engine.py, step 2); 0 = one pass. None: chosen by the
  # plan (rspo_jax/plan/choices.py ``choose``: one pass if it fits the device,
  # else the widest block that does; without a known device memory the
  # engine's default, 64 on CPU, one pass elsewhere).
  c.rollout.prefill_chunk = None
  # The in-process engine's rows a prefill / decode call, at most (rounded
  # down to a batch bucket, a power of 2): a host's episodes of a turn go
  # in calls of this many, one after another; a call's KV cache and
  # prefill scores scale with its rows (rollout/jax_engine.py, step 0).
  # 0 = no cap (all of a host's episodes, up to 256, in one call). None:
  # chosen by the plan (rspo_jax/plan/choices.py ``choose``: all rows if the
  # prefill fits the device, else the most that do; without a known
  # device memory, no cap).
  c.rollout.engine_max_rows = None
  c.rollout.b_server_urls = ""  # SGLang servers for B (decoupled, sglang)
  c.rollout.decoupled_timeout_s = 1800.0
  # Stop the run when more than this share of a collection's (or an
  # evaluation seed's) episodes fail: the environment raised or its worker
  # died (rollout/collect.check_failures; docs/custom_env.md section 5).
  c.rollout.max_failed_episode_frac = 0.5


def _train(c: ml_collections.ConfigDict) -> None:
  """c.train: optimisation, checkpoints and the compile cache."""
  # scales.py: total_steps (of A), batch_tasks (tasks a batch), group_size
  # (episodes a task), lr, weight_decay, micro_batch_rows (0 = an update at
  # once), max_train_rows (0 = every row), mini_batch_rows,
  # updates_per_step, ppo_epochs, eval_every (0 = start and end only).
  # Per step: the step's rows (one per episode step; at most max_train_rows
  # when > 0) are shuffled into mini-batches, one optimizer update each,
  # ppo_epochs passes over the same mini-batches, old and reference
  # log-probs taken once, before the first update. Mini-batches:
  # updates_per_step = n > 0: n (at most one per row); else
  # mini_batch_rows = m > 0 (verl's ppo_mini_batch_size, in step rows):
  # ceil(rows / m); else one. micro_batch_rows only splits an update's
  # gradient into accumulated pieces (memory, not results).
  c.train = ml_collections.ConfigDict()
  c.train.warmup_steps = 0
  c.train.grad_clip = 1.0
  # LoRA (model.lora_rank > 0): the adapters of A, B and a critic train at
  # their lr (train.lr, rspo.b_lr, algo.critic_lr) x this; 1 = off
  # (models/lora.py lr_multiplier; docs/results.md "LoRA learning rate").
  c.train.lora_lr_multiplier = 10.0
  # Train only on rows with a non-zero advantage (DAPO's dynamic sampling,
  # per row): a group whose rewards all tie teaches nothing but KL/entropy.
  c.train.drop_zero_advantage_rows = False
  # Orbax checkpoint every N A steps (and after B's collection, at each
  # loop's end and at the run's end); written in the background.
  c.train.checkpoint_every = 1
  # JAX's persistent compilation cache: "" = $JAX_COMPILATION_CACHE_DIR if
  # set, else <workdir>/compile_cache; "none" = off (rspo_jax/compile_cache.py).
  c.train.compile_cache_dir = ""
  c.train.log_every = 1
  c.train.max_bad_steps = 5  # consecutive NaN/Inf steps before stopping


def _sft(c: ml_collections.ConfigDict) -> None:
  """c.sft: the behaviour-cloning warm start (every key in scales.py)."""
  # scales.py: enabled (behaviour-clone the policy on the first run),
  # num_episodes (expert episodes), steps, lr, batch_rows,
  # prompt_loss_weight (> 0: also model the prompts, make_sft_loss).
  c.sft = ml_collections.ConfigDict()


def _metrics(c: ml_collections.ConfigDict) -> None:
  """c.metrics: Weights & Biases logging."""
  c.metrics = ml_collections.ConfigDict()
  c.metrics.wandb_project = ""  # "" = no W&B (pip install 'rspo_jax[wandb]')
  c.metrics.wandb_entity = ""  # "" = the account's default entity
  c.metrics.wandb_name = ""  # "" = the workdir's name


def _mesh(c: ml_collections.ConfigDict) -> None:
  """c.mesh: the device mesh and the logical axis rules."""
  c.mesh = ml_collections.ConfigDict()  # scales.py: shape (data, fsdp,
  # tensor; -1 takes the rest)
  # The hardware a --mesh=configs/mesh/*.py file describes (0 / "": not
  # given; the plan then reads what it can from the devices it sees).
  c.mesh.num_hosts = 0
  c.mesh.devices_per_host = 0
  c.mesh.platform = ""
  c.mesh.device_memory_gb = 0.0
  c.logical_axis_rules = sharding.DEFAULT_RULES


def _apply_table(c: ml_collections.ConfigDict, table: dict) -> None:
  """Sets every key of a `scales` table (creating the field)."""
  env, algo = c.env.name, c.algo.name
  values = scales.resolve(table, env, algo)
  if set(values) != set(scales.SCALE_KEYS):
    raise AssertionError(  # a table that misses or adds a scale key
        f"scale table keys != SCALE_KEYS:"
        f" {sorted(set(values) ^ set(scales.SCALE_KEYS))}"
    )
  for key, value in values.items():
    section, leaf = key.split(".")
    if isinstance(value, dict):
      value = ml_collections.ConfigDict(value)
    c[section][leaf] = value


def paper_scale(c: ml_collections.ConfigDict) -> None:
  """The paper's settings (`scales.PAPER`: Qwen2.5-1.5B/7B-Instruct on
  8-16 GPUs, every value with its source)."""
  _apply_table(c, scales.PAPER)


def cpu_scale(c: ml_collections.ConfigDict) -> None:
  """The embedded default (`scales.CPU`): RSPO end to end in ~15 minutes on
  2 CPU cores; every value that differs from the paper's is a CPU budget
  choice, its reason next to it."""
  _apply_table(c, scales.CPU)


def last_override(
    arg: str | None, key: str, default: str | None = None
) -> str | None:
  """The value of the last `key=value` in a comma-separated override
  string `arg` (the one that wins), else `default`."""
  value = default
  for item in (arg or "").split(","):
    k, _, v = item.partition("=")
    if k.strip() == key:
      value = v.strip()
  return value


def scale_of(arg: str | None) -> str:
  """'paper' when the last `model=` of `arg` names a paper preset."""
  return "paper" if last_override(arg, "model") in PAPER_PRESETS else "cpu"


def apply_overrides(c: ml_collections.ConfigDict, arg: str | None) -> None:
  if not arg:
    return
  for item in arg.split(","):
    if not item.strip():
      continue
    if "=" not in item:
      raise ConfigError(
          f"config override {item!r} is not key=value"
          f" (e.g. rspo.alpha=0.25)"
      )
    key, value = (s.strip() for s in item.split("=", 1))
    if key == "model":
      presets = CPU_PRESETS + PAPER_PRESETS
      if value not in presets:
        raise ConfigError(
            f"unknown model preset {value!r}{did_you_mean(value, presets)}"
            f" in model={value}; known: {', '.join(presets)}"
        )
      c.model.preset = value  # the scale was chosen by `make_config`
    elif key == "rspo":
      set_by_path(c, "rspo.enabled", value)  # refuses e.g. rspo=maybe
    elif key == "seed":
      set_by_path(c, "seed", value)
    elif key == "steps":
      set_by_path(c, "train.total_steps", value)
    else:
      set_by_path(c, key, value)
      if key in _ONE_OF and c.train[key.split(".")[1]]:
        c.train[_ONE_OF[key].split(".")[1]] = 0  # the other one yields


# Two ways to size a step's mini-batches: an override of one (> 0) clears
# the other (validate refuses both > 0, e.g. from --config.<key> flags).
_ONE_OF = {
    "train.mini_batch_rows": "train.updates_per_step",
    "train.updates_per_step": "train.mini_batch_rows",
}


def leaf_keys(c: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every leaf's dotted key, e.g. ['algo.clip_eps', ..., 'seed']."""
  keys = []
  for name, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += leaf_keys(value, f"{prefix}{name}.")
    else:
      keys.append(prefix + name)
  return keys


def resolve_key(
    c: ml_collections.ConfigDict,
    key: str,
    value: str,
    *,
    what: str = "unknown config key",
    given: str = "",
):
  """(section, leaf name) of the dotted `key`; a ConfigError naming `key`,
  `value` (as `given` on the command line), the closest existing keys and
  the keys of the deepest section reached when `key` names no field."""
  node, parts = c, key.split(".")
  for depth, p in enumerate(parts):
    last = depth == len(parts) - 1
    if p in node and (last or isinstance(node[p], ml_collections.ConfigDict)):
      if last:
        return node, p
      node = node[p]
      continue
    section = ".".join(parts[:depth])
    where = f"known keys of {section}" if section else "known top-level keys"
    raise ConfigError(
        f"{what} {key!r}{did_you_mean(key, leaf_keys(c))} in"
        f" {given or f'{key}={value}'}"
        f"; {where}: {', '.join(sorted(node.keys()))}"
    )
  raise ConfigError(f"{what} {key!r}: empty key")


def check_override(
    c: ml_collections.ConfigDict,
    key: str,
    value: str,
    *,
    what: str = "unknown config key",
    given: str = "",
) -> None:
  """ConfigError when `key=value` names no field of `c` or a scalar field
  `value` does not convert to (what `set_by_path` would set); `c` is left
  as it was."""
  node, leaf = resolve_key(c, key, value, what=what, given=given)
  old = node[leaf]
  if old is None or isinstance(old, (bool, int, float, str)):
    scratch = ml_collections.ConfigDict({leaf: old})
    set_by_path(scratch, leaf, value, name=key)


def set_by_path(
    c: ml_collections.ConfigDict, key: str, value: str, *, name: str = ""
) -> None:
  """Sets `a.b.c` from a string, keeping the existing field's type.
  ConfigError names the key (`name`, when given), the value and what the
  field accepts."""
  node, leaf = resolve_key(c, key, value)
  key = name or key
  old = node[leaf]
  if isinstance(old, bool):
    if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
      raise ConfigError(
          f"config key {key!r} wants a bool, got {value!r}"
          " (true/false, 1/0, yes/no)"
      )
    node[leaf] = value.lower() in ("1", "true", "yes")
    return
  try:
    if isinstance(old, int):
      node[leaf] = int(value)
    elif isinstance(old, float) or old is None:
      node[leaf] = float(value)
    else:
      node[leaf] = value
  except (TypeError, ValueError):  # name the key, not just the literal
    want = "float" if old is None else type(old).__name__
    raise ConfigError(
        f"config key {key!r} expects type {want}, got {value!r}"
    ) from None


def make_config(env: str, algo: str, arg: str | None = None):
  if env not in ENVS:
    raise ConfigError(
        f"unknown env {env!r}{did_you_mean(env, ENVS)};"
        f" known: {', '.join(ENVS)}"
    )
  if algo not in ALGOS:
    raise ConfigError(
        f"unknown algo {algo!r}{did_you_mean(algo, ALGOS)};"
        f" known: {', '.join(ALGOS)}"
    )
  c = _base(env, algo)
  if scale_of(arg) == "paper":
    paper_scale(c)
  else:
    cpu_scale(c)
  apply_overrides(c, arg)
  validate(c)
  return c


def _one_of(
    value, choices: tuple, key: str, other_ok: bool = False, other: str = ""
):
  """A `validate` check: `value` is one of `choices` (or `other_ok`)."""
  accepts = "one of " + ", ".join(choices) + (f" or {other}" if other else "")
  return (
      value in choices or other_ok,
      key,
      value,
      accepts,
      did_you_mean(value, choices),
  )


def _prefill_chunk_ok(
    c,
    key="prefill_chunk",
    accepts="None (the plan chooses), 0 (one pass) or a" " block width > 0",
):
  """A `validate` check of rollout.prefill_chunk (or another rollout
  ``key`` of the same kind: None or an int >= 0; a command line gives a
  float: made an int)."""
  v = c.rollout[key]
  ok = v is None or (
      isinstance(v, (int, float))
      and not isinstance(v, bool)
      and v >= 0
      and float(v).is_integer()
  )
  if ok and v is not None:
    c.rollout[key] = int(v)
  return (ok, f"rollout.{key}", v, accepts)


def _remat_ok(value):
  """A `validate` check of model.remat: 'auto' (the plan chooses) or a
  policy of models.config.REMAT_POLICIES (the old bools read as 'none' /
  'full')."""
  from rspo_jax.models.config import REMAT_POLICIES, remat_policy

  ok = isinstance(value, str) and value.strip().lower() == "auto"
  if not ok:
    try:
      remat_policy(value)
      ok = True
    except ValueError:
      pass
  return (
      ok,
      "model.remat",
      value,
      "auto (the plan picks) or one of "
      + ", ".join(REMAT_POLICIES)
      + " (True / False: full / none)",
  )


def validate(c: ml_collections.ConfigDict) -> None:
  """Fails at start with a message naming the bad key."""
  if c.rspo.dense_reward == "env":  # the deprecated name of 'oracle'
    c.rspo.dense_reward = "oracle"
  held = scales.WARM_START_PRESET.get(c.model.checkpoint_dir)
  if held and (c.model.preset != held or c.model.overrides):
    # A committed warm start holds one model (`model=tiny` on CPU WebShop):
    # another behaviour-clones its own, as it did before there was one.
    c.model.checkpoint_dir, c.sft.enabled = "", True
  any_path = "an import path pkg.module:name"
  checks = [  # (ok, key, value, what the key accepts[, did you mean])
      _one_of(c.algo.name, ("grpo", "ppo", "gigpo"), "algo.name"),
      _one_of(
          c.rspo.sampling, ("reward", "variance", "random"), "rspo.sampling"
      ),
      _one_of(c.rspo.replay_reuse, ("wins", "pass"), "rspo.replay_reuse"),
      _one_of(c.rspo.b_lift_tasks, ("first", "fresh"), "rspo.b_lift_tasks"),
      _one_of(
          c.rspo.data_source, ("rspo", "history", "outcome"), "rspo.data_source"
      ),
      _one_of(
          c.rspo.dense_reward,
          ("oracle", "prm"),
          "rspo.dense_reward",
          registry.is_import_path(c.rspo.dense_reward),
          any_path,
      ),
      _one_of(
          c.env.name,
          ENVS,
          "env.name",
          registry.is_import_path(c.env.name),
          any_path,
      ),
      (0.0 <= c.rspo.alpha < 1.0, "rspo.alpha", c.rspo.alpha, "0 <= x < 1"),
      (c.rspo.k >= 1, "rspo.k", c.rspo.k, ">= 1"),
      (
          c.rspo.b_k_max == 0 or c.rspo.b_k_max > c.rspo.k,
          "rspo.b_k_max",
          c.rspo.b_k_max,
          "0 (B trains rspo.k steps) or > rspo.k",
      ),
      (
          c.rspo.b_win_multiple > 0,
          "rspo.b_win_multiple",
          c.rspo.b_win_multiple,
          "> 0",
      ),
      (c.rspo.b_lr >= 0, "rspo.b_lr", c.rspo.b_lr, ">= 0 (0 = train.lr)"),
      (
          c.train.lora_lr_multiplier > 0,
          "train.lora_lr_multiplier",
          c.train.lora_lr_multiplier,
          "> 0 (1 = adapters at train.lr)",
      ),
      (
          c.rspo.b_warmup_steps >= 0,
          "rspo.b_warmup_steps",
          c.rspo.b_warmup_steps,
          ">= 0",
      ),
      (c.rspo.dense_scale > 0, "rspo.dense_scale", c.rspo.dense_scale, "> 0"),
      (
          c.rspo.dense_noise_sigma >= 0,
          "rspo.dense_noise_sigma",
          c.rspo.dense_noise_sigma,
          ">= 0",
      ),
      # c = 1 where A and B agree: a cap below 1 would cut those (AReaL
      # also documents its behav_imp_weight_cap as > 1).
      (
          c.rspo.centre_cap == 0 or c.rspo.centre_cap >= 1,
          "rspo.centre_cap",
          c.rspo.centre_cap,
          "0 (off) or >= 1",
      ),
      _one_of(
          c.rspo.centre_cap_mode, ("truncate", "mask"), "rspo.centre_cap_mode"
      ),
      _one_of(
          c.algo.clip_window, ("additive", "multiplicative"), "algo.clip_window"
      ),
      _one_of(c.algo.kl_kind, ("k1", "k2", "k3"), "algo.kl_kind"),
      (
          c.algo.clip_ratio_c == 0 or c.algo.clip_ratio_c > 1,
          "algo.clip_ratio_c",
          c.algo.clip_ratio_c,
          "0 (off) or > 1",
      ),
      _one_of(
          c.algo.credit_mode, ("verl_agent", "trajectory"), "algo.credit_mode"
      ),
      _one_of(
          c.algo.loss_agg,
          ("token_mean", "seq_mean_token_mean"),
          "algo.loss_agg",
      ),
      _one_of(c.rollout.engine, ("jax", "sglang"), "rollout.engine"),
      _one_of(
          c.rollout.sglang_lora_sync, LORA_SYNCS, "rollout.sglang_lora_sync"
      ),
      _one_of(
          c.rollout.placement, ("colocated", "decoupled"), "rollout.placement"
      ),
      (
          c.rollout.overlap in (0, 1),
          "rollout.overlap",
          c.rollout.overlap,
          "0 (off) or 1 (A's next collection during the update)",
      ),
      (
          c.rollout.turn_barriers or c.rollout.engine == "sglang",
          "rollout.turn_barriers",
          c.rollout.turn_barriers,
          "True with rollout.engine='jax' (one batched decode a turn; False"
          " is for SGLang servers)",
      ),
      _prefill_chunk_ok(c),
      _prefill_chunk_ok(
          c,
          "engine_max_rows",
          "None (the plan chooses), 0 (no cap) or a row" " count > 0",
      ),
      _remat_ok(c.model.remat),
      (
          c.rollout.engine_tensor >= 0,
          "rollout.engine_tensor",
          c.rollout.engine_tensor,
          ">= 0 (0: the learner mesh's tensor axis)",
      ),
      (
          0 <= c.rollout.max_failed_episode_frac <= 1,
          "rollout.max_failed_episode_frac",
          c.rollout.max_failed_episode_frac,
          "in [0, 1] (1: never stop)",
      ),
      # PPO has no groups (the paper's PPO: 128 tasks x 1 episode).
      (
          c.train.group_size >= (1 if c.algo.name == "ppo" else 2),
          "train.group_size",
          c.train.group_size,
          ">= 1" if c.algo.name == "ppo" else ">= 2 (a group)",
      ),
      (
          c.train.batch_tasks >= 1,
          "train.batch_tasks",
          c.train.batch_tasks,
          ">= 1",
      ),
      (
          c.env.train_tasks == 0 or c.env.train_tasks >= c.train.batch_tasks,
          "env.train_tasks",
          c.env.train_tasks,
          f"0 (all) or >= train.batch_tasks = {c.train.batch_tasks} (a step's"
          " tasks are distinct)",
      ),
      (
          c.train.total_steps >= 1,
          "train.total_steps",
          c.train.total_steps,
          ">= 1",
      ),
      (
          c.train.mini_batch_rows >= 0,
          "train.mini_batch_rows",
          c.train.mini_batch_rows,
          ">= 0",
      ),
      (
          c.train.updates_per_step >= 0,
          "train.updates_per_step",
          c.train.updates_per_step,
          ">= 0",
      ),
      (c.train.ppo_epochs >= 1, "train.ppo_epochs", c.train.ppo_epochs, ">= 1"),
      (
          len(tuple(c.mesh.shape)) == 3,
          "mesh.shape",
          c.mesh.shape,
          "(data, fsdp, tensor)",
      ),
      _one_of(c.model.preset, CPU_PRESETS + PAPER_PRESETS, "model.preset"),
      _one_of(c.model.attention, ATTENTION, "model.attention"),
  ]
  for ok, key, value, *accepts in checks:  # accepts: [what[, did you mean]]
    if not ok:
      wants = f"; wants {accepts[0]}" if accepts else ""
      raise ConfigError(
          f"bad config value {key}={value!r}" f"{''.join(accepts[1:])}{wants}"
      )
  sharding.check_rules(c.logical_axis_rules)
  if c.train.updates_per_step and c.train.mini_batch_rows:
    raise ConfigError(
        f"train.updates_per_step={c.train.updates_per_step} and"
        f" train.mini_batch_rows={c.train.mini_batch_rows} both set the"
        " mini-batches of a step; set one of them to 0"
    )
  # alpha is a share of training samples (replay/selection.replay_counts).
  samples = c.train.batch_tasks * c.train.group_size
  if c.rspo.enabled and c.rspo.alpha and samples * c.rspo.alpha < 0.5:
    raise ConfigError(
        f"rspo.alpha={c.rspo.alpha} of train.batch_tasks x group_size ="
        f" {samples} episodes is less than one replayed trajectory"
    )
