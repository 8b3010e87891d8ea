"""WebShopEnv: upstream's text-mode WebShop over the generated catalogue.

Actions (upstream ``parse_action``: ``name[arg]``, arg lower-cased):
  ``search[query]``  on the search page only (upstream accepts it anywhere;
                     verl-agent and this project offer it on that page only);
  ``click[x]``       x a clickable of the current page (see ``pages``).
Anything else is invalid: nothing changes, ``valid_action`` is False.
Admissible actions: the literal hint ``'search[<your query>]'`` on the search
page, and ``'click[x]'`` for every clickable (upstream's search button text
``'search'`` is left out: upstream ignores clicking it).

Click semantics follow upstream ``SimServer.receive``: Back to Search resets
the session; Next > / < Prev page through the 50 hits; < Prev goes from an
item page to its results page (selected options reset, as upstream) and from
a sub page (Description / Features / Reviews) to its item page; an ASIN opens
the item page; an option value selects it; Buy Now ends the episode with
``score = reward.get_reward(...)``, ``won = score == 1.0`` and
``EnvStep.reward = 10 * won``.

Dense reward (for Agent B only) is potential-based progress,
``dense_t = phi(s_{t+1}) - phi(s_t)`` (0 for invalid actions), with
  phi(search page)  = 0
  phi(results)      = 0.2 * max_{p shown} best(p)
  phi(item / sub)   = 0.4 * best(p) + 0.2 * now(p, selected options)
  phi(done)         = score
where ``best(p)`` is the reward of buying ``p`` with the best options it
offers for the goal and ``now`` the reward with the options selected so far.
Over an episode it sums to the final ``phi`` (the score when bought), so it
cannot be farmed by going back and forth; it differs from the outcome reward
(``10 * won``) on every step.
"""

from __future__ import annotations

import re
from typing import Optional

from third_party_envs import base
from third_party_envs.webshop import catalogue
from third_party_envs.webshop import pages
from third_party_envs.webshop import reward as reward_lib
from third_party_envs.webshop import search as search_lib
from third_party_envs.webshop import world as world_lib

SEARCH_HINT = "search[<your query>]"
_ACTION_RE = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, Optional[str]]:
  """Upstream's parse: ``'name[arg]'`` -> (name, arg), else (action, None)."""
  m = _ACTION_RE.match(action)
  return (action, None) if m is None else (m.group(1), m.group(2))


class WebShopEnv(base.TextEnv):
  """One WebShop session over the cached world for ``(seed, num_products,
  goals_per_product, num_test_goals)``; see the module docstring.

  ``expert_query`` is what the scripted solver types: ``"instruction"``
  (the goal's words, upstream's human-like query) or ``"type"`` (the product
  type alone, e.g. ``search[nail polish]``: the CPU recipe's warm start,
  which a policy trained from scratch learns in minutes; with one product per
  type the type finds the product).
  """

  name = "webshop"
  EXPERT_QUERIES = ("instruction", "type")

  def __init__(
      self,
      seed: int = 0,
      num_products: int = 500,
      goals_per_product: int = 3,
      num_test_goals: int = world_lib.NUM_TEST_GOALS,
      expert_query: str = "instruction",
  ):
    if expert_query not in self.EXPERT_QUERIES:
      raise ValueError(
          f"expert_query must be one of {self.EXPERT_QUERIES},"
          f" got {expert_query!r}"
      )
    self.world = world_lib.make_world(
        seed, num_products, goals_per_product, num_test_goals
    )
    self.expert_query = expert_query
    self.goal: Optional[dict] = None

  # --- TextEnv --------------------------------------------------------

  def num_tasks(self, split: str) -> int:
    return len(self.world.split_ids(split))

  def reset(self, task_id: int, split: str = "train") -> base.EnvStep:
    self.goal = self.world.goal(task_id, split)
    self._task = (task_id, split)
    self._best_cache: dict[str, float] = {}
    self._to_search_page()
    self._done, self._score, self._reward_info = False, 0.0, None
    self._phi = 0.0
    return self._make_step(valid=True, dense=0.0)

  def step(self, action: str) -> base.EnvStep:
    if self.goal is None:
      raise RuntimeError("WebShopEnv.step called before reset")
    if self._done:  # a finished episode stays finished
      return self._make_step(valid=False, dense=0.0)
    name, arg = parse_action(action.strip())
    arg = arg.lower() if arg is not None else None
    valid = True
    if name == "search" and self._page == "search" and arg and arg.strip():
      self._search(arg)
    elif name == "click" and arg in self.clickables() and arg != "search":
      self._click(arg)
    else:
      valid = False
    dense = 0.0
    if valid:
      phi = self._potential()
      dense, self._phi = phi - self._phi, phi
    return self._make_step(valid=valid, dense=dense)

  def expert_action(self) -> Optional[str]:
    """Scripted solver: search the goal's words, open the goal product
    (paging to it; best title match if it is not among the hits), select the
    goal's option values, buy."""
    if self.goal is None or self._done:
      return None
    target = self.goal["asin"]
    if self._page == "search":
      words = (
          self.goal["query"]
          if self.expert_query == "type"
          else catalogue.search_words(self.goal)
      )
      return f"search[{words}]"
    if self._page == "sub":
      return "click[< prev]"
    if self._page == "results":
      shown = self._shown()
      if target in shown:
        return f"click[{target.lower()}]"
      if target in self._hits:
        want = self._hits.index(target) // search_lib.PRODUCT_WINDOW + 1
        return "click[next >]" if want > self._page_no else "click[< prev]"
      if shown:
        return f"click[{max(shown, key=self._title_overlap).lower()}]"
      return "click[back to search]"
    if self._asin != target and target in self._hits:
      return "click[< prev]"
    for name, value in self._best_options(self._product()).items():
      if self._options.get(name) != value:
        return f"click[{value}]"
    return "click[buy now]"

  # --- state transitions ---------------------------------------------

  def _to_search_page(self):
    self._page, self._keywords, self._hits = "search", None, []
    self._page_no, self._asin, self._options, self._sub = 1, None, {}, None

  def _search(self, query: str):
    self._keywords = query.split(" ")
    self._hits = self.world.engine.search(" ".join(self._keywords))
    self._to_results(1)

  def _to_results(self, page_no: int):
    self._page, self._page_no = "results", page_no
    self._asin, self._options, self._sub = None, {}, None

  def _click(self, text: str):
    if text == pages.END_BUTTON.lower():
      product = self._product()
      self._score, self._reward_info = reward_lib.get_reward(
          product, self.goal, product["price"], self._options, verbose=True
      )
      self._done, self._page = True, "done"
    elif text == pages.BACK_TO_SEARCH.lower():
      self._to_search_page()
    elif text == pages.NEXT_PAGE.lower():
      self._to_results(self._page_no + 1)
    elif text == pages.PREV_PAGE.lower():
      if self._page == "results":
        self._to_results(self._page_no - 1)
      elif self._page == "sub":
        self._page, self._sub = "item", None
      else:
        self._to_results(self._page_no)
    elif self._page == "item" and text in {s.lower() for s in pages.SUB_PAGES}:
      self._page, self._sub = "sub", text.capitalize()
    elif self._page == "results":
      self._page, self._asin = "item", text.upper()
    else:
      self._options[pages.item_clickables(self._product())[text]] = text

  # --- views -----------------------------------------------------------

  @property
  def hits(self) -> list[str]:
    """ASINs of the current search's hits (at most 50), best first."""
    return list(self._hits)

  def _product(self) -> dict:
    return self.world.by_asin[self._asin]

  def _shown(self) -> list[str]:
    return search_lib.page_slice(self._hits, self._page_no)

  def tokenizer_words(self) -> list[str]:
    """Product ids as shown (upper case) and as clicked (lower case): a tiny
    locally trained tokenizer keeps each whole, so copying one is one token."""
    return [w for a in self.world.by_asin for w in (a, a.lower())]

  def clickables(self) -> list[str]:
    """Lower-cased clickable texts of the current page, upstream's order."""
    if self._page == "search":
      return ["search"]
    if self._page == "results":
      return pages.results_clickables(self._shown(), self._page_no)
    if self._page == "item":
      return list(pages.item_clickables(self._product()))
    if self._page == "sub":
      return list(pages.SUB_CLICKABLES)
    return []

  def admissible_actions(self) -> list[str]:
    acts = [SEARCH_HINT] if self._page == "search" else []
    return acts + [f"click[{c}]" for c in self.clickables() if c != "search"]

  def observation(self) -> str:
    instr = self.goal["instruction_text"]
    if self._page == "search":
      texts = pages.search_page(instr)
    elif self._page == "results":
      shown = [self.world.by_asin[a] for a in self._shown()]
      texts = pages.results_page(instr, shown, self._page_no, len(self._hits))
    elif self._page == "item":
      texts = pages.item_page(instr, self._product())
    elif self._page == "sub":
      texts = pages.sub_page(instr, self._product(), self._sub)
    else:
      texts = pages.done_page(self._score)
    return pages.join(texts)

  def _make_step(self, valid: bool, dense: float) -> base.EnvStep:
    obs = self.observation()
    won = self._done and self._score == 1.0
    info = dict(
        page=self._page,
        asin=self._asin,
        options=dict(self._options),
        goal_asin=self.goal["asin"],
        task_id=self._task[0],
        split=self._task[1],
    )
    if self._reward_info is not None:
      info["reward_info"] = dict(self._reward_info)
    return base.EnvStep(
        observation=obs,
        admissible_actions=self.admissible_actions(),
        reward=base.SUCCESS_REWARD * won if valid else 0.0,
        done=self._done,
        won=won,
        score=self._score,
        anchor_obs=obs,
        dense_reward=dense,
        task=self.goal["instruction_text"],
        task_type=self.goal["category"],
        valid_action=valid,
        info=info,
    )

  # --- dense reward and expert helpers --------------------------------

  def _best_options(self, product: dict) -> dict:
    """Per option name, the goal's value if offered, else the first value
    the reward would count as matching (names with none are skipped)."""
    goal_opts = self.goal["goal_options"]
    wanted = [
        reward_lib.normalize_color(v)
        for v in reward_lib.goal_option_values(self.goal)
    ]
    best = {}
    for name, values in product["options"].items():
      if goal_opts.get(name) in values:
        best[name] = goal_opts[name]
        continue
      for v in values:
        if reward_lib.option_matches(
            name, reward_lib.normalize_color(v), wanted, product
        ):
          best[name] = v
          break
    return best

  def _best(self, asin: str) -> float:
    if asin not in self._best_cache:
      p = self.world.by_asin[asin]
      self._best_cache[asin] = reward_lib.get_reward(
          p, self.goal, p["price"], self._best_options(p)
      )
    return self._best_cache[asin]

  def _potential(self) -> float:
    if self._page == "done":
      return self._score
    if self._page == "results":
      return 0.2 * max((self._best(a) for a in self._shown()), default=0.0)
    if self._page in ("item", "sub"):
      p = self._product()
      now = reward_lib.get_reward(p, self.goal, p["price"], self._options)
      return 0.4 * self._best(self._asin) + 0.2 * now
    return 0.0

  def _title_overlap(self, asin: str) -> float:
    wanted = set(reward_lib.title_nouns(self.goal["name"]))
    have = set(reward_lib.title_nouns(self.world.by_asin[asin]["Title"]))
    return len(wanted & have) / max(1, len(wanted))
