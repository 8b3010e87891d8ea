"""The two scales of every config: two complete, explicit tables.

  config = _base(env, algo)  [structure, scale-neutral defaults]
           + PAPER or CPU     [every key of SCALE_KEYS, nothing else]
           + user overrides

`model=<paper preset>` selects PAPER, anything else CPU; neither table
reads the other, so no CPU budget choice reaches paper scale and no paper
value silently sets the CPU recipe. A value is a constant, or `ByEnv` /
`ByAlgo` of constants where it depends on the environment / algorithm.

Sources of PAPER, cited per key:
  [paper]  the RSPO paper (docs/method.md gives its method as implemented);
  [va:S]   verl-agent (github.com/langfengQ/verl-agent) run script S under
           examples/, e.g. [va:grpo_trainer/run_alfworld.sh]; the GRPO,
           GiGPO and PPO scripts of one environment agree on every value
           cited unless the entry says otherwise (read in a mirror of
           commit d0b9724 'code adjustment & fix prompt agent bug (#183)');
  [verl]   verl's defaults, verl/trainer/config/ppo_trainer.yaml of the same
           verl-agent commit, for what the run scripts leave unset.
"""

from __future__ import annotations

import os

# The committed warm start of CPU WebShop (its MAKE.txt: the command that
# made it and its measured start), found beside this file: a checkout, the
# wheel and any working directory see the same path.
WEBSHOP_WARM_START = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "warm_starts", "webshop_nano"
)
# The model a committed warm start holds (base.validate: another preset
# behaviour-clones its own).
WARM_START_PRESET = {WEBSHOP_WARM_START: "nano"}


class ByEnv(dict):
  """A value per environment name."""


class ByAlgo(dict):
  """A value per algorithm name (`algo.name`); key "*" for the others. May
  stand inside a `ByEnv`."""


# Every key whose value depends on the scale. `cpu_scale` and `paper_scale`
# each set all of these and nothing else; `_base` sets none of them.
SCALE_KEYS = (
    "model.preset",
    "model.checkpoint_dir",
    "model.dtype",
    "model.param_dtype",
    "model.remat",
    "model.scan_layers",
    "env.max_steps",
    "env.history_length",
    "env.num_eval_tasks",
    "env.num_workers",
    "env.kwargs",
    "algo.clip_eps",
    "algo.kl_coef",
    "algo.kl_kind",
    "algo.entropy_coef",
    "algo.invalid_action_penalty",
    "algo.critic_lr",
    "rspo.alpha",
    "rspo.k",
    "rspo.dense_reward",
    "rollout.temperature",
    "rollout.eval_temperature",
    "rollout.max_new_tokens",
    "rollout.max_prompt_tokens",
    "train.total_steps",
    "train.batch_tasks",
    "train.group_size",
    "train.lr",
    "train.weight_decay",
    "train.micro_batch_rows",
    "train.max_train_rows",
    "train.mini_batch_rows",
    "train.updates_per_step",
    "train.ppo_epochs",
    "train.eval_every",
    "sft.enabled",
    "sft.num_episodes",
    "sft.steps",
    "sft.lr",
    "sft.batch_rows",
    "sft.prompt_loss_weight",
    "mesh.shape",
)

# The keys of SCALE_KEYS in which the CPU recipe takes the paper's value
# (for every environment): the objective's constants, k and the rollout
# temperature are the method's, not a budget choice.
CPU_KEEPS_PAPER = (
    "model.param_dtype",
    "algo.clip_eps",
    "algo.kl_coef",
    "algo.kl_kind",
    "algo.entropy_coef",
    "algo.invalid_action_penalty",
    "algo.critic_lr",
    "rspo.k",
    "rollout.temperature",
    "train.ppo_epochs",
)

# The keys in which a config's CPU preset (no `model=`) and its paper preset
# (`model=qwen2.5-1.5b`) differ, per environment: SCALE_KEYS minus
# CPU_KEEPS_PAPER, minus, for ALFWorld, the history window (2 at both
# scales).
# tests/configs_test.py checks it on the six env x algo configs.
SCALE_DIFF = {
    # WebShop's CPU recipe takes the paper's batch, alpha, every-row
    # training, evaluation temperature and no behaviour cloning (it starts
    # from a committed warm start instead).
    "webshop": (
        "model.preset",
        "model.checkpoint_dir",
        "model.dtype",
        "model.remat",
        "model.scan_layers",
        "env.max_steps",
        "env.history_length",
        "env.num_eval_tasks",
        "env.num_workers",
        "env.kwargs",
        "rspo.dense_reward",
        "rollout.max_new_tokens",
        "rollout.max_prompt_tokens",
        "train.total_steps",
        "train.lr",
        "train.weight_decay",
        "train.micro_batch_rows",
        "train.mini_batch_rows",
        "train.updates_per_step",
        "train.eval_every",
        "sft.num_episodes",
        "sft.steps",
        "sft.lr",
        "sft.batch_rows",
        "sft.prompt_loss_weight",
        "mesh.shape",
    ),
    "alfworld": (
        "model.preset",
        "model.dtype",
        "model.remat",
        "model.scan_layers",
        "env.max_steps",
        "env.num_eval_tasks",
        "env.num_workers",
        "env.kwargs",
        "rspo.alpha",
        "rspo.dense_reward",
        "rollout.eval_temperature",
        "rollout.max_new_tokens",
        "rollout.max_prompt_tokens",
        "train.total_steps",
        "train.batch_tasks",
        "train.group_size",
        "train.lr",
        "train.weight_decay",
        "train.micro_batch_rows",
        "train.max_train_rows",
        "train.mini_batch_rows",
        "train.updates_per_step",
        "train.eval_every",
        "sft.enabled",
        "sft.num_episodes",
        "sft.steps",
        "sft.lr",
        "sft.batch_rows",
        "sft.prompt_loss_weight",
        "mesh.shape",
    ),
}

# ---------------------------------------------------------------- paper
PAPER = {
    # [paper] the results table's policy, Qwen2.5-1.5B-Instruct (`model=`
    # picks 0.5B / 7B / Llama-3.2-3B instead).
    "model.preset": "qwen2.5-1.5b",
    # [paper] RL starts from the released instruct model: its local Hugging
    # Face directory is given on the command line ("" initialises the
    # preset's shape at random).
    "model.checkpoint_dir": "",
    # [paper] fp32 master weights and optimizer state, bf16 compute
    # (model.dtype is the compute dtype). [va:*] enable_gradient_
    # checkpointing=True saves nothing but each block's input ('full');
    # not a result-changing value (the same loss and gradients): 'auto'
    # lets the plan pick the lightest policy that fits the device
    # (none > dots > full in memory, the reverse in recompute; rspo_jax/
    # plan/choices.py ``choose``, shown by --dry_run).
    "model.dtype": "bfloat16",
    "model.param_dtype": "float32",
    "model.remat": "auto",
    # Not a result-changing value (the same outputs and gradients):
    # compile time. The 28 blocks are one jax.lax.scan, XLA compiles one
    # block per shape instead of 28 (MaxText's scan_layers); the rollout
    # engine runs them unrolled (models/transformer.py).
    "model.scan_layers": True,
    # [va:*] env.max_steps=50 (ALFWorld), 15 (WebShop). The toy is not in
    # the paper: its own 8; the spell task one turn a letter (env.kwargs).
    "env.max_steps": ByEnv(alfworld=50, webshop=15, toy=8, spell=4),
    # [verl] env.history_length: 2 (the scripts leave it); [paper] window 2.
    "env.history_length": 2,
    # [va:*] val_data_size=128: 128 evaluation episodes.
    "env.num_eval_tasks": 128,
    # Not a result-changing value: environment worker processes.
    "env.num_workers": 32,
    # The upstream-sized worlds (each environment's constructor defaults).
    # The spell task's knobs listed, so `env.kwargs.word_length=6` finds
    # them (its constructor's defaults).
    "env.kwargs": ByEnv(
        alfworld={},
        webshop={},
        toy={},
        spell=dict(
            word_length=4,
            alphabet_size=5,
            dense="aligned",
            expert_digits=10,
            slack=0,
            expert_unknown="abstain",
            show_digit=False,
            cipher_digits=10,
            decoy_positions=0,
            decoy_weight=1.0,
        ),
    ),
    # [paper] clip 0.2 ([verl] clip_ratio: 0.2); KL 0.01 with the low-
    # variance k3 estimator ([va:*] use_kl_loss=True, kl_loss_coef=0.01,
    # kl_loss_type=low_var_kl); entropy 0.001 ([verl] entropy_coeff: 0.001).
    "algo.clip_eps": 0.2,
    "algo.kl_coef": 0.01,
    "algo.kl_kind": "k3",
    "algo.entropy_coef": 0.001,
    # [paper] invalid action -0.1 ([va:*] invalid_action_penalty_coef=0.1).
    "algo.invalid_action_penalty": -0.1,
    # [va:ppo_trainer/run_*.sh] critic.optim.lr=1e-5 (PPO only).
    "algo.critic_lr": 1e-5,
    # [paper] alpha 1/8 (14 online + 2 offline of 16 groups), k = 3, and
    # the dense reward of agent B is the trained PRM.
    "rspo.alpha": 1 / 8,
    "rspo.k": 3,
    "rspo.dense_reward": "prm",
    # [verl] rollout.temperature: 1.0; [va:*] val_kwargs.temperature=0.4,
    # val_kwargs.do_sample=True.
    "rollout.temperature": 1.0,
    "rollout.eval_temperature": 0.4,
    # [va:*] data.max_response_length=512; data.max_prompt_length=2048
    # (ALFWorld), 4096 (WebShop); the toy as ALFWorld.
    "rollout.max_new_tokens": 512,
    "rollout.max_prompt_tokens": ByEnv(
        alfworld=2048, webshop=4096, toy=2048, spell=2048
    ),
    # [paper] 150 steps; [va:*] trainer.total_epochs=150 over a train set
    # of one batch (train_data_size = data.train_batch_size).
    "train.total_steps": 150,
    # [paper] 16 tasks x group 8; [va:grpo/gigpo] train_data_size=16,
    # env.rollout.n=8. PPO has no groups: [va:ppo_trainer/run_*.sh]
    # train_data_size=128 ("match GRPO and GiGPO configuration (16 x 8)"),
    # env.rollout.n left at 1: 128 distinct tasks x 1 episode.
    "train.batch_tasks": ByAlgo({"ppo": 128, "*": 16}),
    "train.group_size": ByAlgo({"ppo": 1, "*": 8}),
    # [paper] lr 1e-6 ([va:*] actor.optim.lr=1e-6); [verl] AdamW
    # actor.optim.weight_decay: 0.01.
    "train.lr": 1e-6,
    "train.weight_decay": 0.01,
    # Memory only (gradient accumulation over the whole update's token
    # totals, so results do not depend on it; in verl they do, a little:
    # each micro-batch is its own token mean, divided by their count):
    # 16 global rows, what configs/mesh/gpu16.py's 7B plan is sized for
    # ([va:*] ppo_micro_batch_size_per_gpu=32 / 8 on 2 GPUs).
    "train.micro_batch_rows": 16,
    # [paper] every rollout row is trained.
    "train.max_train_rows": 0,
    # [va:*] actor.ppo_mini_batch_size=256 (ALFWorld), 64 (WebShop),
    # counted as verl counts it: verl multiplies it by
    # actor_rollout_ref.rollout.n, which verl-agent leaves at 1 (its group
    # is env.rollout.n), and every *step row* of an episode is one row of
    # the batch (agent_system/multi_turn_rollout). So one optimizer update
    # per 256 (64) step rows: a step's rows split into
    # ceil(rows / mini_batch_rows) updates (an ALFWorld step of 128
    # episodes x 20-50 turns: 10-25 updates; WebShop 128 x 5-15: 10-30).
    # The toy as ALFWorld.
    "train.mini_batch_rows": ByEnv(
        alfworld=256, webshop=64, toy=256, spell=256
    ),
    "train.updates_per_step": 0,  # 0: mini_batch_rows decides
    # [verl] actor.ppo_epochs: 1 (the scripts leave it).
    "train.ppo_epochs": 1,
    # [va:*] trainer.test_freq=5 (and val_before_train=True: we evaluate
    # at the start and the end of every run anyway).
    "train.eval_every": 5,
    # [paper] RL starts from the instruct model: no warm start. The other
    # sft.* are not from the paper; they are what launch/sft.py uses on a
    # pretrained model (a fine-tuning rate, not the from-scratch 1e-3).
    "sft.enabled": False,
    "sft.num_episodes": 256,
    "sft.steps": 200,
    "sft.lr": 1e-5,
    "sft.batch_rows": 32,
    "sft.prompt_loss_weight": 0.0,
    # FSDP over every device (verl's FSDP workers); configs/mesh/*.py
    # replace it for a given machine.
    "mesh.shape": (1, -1, 1),
}

# ---------------------------------------------------------------- CPU
# The embedded default: RSPO end to end in ~15 minutes on 2 CPU cores.
# Every number that differs from PAPER is a CPU budget choice, measured
# (docs/results.md); the reasons are next to each.
CPU = {
    # From-scratch policies (a locally trained tokenizer): 0.6 M 'nano' on
    # the small worlds below; the toy's 3.5 M 'tiny'.
    "model.preset": ByEnv(
        webshop="nano", alfworld="nano", toy="tiny", spell="tiny"
    ),
    # WebShop starts RL from the committed warm start (WEBSHOP_WARM_START,
    # nano behaviour-cloned on the world below; greedy success 24.6 % of
    # the 256 held-out goals) instead of ~20 minutes of behaviour cloning
    # on 2 cores; `sft.enabled=True,model.checkpoint_dir=` clones again.
    # The others clone at start (sft.*).
    "model.checkpoint_dir": ByEnv(
        webshop=WEBSHOP_WARM_START, alfworld="", toy="", spell=""
    ),
    "model.dtype": "float32",
    "model.param_dtype": "float32",
    "model.remat": "none",
    # 2-4 blocks: little to save. Measured on 2 CPU cores, a forward +
    # backward of nano (64 x 768) / tiny (16 x 256): scanned 1-6 % slower
    # a step and 0.4-0.6 s slower to compile than unrolled.
    "model.scan_layers": False,
    # The expert solves the small WebShop in ~5 steps, ALFWorld's two task
    # types in 5-25.
    "env.max_steps": ByEnv(webshop=8, alfworld=20, toy=8, spell=4),
    # WebShop pages are long: one history entry and 768 prompt tokens keep
    # a 64-row update at ~50 k tokens (the oldest history goes first).
    "env.history_length": ByEnv(webshop=1, alfworld=2, toy=2, spell=2),
    # 256: every held-out goal of the WebShop world below (a paired 95 %
    # interval of final - start of about +-5 points); 32 fixed tasks else.
    "env.num_eval_tasks": ByEnv(webshop=256, alfworld=32, toy=32, spell=64),
    "env.num_workers": 2,
    "env.kwargs": ByEnv(
        # A 30-product catalogue (one product per type, 20 goals each, 256
        # held out for evaluation: the CPU study's world, where the
        # committed warm start was cloned) and an expert that searches by
        # product type: each decision is then a choice (which type, which
        # product, which option values) that a from-scratch policy learns on 2
        # cores, not the copying of a whole instruction that a pretrained
        # model brings. See docs/results.md for what the 3.5 M 'tiny'
        # policy did on the full world.
        webshop=dict(
            num_products=30,
            goals_per_product=20,
            num_test_goals=256,
            expert_query="type",
        ),
        # Two of the six task types (find an object, then place it / look
        # at it under a lamp): the shortest plans. expert: 'search' visits
        # receptacles until it sees the object (search.py; no hidden
        # state), stating what it sees as its thought; a 0.6 M policy
        # cloned from 512 of its episodes for 500 steps wins 5.0 % of
        # valid_seen greedily (140 tasks; 750 steps: 5.0 %, 1000: 5.0 %).
        # 'oracle' knows where objects are (its clone, 256 episodes, 300
        # steps: 3 %; runs/alfworld_search has the sweeps). num_tasks:
        # ALFWorld's split sizes (AlfWorldEnv's defaults, here to be
        # overridden: they count all six types, the two kept get a third).
        alfworld=dict(
            task_types=("pick_and_place_simple", "look_at_obj_in_light"),
            expert="search",
            num_tasks=dict(train=3553, valid_seen=140, valid_unseen=134),
        ),
        toy={},
        # A 4-letter word over a..e: a random policy wins 1 / 625.
        spell=dict(
            word_length=4,
            alphabet_size=5,
            dense="aligned",
            expert_digits=10,
            slack=0,
            expert_unknown="abstain",
            show_digit=False,
            cipher_digits=10,
            decoy_positions=0,
            decoy_weight=1.0,
        ),
    ),
    "algo.clip_eps": 0.2,  # the paper's objective (CPU_KEEPS_PAPER)
    "algo.kl_coef": 0.01,
    "algo.kl_kind": "k3",
    "algo.entropy_coef": 0.001,
    "algo.invalid_action_penalty": -0.1,
    "algo.critic_lr": 1e-5,
    # WebShop: the paper's 1/8 of its 16 x 8 batch, 16 replayed
    # trajectories. Else 1/4 of a 4 x 4 batch: one replayed group (1/8
    # would be half a group) = 4 of 16 trajectories when replay selects
    # trajectories (alpha is a share of training samples), so at least one
    # replayed trajectory.
    "rspo.alpha": ByEnv(webshop=1 / 8, alfworld=1 / 4, toy=1 / 4, spell=1 / 4),
    "rspo.k": 3,
    # The environment's progress signal: a privileged oracle (it encodes
    # the expert's plan), named as such; every CPU result says it used it.
    "rspo.dense_reward": "oracle",
    "rollout.temperature": 1.0,  # behaviour log-probs are taken at T=1
    # WebShop: the paper's T = 0.4 on its 256 goals, one sample each. Three
    # A steps move a 0.6 M policy's probabilities more than its modes: the
    # default run's greedy success went 24.6 -> 24.6 % where T = 0.4 went
    # 21.9 -> 24.2 % (same run, docs/results/default_run). Greedy else:
    # 32-64 tasks, one sample. The studies evaluate greedy in training
    # (experiments/runner.py) and at T = 0.4 and 1 after (launch/eval.py).
    "rollout.eval_temperature": ByEnv(
        webshop=0.4, alfworld=0.0, toy=0.0, spell=0.0
    ),
    # '<think>..</think><action>search[..]</action>' fits 64 tokens.
    "rollout.max_new_tokens": ByEnv(webshop=64, alfworld=64, toy=16, spell=16),
    "rollout.max_prompt_tokens": ByEnv(
        webshop=768, alfworld=768, toy=256, spell=256
    ),
    # WebShop: 1 RSPO loop of k = 3 at 16 x 8, every row. Measured alone
    # on 2 cores (docs/results/default_run): an A step ~78 s, a B step
    # ~90 s, B's stored collection ~20 s, ~9 min a loop with its
    # compiles, plus two evaluations of the 256 goals at ~45 s each: 1
    # loop took 10.1 min from a fresh clone (2026-12-05); 2 loops took
    # 20.2 min (2026-12-03), over the default run's 15.
    # The others: 2 loops of k = 3.
    "train.total_steps": ByEnv(webshop=3, alfworld=6, toy=6, spell=6),
    # WebShop: the paper's batch (16 x 8; PPO 128 x 1), what the CPU study
    # found to learn (GRPO +6.4 points [+1.8, +11.1] at T = 0.4 in 30 A
    # steps, every row trained; 4 x 4 with 64 rows: +0.0 [-5.5, +5.3];
    # docs/results/study_allrows). Else 4 groups: 3 fresh + 1 replayed at
    # alpha=1/4, of 4, the smallest group with a usable GRPO baseline.
    "train.batch_tasks": ByEnv(
        webshop=ByAlgo({"ppo": 128, "*": 16}), alfworld=4, toy=4, spell=4
    ),
    "train.group_size": ByEnv(
        webshop=ByAlgo({"ppo": 1, "*": 8}), alfworld=4, toy=4, spell=4
    ),
    # A 0.6-3.5 M model needs a larger step than 1e-6. WebShop/ALFWorld:
    # 3e-4 with 4 updates a step is the smallest tried at which A's clip
    # window binds (README "Results": at 1e-4 and 2 updates it never did).
    "train.lr": ByEnv(webshop=3e-4, alfworld=3e-4, toy=3e-5, spell=3e-5),
    "train.weight_decay": 0.0,
    # WebShop: every row (the paper's), an update's gradient accumulated
    # over 32-row pieces (memory only); else the whole update at once on
    # at most 64 step rows a step.
    "train.micro_batch_rows": ByEnv(webshop=32, alfworld=0, toy=0, spell=0),
    "train.max_train_rows": ByEnv(webshop=0, alfworld=64, toy=64, spell=64),
    # A fixed number of optimizer updates per step (4; the toys 2),
    # whatever the step's row count (16 to 64 rows; WebShop's 16 x 8: ~600),
    # so the clip window acts in every default run (at the first update
    # r = 1 on fresh rows, r = c on replayed ones).
    "train.mini_batch_rows": 0,
    "train.updates_per_step": ByEnv(webshop=4, alfworld=4, toy=2, spell=2),
    "train.ppo_epochs": 1,
    "train.eval_every": 0,  # evaluate at the start and the end only
    # Behaviour cloning only far enough for a weak policy (paper: instruct
    # models start at low but non-zero success). WebShop: off, its
    # committed warm start (model.checkpoint_dir) was made with the sft.*
    # below.
    "sft.enabled": ByEnv(webshop=False, alfworld=True, toy=True, spell=True),
    # WebShop: every train goal of the world (257); 500 steps (~20 min at
    # ~2.5 s a step): option values start to be copied from the instruction
    # (score 0.75 vs 0.50 after 300 steps), so A's rollouts win on goals
    # whose options are not a product's default.
    # spell: the toy's budget; its clone spelled 0 of 64 held-out words
    # (letters right 0.19, chance 0.20): it knows the format, not the cipher.
    "sft.num_episodes": ByEnv(webshop=275, alfworld=512, toy=64, spell=64),
    "sft.steps": ByEnv(webshop=500, alfworld=500, toy=40, spell=40),
    # 3e-3 on the small worlds; the toy's 'tiny': 2e-3 made its greedy
    # replies degenerate, 1e-3.
    "sft.lr": ByEnv(webshop=3e-3, alfworld=3e-3, toy=1e-3, spell=1e-3),
    "sft.batch_rows": 16,
    "sft.prompt_loss_weight": ByEnv(
        webshop=1.0, alfworld=1.0, toy=0.0, spell=0.0
    ),
    "mesh.shape": (-1, 1, 1),  # data parallel over the local CPU devices
}


def resolve(table: dict, env: str, algo: str) -> dict:
  """{key: value} of `table` for one environment and algorithm name."""
  out = {}
  for key, value in table.items():
    if isinstance(value, ByEnv):
      value = value[env]
    if isinstance(value, ByAlgo):
      value = value.get(algo, value["*"])
    out[key] = value
  return out
