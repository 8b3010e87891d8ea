"""Adapter running the original WebShop site code behind ``TextEnv``.

Needs (none of which can be fetched on an offline machine):
  * the WebShop repository importable as ``web_agent_site`` (clone
    princeton-nlp/WebShop, ``pip install -r requirements.txt``, with spaCy's
    ``en_core_web_lg`` model and a Java runtime for Pyserini);
  * its product data in the directory named by ``$WEBSHOP_DATA_DIR``:
    ``items_shuffle.json`` + ``items_ins_v2.json`` (or the ``_1000`` small
    variants) and ``items_human_ins.json``;
  * the Lucene index its ``setup.sh`` builds under ``search_engine/indexes``.

Task ids and splits are verl-agent's: goal ``i`` of the site's (seeded,
shuffled) goal list; test / valid_* = goals 0..499, train = 500 onwards.
Rewards mirror ``WebShopEnv``: ``reward = 10 * won`` with ``won`` = score 1.0.
There is no scripted expert for the original (``expert_action`` -> None) and
no dense reward (0.0).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Optional

from third_party_envs import base
from third_party_envs.webshop import env as env_lib

DATA_ENV_VAR = "WEBSHOP_DATA_DIR"
NUM_TEST_GOALS = 500
# (role, accepted file names, first found wins)
DATA_FILES = (
    ("products", ("items_shuffle.json", "items_shuffle_1000.json")),
    ("attributes", ("items_ins_v2.json", "items_ins_v2_1000.json")),
    ("human instructions", ("items_human_ins.json",)),
)


def require_site_code() -> None:
  """Raises ImportError unless the original ``web_agent_site`` imports."""
  if importlib.util.find_spec("web_agent_site") is None:
    raise ImportError(
        "The original WebShop code is not importable (module "
        "'web_agent_site' not found). Clone princeton-nlp/WebShop, install "
        "its requirements (spaCy en_core_web_lg, pyserini with Java) and put "
        "the clone on PYTHONPATH; or use "
        "third_party_envs.webshop.WebShopEnv, the offline reimplementation."
    )


def resolve_data_files(data_dir: Optional[str] = None) -> dict[str, str]:
  """``{role: path}`` of the data files in ``data_dir`` (default
  ``$WEBSHOP_DATA_DIR``); FileNotFoundError naming what is missing."""
  data_dir = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR)
  if not data_dir:
    raise FileNotFoundError(
        f"${DATA_ENV_VAR} is not set: point it at the directory holding "
        "WebShop's data files (" + ", ".join(n[0] for _, n in DATA_FILES) + ")."
    )
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
        f"WebShop data directory {data_dir!r} "
        f"(${DATA_ENV_VAR}) does not exist"
    )
  found, missing = {}, []
  for role, names in DATA_FILES:
    paths = [os.path.join(data_dir, n) for n in names]
    hit = next((p for p in paths if os.path.isfile(p)), None)
    if hit is None:
      missing.append(f"{role} ({' or '.join(names)})")
    else:
      found[role] = hit
  if missing:
    raise FileNotFoundError(
        f"WebShop data directory {data_dir!r} lacks: " + "; ".join(missing)
    )
  return found


class WebShopOriginalEnv(base.TextEnv):
  """``web_agent_site.envs.WebAgentTextEnv`` in text mode, human goals."""

  name = "webshop_original"

  def __init__(
      self,
      data_dir: Optional[str] = None,
      num_products=None,
      human_goals: bool = True,
  ):
    files = resolve_data_files(data_dir)
    require_site_code()
    utils = importlib.import_module("web_agent_site.utils")
    engine = importlib.import_module("web_agent_site.engine.engine")
    for module in (utils, engine):  # the site reads these module globals
      module.DEFAULT_FILE_PATH = files["products"]
      module.DEFAULT_ATTR_PATH = files["attributes"]
      module.HUMAN_ATTR_PATH = files["human instructions"]
    envs = importlib.import_module("web_agent_site.envs")
    self._env = envs.WebAgentTextEnv(
        observation_mode="text",
        file_path=files["products"],
        num_products=num_products,
        human_goals=human_goals,
    )
    self._goals = self._env.server.goals
    self._done = False

  def num_tasks(self, split: str) -> int:
    return len(self._ids(split))

  def _ids(self, split: str) -> range:
    n = len(self._goals)
    if split == "train":
      return range(min(NUM_TEST_GOALS, n), n)
    if split in ("test", "valid_seen", "valid_unseen"):
      return range(min(NUM_TEST_GOALS, n))
    raise ValueError(f"unknown split {split!r}")

  def _actions(self) -> list[str]:
    avail = self._env.get_available_actions()
    acts = ["search[<your query>]"] if avail["has_search_bar"] else []
    return acts + [f"click[{c}]" for c in avail["clickables"] if c != "search"]

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    goal_idx = self._ids(split)[task_id]
    obs, _ = self._env.reset(session=goal_idx)
    self._task = self._env.instruction_text
    self._done = False
    return base.EnvStep(
        observation=obs,
        admissible_actions=self._actions(),
        anchor_obs=obs,
        task=self._task,
        info=dict(task_id=task_id, split=split),
    )

  def step(self, action: str) -> base.EnvStep:
    name, arg = env_lib.parse_action(action)
    arg = arg.lower() if arg is not None else None
    clickables = self._env.get_available_actions()["clickables"]
    # upstream's own test: a non-empty search, or a click on a clickable
    valid = bool(
        (name == "search" and arg)
        or (name == "click" and arg in clickables and arg != "search")
    )
    obs, score, done, _ = self._env.step(action)
    won = bool(done and score == 1.0)
    return base.EnvStep(
        observation=obs,
        admissible_actions=[] if done else self._actions(),
        reward=base.SUCCESS_REWARD * won,
        done=bool(done),
        won=won,
        score=float(score),
        anchor_obs=obs,
        task=self._task,
        valid_action=valid,
    )

  def expert_action(self) -> Optional[str]:
    return None
