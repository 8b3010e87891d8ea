"""A deterministic WebShop-like catalogue and its goals, from a seed.

Products carry upstream's fields after ``engine.load_products``: ``asin``,
``name`` (= ``Title``), ``category``, ``query``, ``product_category``
(``'a › b › c'``), ``Description``, ``BulletPoints``, ``pricing`` (one price
or a ``[low, high]`` range), ``Price`` (the shown tag, ``'$12.99'`` or
``'$12.99 to $17.99'``), ``options`` (``{name: [values]}``), ``Attributes``,
``Reviews``, ``Rating`` -- plus ``price``, the actual price (upstream's
``product_prices``: the single price, or uniform in the range).

Goals follow upstream's ``get_synthetic_goals``: a product's attributes (a
subset), one chosen value per option, a price cap ``max(sample(first 4
multiples of 10 above the price, 2))`` and an instruction in upstream's
style ending ``', and price lower than {cap:.2f} dollars'``.
"""

from __future__ import annotations

import random
import string
from typing import Any, Sequence

from third_party_envs.webshop import catalogue_data as data
from third_party_envs.webshop import reward as reward_lib

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
_BUTTONS = {
    "back to search",
    "< prev",
    "next >",
    "description",
    "features",
    "reviews",
    "buy now",
    "search",
    "attributes",
}


def _brand(rng: random.Random) -> str:
  n = rng.choice((2, 2, 3))
  return "".join(rng.choice(data.BRAND_SYLLABLES) for _ in range(n)).title()


def _asin(rng: random.Random, taken: set) -> str:
  alphabet = string.ascii_uppercase + string.digits
  while True:
    asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
    if asin not in taken:
      taken.add(asin)
      return asin


def _title_case(phrase: str) -> str:
  return " ".join(w[:1].upper() + w[1:] for w in phrase.split())


def _collides(name: str, value: str, chosen: Sequence[str], product) -> bool:
  """True if ``value`` would be matched by the reward as another chosen value
  (colour normalisation, fuzzy match) or by its substring rule."""
  norm = reward_lib.normalize_color(value)
  if reward_lib.in_product_text(norm, product):
    return True
  for other in chosen:
    other_norm = reward_lib.normalize_color(other)
    if norm == other_norm:
      return True
    if (
        name not in reward_lib.EXACT_MATCH_OPTS
        and reward_lib.token_set_ratio(norm, other_norm) > 85
    ):
      return True
  return False


def _options(ptype, product, rng: random.Random) -> dict:
  options, used = {}, set()
  for name, pool in ptype.options.items():
    want = rng.randint(2, min(5, len(pool)))
    chosen = []
    for value in rng.sample(pool, len(pool)):
      if len(chosen) == want:
        break
      if (
          value in used
          or value in _BUTTONS
          or _collides(name, value, chosen, product)
      ):
        continue
      chosen.append(value)
    if len(chosen) >= 2:
      options[name] = sorted(chosen, key=pool.index)  # site order
      used.update(chosen)
  return options


def _product(ptype, rng: random.Random, taken: set) -> dict:
  n_attrs = rng.randint(3, min(5, len(ptype.attributes)))
  attrs = rng.sample(ptype.attributes, n_attrs)
  brand = _brand(rng)
  title = f"{brand} {_title_case(attrs[0])} {ptype.noun}"
  if rng.random() < 0.6:
    title += f", {_title_case(attrs[1])}"
  if ptype.descriptors and rng.random() < 0.7:
    title += f", {rng.choice(ptype.descriptors)}"
  bullets = [
      rng.choice(data.BULLET_LEADS).format(A=a.upper(), noun=ptype.noun.lower())
      for a in rng.sample(attrs, len(attrs))
  ]
  description = (
      rng.choice(data.DESCRIPTION_LEADS).format(noun=ptype.noun.lower())
      + f" {brand} brings you: "
      + "; ".join(attrs)
      + "."
  )
  low = round(rng.uniform(*ptype.price)) + 0.99
  if rng.random() < 0.25:
    pricing = [low, round(low + rng.choice((2.0, 3.0, 5.0, 8.0)), 2)]
    price_tag = f"${pricing[0]} to ${pricing[1]}"
    price = rng.uniform(*pricing)
  else:
    pricing, price_tag, price = [low], f"${low}", low
  reviews = []
  if rng.random() < 0.3:
    for _ in range(rng.randint(1, 3)):
      reviews.append(
          dict(
              title=rng.choice(data.REVIEW_TITLES),
              score=rng.randint(1, 5),
              body=rng.choice(data.REVIEW_BODIES),
          )
      )
  rating = (
      round(sum(r["score"] for r in reviews) / len(reviews), 1)
      if reviews
      else "N.A."
  )
  product = dict(
      asin=_asin(rng, taken),
      name=title,
      Title=title,
      category=ptype.category,
      query=ptype.query,
      product_category=" › ".join(ptype.path),
      Description=description,
      BulletPoints=bullets,
      pricing=pricing,
      Price=price_tag,
      price=price,
      Attributes=list(attrs),
      Reviews=reviews,
      Rating=rating,
      MainImage=None,
  )
  product["options"] = _options(ptype, product, rng)
  return product


def make_catalogue(seed: int = 0, num_products: int = 500) -> list[dict]:
  """``num_products`` products, balanced over the product types, in a
  seed-determined order. Same seed and size -> identical catalogue."""
  if num_products < 1:
    raise ValueError(f"num_products must be >= 1, got {num_products}")
  rng = random.Random(f"webshop-catalogue-{seed}")
  types = list(data.PRODUCT_TYPES)
  taken: set = set()
  products = []
  for i in range(num_products):
    if i % len(types) == 0:
      rng.shuffle(types)
    products.append(_product(types[i % len(types)], rng, taken))
  return products


def price_cap(price: float, rng: random.Random) -> float:
  """Larger of two values drawn from the 4 smallest multiples of 10 above
  ``price`` (1e6, i.e. no cap, if fewer than two exist)."""
  above = [p for p in PRICE_RANGE if p > price][:4]
  if len(above) < 2:
    return 1_000_000.0
  return max(rng.sample(above, 2))


def _join_and(items: Sequence[str]) -> str:
  items = list(items)
  return (
      items[0]
      if len(items) == 1
      else (", ".join(items[:-1]) + " and " + items[-1])
  )


def instruction_text(
    noun: str, attrs: Sequence[str], goal_options: dict, cap: float, style: int
) -> str:
  """Upstream-style instruction; ``style`` in 0..3 picks the template."""
  noun = noun.lower()
  if goal_options and style % 2 == 0:  # upstream's synthetic option text
    opts = " with " + ", and ".join(
        f"{k}: {v}" for k, v in goal_options.items()
    )
  elif goal_options:
    opts = " in " + " and ".join(
        f"{v} {k.replace(' name', '')}" for k, v in goal_options.items()
    )
  else:
    opts = ""
  head = (
      f"i need {noun} that is {_join_and(attrs)}",
      f"i am looking for {_join_and(attrs)} {noun}",
      f"find me {noun} with {_join_and(attrs)}",
      f"i want to buy {noun} which is {_join_and(attrs)}",
  )[style % 4]
  tail = (
      f", and price lower than {cap:.2f} dollars" if cap < 1_000_000.0 else ""
  )
  return head + opts + tail


def make_goals(
    products: Sequence[dict], seed: int = 0, goals_per_product: int = 3
) -> list[dict]:
  """Up to ``goals_per_product`` distinct goals per product, upstream's
  goal-dict fields (asin, category, query, name, product_category,
  instruction_text, attributes, price_upper, goal_options, weight)."""
  if goals_per_product < 1:
    raise ValueError(
        f"goals_per_product must be >= 1, got " f"{goals_per_product}"
    )
  rng = random.Random(f"webshop-goals-{seed}")
  noun_of = {t.query: t.noun for t in data.PRODUCT_TYPES}
  goals, counts = [], {}
  for p in products:
    seen = set()
    for _ in range(goals_per_product):
      k = rng.choice((1, 2, 2, 3))
      attrs = rng.sample(p["Attributes"], min(k, len(p["Attributes"])))
      goal_options = {n: rng.choice(v) for n, v in p["options"].items()}
      key = (tuple(sorted(attrs)), tuple(sorted(goal_options.items())))
      if key in seen:
        continue
      seen.add(key)
      cap = price_cap(p["price"], rng)
      text = instruction_text(
          noun_of[p["query"]], attrs, goal_options, cap, rng.randrange(4)
      )
      goals.append(
          dict(
              asin=p["asin"],
              category=p["category"],
              query=p["query"],
              name=p["Title"],
              product_category=p["product_category"],
              instruction_text=text,
              attributes=list(attrs),
              price_upper=cap,
              goal_options=goal_options,
          )
      )
      for a in attrs:
        counts[a] = counts.get(a, 0) + 1
  for g in goals:  # upstream: rarer attributes weigh more
    g["weight"] = sum(1.0 / counts[a] for a in g["attributes"]) / len(
        g["attributes"]
    )
  return goals


def search_words(goal: dict[str, Any]) -> str:
  """The goal's words an expert types: the instruction minus the price."""
  return goal["instruction_text"].split(", and price lower than")[0]
