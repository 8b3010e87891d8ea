"""The shared, read-only WebShop world: catalogue, search index, goal splits.

Built once per process per ``(seed, num_products, goals_per_product)`` and
shared by every environment instance (building takes about a second).

Goal order and splits follow upstream: the goal list is shuffled with a fixed
seed (upstream: ``random.seed(233)``); goals ``0..499`` (``num_test_goals``)
are ``test``, the rest
``train``; ``valid_seen`` and ``valid_unseen`` alias ``test`` (verl-agent
evaluates on goals 0..499 too).

Solvability is guaranteed by construction and checked here: a goal is kept
only if buying its product with its options scores exactly 1.0 and the
product is among the 50 hits for the goal's own words
(:func:`catalogue.search_words`), so the expert always finds it.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from third_party_envs.webshop import catalogue
from third_party_envs.webshop import reward as reward_lib
from third_party_envs.webshop import search as search_lib

NUM_TEST_GOALS = 500


@dataclasses.dataclass(frozen=True)
class World:
  products: list
  by_asin: dict
  engine: search_lib.SearchEngine
  goals: list  # shuffled; index = goal id
  num_test_goals: int = NUM_TEST_GOALS

  def split_ids(self, split: str) -> range:
    """Goal ids of ``split`` (train: ``num_test_goals``.., test/valid_*:
    0..num_test_goals-1; upstream: 500)."""
    n, n_test = len(self.goals), min(self.num_test_goals, len(self.goals))
    if split == "train":
      return range(n_test, n)
    if split in ("test", "valid_seen", "valid_unseen"):
      return range(n_test)
    raise ValueError(
        f"unknown split {split!r}; expected train, test, "
        "valid_seen or valid_unseen"
    )

  def goal(self, task_id: int, split: str) -> dict:
    ids = self.split_ids(split)
    if not 0 <= task_id < len(ids):
      raise ValueError(
          f"task_id {task_id} out of range for split {split!r} "
          f"({len(ids)} tasks)"
      )
    return self.goals[ids[task_id]]


def is_solvable(
    goal: dict, products_by_asin: dict, engine: search_lib.SearchEngine
) -> bool:
  product = products_by_asin[goal["asin"]]
  score = reward_lib.get_reward(
      product, goal, product["price"], goal["goal_options"]
  )
  if score != 1.0:
    return False
  return goal["asin"] in engine.search(catalogue.search_words(goal))


@functools.lru_cache(maxsize=8)
def make_world(
    seed: int = 0,
    num_products: int = 500,
    goals_per_product: int = 3,
    num_test_goals: int = NUM_TEST_GOALS,
) -> World:
  """The cached world for these arguments (deterministic)."""
  if num_test_goals < 1:
    raise ValueError(f"num_test_goals must be >= 1, got {num_test_goals}")
  products = catalogue.make_catalogue(seed, num_products)
  by_asin = {p["asin"]: p for p in products}
  engine = search_lib.SearchEngine(products)
  goals = catalogue.make_goals(products, seed, goals_per_product)
  goals = [g for g in goals if is_solvable(g, by_asin, engine)]
  random.Random(233 + seed).shuffle(goals)
  return World(
      products=products,
      by_asin=by_asin,
      engine=engine,
      goals=goals,
      num_test_goals=num_test_goals,
  )
