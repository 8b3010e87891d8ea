"""Offline ALFWorld games: sampled from the wheel's layouts, checked by play.

A game is the pair ALFWorld ships per trial: ``game.tw-pddl`` (JSON
``{pddl_domain, grammar, pddl_problem, solvable, walkthrough}``) next to
``traj_data.json`` (``task_type``, ``pddl_params``, ``scene``,
``turk_annotations``), so the stock loaders (``AlfredTWEnv``,
``textworld.start``) play it. Everything comes from the alfworld wheel:
domain ``alfred.pddl``, grammar ``alfred.twl2``, goals and goal templates
from ``gen/goal_library.py``, object/receptacle rules from
``gen/constants.py`` and the 120 floor plans in ``gen/layouts``.

Task ``task_id`` of a split has type ``TASK_TYPES[task_id % 6]``; the rest
(room, object/receptacle targets, object placement, start pose, goal
template) is drawn from ``random.Random('...:{seed}:{split}:{task_id}:{k}')``
for attempts ``k = 0, 1, ...``: the first attempt whose walkthrough wins
when played in the engine is kept (unsolvable problems are discarded), so a
game is a pure function of ``(seed, split, task_id)``. The walkthrough is
the full-knowledge expert's plan (``expert.py``), which is as short as the
engine's fast-downward plan (``policy_commands``, tested) but takes
milliseconds where fast-downward takes 0.1 s to minutes in a kitchen; it is
stored as the game's ``walkthrough``, as ALFWorld's generator does.

Splits by layout: ``train`` and ``valid_seen`` use ALFRED's training floor
plans (``constants.TRAIN_SCENE_NUMBERS``) and split the goal combinations
``(room, type, object, receptacle, lamp)`` between them by a stable hash
(1 in 5 to ``valid_seen``), so validation goals never occur in training;
``valid_unseen`` uses the held-out floor plans
(``constants.TEST_SCENE_NUMBERS``). Sampling rules follow ALFRED: the goal
is not already true at the start, cleaning needs a sink basin, heating a
microwave, cooling a fridge, ``look_at_obj_in_light`` a desk lamp standing
on a desk, side table or dresser.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import tempfile
from typing import Optional

from alfworld import info as alfworld_info
from alfworld.gen import constants
from alfworld.gen import goal_library

from third_party_envs.alfworld import expert
from third_party_envs.alfworld import problem
from third_party_envs.alfworld import scenes
from third_party_envs.alfworld import speedups
from third_party_envs.alfworld import tw

GEN_VERSION = "v1"
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
GEN_SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_CACHE_DIR = os.path.expanduser("~/.cache/rspo_jax/alfworld")
MAX_ATTEMPTS = 32
_TOOL = {  # the appliance a state-change task needs
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}


def split_scenes(split: str) -> tuple[int, ...]:
  """Floor plans a split draws from."""
  have = set(scenes.available_scenes())
  if split in ("train", "valid_seen"):
    return tuple(sorted(have & set(constants.TRAIN_SCENE_NUMBERS)))
  if split == "valid_unseen":
    return tuple(sorted(have & set(constants.TEST_SCENE_NUMBERS)))
  raise ValueError(f"unknown split {split!r}; known: {list(GEN_SPLITS)}")


def _holders(scene: scenes.Scene, otype: str, exclude=()) -> list:
  return [
      r
      for r in scene.receptacles
      if otype in constants.VAL_RECEPTACLE_OBJECTS.get(r.type, ())
      and r.type not in exclude
  ]


def _combo_split(scene_num: int, key: tuple) -> str:
  """Stable train / valid_seen assignment of a goal combination."""
  text = f"{scene_num}:" + ":".join(key)
  digest = hashlib.sha256(text.encode()).digest()
  return "valid_seen" if digest[0] % 5 == 0 else "train"


@functools.lru_cache(maxsize=None)
def goal_combos(scene_num: int, task_type: str) -> tuple:
  """All ``(object, parent, toggle)`` goals of ``task_type`` in a room."""
  scene = scenes.load_scene(scene_num)
  if scene.room not in constants.GOALS_VALID[task_type]:
    return ()
  objs = scene.pickupable_types
  if task_type == "look_at_obj_in_light":
    if "DeskLamp" not in scene.object_types or not _lamp_holders(scene):
      return ()
    return tuple((o, "", "DeskLamp") for o in objs if _holders(scene, o))
  exclude = ()
  if task_type in _TOOL:
    tool, prop = _TOOL[task_type]
    if tool not in scene.receptacle_types:
      return ()
    objs = [o for o in objs if o in constants.VAL_ACTION_OBJECTS[prop]]
    exclude = (tool,)
  combos = []
  for o in objs:
    for parent in sorted(scene.receptacle_types - set(exclude)):
      if not _holders(scene, o, exclude=(parent,)):
        continue  # nowhere to start from
      if o in constants.VAL_RECEPTACLE_OBJECTS.get(parent, ()):
        combos.append((o, parent, ""))
  return tuple(combos)


def _lamp_holders(scene: scenes.Scene) -> list:
  return [r for r in scene.receptacles if r.type in scenes.LAMP_RECEPTACLES]


@functools.lru_cache(maxsize=None)
def split_combos(split: str, task_type: str) -> tuple[tuple[int, tuple], ...]:
  """``(scene, combo)`` pairs a split may sample for ``task_type``."""
  out = []
  for num in split_scenes(split):
    for combo in goal_combos(num, task_type):
      if split == "valid_unseen" or _combo_split(num, combo) == split:
        out.append((num, combo))
  return tuple(out)


def _new_id(rng, otype, recep, used) -> str:
  x, y, z = recep.xyz
  while True:
    oid = scenes.make_id(
        otype,
        (
            x + rng.uniform(-0.4, 0.4),
            y + rng.uniform(0.0, 0.1),
            z + rng.uniform(-0.4, 0.4),
        ),
    )
    if oid not in used:
      used.add(oid)
      return oid


def place_objects(rng, scene, params) -> Optional[list]:
  """Samples the room's loose objects; None if the goal cannot be set up.

  Each pickupable type of the room gets 1-3 instances (the target 1-3, two
  to four for ``pick_two``), each in a random receptacle that may hold it;
  targets avoid the goal receptacle type (and the fridge for cooling, which
  would make them cold already). A desk lamp stands on a lamp receptacle.
  """
  target = params.object_target
  avoid = {params.parent_target} - {""}
  if params.task_type == "pick_cool_then_place_in_recep":
    avoid.add("Fridge")
  used = {r.id for r in scene.receptacles}
  placed = []
  for otype in scene.pickupable_types:
    is_target = otype == target
    if is_target and params.task_type == "pick_two_obj_and_place":
      count = rng.randint(2, 4)
    else:
      count = rng.choice((1, 1, 2, 2, 3))
    holders = _holders(scene, otype, exclude=avoid if is_target else ())
    if not holders:
      if is_target:
        return None
      continue
    for _ in range(count):
      recep = rng.choice(holders)
      placed.append(
          problem.PlacedObject(_new_id(rng, otype, recep, used), otype, recep)
      )
  if "DeskLamp" in scene.object_types and _lamp_holders(scene):
    recep = rng.choice(_lamp_holders(scene))
    placed.append(
        problem.PlacedObject(
            _new_id(rng, "DeskLamp", recep, used), "DeskLamp", recep
        )
    )
  elif params.toggle_target:
    return None
  return placed


def _agent_loc(rng, scene) -> str:
  """A start pose on the navigation grid where no receptacle is, so the
  intro reads 'You are in the middle of a room'."""
  taken = {r.loc for r in scene.receptacles}
  x, z = scene.nav_points[rng.randrange(len(scene.nav_points))]
  rot, horizon = rng.randrange(4), 30
  loc = scenes.loc_name(
      round(x / scenes.STEP), round(z / scenes.STEP), rot, horizon
  )
  while loc in taken:
    horizon += 15
    loc = scenes.loc_name(
        round(x / scenes.STEP), round(z / scenes.STEP), rot, horizon
    )
  return loc


def goal_text(rng, params) -> str:
  """ALFWorld's templated goal (``misc.get_templated_task_desc``)."""
  template = rng.choice(goal_library.gdict[params.task_type]["templates"])
  return template.format(
      obj=params.object_target.lower(),
      recep=params.parent_target.lower(),
      toggle=params.toggle_target.lower(),
      mrecep=params.mrecep_target.lower(),
  )


@functools.lru_cache(maxsize=1)
def _logic() -> tuple[str, str]:
  with open(alfworld_info.ALFRED_PDDL_PATH) as f:
    domain = f.read()
  with open(alfworld_info.ALFRED_TWL2_PATH) as f:
    grammar = f.read()
  return domain, grammar


def sample_game(seed: int, split: str, task_id: int, attempt: int):
  """One candidate game as ``(game_json, traj_data)``, or None."""
  task_type = TASK_TYPES[task_id % len(TASK_TYPES)]
  rng = random.Random(
      f"alfworld-gen:{GEN_VERSION}:{seed}:{split}:{task_id}:{attempt}"
  )
  combos = split_combos(split, task_type)
  if not combos:
    raise RuntimeError(f"no {task_type} goals for split {split!r}")
  scene_num, (obj, parent, toggle) = rng.choice(combos)
  scene = scenes.load_scene(scene_num)
  params = problem.TaskParams(task_type, obj, parent, toggle)
  objects = place_objects(rng, scene, params)
  if objects is None:
    return None
  name = f"{split}_{task_id}"
  pddl = problem.problem_pddl(
      name, scene, objects, _agent_loc(rng, scene), params
  )
  text = goal_text(rng, params)
  domain, grammar = _logic()
  game = {
      "pddl_domain": domain,
      "grammar": grammar.replace("UNKNOWN GOAL", text),
      "pddl_problem": pddl,
      "solvable": None,
      "walkthrough": None,
  }
  traj = {
      "task_id": f"trial_gen{GEN_VERSION}_s{seed}_{name}",
      "task_type": task_type,
      "pddl_params": params.as_pddl_params(),
      "scene": {"floor_plan": f"FloorPlan{scene_num}", "scene_num": scene_num},
      "turk_annotations": {"anns": [{"task_desc": text, "votes": []}]},
      "generator": {
          "version": GEN_VERSION,
          "seed": seed,
          "split": split,
          "index": task_id,
          "attempt": attempt,
      },
  }
  return game, traj


def _write_json(path: str, data: dict) -> None:
  """Atomic write (parallel workers may generate the same game)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    json.dump(data, f)
  os.replace(tmp, path)


def walkthrough_wins(env, game_file: str, traj: dict) -> Optional[list[str]]:
  """The expert's walkthrough if playing it in the engine wins, else None."""
  state = tw.load_and_reset(env, game_file)
  if state["won"]:
    return None  # goal already true: not a task
  commands = expert.expert_plan(state["_facts"], tw.names(env), traj)
  if not commands:
    return None
  for cmd in commands:
    if cmd not in state["admissible_commands"]:
      return None
    state, _, _ = env.step(cmd)
  return commands if state["won"] else None


class GameCache:
  """Generated games under ``{cache_dir}/gen-{version}-seed{seed}/{split}``.

  ``game_file(split, task_id)`` returns the path of the verified
  ``game.tw-pddl``, generating it (and its ``traj_data.json``) on first use.
  """

  def __init__(self, cache_dir: Optional[str] = None, seed: int = 0):
    self.root = os.path.join(
        os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR),
        f"gen-{GEN_VERSION}-seed{seed}",
    )
    self.seed = seed
    self._env = None
    speedups.install(sas_cache_dir=self.sas_dir)

  @property
  def sas_dir(self) -> str:
    """Disk cache of SAS translations (see ``speedups``)."""
    return os.path.join(self.root, "sas")

  def task_dir(self, split: str, task_id: int) -> str:
    if split not in GEN_SPLITS:
      raise ValueError(f"unknown split {split!r}; known: {list(GEN_SPLITS)}")
    if task_id < 0:
      raise ValueError(f"task_id must be >= 0, got {task_id}")
    return os.path.join(self.root, split, f"{task_id:06d}")

  def game_file(self, split: str, task_id: int, engine=None) -> str:
    """Path of the game; ``engine`` (a ``tw.make_tw_env()``) is used to
    verify a new game, losing whatever it was playing."""
    out_dir = self.task_dir(split, task_id)
    path = os.path.join(out_dir, "game.tw-pddl")
    if os.path.exists(path):
      return path
    os.makedirs(out_dir, exist_ok=True)
    if engine is None:
      if self._env is None:
        self._env = tw.make_tw_env()
      engine = self._env
    for attempt in range(MAX_ATTEMPTS):
      sample = sample_game(self.seed, split, task_id, attempt)
      if sample is None:
        continue
      game, traj = sample
      fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".tw-pddl")
      with os.fdopen(fd, "w") as f:
        json.dump(game, f)
      try:
        commands = walkthrough_wins(engine, tmp, traj)
      finally:
        os.remove(tmp)
      if commands is None:
        continue  # discard unsolvable problems
      game["solvable"], game["walkthrough"] = True, commands
      _write_json(os.path.join(out_dir, "traj_data.json"), traj)
      _write_json(path, game)  # written last: marks the task complete
      return path
    raise RuntimeError(
        f"no solvable game for {split}/{task_id} in {MAX_ATTEMPTS} attempts"
    )
