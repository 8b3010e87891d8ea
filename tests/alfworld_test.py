"""ALFWorld adapter: offline game generation, the real engine, the expert."""

# pylint: disable=protected-access

from __future__ import annotations

import json
import os
import random
import shutil
import sys

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld")

import textworld  # noqa: E402
from textworld.envs.pddl import logic as pddl_logic  # noqa: E402
from alfworld.agents.environment import alfred_tw_env  # noqa: E402
from alfworld.gen import goal_library  # noqa: E402

from third_party_envs import registry  # noqa: E402
from third_party_envs.alfworld import env as env_lib  # noqa: E402
from third_party_envs.alfworld import expert as expert_lib  # noqa: E402
from third_party_envs.alfworld import gen  # noqa: E402
from third_party_envs.alfworld import scenes  # noqa: E402
from third_party_envs.alfworld import speedups  # noqa: E402
from third_party_envs.alfworld import tw  # noqa: E402

# Train task ids in small rooms (quick to generate), one per task type:
# task id t has type TASK_TYPES[t % 6].
SMALL_IDS = {
    "pick_and_place_simple": 12,
    "look_at_obj_in_light": 1,
    "pick_clean_then_place_in_recep": 50,
    "pick_heat_then_place_in_recep": 21,
    "pick_cool_then_place_in_recep": 16,
    "pick_two_obj_and_place": 11,
}


@pytest.fixture(scope="module", autouse=True)
def no_official_data(tmp_path_factory):
  """Hermetic: never pick up a downloaded ALFWorld dataset."""
  saved = os.environ.get("ALFWORLD_DATA")
  os.environ["ALFWORLD_DATA"] = str(tmp_path_factory.mktemp("no_data"))
  yield
  if saved is None:
    os.environ.pop("ALFWORLD_DATA", None)
  else:
    os.environ["ALFWORLD_DATA"] = saved


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("alfworld_cache"))


@pytest.fixture(scope="module")
def env(cache_dir):
  e = env_lib.AlfWorldEnv(cache_dir=cache_dir)
  yield e
  e.close()


def play_expert(env, task_id, split="train", max_steps=60):
  first = step = env.reset(task_id, split)
  steps = []
  while not step.done and len(steps) < max_steps:
    step = env.step(env.expert_action())
    steps.append(step)
  return first, steps


# ---------------------------------------------------------------- generation


def test_sample_game_is_deterministic_and_ids_differ():
  a = [gen.sample_game(0, "train", t, 0) for t in range(12)]
  b = [gen.sample_game(0, "train", t, 0) for t in range(12)]
  assert a == b
  problems = {g[0]["pddl_problem"] for g in a}
  assert len(problems) == 12
  assert gen.sample_game(1, "train", 0, 0) != a[0]  # the seed matters


def test_generated_files_identical_in_fresh_caches(tmp_path):
  paths = [
      gen.GameCache(str(tmp_path / d), seed=0).game_file("train", 1)
      for d in ("a", "b")
  ]
  for name in ("game.tw-pddl", "traj_data.json"):
    texts = [open(os.path.join(os.path.dirname(p), name)).read() for p in paths]
    assert texts[0] == texts[1]
  game = json.load(open(paths[0]))
  assert set(game) == {
      "pddl_domain",
      "grammar",
      "pddl_problem",
      "solvable",
      "walkthrough",
  }
  assert game["solvable"] is True and game["walkthrough"]
  traj = json.load(
      open(os.path.join(os.path.dirname(paths[0]), "traj_data.json"))
  )
  assert traj["task_type"] == "look_at_obj_in_light"
  assert traj["pddl_params"]["toggle_target"] == "DeskLamp"
  assert traj["pddl_params"]["parent_target"] == ""


def test_alfred_style_ids_and_format():
  game, traj = gen.sample_game(0, "train", 2, 0)  # a clean task: a kitchen
  pddl = game["pddl_problem"]
  assert "(:domain alfred)" in pddl
  assert "SinkBasin - receptacle" in pddl  # Sink_bar_..._bar_SinkBasin
  assert "Sink_bar_" in pddl and "|" not in pddl and "#" not in pddl
  assert "UNKNOWN GOAL" not in game["grammar"]
  assert scenes.fmt_coord(0.68) == "+00.68"
  assert scenes.fmt_coord(-2.2) == "-02.20"
  assert scenes.fmt_coord(0.0) == "00.00"
  assert scenes.make_id("SinkBasin", (-1.9, 0.97, -1.5)) == (
      "Sink|-01.90|+00.97|-01.50|SinkBasin"
  )
  assert scenes.id_type("Sink|-01.90|+00.97|-01.50|SinkBasin") == "SinkBasin"
  assert traj["scene"]["scene_num"] in gen.split_scenes("train")


def test_splits_by_layout_and_goal():
  train = set(gen.split_scenes("train"))
  unseen = set(gen.split_scenes("valid_unseen"))
  assert len(train) == 96 and len(unseen) == 24 and not train & unseen
  for task_type in gen.TASK_TYPES:
    tr = set(gen.split_combos("train", task_type))
    vs = set(gen.split_combos("valid_seen", task_type))
    assert tr and vs and not tr & vs  # valid_seen: train rooms, other goals
    assert {s for s, _ in vs} <= train
  total = sum(len(gen.split_combos("train", t)) for t in gen.TASK_TYPES)
  assert total > 5000  # thousands of goals before random placements


# ------------------------------------------------------------------- playing


@pytest.mark.parametrize("task_type", gen.TASK_TYPES)
def test_expert_wins_each_type(env, cache_dir, task_type):
  task_id = SMALL_IDS[task_type]
  first, steps = play_expert(env, task_id)
  assert first.task_type == task_type
  assert steps[-1].won and steps[-1].done
  assert [s.reward for s in steps] == [0.0] * (len(steps) - 1) + [10.0]
  assert steps[-1].score == 1.0
  # every expert step removes one command from the expert's plan
  assert [s.dense_reward for s in steps] == pytest.approx(
      [1 / len(steps)] * len(steps)
  )
  walkthrough = json.load(open(env.game_file(task_id)))["walkthrough"]
  assert len(steps) == len(walkthrough)
  assert all(s.valid_action for s in steps)


def test_observation_contains_task_line(env):
  first = env.reset(SMALL_IDS["pick_heat_then_place_in_recep"], "train")
  obs = first.observation
  assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")
  assert "You are in the middle of a room." in obs
  assert obs.endswith("Your task is to: " + first.task)
  traj = json.load(
      open(os.path.join(os.path.dirname(env.game_file(21)), "traj_data.json"))
  )
  p = traj["pddl_params"]
  texts = [
      t.format(
          obj=p["object_target"].lower(),
          recep=p["parent_target"].lower(),
          toggle="",
          mrecep="",
      )
      for t in goal_library.gdict[traj["task_type"]]["templates"]
  ]
  assert first.task[:-1] in texts and first.task.endswith(".")
  assert first.anchor_obs == obs
  assert "look" in first.admissible_actions


def test_invalid_action_changes_nothing(env):
  task_id = SMALL_IDS["pick_cool_then_place_in_recep"]
  first = env.reset(task_id, "train")
  facts = sorted(map(str, env._state["_facts"]))
  bad = env.step("fly to the moon")
  assert bad.observation == "Nothing happens." and not bad.valid_action
  assert bad.reward == 0.0 and bad.dense_reward == 0.0 and not bad.done
  assert bad.admissible_actions == first.admissible_actions
  assert sorted(map(str, env._state["_facts"])) == facts
  steps = []  # the expert still needs exactly the walkthrough
  while not (steps and steps[-1].done):
    steps.append(env.step(env.expert_action()))
  walkthrough = json.load(open(env.game_file(task_id)))["walkthrough"]
  assert len(steps) == len(walkthrough) and steps[-1].won
  after = env.step("look")  # the episode is over: nothing changes
  assert not after.valid_action and after.done and after.reward == 0.0
  assert env.expert_action() is None


def test_same_task_id_same_game(cache_dir):
  a = env_lib.AlfWorldEnv(cache_dir=cache_dir)
  b = registry.make_env("alfworld", cache_dir=cache_dir)
  sa, sb = a.reset(12, "train"), b.reset(12, "train")
  assert sa == sb
  assert a.step("inventory") == b.step("inventory")
  assert a.reset(12, "valid_seen").observation != sa.observation


def test_task_types_subset_plays_the_same_games(cache_dir):
  """task_types=(look, simple): our ids 0, 1, 2, 3 are the generator's
  1, 0, 7, 6 (types cycle in the given order), same games as the full set."""
  full = env_lib.AlfWorldEnv(cache_dir=cache_dir)
  sub = env_lib.AlfWorldEnv(
      cache_dir=cache_dir,
      task_types=("look_at_obj_in_light", "pick_and_place_simple"),
  )
  assert sub.num_tasks("valid_seen") == 2 * (140 // 6)
  for ours, theirs in [(0, 1), (1, 0), (3, 6)]:
    s = sub.reset(ours, "valid_seen")
    assert s.observation == full.reset(theirs, "valid_seen").observation
    assert s.task_type == sub.task_types[ours % 2]
  with pytest.raises(ValueError, match="task_types"):
    env_lib.AlfWorldEnv(task_types=("pick_and_place",))
  with pytest.raises(ValueError, match="task_types"):
    env_lib.AlfWorldEnv(task_types=("look_at_obj_in_light",) * 2)


def test_dense_reward_hand_computed(env):
  """Train game 12: 'put some plate on sidetable', expert plan of 4:
  go to coffeetable 1, take plate 1, go to sidetable 1, move plate 1.
  dense = (L_prev - L_now) / 4: a detour via an armchair costs nothing,
  taking a pillow adds a command (put it back), and so on."""
  first = env.reset(12, "train")
  assert first.task == "put some plate on sidetable."
  moves = [
      "go to armchair 1",
      "take pillow 1 from armchair 1",
      "move pillow 1 to armchair 1",
      "go to coffeetable 1",
      "take plate 1 from coffeetable 1",
      "go to sidetable 1",
      "move plate 1 to sidetable 1",
  ]
  steps = [env.step(m) for m in moves]
  assert all(s.valid_action for s in steps)
  assert [s.dense_reward for s in steps] == [
      0.0,
      -0.25,
      0.25,
      0.25,
      0.25,
      0.25,
      0.25,
  ]
  assert [s.done for s in steps] == [False] * 6 + [True]
  assert steps[-1].reward == 10.0 and steps[-1].won


def test_expert_matches_stock_planner(env):
  """The expert's plans are as short as fast-downward's (optimal) plans."""
  speedups.install(share_replan=False)
  try:
    rng = random.Random(0)
    for task_id in (12, 1, 16, 11):
      step = env.reset(task_id, "train")
      for _ in range(3):
        ours = expert_lib.expert_plan(
            env._state["_facts"], tw.names(env._env), env._traj
        )
        planner = tw.plan(env._env)
        assert len(ours) == len(planner), (task_id, ours, planner)
        moves = [
            a
            for a in step.admissible_actions
            if a.startswith(("take", "open", "go to"))
        ]
        step = env.step(rng.choice(moves))
        if step.done:
          break
  finally:
    speedups.install(share_replan=True)


def test_speedups_preserve_transcript(env, cache_dir):
  game = env.game_file(11)
  commands = json.load(open(game))["walkthrough"]
  commands = (
      commands[:3]
      + ["look", "inventory", "examine " + commands[1].split(" from ")[1]]
      + commands[3:]
  )

  def transcript():
    raw = tw.make_tw_env()
    state = tw.load_and_reset(raw, game)
    out = [(state["feedback"], state["admissible_commands"])]
    for cmd in commands:
      state, _, _ = raw.step(cmd)
      out.append(
          (state["feedback"], state["admissible_commands"], state["won"])
      )
    return out

  fast = transcript()
  speedups.uninstall()
  try:
    slow = transcript()
  finally:
    speedups.install(sas_cache_dir=os.path.join(env._cache.root, "sas"))
  assert fast == slow and fast[-1][2]


def _engine_view(state) -> dict:
  """Everything an engine state holds, as comparable values (list orders
  kept: they are part of what the engine returns)."""
  return dict(
      feedback=state["feedback"],
      raw=state["raw"],
      won=state["won"],
      lost=state["lost"],
      done=state.get("done"),
      score=state.get("score"),
      last_command=state.get("last_command"),
      admissible=state["admissible_commands"],
      valid=state["_valid_commands"],
      actions=[
          (
              a.name,
              [(str(p), str(v)) for p, v in a.mapping.items()],
              a.command_template,
              a.feedback_rule,
          )
          for a in state["_valid_actions"]
      ],
      last_action=str(state["_last_action"]),
      facts=[str(f) for f in state["_facts"]],
      templates=state["command_templates"],
      names={k: i.name for k, i in state["_entity_infos"].items()},
      gamefile=state.get("extra.gamefile"),
  )


def _engine_transcripts(games, seed=0, turns=10):
  """Per game: its walkthrough and two seeded random episodes (an invalid
  'jump' in each), the first two on one engine, the third on another, each
  followed by a reset without a load and one more step."""
  rng = random.Random(seed)
  engines = [tw.make_tw_env(), tw.make_tw_env()]
  out = []
  for game in games:
    walkthrough = json.load(open(game))["walkthrough"]
    for engine, walk in (
        (engines[0], True),
        (engines[0], False),
        (engines[1], False),
    ):
      state = tw.load_and_reset(engine, game)
      episode = [_engine_view(state)]
      for t in range(len(walkthrough) if walk else turns):
        command = (
            walkthrough[t]
            if walk
            else "jump"
            if t == 3
            else rng.choice(state["admissible_commands"])
        )
        state, _, _ = engine.step(command)
        episode.append(_engine_view(state))
      with tw.keep_argv():
        state = engine.reset()
      episode.append(_engine_view(state))
      state, _, _ = engine.step(state["admissible_commands"][-1])
      episode.append(_engine_view(state))
      out.append(episode)
  return out


@pytest.mark.slow
def test_speedups_preserve_every_engine_output(env):
  """Three task types, a won walkthrough and random play, a game loaded
  twice on one engine and once on another, resets with and without a
  load: with speedups (cached command texts, sorted facts, parses, reused
  initial state) every field of every state equals stock textworld's."""
  games = [
      env.game_file(SMALL_IDS[t])
      for t in (
          "pick_and_place_simple",
          "look_at_obj_in_light",
          "pick_clean_then_place_in_recep",
      )
  ]
  pddl_logic._parse_and_convert.mem.clear()  # parses read back from disk
  fast = _engine_transcripts(games)
  assert fast[0][-3]["won"]  # the walkthrough wins
  assert any(s["feedback"] == "Nothing happens." for s in fast[1])
  speedups.uninstall()
  try:
    slow = _engine_transcripts(games)
  finally:
    speedups.install(sas_cache_dir=os.path.join(env._cache.root, "sas"))
  for fast_episode, slow_episode in zip(fast, slow, strict=True):
    for fast_state, slow_state in zip(fast_episode, slow_episode, strict=True):
      assert fast_state == slow_state


def test_game_logic_parse_read_back_from_disk(env, monkeypatch):
  """A game's GameLogic parse, stored on disk by the speedups, reads back
  (without tatsu) equal to a fresh parse: the same actions and rules."""
  text = json.load(open(env.game_file(SMALL_IDS["look_at_obj_in_light"])))[
      "grammar"
  ]
  parses = pddl_logic._parse_and_convert
  assert isinstance(parses, speedups._GameLogicParses) and parses.cache_dir
  parses(text, rule_name="pddlStart")  # stored, if it was not yet
  parses.mem.clear()

  def no_tatsu(*args, **kwargs):
    raise AssertionError("parsed again")

  monkeypatch.setattr(parses, "orig", no_tatsu)
  from_disk = parses(text, rule_name="pddlStart")
  fresh = speedups._ORIG["pddl_parse"](text, rule_name="pddlStart")

  def view(parsed):
    actions, grammar = parsed
    return (
        {k: vars(a) for k, a in actions.items()},
        {k: repr(rules) for k, rules in grammar._rules.items()},
    )

  assert view(from_disk) == view(fresh)
  assert "GotoLocation.feedback" in view(fresh)[1]


def test_fact_tokens_number_fact_sets_and_are_never_reused(env):
  """``_Game.token``: equal facts of the predicates, equal numbers; past
  ``MAX_TOKENS`` sets the texts go with the tokens and numbering goes on
  (a number handed out before cannot name another set)."""
  env.reset(SMALL_IDS["pick_and_place_simple"])
  pddl_state = env._env.unwrapped._pddl_state
  game = speedups._Game()
  game.MAX_TOKENS = 2
  at = frozenset({"atlocation"})
  first = game.token(pddl_state, at)
  static = game.token(pddl_state, frozenset({"receptacleatlocation"}))
  assert (first, static) == (0, 1)
  game.texts["some key"] = "some text"
  env.step("go to coffeetable 1")
  assert game.token(pddl_state, frozenset({"receptacleatlocation"})) == 1
  moved = game.token(pddl_state, at)  # a third set: all dropped
  assert moved == 2 and game.texts == {} and len(game.tokens) == 1
  env.step("go to armchair 1")
  assert game.token(pddl_state, at) == 3


def test_template_reads_hand_computed(env):
  """What deriving a command template reads, from ALFWorld's grammar:
  'go to' lists the receptacles at its location (a query), the others
  print their placeholders; a template naming a rule reads its
  conditions."""
  env.reset(SMALL_IDS["pick_and_place_simple"])
  grammar = env._env.unwrapped._logic.grammar
  reads = speedups._template_reads(
      grammar,
      "go to [{r.name | receptacleatlocation(r:receptacle, lend:location)}]",
  )
  assert reads.predicates == {"receptacleatlocation"}
  assert reads.names == {"r", "lend"}
  assert {str(p) for p in reads.queried} == {"r: receptacle", "lend: location"}
  reads = speedups._template_reads(grammar, "take {o} from {r}")
  assert (reads.predicates, reads.names, reads.queried) == (
      frozenset(),
      {"o", "r"},
      frozenset(),
  )
  reads = speedups._template_reads(grammar, "#inventory.feedback#")
  assert reads.predicates == {"holdsany", "holds"}
  assert reads.names == {"a", "o"}
  assert speedups._template_reads(grammar, "#no_such_rule#") is None
  assert speedups._template_reads(grammar, "{context}") is None


def test_world_from_facts_reads_its_predicates_only():
  """The expert's World: the facts it reads, whatever else the state
  holds (pickupable, objectatlocation, ... are skipped)."""

  def fact(name, *args):
    return textworld.logic.Proposition(
        name, [textworld.logic.Variable(a, "t") for a in args]
    )

  facts = [
      fact("atlocation", "agent1", "loc1"),
      fact("pickupable", "egg1"),
      fact("receptacleatlocation", "sink1", "loc2"),
      fact("objectatlocation", "egg1", "loc2"),
      fact("inreceptacle", "egg1", "sink1"),
      fact("objecttype", "egg1", "eggtype"),
      fact("receptacletype", "sink1", "sinkbasintype"),
      fact("openable", "sink1"),
      fact("isclean", "egg1"),
      fact("cancontain", "sinkbasintype", "eggtype"),
  ]
  w = expert_lib.World.from_facts(facts)
  assert w == expert_lib.World(
      agent_loc="loc1",
      holding=None,
      recep_loc={"sink1": "loc2"},
      obj_recep={"egg1": "sink1"},
      otype={"egg1": "eggtype"},
      rtype={"sink1": "sinkbasintype"},
      openable={"sink1"},
      opened=set(),
      props={
          "isclean": {"egg1"},
          "ishot": set(),
          "iscool": set(),
          "istoggled": set(),
      },
      can_contain={("sinkbasintype", "eggtype")},
  )


def test_sys_argv_kept(env):
  argv = list(sys.argv)
  env.reset(SMALL_IDS["pick_two_obj_and_place"], "train")
  env.step(env.expert_action())
  assert sys.argv == argv


# ------------------------------------------------- stock ALFWorld interfaces


def test_stock_alfworld_loaders_play_generated_games(env, cache_dir):
  env.game_file(1)  # make sure the games exist
  env.game_file(12)
  config = {
      "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
      "dataset": {
          "data_path": os.path.join(env._cache.root, "train"),
          "num_train_games": -1,
      },
  }
  stock = alfred_tw_env.AlfredTWEnv(config, train_eval="train")
  assert env.game_file(1) in stock.game_files
  infos = textworld.EnvInfos(
      won=True, admissible_commands=True, extras=["gamefile", "expert_plan"]
  )
  for task_id in (1, 12):  # ALFWorld's hand-coded expert wins them too
    with tw.keep_argv():
      game = textworld.start(
          env.game_file(task_id),
          infos,
          wrappers=[
              alfred_tw_env.AlfredDemangler(),
              alfred_tw_env.AlfredInfos,
              alfred_tw_env.AlfredExpert(expert_type="handcoded"),
          ],
      )
      state = game.reset()
      for _ in range(60):
        if state["won"]:
          break
        state, _, _ = game.step(state["extra.expert_plan"][0])
    assert state["won"]


def test_official_data_is_used_when_present(env, tmp_path):
  env.game_file(12)
  root = tmp_path / "json_2.1.1"
  for split in ("train", "valid_seen", "valid_unseen"):
    for i, task_id in enumerate((12, 1)):
      src = os.path.dirname(env.game_file(task_id))
      dst = root / split / f"task_{i}" / "trial_T0"
      shutil.copytree(src, dst)
  official = env_lib.AlfWorldEnv(
      data_dir=str(tmp_path), cache_dir=str(tmp_path / "cache")
  )
  assert official.uses_official_data
  assert official.num_tasks("train") == 2 and official.num_tasks("test") == 2
  first = official.reset(0, "valid_unseen")
  assert first.observation == env.reset(12, "train").observation
  assert official.game_file(1, "train").endswith(
      os.path.join("task_1", "trial_T0", "game.tw-pddl")
  )


def test_bad_inputs(env):
  with pytest.raises(ValueError, match="'dev'"):
    env.reset(0, "dev")
  with pytest.raises(ValueError, match="out of range"):
    env.reset(10**6, "train")
  with pytest.raises(ValueError, match="expert"):
    env_lib.AlfWorldEnv(expert="oracle2")
  with pytest.raises(ValueError, match="num_tasks"):
    env_lib.AlfWorldEnv(num_tasks={"train": 0})
  with pytest.raises(RuntimeError, match="reset"):
    env_lib.AlfWorldEnv().step("look")
  assert env.num_tasks("train") == 3553 and env.num_tasks("test") == 134


# ---------------------------------------------------------------------- slow


@pytest.mark.slow
def test_expert_wins_fifty_tasks_per_type(cache_dir):
  """300 episodes: 50 per type, over the three splits (30/10/10)."""
  env = env_lib.AlfWorldEnv(cache_dir=cache_dir)
  for split, per_type in (
      ("train", 30),
      ("valid_seen", 10),
      ("valid_unseen", 10),
  ):
    for task_id in range(6 * per_type):
      _, steps = play_expert(env, task_id, split)
      assert steps and steps[-1].won, (split, task_id)
      assert sum(s.dense_reward for s in steps) == pytest.approx(1.0)


@pytest.mark.slow
def test_random_admissible_actions_rarely_win(cache_dir):
  env = env_lib.AlfWorldEnv(cache_dir=cache_dir, dense_reward=False)
  rng = random.Random(0)
  wins = 0
  for task_id in range(60):
    step = env.reset(task_id, "train")
    for _ in range(50):  # verl-agent's ALFWorld step budget
      step = env.step(rng.choice(step.admissible_actions))
      if step.done:
        wins += 1
        break
  assert wins <= 3  # 5% (0 of 60 at seed 0); plans need 3-10 exact commands
