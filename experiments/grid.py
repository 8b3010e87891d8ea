"""The results grids: which runs, named how, with which overrides.

A run is a ``RunSpec``: a cell (env, algo, variant) and a seed; its
``--config`` argument is ``configs/<env>_<algo>.py:<variant overrides>,
seed=<seed>[,--extra]`` (toy: configs/toy_grpo.py with ``algo.name``), its
workdir ``<root>/<env>_<algo>_<variant>_s<seed>``. The grids
(experiments/reproduce.py's ``--grid``):

  main       env x algo x {baseline (``rspo=0``), rspo (``rspo=1``)} x seed
             (``main_grid``; the paper's table, ``PAPER_SUCCESS``);
  ablations  WebShop GRPO x ``ABLATION_VARIANTS`` (``ablation_grid``;
             rows and paper numbers ``ABLATION_ROWS``);
  study      the CPU study (``study_grid``): ``STUDY_OVERRIDES`` per env,
             ``STUDY_VARIANTS`` naming the dense reward, ``study_cells``,
             and the sampled evaluations ``SAMPLED``.

Pure names and strings: nothing here reads or runs anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Optional, Sequence

from configs.base import last_override
from third_party_envs import spell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENVS = ("webshop", "alfworld")
TEST_ENVS = ("toy",)  # accepted by --envs, in no default grid
ALGOS = ("grpo", "ppo", "gigpo")
SEEDS = (0, 200, 400)
MAIN_VARIANTS = {"baseline": "rspo=0", "rspo": "rspo=1"}
ALGO_LABELS = {"grpo": "GRPO", "ppo": "PPO", "gigpo": "GiGPO"}
ENV_LABELS = {"webshop": "WebShop", "alfworld": "ALFWorld", "toy": "Toy"}
# The paper's Table 1 (docs/results.md "What is measured"): Qwen2.5-1.5B,
# success rate %, (env, algo, variant).
PAPER_SUCCESS = {
    ("alfworld", "grpo", "baseline"): 69.0,
    ("alfworld", "grpo", "rspo"): 74.7,
    ("alfworld", "ppo", "baseline"): 68.0,
    ("alfworld", "ppo", "rspo"): 76.6,
    ("alfworld", "gigpo", "baseline"): 88.8,
    ("alfworld", "gigpo", "rspo"): 90.4,
    ("webshop", "grpo", "baseline"): 65.1,
    ("webshop", "grpo", "rspo"): 70.6,
    ("webshop", "ppo", "baseline"): 57.3,
    ("webshop", "ppo", "rspo"): 69.3,
    ("webshop", "gigpo", "baseline"): 67.4,
    ("webshop", "gigpo", "rspo"): 75.3,
}


# --------------------------------------------------------------------------
# Runs and the main grid
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run: a cell of the grid (env, algo, variant) and a seed."""

  env: str
  algo: str
  variant: str
  seed: int
  overrides: str = ""  # the variant's config overrides
  start_eval: str = ""  # the shared warm start's eval_start.json, if any
  # Overrides after --extra, for a key a grid's recipe (in --extra) sets
  # and one cell must change: the spell study's GiGPO at RSPO's
  # environment steps (steps=60 after SPELL_OVERRIDES' steps=30).
  late_overrides: str = ""
  # A variant of the same grid and seed whose final policy this run starts
  # from (runner.py: <root>/<that run>/final_policy, after everything
  # else, so it wins over the shared warm start): a reward switched in
  # mid-training, as the spell study's ``from_gigpo_*`` cells.
  start_from: str = ""

  @property
  def name(self) -> str:
    return run_name(self.env, self.algo, self.variant, self.seed)

  def config_arg(self, extra: str = "") -> str:
    """``configs/<file>.py:<variant>,seed=<seed>[,algo.name=..][,extra]
    [,late_overrides]``."""
    if self.env in TEST_ENVS:
      path = os.path.join(ROOT, "configs", f"{self.env}_grpo.py")
      algo = "" if self.algo == "grpo" else f"algo.name={self.algo}"
    else:
      path = os.path.join(ROOT, "configs", f"{self.env}_{self.algo}.py")
      algo = ""
    parts = [
        self.overrides,
        f"seed={self.seed}",
        algo,
        extra.strip(" ,"),
        self.late_overrides,
    ]
    return f"{path}:" + ",".join(p for p in parts if p)


def run_name(env: str, algo: str, variant: str, seed: int) -> str:
  return f"{env}_{algo}_{variant}_s{seed}"


def config_key(config: str) -> str:
  """A ``--config`` argument as a finished run's is compared with its
  spec's: without the repository's directory (the part before
  ``configs/``, so that a clone elsewhere matches) and without
  ``model.checkpoint_dir`` (a spec names the shared warm start only while
  some run still trains; the warm start's own config is checked by its
  done.json)."""
  path, _, overrides = config.partition(":")
  i = path.rfind(f"{os.sep}configs{os.sep}")
  repo = path[: i + 1] if i > 0 else ""
  kept = [
      p
      for p in overrides.split(",")
      if not p.startswith("model.checkpoint_dir=")
  ]
  key = f"{path}:{','.join(kept)}"
  return key.replace(repo, "") if repo else key


def _pick(
    kind: str, wanted: Optional[Sequence], known: Sequence, default: Sequence
) -> list:
  if not wanted:
    return list(default)
  bad = [w for w in wanted if w not in known]
  if bad:
    raise ValueError(f"unknown {kind} {bad}; known: {list(known)}")
  return list(dict.fromkeys(wanted))


def make_grid(
    variants: dict[str, str],
    envs: Optional[Sequence[str]] = None,
    algos: Optional[Sequence[str]] = None,
    seeds: Optional[Sequence[int]] = None,
    names: Optional[Sequence[str]] = None,
    default_envs: Sequence[str] = ENVS,
    default_algos: Sequence[str] = ALGOS,
) -> list[RunSpec]:
  """env x algo x variant x seed, filtered; ValueError on unknown names."""
  envs = _pick("env", envs, ENVS + TEST_ENVS, default_envs)
  algos = _pick("algo", algos, ALGOS, default_algos)
  names = _pick("variant", names, tuple(variants), tuple(variants))
  seeds = list(dict.fromkeys(int(s) for s in seeds)) if seeds else SEEDS
  return [
      RunSpec(e, a, v, s, variants[v])
      for e, a, v, s in itertools.product(envs, algos, names, seeds)
  ]


def main_grid(envs=None, algos=None, seeds=None, variants=None):
  """The paper's main table: baseline and RSPO for every env x algo."""
  return make_grid(MAIN_VARIANTS, envs, algos, seeds, variants)


def start_run(spec: RunSpec) -> Optional[str]:
  """The name of the run ``spec`` starts from (``start_from``), or None."""
  if not spec.start_from:
    return None
  return run_name(spec.env, spec.algo, spec.start_from, spec.seed)


def from_warm_start(
    spec: RunSpec, policy: str, start_eval: str = ""
) -> RunSpec:
  """The run, starting from ``policy`` instead of its own SFT (and, given
  ``start_eval``, from that policy's evaluation)."""
  overrides = ",".join(
      p for p in (spec.overrides, f"model.checkpoint_dir={policy}") if p
  )
  return dataclasses.replace(spec, overrides=overrides, start_eval=start_eval)


def with_rl_extra(spec: RunSpec, rl_extra: str) -> RunSpec:
  """The run with ``rl_extra`` after its variant's overrides (--rl_extra:
  the RL runs' settings only; the shared warm start keeps ``--extra``)."""
  overrides = ",".join(p for p in (spec.overrides, rl_extra.strip(" ,")) if p)
  return dataclasses.replace(spec, overrides=overrides)


# --------------------------------------------------------------------------
# The ablations (WebShop GRPO; experiments/ablations.py)
# --------------------------------------------------------------------------

ABLATION_VARIANTS = {
    "rspo": MAIN_VARIANTS["rspo"],  # the same run as the main grid's
    "sample_variance": "rspo=1,rspo.sampling=variance",
    "sample_random": "rspo=1,rspo.sampling=random",
    "rspo_h": "rspo=1,rspo.data_source=history",
    "rspo_o": "rspo=1,rspo.data_source=outcome",
    "dense_only": "rspo=0,rspo.dense_only=1",
    "baseline": MAIN_VARIANTS["baseline"],
}
# (group, setting, variant, paper's WebShop GRPO success %).
ABLATION_ROWS = (
    ("sampling", "reward", "rspo", 70.6),
    ("sampling", "variance", "sample_variance", 63.0),
    ("sampling", "random", "sample_random", 12.8),
    ("data source", "RSPO_H", "rspo_h", 57.0),
    ("data source", "RSPO_O", "rspo_o", 64.1),
    ("data source", "RSPO", "rspo", 70.6),
    ("dense only", "dense reward alone", "dense_only", None),
    ("baseline", "GRPO", "baseline", 65.1),
)
ABLATION_PAPER_CELL = ("webshop", "grpo")  # the cell of the paper's numbers


def ablation_grid(envs=None, algos=None, seeds=None, variants=None):
  """WebShop GRPO x ABLATION_VARIANTS x seeds (``envs``/``algos`` may
  retarget)."""
  return make_grid(
      ABLATION_VARIANTS,
      envs,
      algos,
      seeds,
      variants,
      default_envs=("webshop",),
      default_algos=("grpo",),
  )


def paper_success(env: str, algo: str, variant: str) -> Optional[float]:
  """The paper's success rate (%) of a cell: the main table's, or an
  ablation row's for the ablations' cell; None when it has none."""
  if variant in MAIN_VARIANTS:
    return PAPER_SUCCESS.get((env, algo, variant))
  if (env, algo) != ABLATION_PAPER_CELL:
    return None
  return {v: paper for _, _, v, paper in ABLATION_ROWS}.get(variant)


# --------------------------------------------------------------------------
# The CPU study: intervals over goals, sampling seeds and training seeds
# --------------------------------------------------------------------------

STUDY_ROOT = os.path.join(ROOT, "runs", "study")
STUDY_ENVS = ("webshop",)  # the default; --envs alfworld runs the other
STUDY_ALGOS = ("grpo", "gigpo")
# Applied to the shared warm start, its evaluations and every run (before
# --extra, which may override them); an env without an entry has no study.
# WebShop: the paper's batch shape (16 tasks x 8 samples), 30 A steps
# (rspo.k = 3: 10 RSPO loops) and 256 held-out goals: the CPU world (30
# products) at 20 goals a product keeps 513 solvable goals, 256 test and
# 257 train (12 a product: 339, 83 train). ALFWorld: the same batch shape
# and 30 A steps, from the searching expert's warm start (the CPU
# default, env.kwargs.expert=search), evaluated on 140 valid_seen tasks of
# the two CPU task types (num_tasks counts all six types: 420 -> 140 of
# two; the default 140 leaves 46).
STUDY_OVERRIDES = {
    "webshop": (
        "train.batch_tasks=16,train.group_size=8,steps=30,"
        "env.kwargs.goals_per_product=20,env.kwargs.num_test_goals="
        "256,env.num_eval_tasks=256"
    ),
    "alfworld": (
        "train.batch_tasks=16,train.group_size=8,steps=30,"
        "env.kwargs.num_tasks.valid_seen=420,"
        "env.num_eval_tasks=140"
    ),
    "toy": "",  # tests and smoke runs give their own --extra
}
DENSE = "rspo.dense_reward=oracle"  # named in every cell, used by RSPO's B
STUDY_VARIANTS = {
    "baseline": f"rspo=0,{DENSE}",
    "rspo": f"rspo=1,rspo.sampling=reward,{DENSE}",
    "sample_variance": f"rspo=1,rspo.sampling=variance,{DENSE}",
    "sample_random": f"rspo=1,rspo.sampling=random,{DENSE}",
}
STUDY_CELLS = {algo: tuple(STUDY_VARIANTS) for algo in STUDY_ALGOS}
# Envs whose study has other cells (algo -> variants) than STUDY_CELLS.
STUDY_ENV_CELLS = {"alfworld": {"grpo": ("baseline", "rspo")}}
# Sampled evaluations beside greedy, 3 sampling seeds each: the paper's
# T = 0.4, and the training temperature T = 1.0 (the distribution the RL
# objective improves; greedy and T = 0.4 read its mode). (label, tag, T)
SAMPLED = (
    ("T = 0.4, 3 seeds", "t04", 0.4),
    ("T = 1.0 (training), 3 seeds", "t10", 1.0),
)


def sampled_flags(temperature: float) -> tuple[str, ...]:
  return ("--seeds=0,1,2", f"--temperature={temperature}")


def sampled_names(tag: str) -> tuple[str, str]:
  """(start, final) evaluation file names of a sampled decoding."""
  return f"eval_start_{tag}.json", f"eval_final_{tag}.json"


def study_cells(env: str) -> dict:
  """{algo: variants} of an env's study."""
  return STUDY_ENV_CELLS.get(env, STUDY_CELLS)


def study_grid(envs=None, algos=None, seeds=None, variants=None):
  """The env's study_cells (WebShop: GRPO and GiGPO x 4 variants, the
  replay-sampling ablation in each; ALFWorld: GRPO x {baseline, rspo}) x
  seeds, filtered; ValueError for an env without a study recipe
  (STUDY_OVERRIDES)."""
  specs = make_grid(
      STUDY_VARIANTS,
      envs,
      algos,
      seeds,
      variants,
      default_envs=STUDY_ENVS,
      default_algos=STUDY_ALGOS,
  )
  for env in dict.fromkeys(s.env for s in specs):
    if env not in STUDY_OVERRIDES:
      raise ValueError(
          f"env {env!r} has no study recipe; known:"
          f" {', '.join(STUDY_OVERRIDES)}"
      )
  return [s for s in specs if s.variant in study_cells(s.env).get(s.algo, ())]


def study_extra(env: str, extra: str = "") -> str:
  return ",".join(
      p for p in (STUDY_OVERRIDES.get(env, ""), extra.strip(" ,")) if p
  )


# --------------------------------------------------------------------------
# The spell study (third_party_envs/spell.py; experiments/report/spell.py)
# --------------------------------------------------------------------------

# Does RSPO+GiGPO beat GiGPO where outcomes are sparse, and does the dense
# reward alone find wins faster, with an aligned and a misaligned dense
# reward, as the word (the horizon) grows? One env, one algorithm, the
# word length L from ``--extra env.kwargs.word_length=L`` (default
# SPELL_LENGTH); each world (L and the cipher's D) has its own root
# (spell_root) and so its own shared warm start.
SPELL_ENV, SPELL_ALGO, SPELL_LENGTH = "spell", "gigpo", 4
SPELL_SEEDS = (0, 200, 400, 600, 800)
SPELL_ROOT = os.path.join(ROOT, "runs", "spell")
# The recipe (the warm start's and every run's; --extra after it wins):
# one hidden letter (env.kwargs.cipher_digits=1: the word is that letter L
# times, so a random policy wins (1/5)^L, and a clone of the guessing
# expert that knows no digit, expert_digits=0, is uniform over the
# letters), a short warm start (300 behaviour-cloning steps: the reply
# format, no letter preferred), prompts without history, 8 tasks x 8
# samples, alpha 1/8 (7 fresh groups + 1 replayed), 30 A steps, every row
# trained, 256 held-out tasks (valid_seen). The RSPO cells set k = 10
# (3 loops: B's 10 dense-reward steps reach wins, 3 do not; rspo_k3
# keeps k = 3); k sits in the variants because the recipe comes after
# them and would win. Why one letter: the nano policy does not learn the
# full cipher, a 10-digit lookup, from reward at this batch size, not
# even as a one-turn bandit with 20 % random success; it does learn one
# letter (docs/results/log.md, 2026-12-04). The pilot's full cipher:
# docs/results/study_spell_L4.md.
SPELL_OVERRIDES = (
    "model.preset=nano,env.history_length=0,env.kwargs.cipher_digits=1,"
    "env.kwargs.expert_digits=0,env.kwargs.expert_unknown=guess,"
    "env.kwargs.show_digit=True,"
    "sft.num_episodes=1024,sft.steps=300,sft.lr=2e-3,sft.batch_rows=16,"
    "train.batch_tasks=8,train.group_size=8,rspo.alpha=0.125,steps=30,"
    "train.max_train_rows=0,train.lr=3e-4,env.num_eval_tasks=256"
)
K10 = "rspo.k=10"
# Two misleading dense rewards for B: 'misaligned' pays a letter of the
# word typed anywhere, which in the one-letter world is the answer (so it
# means something only with env.kwargs.cipher_digits > 1); 'decoy' pays
# the letter after the right one, farmable in every world. Neither is in
# the default grid (``--variants`` runs them).
MISALIGNED = "env.kwargs.dense=misaligned"
DECOY = "env.kwargs.dense=decoy"
NO_PENALTY = "algo.invalid_action_penalty=0"


def rspo_cell(k: int) -> str:
  """RSPO+GiGPO with reward sampling and k B steps a loop, B on DENSE."""
  return f"rspo=1,rspo.sampling=reward,rspo.k={k},{DENSE}"


RSPO_K10 = rspo_cell(10)
RSPO_O = (
    f"rspo=1,rspo.sampling=reward,rspo.data_source=outcome,{K10}," f"{DENSE}"
)
DENSE_ONLY = f"rspo=0,rspo.dense_only=1,{DENSE}"
SPELL_VARIANTS = {
    "baseline": f"rspo=0,{DENSE}",
    "rspo": RSPO_K10,
    "rspo_misaligned": f"{RSPO_K10},{MISALIGNED}",
    "rspo_decoy": f"{RSPO_K10},{DECOY}",
    "rspo_o": RSPO_O,
    "dense_only": DENSE_ONLY,
    "dense_only_misaligned": f"{DENSE_ONLY},{MISALIGNED}",
    "dense_only_decoy": f"{DENSE_ONLY},{DECOY}",
    "rspo_k3": rspo_cell(3),
    # One loop of k = 30 = every A step: at L = 8 the dense reward alone
    # first wins at its step 21, so B needs more than 20 steps to win.
    "rspo_k30": rspo_cell(30),
    # Without the invalid-action penalty (-0.1): B's replayed failures then
    # carry no advantage at all. Does that close the decoy cell's gap to
    # GiGPO at T = 1, and is RSPO's gain the penalty's handicap of GiGPO?
    # Each is compared with the baseline without the penalty.
    "rspo_decoy_nopen": f"{RSPO_K10},{DECOY},{NO_PENALTY}",
    "baseline_nopen": f"rspo=0,{DENSE},{NO_PENALTY}",
    "rspo_nopen": f"{RSPO_K10},{NO_PENALTY}",
    # The dense reward alone without the penalty: the "− dense alone"
    # contrasts of rspo_nopen and rspo_decoy_nopen.
    "dense_only_nopen": f"{DENSE_ONLY},{NO_PENALTY}",
    "dense_only_decoy_nopen": f"{DENSE_ONLY},{DECOY},{NO_PENALTY}",
}


# The paper's regime (docs/results.md, "The claim where the paper makes
# it"): a dense reward that helps early
# and misleads late, env.kwargs.dense=partial with decoy_positions = m
# (third_party_envs/spell.py: aligned prefix credit on the first L - m
# letters, the decoy on the last m whatever came before; m = 0 is
# 'aligned', m = L 'decoy'). A policy typing one letter everywhere earns
# (L - m) / L with the right letter and m / L with its decoy, so the
# decoy pays more iff m > L / 2. The calibration (docs/results/log.md,
# 2026-12-06; dense reward alone, L = 4, seed 0): m = 1 and 2 help (the
# policy learns the right letter everywhere and wins), m = 3 is hacked
# from the start (0 %), like m = 4, the decoy; no m showed Figure 3's
# rise then fall (decoy_weight at m = 2 is untried). PARTIAL_M brackets
# the switch: at L = 4, 2 helps, 3 and 4 are hacked; at L = 6, where a
# one-letter policy gains from the decoy only above m = 3, 4 is the switch.
PARTIAL_M = (2, 3, 4)
# RSPO+GiGPO (k = 10, alpha 1/8, 30 A steps) spends B's 3 loops x 11
# collections x 8 x 8 episodes besides A's 30 x 7 x 8: 59.25 x GiGPO's
# 30 x 8 x 8 episodes of L turns at any L (15,168 against 7,680
# environment steps at L = 4, 22,752 against 11,520 at L = 6). GiGPO run
# 60 A steps (15,360 and 23,040: 1.3 % more than RSPO's) is GiGPO at
# RSPO's environment steps; its first 30 steps are the 30-step run's
# (constant lr, the same seed), so it also gives that curve.
EQUAL_ENV_STEPS = 60
LONG = f"steps={EQUAL_ENV_STEPS}"


def partial(m: int) -> str:
  """The partly misleading dense reward with m decoy positions."""
  return f"env.kwargs.dense=partial,env.kwargs.decoy_positions={m}"


def partial_variants() -> dict[str, str]:
  """The partly misleading study's variants, with the invalid-action
  penalty and without it (``_nopen``): GiGPO at RSPO's environment steps
  (``baseline_long``), and per m in PARTIAL_M the dense reward alone
  (``dense_only_partial<m>``) and RSPO+GiGPO with B on it
  (``rspo_partial<m>``); RSPO_O without the penalty (``rspo_o_nopen``)."""
  out = {}
  for pen, tail in (("", ""), ("_nopen", f",{NO_PENALTY}")):
    out[f"baseline_long{pen}"] = f"rspo=0,{DENSE}{tail}"
    for m in PARTIAL_M:
      out[f"dense_only_partial{m}{pen}"] = f"{DENSE_ONLY},{partial(m)}{tail}"
      out[f"rspo_partial{m}{pen}"] = f"{RSPO_K10},{partial(m)}{tail}"
  out["rspo_o_nopen"] = f"{RSPO_O},{NO_PENALTY}"
  return out


SPELL_VARIANTS.update(partial_variants())
# Adaptive B (issue 50 item 6, loop/adaptive_b.py): B takes its k = 10
# steps, then goes on until its odds of a win are 10x A's, up to 20 steps
# (B_K_MAX). At most 3 x 21 B collections + 30 x 7/8 of A's: 89.25 x
# GiGPO's 30, so GiGPO at 90 A steps (``baseline_x3_nopen``) is GiGPO at
# its largest cost.
B_K_MAX = 20
SPELL_VARIANTS["rspo_adaptive_partial2_nopen"] = (
    f"{RSPO_K10},rspo.b_k_max={B_K_MAX},{partial(2)},{NO_PENALTY}"
)
SPELL_VARIANTS["baseline_x3_nopen"] = f"rspo=0,{DENSE},{NO_PENALTY}"
# The dense reward alone at the same 90 A steps: it was still rising at
# its 30th step, so RSPO - dense alone at equal A steps flatters RSPO.
SPELL_VARIANTS["dense_only_x3_partial2_nopen"] = (
    f"{DENSE_ONLY},{partial(2)},{NO_PENALTY}"
)
# Overrides after --extra (RunSpec.late_overrides), by variant.
SPELL_LATE = {
    "baseline_long": LONG,
    "baseline_long_nopen": LONG,
    "baseline_x3_nopen": "steps=90",
    "dense_only_x3_partial2_nopen": "steps=90",
}
# Figure 3 on spell: the dense reward alone from a policy that already
# wins. GiGPO trains 30 A steps from the warm start (``baseline_nopen``,
# 55-70 % of rollouts won at 4 of 5 seeds at L = 4); the cell
# ``from_gigpo_<v>`` goes on from its final policy (fresh Adam moments)
# as cell v: on the outcome (the control; 60 A steps, RSPO's environment
# steps, for ``baseline_long_nopen``), on the dense reward alone with
# m = 2 or 3 decoy positions, or as RSPO+GiGPO with B on the m = 3
# reward (does RSPO keep A from a dense reward that is hacked?). The
# start is a policy that wins, not the warm start, so the dense reward
# can be seen rising while success falls.
SWITCHED = (
    "baseline_nopen",
    "dense_only_partial2_nopen",
    "dense_only_partial3_nopen",
    "rspo_partial3_nopen",
    "baseline_long_nopen",
)
START_FROM = {f"from_gigpo_{v}": "baseline_nopen" for v in SWITCHED}
for _v in SWITCHED:
  SPELL_VARIANTS[f"from_gigpo_{_v}"] = SPELL_VARIANTS[_v]
  if _v in SPELL_LATE:
    SPELL_LATE[f"from_gigpo_{_v}"] = SPELL_LATE[_v]


def partial_study(penalty: bool = False) -> tuple[str, ...]:
  """The partly misleading study's cells: GiGPO, GiGPO at RSPO's
  environment steps, RSPO_O, and per m in PARTIAL_M the dense reward
  alone and RSPO+GiGPO on it; without the invalid-action penalty (the
  main setting), or with it (the check)."""
  pen = "" if penalty else "_nopen"
  return (
      f"baseline{pen}",
      f"baseline_long{pen}",
      f"rspo_o{pen}",
      *(
          f"{cell}_partial{m}{pen}"
          for m in PARTIAL_M
          for cell in ("dense_only", "rspo")
      ),
  )


SPELL_DEFAULT_VARIANTS = ("baseline", "rspo", "rspo_o", "dense_only", "rspo_k3")
# Sampled evaluations beside greedy: the training temperature, 3 seeds.
SPELL_SAMPLED = (("T = 1.0 (training), 3 seeds", "t10", 1.0),)


def _sparse_grid(
    env: str,
    table: dict,
    default_seeds: Sequence[int],
    envs,
    algos,
    seeds,
    variants,
    run_overrides: str = "",
    late: Optional[dict] = None,
    starts: Optional[dict] = None,
) -> list[RunSpec]:
  """env x GiGPO x variants (default SPELL_DEFAULT_VARIANTS, any of
  ``table``'s; each run's overrides its variant's, then ``run_overrides``;
  after --extra ``late``'s of its variant; starting from the final policy
  of ``starts``' variant, if any) x seeds, seed-major (a cut-short pass
  leaves whole seeds of every cell); ValueError on another env or
  algorithm."""
  _pick("env", envs, (env,), (env,))
  _pick("algo", algos, (SPELL_ALGO,), (SPELL_ALGO,))
  names = _pick("variant", variants, tuple(table), SPELL_DEFAULT_VARIANTS)
  seeds = (
      list(dict.fromkeys(int(s) for s in seeds))
      if seeds
      else list(default_seeds)
  )
  late = late or {}
  return [
      RunSpec(
          env,
          SPELL_ALGO,
          v,
          s,
          ",".join(p for p in (table[v], run_overrides) if p),
          late_overrides=late.get(v, ""),
          start_from=(starts or {}).get(v, ""),
      )
      for s in seeds
      for v in names
  ]


def spell_grid(envs=None, algos=None, seeds=None, variants=None):
  """spell x GiGPO x variants (default SPELL_DEFAULT_VARIANTS, any of
  SPELL_VARIANTS) x seeds (default SPELL_SEEDS)."""
  return _sparse_grid(
      SPELL_ENV,
      SPELL_VARIANTS,
      SPELL_SEEDS,
      envs,
      algos,
      seeds,
      variants,
      late=SPELL_LATE,
      starts=START_FROM,
  )


def _int_in(value: str, key: str, lo: int, hi: Optional[int] = None) -> int:
  if not value.isdigit() or int(value) < lo or (hi and int(value) > hi):
    bound = f"in [{lo}, {hi}]" if hi else f">= {lo}"
    raise ValueError(f"{key} wants an integer {bound}, got {value!r}")
  return int(value)


def spell_length(extra: str = "") -> int:
  """The word length L an ``--extra`` sets (its last
  env.kwargs.word_length=), else SPELL_LENGTH; ValueError when not an
  integer >= 1."""
  key = "env.kwargs.word_length"
  return _int_in(last_override(extra, key, str(SPELL_LENGTH)), key, 1)


def spell_name(extra: str = "") -> str:
  """The world's name: ``L<L>``, or ``L<L>_D<D>`` when SPELL_OVERRIDES
  and then ``extra`` (the last wins) set env.kwargs.cipher_digits=D below
  the full cipher's 10; ValueError when D is not in [1, 10]."""
  key = "env.kwargs.cipher_digits"
  digits = _int_in(
      last_override(f"{SPELL_OVERRIDES},{extra}", key, str(spell.DIGITS)),
      key,
      1,
      spell.DIGITS,
  )
  tag = "" if digits == spell.DIGITS else f"_D{digits}"
  return f"L{spell_length(extra)}{tag}"


def spell_root(extra: str = "") -> str:
  """``runs/spell/<spell_name>``: one root, so one warm start, per
  world (word length and cipher)."""
  return os.path.join(SPELL_ROOT, spell_name(extra))


def spell_extra(extra: str = "") -> str:
  """SPELL_OVERRIDES, then ``--extra`` (which may override them)."""
  return ",".join(p for p in (SPELL_OVERRIDES, extra.strip(" ,")) if p)


# --------------------------------------------------------------------------
# The WebShop sparse study (docs/results.md; experiments/report/spell.py)
# --------------------------------------------------------------------------

# RSPO where WebShop's outcomes are sparse: the CPU study's world, batch
# (16 x 8) and 30 A steps (STUDY_OVERRIDES), every row trained, alpha 1/8
# (14 fresh + 2 replayed groups, the paper's split), from a weaker warm
# start: 300 behaviour-cloning steps instead of 500 (held-out success at
# T = 1 5 % instead of 16 %), so most groups of 8 episodes all fail. The
# cells are the spell study's (SPELL_DEFAULT_VARIANTS: GiGPO, RSPO+GiGPO
# with k = 10 and 3, RSPO_O, the dense reward alone), B's dense reward the
# WebShop oracle. The A steps sit in each run's overrides, not in the
# shared ones, so that ``--rl_extra steps=12`` can shorten the runs without
# another warm start: the gate (does the dense reward find wins faster?
# docs/results.md "WebShop where outcomes are sparse: the gate") is
# ``--variants baseline,dense_only --rl_extra steps=12 --root
# runs/webshop_sparse_gate``, whose warm_start_webshop links to
# SPARSE_ROOT's.
SPARSE_ENV = "webshop"
SPARSE_ROOT = os.path.join(ROOT, "runs", "webshop_sparse")
SPARSE_STEPS = "steps=30"
SPARSE_OVERRIDES = (
    "train.batch_tasks=16,train.group_size=8,"
    "env.kwargs.goals_per_product=20,"
    "env.kwargs.num_test_goals=256,env.num_eval_tasks=256,"
    "sft.steps=300,rspo.alpha=0.125,train.max_train_rows=0,"
    "train.micro_batch_rows=32"
)
# LoRA instead of full fine-tuning (docs/results.md "LoRA against full
# fine-tuning, WebShop"): rank 16 on every attention
# and MLP projection, alpha 32, the base frozen. lr 1e-3 against full
# fine-tuning's 3e-4: Adam moves each entry of B by about lr a step, and
# (alpha / r) A B then moves an entry of W by about 2 x sqrt(16) x
# 0.05 x lr = 0.4 lr (A's entries uniform in +-1/sqrt(128), rms 0.05),
# so ~3x the lr was to give updates of full fine-tuning's size; measured
# on the gate (docs/results.md, LoRA), LoRA's approx_kl a step is a third
# of full fine-tuning's (median 0.00014 vs 0.00045). By name only, on
# WebShop only: the spell recipe sets its own lr after the variant's.
# These lrs are the adapters' own (train.lora_lr_multiplier=1), as run.
LORA = (
    "model.lora_rank=16,model.lora_alpha=32,train.lr=1e-3,"
    "train.lora_lr_multiplier=1"
)
SPARSE_TABLE = {
    v: o
    for v, o in SPELL_VARIANTS.items()
    if "env.kwargs.dense=" not in o  # not spell's own rewards
    and v not in SPELL_LATE
}  # nor spell's step counts
SPARSE_TABLE.update(
    baseline_lora=f"rspo=0,{DENSE},{LORA}",
    rspo_lora=f"{RSPO_K10},{LORA}",
    # LoRA at 3x the lr: are its steps too small at 1e-3?
    baseline_lora3e3=f"rspo=0,{DENSE},{LORA},train.lr=3e-3",
)
# GRPO instead of GiGPO (LoRA vs full fine-tuning on GRPO and RSPO+GRPO
# too): these two keys turn the GiGPO config into
# configs/webshop_grpo.py's (configs/base.py: GiGPO on WebShop differs only
# in algo.name and mean_norm). The run names keep the grid's algo, gigpo:
# the variant names the algorithm.
GRPO = "algo.name=grpo,algo.normalize_std=True"
SPARSE_TABLE.update(
    grpo=f"rspo=0,{DENSE},{GRPO}",
    grpo_lora=f"rspo=0,{DENSE},{GRPO},{LORA}",
    rspo_grpo=f"{RSPO_K10},{GRPO}",
    rspo_grpo_lora=f"{RSPO_K10},{GRPO},{LORA}",
)
SPARSE_VARIANTS = tuple(SPARSE_TABLE)


def sparse_grid(envs=None, algos=None, seeds=None, variants=None):
  """webshop x GiGPO x variants (default SPELL_DEFAULT_VARIANTS, any of
  SPARSE_VARIANTS) x seeds (default SEEDS)."""
  return _sparse_grid(
      SPARSE_ENV,
      SPARSE_TABLE,
      SEEDS,
      envs,
      algos,
      seeds,
      variants,
      SPARSE_STEPS,
  )


def sparse_extra(extra: str = "") -> str:
  """SPARSE_OVERRIDES, then ``--extra`` (which may override them)."""
  return ",".join(p for p in (SPARSE_OVERRIDES, extra.strip(" ,")) if p)
