"""Shared base config. Per-experiment files (`webshop_grpo.py`, ...) call
`make_config(env, algo, arg)`.

`arg` is a comma-separated list of `key=value` overrides applied on top
(big_vision style, `--config=configs/webshop_grpo.py:model=qwen2.5-1.5b`):
  * `model=<preset>` selects a model preset; a real preset (qwen/llama)
    switches every other knob to the paper's scale (`paper_scale`),
  * `rspo=0` turns RSPO off (the baseline), `seed=N`, `steps=N`,
  * any other `a.b=value` sets that key (must exist; type is checked).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from rspo_jax import sharding
from rspo_jax.models.config import LOCAL_TOKENIZER_PRESETS

# The from-scratch presets (a locally trained tokenizer; CPU recipe).
CPU_PRESETS = LOCAL_TOKENIZER_PRESETS
PAPER_PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.2-3b")
ALGOS = ("grpo", "grpo_nostd", "ppo", "gigpo")
ENVS = ("webshop", "alfworld", "toy")


def _base(env: str, algo: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = f"runs/{env}_{algo}"
  c.seed = 0

  # ---------------------------------------------------------------- model
  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"  # 3.5 M params: trains at ~3 k tok/s on 1 CPU core
  c.model.checkpoint_dir = ""  # HF dir (config.json + safetensors); "" = init
  c.model.tokenizer_dir = ""  # "" = the checkpoint's, or a locally trained one
  c.model.tokenizer_vocab = 2048  # vocab of the locally trained tokenizer
  c.model.dtype = "float32"
  c.model.remat = False
  # Preset field overrides, e.g. "num_layers=1;hidden_size=64" (tests).
  c.model.overrides = ""

  # ---------------------------------------------------------------- env
  c.env = ml_collections.ConfigDict()
  c.env.name = env
  c.env.max_steps = {"webshop": 15, "alfworld": 50, "toy": 8}[env]
  c.env.history_length = 2
  c.env.train_split = "train"
  c.env.eval_split = "test" if env == "webshop" else "valid_seen"
  c.env.num_eval_tasks = 64
  c.env.num_workers = 2
  c.env.kwargs = ml_collections.ConfigDict()  # passed to the env constructor

  # ---------------------------------------------------------------- algo
  c.algo = ml_collections.ConfigDict()
  c.algo.name = "grpo" if algo == "grpo_nostd" else algo
  c.algo.normalize_std = algo != "grpo_nostd"
  c.algo.gamma = 0.95  # GiGPO step-return discount / PPO GAE discount
  c.algo.gae_lambda = 1.0
  c.algo.omega = 1.0  # GiGPO step-advantage weight
  c.algo.anchor_similarity = config_dict.placeholder(float)  # None = exact
  c.algo.clip_eps = 0.2
  c.algo.clip_eps_high = config_dict.placeholder(float)  # None = clip_eps
  c.algo.clip_window = "additive"  # or "multiplicative" (AReaL decoupled)
  c.algo.kl_coef = 0.01
  c.algo.kl_kind = "k3"
  c.algo.entropy_coef = 0.001
  c.algo.loss_agg = "token_mean"
  c.algo.invalid_action_penalty = -0.1
  c.algo.value_coef = 1.0  # PPO critic
  c.algo.value_clip_eps = 0.2
  c.algo.critic_lr = 1e-5

  # ---------------------------------------------------------------- rspo
  c.rspo = ml_collections.ConfigDict()
  c.rspo.enabled = True
  c.rspo.alpha = 1 / 8  # off-policy fraction of A's batch (2 of 16 groups)
  c.rspo.k = 3  # training steps of B, then of A, per loop
  c.rspo.sampling = "reward"  # reward | variance | random
  c.rspo.data_source = "rspo"  # rspo | history (RSPO_H) | outcome (RSPO_O)
  c.rspo.dense_reward = "env"  # env | prm
  c.rspo.dense_noise_sigma = 0.0  # Gaussian noise on the dense reward
  c.rspo.copy_optimizer_state = False  # B := A also copies A's Adam moments
  c.rspo.dense_only = False  # train B alone on the dense reward (hacking)
  c.rspo.prm_dir = ""  # trained PRM; "" = train one at start (<workdir>/prm)
  c.rspo.prm_backbone_dir = ""  # frozen f_pre; "" = the starting policy
  c.rspo.prm_train_groups = 16  # warm-start policy groups the PRM learns from
  c.rspo.prm_steps = 300  # Adam steps of the PRM head
  c.rspo.prm_refresh_loops = 0  # retrain the head every N loops (0 = never)

  # ---------------------------------------------------------------- rollout
  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "jax"  # jax (in-process) | sglang (HTTP servers)
  c.rollout.server_urls = ""  # comma-separated, for engine=sglang
  c.rollout.temperature = 1.0  # behaviour log-probs are taken at T=1
  c.rollout.top_p = 1.0
  c.rollout.max_new_tokens = 48
  c.rollout.max_prompt_tokens = 512
  c.rollout.eval_temperature = 0.0  # 0 = greedy
  # colocated: B's stored collection finishes before A's phase starts.
  # decoupled: B's collection runs on its own engine (second half of the
  # devices, or rollout.b_server_urls) while A's phase starts as soon as the
  # groups it replays exist.
  c.rollout.placement = "colocated"
  c.rollout.b_server_urls = ""  # SGLang servers for B (decoupled, sglang)
  c.rollout.decoupled_timeout_s = 1800.0

  # ---------------------------------------------------------------- train
  c.train = ml_collections.ConfigDict()
  c.train.total_steps = 150  # training steps of A
  c.train.batch_tasks = 16  # groups per batch
  c.train.group_size = 8  # episodes per group (same task)
  c.train.lr = 1e-6
  c.train.warmup_steps = 0
  c.train.weight_decay = 0.0
  c.train.grad_clip = 1.0
  c.train.micro_batch_rows = 0  # 0 = the whole batch at once
  c.train.max_train_rows = 0  # 0 = all step rows; else subsample per update
  # Rows per optimizer update (verl's ppo_mini_batch_size): a step's rows
  # are shuffled and trained in ceil(rows / n) updates; 0 = one update.
  c.train.mini_batch_rows = 0
  # Train only on rows with a non-zero advantage (DAPO's dynamic sampling,
  # per row): a group whose rewards all tie teaches nothing but KL/entropy.
  c.train.drop_zero_advantage_rows = False
  c.train.eval_every = 25
  c.train.checkpoint_every = 1
  c.train.log_every = 1
  c.train.max_bad_steps = 5  # consecutive NaN/Inf steps before stopping

  # ---------------------------------------------------------------- warm start
  c.sft = ml_collections.ConfigDict()
  c.sft.enabled = True  # behaviour-clone a tiny policy on first run
  c.sft.num_episodes = 256
  c.sft.steps = 200
  c.sft.lr = 1e-3
  c.sft.batch_rows = 32
  c.sft.prompt_loss_weight = 0.0  # > 0: also model the prompts (make_sft_loss)

  # ---------------------------------------------------------------- mesh
  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the rest
  c.logical_axis_rules = sharding.DEFAULT_RULES
  return c


def paper_scale(c: ml_collections.ConfigDict) -> None:
  """The paper's hyperparameters (Qwen2.5-1.5B/7B-Instruct, 8-16 GPUs)."""
  env = c.env.name
  c.sft.enabled = False
  c.train.total_steps = 150
  c.train.batch_tasks = 16
  c.train.group_size = 8
  c.train.lr = 1e-6
  c.train.micro_batch_rows = 16
  c.algo.kl_coef = 0.01
  c.algo.entropy_coef = 0.001
  c.algo.clip_eps = 0.2
  c.rollout.max_new_tokens = 512
  c.rollout.max_prompt_tokens = {"webshop": 4096}.get(env, 2048)
  c.rollout.temperature = 1.0
  c.rollout.eval_temperature = 0.4
  c.env.max_steps = {"webshop": 15, "alfworld": 50}.get(env, c.env.max_steps)
  c.model.dtype = "bfloat16"
  c.model.remat = True
  c.env.num_workers = 32
  c.env.kwargs = ml_collections.ConfigDict()  # upstream-sized worlds
  c.mesh.shape = (1, -1, 1)


def cpu_scale(c: ml_collections.ConfigDict) -> None:
  """The embedded default: RSPO end to end in ~15 minutes on 2 CPU cores.

  Every number is a CPU budget choice; the paper's are in `paper_scale`.
  """
  env = c.env.name
  c.train.total_steps = 6  # 2 RSPO loops of k=3
  c.train.batch_tasks = 4  # 4 groups: 3 fresh + 1 replayed at alpha=1/4
  c.train.group_size = 4  # smallest group with a usable GRPO baseline
  c.rspo.alpha = 1 / 4  # 1 of 4 groups; 1/8 would be half a group
  c.train.lr = 3e-5  # a 3.5 M model needs a larger step than 1e-6
  c.train.max_train_rows = 64  # caps one update at 64 step rows
  c.train.eval_every = 0  # evaluate at the start and the end only
  c.env.num_eval_tasks = 32  # 32 fixed test tasks, greedy decoding
  c.rollout.max_new_tokens = 64  # '<think>..</think><action>search[..]'
  # WebShop pages are long: one history entry and 768 prompt tokens keep a
  # 64-row update at ~50 k tokens (the oldest history is dropped first).
  c.env.history_length = 1 if env == "webshop" else 2
  c.rollout.max_prompt_tokens = 768 if env != "toy" else 256
  # The expert solves WebShop in ~5 steps, ALFWorld tasks in 5-25.
  c.env.max_steps = {"webshop": 8, "alfworld": 20, "toy": 8}[env]
  # Behaviour cloning only far enough for a weak policy (paper: instruct
  # models start at low but non-zero success).
  c.sft.num_episodes = 128
  c.sft.steps = 60  # ~4 s a step on 2 idle cores
  c.sft.batch_rows = 16
  c.sft.lr = 1e-3  # 2e-3 made the tiny policy's greedy replies degenerate
  if env == "webshop":
    # A 30-product catalogue (one product per type, 12 goals each, 64 held
    # out for evaluation) and an expert that searches by product type: each
    # decision is then a choice (which type, which product, which option
    # values) that a from-scratch policy learns on 2 cores, not the copying
    # of a whole instruction that a pretrained model brings. See
    # docs/results.md for what the 3.5 M 'tiny' policy did on the full world.
    c.env.kwargs = ml_collections.ConfigDict(dict(
        num_products=30, goals_per_product=12, num_test_goals=64,
        expert_query="type"))
    c.model.preset = "nano"
    c.env.num_eval_tasks = 64  # every held-out goal
    c.sft.num_episodes = 275  # every train goal of the small world
    # 500 steps (~13 min at ~1.6 s a step): option values start to be
    # copied from the instruction (score 0.75 vs 0.50 after 300 steps), so
    # A's rollouts win on goals whose options are not a product's default.
    c.sft.steps = 500
    c.sft.lr = 3e-3
    c.sft.prompt_loss_weight = 1.0
    c.train.lr = 1e-4
  if env == "alfworld":
    # Two of the six task types (find an object, then place it / look at it
    # under a lamp): the shortest plans, so a 0.6 M policy cloned from 256
    # expert episodes wins some (3 % of valid_seen greedily after 300
    # steps; the 3.5 M 'tiny' preset on all six types after 60 steps: 0 %).
    c.env.kwargs = ml_collections.ConfigDict(dict(
        task_types=("pick_and_place_simple", "look_at_obj_in_light")))
    c.model.preset = "nano"
    c.sft.num_episodes = 256
    c.sft.steps = 300
    c.sft.lr = 3e-3
    c.sft.prompt_loss_weight = 1.0
    c.train.lr = 1e-4


def apply_overrides(c: ml_collections.ConfigDict, arg: str | None) -> None:
  if not arg:
    return
  for item in arg.split(","):
    if not item.strip():
      continue
    if "=" not in item:
      raise ValueError(f"config override {item!r} is not key=value")
    key, value = (s.strip() for s in item.split("=", 1))
    if key == "model":
      if value not in CPU_PRESETS + PAPER_PRESETS:
        raise ValueError(
            f"unknown model preset {value!r}; known:"
            f" {CPU_PRESETS + PAPER_PRESETS}"
        )
      c.model.preset = value
      if value in PAPER_PRESETS:
        paper_scale(c)
    elif key == "rspo":
      set_by_path(c, "rspo.enabled", value)  # refuses e.g. rspo=maybe
    elif key == "seed":
      set_by_path(c, "seed", value)
    elif key == "steps":
      set_by_path(c, "train.total_steps", value)
    else:
      set_by_path(c, key, value)


def set_by_path(c: ml_collections.ConfigDict, key: str, value: str) -> None:
  """Sets `a.b.c` from a string, keeping the existing field's type."""
  node, parts = c, key.split(".")
  for p in parts[:-1]:
    if not isinstance(node, ml_collections.ConfigDict) or p not in node:
      raise ValueError(f"unknown config key {key!r} (no {p!r})")
    node = node[p]
  leaf = parts[-1]
  if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
    raise ValueError(f"unknown config key {key!r}")
  old = node[leaf]
  if isinstance(old, bool):
    if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
      raise ValueError(f"config key {key!r} wants a bool, got {value!r}")
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
    raise ValueError(
        f"config key {key!r} expects type {want}, got {value!r}"
    ) from None


def make_config(env: str, algo: str, arg: str | None = None):
  if env not in ENVS:
    raise ValueError(f"unknown env {env!r}; known: {ENVS}")
  if algo not in ALGOS:
    raise ValueError(f"unknown algo {algo!r}; known: {ALGOS}")
  c = _base(env, algo)
  cpu_scale(c)
  apply_overrides(c, arg)
  validate(c)
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Fails at start with a message naming the bad key."""
  checks = [
      (c.algo.name in ("grpo", "ppo", "gigpo"), "algo.name", c.algo.name),
      (c.rspo.sampling in ("reward", "variance", "random"), "rspo.sampling",
       c.rspo.sampling),
      (c.rspo.data_source in ("rspo", "history", "outcome"),
       "rspo.data_source", c.rspo.data_source),
      (c.rspo.dense_reward in ("env", "prm"), "rspo.dense_reward",
       c.rspo.dense_reward),
      (0.0 <= c.rspo.alpha < 1.0, "rspo.alpha", c.rspo.alpha),
      (c.rspo.k >= 1, "rspo.k", c.rspo.k),
      (c.rspo.dense_noise_sigma >= 0, "rspo.dense_noise_sigma",
       c.rspo.dense_noise_sigma),
      (c.algo.clip_window in ("additive", "multiplicative"),
       "algo.clip_window", c.algo.clip_window),
      (c.algo.kl_kind in ("k1", "k2", "k3"), "algo.kl_kind", c.algo.kl_kind),
      (c.algo.loss_agg in ("token_mean", "seq_mean_token_mean"),
       "algo.loss_agg", c.algo.loss_agg),
      (c.rollout.engine in ("jax", "sglang"), "rollout.engine",
       c.rollout.engine),
      (c.rollout.placement in ("colocated", "decoupled"),
       "rollout.placement", c.rollout.placement),
      (c.train.group_size >= 2, "train.group_size", c.train.group_size),
      (c.train.batch_tasks >= 1, "train.batch_tasks", c.train.batch_tasks),
      (c.train.total_steps >= 1, "train.total_steps", c.train.total_steps),
      (c.train.mini_batch_rows >= 0, "train.mini_batch_rows",
       c.train.mini_batch_rows),
      (len(tuple(c.mesh.shape)) == 3, "mesh.shape", c.mesh.shape),
      (c.model.preset in CPU_PRESETS + PAPER_PRESETS, "model.preset",
       c.model.preset),
  ]
  for ok, key, value in checks:
    if not ok:
      raise ValueError(f"bad config value {key}={value!r}")
  sharding.check_rules(c.logical_axis_rules)
  if c.rspo.enabled and c.train.batch_tasks * c.rspo.alpha < 1 and c.rspo.alpha:
    raise ValueError(
        f"rspo.alpha={c.rspo.alpha} of train.batch_tasks="
        f"{c.train.batch_tasks} groups is less than one replayed group"
    )
