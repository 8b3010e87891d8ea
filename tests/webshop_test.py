"""Offline WebShop: upstream reward cases, pages, search, expert, splits."""

import math
import random

import pytest

from third_party_envs.webshop import catalogue
from third_party_envs.webshop import original
from third_party_envs.webshop import pages
from third_party_envs.webshop import reward as R
from third_party_envs.webshop import search
from third_party_envs.webshop import WebShopEnv
from third_party_envs.webshop import parse_action

SAIREED = (
    "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 "
    "Channel 4K Ultra HD Soundbar"
)
BRST = (
    "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic "
    "SC-HT830V DVD/VCR Combo Home Theater System"
)


@pytest.fixture(scope="module")
def env():
  return WebShopEnv()


# --- upstream tests/web-agent-site/engine/test_goal.py ------------------


def test_type_reward_upstream_cases():
  goal = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
  bought = dict(goal)
  r = R.get_type_reward(bought, goal)
  assert (
      r["r_type"],
      r["query_match"],
      r["category_match"],
      r["title_score"],
  ) == (1.0, True, True, 1.0)
  bought["query"] = "Query 2"
  assert not R.get_type_reward(bought, goal)["query_match"]
  for path, match in [
      ("b › c › a", True),
      ("d › e › f", False),
      ("a › d › b", True),
      ("a › a › b", True),
      ("a › a › d", False),
  ]:
    bought["product_category"] = path
    assert R.get_type_reward(bought, goal)["category_match"] == match, path
  # Title scores: upstream (spaCy) expects 0.85, 0.31, 0.17, < 0.05; the
  # offline noun rule gives 6/7, 5/16, 2/12, 0 -- within upstream's 0.01.
  cases = [
      (
          "adidas Unisex-Adult D.o.n. Issue 2 Basketball Shoe",
          "adidas Unisex-Adult D.o.n. Issue 2 Indoor Court Shoe",
          6 / 7,
      ),
      (SAIREED + " Home Theater System Subwoofer", BRST, 5 / 16),
      (SAIREED, BRST, 2 / 12),
      (
          "Rusticware 921ORB Kitchen and Bath Cabinet Knob",
          "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne "
          "Remover Portable Makeup Tweezers (Silver)",
          0.0,
      ),
  ]
  for want, have, score in cases:
    goal["name"], bought["name"] = want, have
    assert math.isclose(R.get_type_reward(bought, goal)["title_score"], score)
  assert math.isclose(5 / 16, 0.31, abs_tol=1e-2)
  assert math.isclose(2 / 12, 0.17, abs_tol=1e-2)


def test_title_nouns_rule():
  assert R.title_nouns(SAIREED) == (
      "saireed",
      "ul",
      "prong",
      "power",
      "cord",
      "jbl",
      "bar",
      "bar",
      "channel",
      "ultra",
      "hd",
      "soundbar",
  )


def test_attribute_reward_upstream_cases():
  goal = {"attributes": ["tea tree", "essential oils", "natural ingredients"]}
  empty = {"Title": "", "BulletPoints": [], "Description": ""}
  full = dict(
      empty, Attributes=["tea tree", "essential oil", "natural ingredients"]
  )
  assert R.get_attribute_reward(full, goal) == (1.0, 3)
  partial = dict(empty, Attributes=["essential oil", "natural ingredients"])
  assert R.get_attribute_reward(partial, goal) == (2 / 3, 2)
  in_text = dict(
      Attributes=[],
      Title="",
      BulletPoints=["This shampoo has essential oils and smells like lemons"],
      Description="Best shampoo on the market, made with natural ingredients",
  )
  assert R.get_attribute_reward(in_text, goal) == (2 / 3, 2)
  none = dict(
      Attributes=["tea bag", "earl gray", "lipton"],
      Title="English tea for breakfast",
      BulletPoints=["Soothing aroma", "Calming, great feeling"],
      Description="Best tea made by Lipton, great to pair with " "breakfast",
  )
  assert R.get_attribute_reward(none, goal) == (0.0, 0)


def test_option_reward_upstream_cases():
  # Upstream's test predates the (product, goal, purchased) signature; same
  # cases, purchased options as {name: value}, a product with no text.
  product = {"Title": "", "BulletPoints": [], "Description": ""}
  goal = ["grey", "XL", "pack of 12"]
  exact = {"amount": "pack of 12", "color": "grey", "size": "XL"}
  assert R.get_option_reward(product, goal, exact) == (1.0, 3)
  partial = {"amount": "pack of 12", "color": "blue", "size": "XL"}
  assert R.get_option_reward(product, goal, partial) == (2 / 3, 2)
  fuzzy = {"amount": "pack of 12", "color": "powder snow", "size": "XL"}
  assert R.get_option_reward(
      product, ["cool powder snow", "XL", "pack of 12"], fuzzy
  ) == (1.0, 3)
  assert R.get_option_reward(product, [], {"a": "goal 1", "b": "goal 2"}) == (
      None,
      0,
  )
  assert R.get_option_reward(product, ["goal 1", "goal 2"], {}) == (0.0, 0)
  # size is matched exactly: 'x-large' is not 'large' (fuzzy would say yes)
  assert R.get_option_reward(product, ["large"], {"size": "x-large"}) == (
      0.0,
      0,
  )
  assert R.get_option_reward(product, ["large"], {"fit": "x-large"}) == (1.0, 1)


def test_get_reward_upstream_cases():
  name = (
      "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off " "White"
  )
  goal = {
      "query": "Query 1",
      "product_category": "a › b › c",
      "name": name,
      "attributes": ["tea tree", "essential oils", "natural ingredients"],
      "goal_options": {"color": "grey", "size": "XL"},
      "price_upper": 40.00,
  }
  bought = {
      "query": "Query 1",
      "product_category": "a › b › c",
      "name": name,
      "Attributes": ["tea tree", "essential oil", "natural ingredients"],
      "Title": "",
      "BulletPoints": [],
      "Description": "",
  }
  opts = {"color": "grey", "size": "XL"}
  assert R.get_reward(bought, goal, 35, opts) == 1.0
  # upstream passes BulletPoints as a str: ' '.join spaces its letters, so
  # only the description's 'natural ingredients' matches: (1+2+1)/6
  bought.update(
      Attributes=[],
      BulletPoints="This shampoo has essential " "oils and smells like lemons",
      Description="Best shampoo on "
      "the market, made with natural ingredients",
  )
  assert math.isclose(R.get_reward(bought, goal, 35, opts), 2 / 3)
  goal["goal_options"] = {"color": "grey", "size": "XL", "amount": "pack of 12"}
  assert math.isclose(R.get_reward(bought, goal, 35, opts), 4 / 7)
  assert math.isclose(4 / 7, 0.5714, abs_tol=1e-4)
  goal["name"], bought["name"] = SAIREED, BRST
  bought.update(query="Query 2", product_category="a › d › e")
  total, info = R.get_reward(bought, goal, 35, opts, verbose=True)
  assert info["r_type"] == 0.5
  assert math.isclose(total, 2 / 7)
  assert math.isclose(2 / 7, 0.2857, abs_tol=1e-4)
  assert R.get_reward(bought, goal, 45, opts) == 0.5 * 3 / 7  # over the cap


def test_normalize_color_upstream_cases():
  for value, want in [
      ("", ""),
      ("black forest", "black"),
      ("violet lavender", "lavender"),
      ("steelivy fuchsia", "fuchsia"),
      ("123alabaster", "alabaster"),
      ("webshop", "webshop"),
  ]:
    assert R.normalize_color(value) == want


# --- catalogue and goals -------------------------------------------------


def test_catalogue_is_deterministic_and_complete():
  a = catalogue.make_catalogue(seed=3, num_products=40)
  assert a == catalogue.make_catalogue(seed=3, num_products=40)
  assert a != catalogue.make_catalogue(seed=4, num_products=40)
  assert len({p["asin"] for p in a}) == 40
  assert {p["category"] for p in a} == {
      "beauty",
      "electronics",
      "fashion",
      "food",
      "garden",
  }
  for p in a:
    assert len(p["asin"]) == 10 and p["asin"].startswith("B0")
    assert p["name"] == p["Title"] and p["Attributes"] and p["BulletPoints"]
    assert len(p["product_category"].split(" › ")) >= 3
    if len(p["pricing"]) == 1:
      assert p["price"] == p["pricing"][0]
      assert p["Price"] == f"${p['pricing'][0]}"
    else:
      assert p["pricing"][0] <= p["price"] <= p["pricing"][1]
      assert p["Price"] == f"${p['pricing'][0]} to ${p['pricing'][1]}"
  with pytest.raises(ValueError, match="num_products"):
    catalogue.make_catalogue(num_products=0)


def test_price_cap_is_from_four_multiples_of_ten_above():
  rng = random.Random(0)
  caps = {catalogue.price_cap(23.5, rng) for _ in range(200)}
  assert caps == {40.0, 50.0, 60.0}  # larger of 2 of {30, 40, 50, 60}
  assert catalogue.price_cap(985.0, rng) == 1_000_000.0


def test_default_world_goals(env):
  world = env.world
  assert len(world.goals) >= 1000
  assert env.num_tasks("test") == 500
  assert env.num_tasks("valid_seen") == env.num_tasks("valid_unseen") == 500
  assert env.num_tasks("train") == len(world.goals) - 500
  for g in world.goals[:100]:
    p = world.by_asin[g["asin"]]
    above = [10.0 * i for i in range(1, 100) if 10.0 * i > p["price"]][:4]
    assert g["price_upper"] in above[1:]
    assert g["instruction_text"].endswith(
        f", and price lower than {g['price_upper']:.2f} dollars"
    )
    assert set(g["attributes"]) <= set(p["Attributes"])
    assert all(g["goal_options"][k] in v for k, v in p["options"].items())
  with pytest.raises(ValueError, match="split"):
    env.num_tasks("dev")
  with pytest.raises(ValueError, match="task_id"):
    env.reset(500, "test")


def test_same_task_id_same_goal(env):
  other = WebShopEnv()
  a, b = env.reset(7, "train"), other.reset(7, "train")
  assert a.observation == b.observation and env.goal == other.goal
  assert env.reset(8, "train").task != a.task
  assert env.reset(7, "test").task != a.task


# --- search --------------------------------------------------------------


def test_analyzer_and_bm25_scores_by_hand():
  assert search.analyze("The Essential Oils for Men's running") == [
      "essenti",
      "oil",
      "men",
      "run",
  ]
  docs = [
      dict(Title=t, Description="", BulletPoints=[], options={})
      for t in ("red shoe", "red red hat", "blue hat box")
  ]
  for i, d in enumerate(docs):
    d["asin"] = f"A{i}"
  engine = search.SearchEngine(docs)
  # Lucene BM25: idf = ln(1 + (N - df + .5)/(df + .5)),
  # tf part = tf / (tf + k1 (1 - b + b dl/avgdl)); avgdl = 8/3
  idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
  norm = lambda tf, dl: tf / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / (8 / 3)))
  scores = engine.scores("red")
  assert scores[0] == pytest.approx(idf * norm(1, 2), rel=1e-5)
  assert scores[1] == pytest.approx(idf * norm(2, 3), rel=1e-5)
  assert scores[2] == 0
  assert engine.search("red") == ["A1", "A0"]  # zero-score docs left out
  assert engine.search("green") == []
  # "s" stems to "", bm25s's placeholder term with no column in the index:
  # a query holding it (a policy's "men s shoe") ignores it, as any
  # unknown term, instead of raising (a failed episode at seed 200 of the
  # default run).
  assert search.analyze("men s") == ["men", ""]
  assert list(engine.scores("s")) == [0, 0, 0] and engine.search("s") == []
  assert list(engine.scores("red s")) == list(scores)


def test_search_returns_50_hits_paged_by_10(env):
  env.reset(0, "test")
  s = env.step("search[Long lasting and easy to use]")  # 333 docs match
  hits = env.hits
  assert len(hits) == 50 and len(set(hits)) == 50
  assert "Page 1 (Total results: 50) [SEP] Next > [SEP] " in s.observation
  assert "< Prev" not in s.observation
  assert [a[6:-1] for a in s.admissible_actions[2:]] == [
      h.lower() for h in hits[:10]
  ]
  for page in range(2, 7):
    s = env.step("click[next >]")
    shown = hits[(page - 1) * 10 : page * 10]
    assert (
        f"Page {page} (Total results: 50) [SEP] < Prev [SEP] Next >"
        in s.observation
    )
    assert s.admissible_actions == (
        ["click[back to search]", "click[< prev]", "click[next >]"]
        + [f"click[{h.lower()}]" for h in shown]
    )
  assert s.observation.endswith("Next >")  # page 6: past the 50 hits
  s = env.step("click[< prev]")
  assert s.observation.endswith(env.world.by_asin[hits[49]]["Price"])
  env.step("click[back to search]")
  env.step("search[shoes]")  # only 16 products mention shoes
  assert len(env.hits) == 16
  assert "Page 1 (Total results: 16)" in env.observation()


# --- pages ---------------------------------------------------------------


def test_page_observations(env):
  s = env.reset(3, "test")
  instr = env.goal["instruction_text"]
  assert s.observation == (
      f"WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search"
  )
  assert s.admissible_actions == ["search[<your query>]"]
  assert s.task == instr and s.anchor_obs == s.observation
  s = env.step(f"search[{catalogue.search_words(env.goal)}]")
  top = [env.world.by_asin[a] for a in env.hits[:10]]
  assert s.observation == " [SEP] ".join(
      [
          "Instruction:",
          instr,
          "Back to Search",
          "Page 1 (Total results: " f"{len(env.hits)})",
          "Next >",
      ]
      + [x for p in top for x in (p["asin"], p["Title"], p["Price"])]
  )
  p = env.world.by_asin[env.goal["asin"]]
  s = env.step(f"click[{p['asin'].lower()}]")
  opts = [x for n, v in p["options"].items() for x in (n, *v)]
  assert s.observation == " [SEP] ".join(
      [
          "Instruction:",
          instr,
          "Back to Search",
          "< Prev",
          *opts,
          p["Title"],
          f"Price: {p['Price']}",
          f"Rating: {p['Rating']}",
          "Description",
          "Features",
          "Reviews",
          "Buy Now",
      ]
  )
  assert s.admissible_actions == [
      "click[back to search]",
      "click[< prev]",
      "click[description]",
      "click[features]",
      "click[reviews]",
      "click[buy now]",
  ] + [f"click[{v}]" for vs in p["options"].values() for v in vs]
  head = f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] < Prev"
  s = env.step("click[description]")
  assert s.observation == f"{head} [SEP] {p['Description']}"
  assert s.admissible_actions == ["click[back to search]", "click[< prev]"]
  env.step("click[< prev]")
  s = env.step("click[features]")
  assert s.observation == " [SEP] ".join([head, *p["BulletPoints"]])
  env.step("click[< prev]")
  s = env.step("click[reviews]")
  reviews = [
      x
      for r in p["Reviews"]
      for x in (f'"{r["title"]}"', str(r["score"]), r["body"])
  ]
  assert s.observation == " [SEP] ".join([head, *reviews])
  env.step("click[< prev]")
  s = env.step("click[buy now]")
  assert s.done and s.admissible_actions == []
  assert s.observation == (
      "Thank you for shopping with us! [SEP] Your score "
      f"(min 0.0, max 1.0) [SEP] {s.score}"
  )


def test_product_with_reviews_renders_them(env):
  p = next(p for p in env.world.products if p["Reviews"])
  r = p["Reviews"][0]
  assert p["Rating"] == round(
      sum(x["score"] for x in p["Reviews"]) / len(p["Reviews"]), 1
  )
  texts = pages.sub_page("x", p, "Reviews")
  assert texts[4:7] == [f'"{r["title"]}"', str(r["score"]), r["body"]]


def test_options_and_navigation(env):
  env.reset(0, "test")
  env.step(env.expert_action())
  p = env.world.by_asin[env.goal["asin"]]
  env.step(f"click[{p['asin'].lower()}]")
  name, values = next(iter(p["options"].items()))
  s = env.step(f"click[{values[1]}]")
  assert s.info["options"] == {name: values[1]}
  s = env.step("click[features]")
  assert s.info["options"] == {name: values[1]}
  s = env.step("click[< prev]")  # sub page -> item page, options kept
  assert s.info["page"] == "item" and s.info["options"] == {name: values[1]}
  s = env.step("click[< prev]")  # item page -> results, options reset
  assert s.info["page"] == "results" and s.info["options"] == {}
  s = env.step("click[back to search]")
  assert s.info["page"] == "search" and s.admissible_actions == [
      "search[<your query>]"
  ]


def test_parse_action():
  assert parse_action("search[red shoes]") == ("search", "red shoes")
  assert parse_action("click[< Prev]") == ("click", "< Prev")
  assert parse_action("buy it") == ("buy it", None)
  assert parse_action("click[]") == ("click[]", None)


def test_invalid_actions_change_nothing(env):
  env.reset(1, "test")
  bad_by_page = {
      "search": [
          "click[search]",
          "search[]",
          "click[buy now]",
          "nonsense",
          "Search[shoes]",
      ],
      "results": [
          "search[shoes]",
          "click[buy now]",
          "click[description]",
          "click[< prev]",
          "click[b000000000]",
      ],
      "item": [
          "search[shoes]",
          "click[next >]",
          "click[not an option]",
          "<think>hmm</think>",
      ],
      "sub": ["click[buy now]", "click[features]", "click[description]"],
  }
  for page, expert_steps in [("search", 0), ("results", 1), ("item", 2)]:
    env.reset(1, "test")
    for _ in range(expert_steps):
      before = env.step(env.expert_action())
    if page == "search":
      before = env.step("noop")  # a step to compare against
    for bad in bad_by_page[page]:
      s = env.step(bad)
      assert not s.valid_action, bad
      assert (s.observation, s.admissible_actions, s.info) == (
          before.observation,
          before.admissible_actions,
          before.info,
      )
      assert s.reward == 0 and s.dense_reward == 0 and not s.done
  env.step("click[reviews]")
  before = env.step("noop")
  for bad in bad_by_page["sub"]:
    s = env.step(bad)
    assert not s.valid_action and s.observation == before.observation


# --- expert, random agent, dense reward ----------------------------------


def _run(env, task_id, split, policy, max_steps=15):
  s = env.reset(task_id, split)
  steps = [s]
  while not s.done and len(steps) <= max_steps:
    s = env.step(policy(s))
    steps.append(s)
  return steps


def test_expert_wins_a_50_goal_sample(env):
  rng = random.Random(0)
  tasks = [(i, "test") for i in range(25)] + [
      (i, "train") for i in rng.sample(range(env.num_tasks("train")), 25)
  ]
  for task_id, split in tasks:
    steps = _run(env, task_id, split, lambda s: env.expert_action())
    last = steps[-1]
    assert last.done and last.won and last.score == 1.0, (task_id, split)
    assert last.reward == 10.0 and all(s.reward == 0 for s in steps[:-1])
    assert all(s.valid_action for s in steps)
    # potential-based dense reward: sums to the score, never the outcome
    assert sum(s.dense_reward for s in steps) == pytest.approx(1.0)
    assert [s.dense_reward for s in steps] != [s.reward for s in steps]
  assert env.expert_action() is None
  s = env.step("click[buy now]")  # a finished episode stays finished
  assert s.done and not s.valid_action and s.reward == 0


def test_expert_pages_back_to_its_product(env):
  env.reset(0, "test")
  env.step(env.expert_action())
  target = env.goal["asin"]
  assert target in env.hits[:10]
  env.step("click[next >]")
  assert env.expert_action() == "click[< prev]"
  other = next(a for a in env.hits[10:20] if a != target)
  env.step(f"click[{other.lower()}]")
  assert env.expert_action() == "click[< prev]"  # wrong product: go back


def test_dense_reward_tracks_progress(env):
  s0 = env.reset(2, "test")
  assert s0.dense_reward == 0
  s1 = env.step(env.expert_action())  # search: best shown product is 1.0
  assert s1.dense_reward == pytest.approx(0.2)
  s2 = env.step("click[back to search]")
  assert s2.dense_reward == pytest.approx(-0.2)


def test_random_admissible_actions_rarely_win(env):
  rng = random.Random(0)

  def policy(s):
    a = rng.choice(s.admissible_actions)
    if a == "search[<your query>]":  # give it the goal's own words
      a = f"search[{catalogue.search_words(env.goal)}]"
    return a

  wins = [_run(env, i, "train", policy, 15)[-1].won for i in range(50)]
  assert sum(wins) / len(wins) < 0.1


# --- original-site adapter -----------------------------------------------


def test_original_adapter_explains_what_is_missing(tmp_path, monkeypatch):
  monkeypatch.delenv(original.DATA_ENV_VAR, raising=False)
  with pytest.raises(FileNotFoundError, match="WEBSHOP_DATA_DIR"):
    original.WebShopOriginalEnv()
  with pytest.raises(FileNotFoundError, match="does not exist"):
    original.resolve_data_files(str(tmp_path / "nope"))
  (tmp_path / "items_shuffle_1000.json").write_text("[]")
  with pytest.raises(FileNotFoundError, match="attributes.*human"):
    original.resolve_data_files(str(tmp_path))
  (tmp_path / "items_ins_v2.json").write_text("{}")
  (tmp_path / "items_human_ins.json").write_text("{}")
  monkeypatch.setenv(original.DATA_ENV_VAR, str(tmp_path))
  assert original.resolve_data_files()["products"].endswith(
      "items_shuffle_1000.json"
  )
  with pytest.raises(ImportError, match="web_agent_site"):
    original.WebShopOriginalEnv()


def test_cpu_world_splits_and_type_expert():
  """The CPU recipe's world: one product per type, 64 held-out goals, an
  expert that searches by product type and still wins every test goal."""
  env = WebShopEnv(
      num_products=30,
      goals_per_product=12,
      num_test_goals=64,
      expert_query="type",
  )
  assert env.num_tasks("test") == 64
  assert env.num_tasks("train") == len(env.world.goals) - 64
  assert len({p["query"] for p in env.world.products}) == 30
  test_asins = set()
  for task_id in range(64):
    obs = env.reset(task_id, "test")
    test_asins.add(env.goal["asin"])
    first = env.expert_action()
    assert first == f"search[{env.goal['query']}]"
    for _ in range(8):
      obs = env.step(env.expert_action())
      if obs.done:
        break
    assert obs.won, task_id
  # Held-out goals are new goals on products the train split also covers.
  train_asins = {
      env.world.goal(i, "train")["asin"] for i in range(env.num_tasks("train"))
  }
  assert test_asins <= train_asins
  env.reset(0, "train")
  assert env.goal is env.world.goals[64]


def test_bad_world_arguments_are_refused():
  with pytest.raises(ValueError, match="expert_query"):
    WebShopEnv(num_products=30, expert_query="copy")
  with pytest.raises(ValueError, match="num_test_goals"):
    WebShopEnv(num_products=30, num_test_goals=0)
