"""WebShop's purchase reward, ported from upstream ``engine/goal.py``.

  total = r_type * (n_attr_matched + n_opt_matched + [price <= price_upper])
                 / (n_goal_attributes + n_goal_options + 1)

``r_type`` (is the purchased thing the same *kind* of product?):
  match = query_match or category_match or title_score > 0.2
  r_type = 1.0 if match else 0.5;  then 0.1 if title_score < 0.1;
           then 0.0 if title_score == 0.
``query_match``: equal search queries. ``category_match``: at least 2 shared
elements of the ``'a › b › c'`` product-category paths (as sets).
``title_score = |set(nouns(bought)) & set(nouns(goal))| / len(nouns(goal))``
(the goal list keeps duplicates; 0.2 when the goal title has no nouns).

Attributes: a goal attribute matches when some product attribute has
``token_set_ratio > 85``, or it is a substring of the product's lower-cased
Title, ``' '.join(BulletPoints)`` or Description. Options: each *purchased*
option value (colour-normalised) matches when (option name ``size``) it is
exactly one of the goal's values, else has ``token_set_ratio > 85`` with one,
or is a substring of Title / bullets / Description.

Offline departure from upstream -- nouns without spaCy. Upstream keeps the
tokens spaCy's ``en_core_web_lg`` tags NOUN/PROPN. That model cannot be
fetched here, so :func:`title_nouns` uses a POS-free heuristic: lower-cased
word tokens (letters/digits, inner dots kept, hyphens split), minus English
function words, minus tokens containing a digit (sizes, model numbers, '4k'),
minus single characters, minus words longer than 4 letters ending in 'ed'
but not 'eed' (participles used as adjectives: 'listed', 'scented'; but
'speed', 'tweed'). On upstream's
``test_goal.py`` titles it gives 0.857 / 0.3125 / 0.167 / 0.0 where spaCy
gives 0.85 / 0.31 / 0.17 / <0.05, so every ``r_type`` bucket is the same.

``token_set_ratio`` is thefuzz's: rapidfuzz with the default processor
(lower-case, non-alphanumerics to spaces), rounded to an integer.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Sequence

from rapidfuzz import fuzz
from rapidfuzz import utils as fuzz_utils

EXACT_MATCH_OPTS = ("size",)
FUZZY_THRESHOLD = 85

# Upstream's normalize.COLOR_SET: the first entry found inside a value wins.
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush "
    "bordeaux bronze brown burgundy camel camo caramel champagne charcoal "
    "cheetah chestnut chocolate christmas coffee cognac copper coral "
    "cranberry cream crystal dark denim eggplant elephant espresso fuchsia "
    "gold granite grape graphite grass gray green grey heather indigo ivory "
    "ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve "
    "merlot midnight mint mocha multicolor mushroom mustard natural navy nude "
    "olive orange peach pewter pink plum purple rainbow red rose royal rust "
    "sand sapphire seashell silver skull slate steel stone stonewash "
    "sunflower tan taupe teal tiger turquoise violet walnut wheat white wine "
    "yellow"
).split()

_STOPWORDS = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on "
    "or such that the their then there these they this to was will with "
    "without w o per plus up down out off over under about after before "
    "all any both each few more most other some own same so than too very "
    "can just i me my we our you your he she him her his them what which who "
    "whom when where why how new".split()
)
_TOKEN_RE = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*")


def normalize_color(value: str) -> str:
  """Returns the first ``COLOR_SET`` entry that occurs in ``value``, else
  ``value`` unchanged (upstream ``normalize_color``)."""
  for color in COLOR_SET:
    if color in value:
      return color
  return value


def token_set_ratio(a: str, b: str) -> int:
  """thefuzz.fuzz.token_set_ratio: processed, 0..100, rounded."""
  a, b = fuzz_utils.default_process(a), fuzz_utils.default_process(b)
  if not a or not b:
    return 0
  return int(round(fuzz.token_set_ratio(a, b)))


@functools.lru_cache(maxsize=65536)
def title_nouns(title: str) -> tuple[str, ...]:
  """Noun-like words of a product title, in order, duplicates kept (see the
  module docstring for the rule that stands in for spaCy's tagger)."""
  nouns = []
  for tok in _TOKEN_RE.findall(title.lower()):
    if len(tok) < 2 or tok in _STOPWORDS or any(c.isdigit() for c in tok):
      continue
    if len(tok) > 4 and tok.endswith("ed") and not tok.endswith("eed"):
      continue
    nouns.append(tok)
  return tuple(nouns)


def _categories(path: str) -> set[str]:
  return {x.strip() for x in path.split("›")}


def get_type_reward(
    purchased: Mapping[str, Any], goal: Mapping[str, Any]
) -> dict:
  """Type reward: ``{'r_type', 'query_match', 'category_match',
  'title_score'}`` of a purchased product against a goal (formula above)."""
  query_match = purchased["query"] == goal["query"]
  shared = _categories(purchased["product_category"]) & _categories(
      goal["product_category"]
  )
  category_match = len(shared) >= 2
  bought = title_nouns(purchased["name"])
  wanted = title_nouns(goal["name"])
  if wanted:
    title_score = len(set(bought) & set(wanted)) / len(wanted)
  else:
    title_score = 0.2
  r_type = 1.0
  if not (query_match or category_match or title_score > 0.2):
    r_type = 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return dict(
      r_type=r_type,
      query_match=query_match,
      category_match=category_match,
      title_score=title_score,
  )


def in_product_text(value: str, product: Mapping[str, Any]) -> bool:
  """Upstream's fallback: ``value`` is a substring of the lower-cased Title,
  bullets or Description (a str BulletPoints joins character-wise, as
  upstream's ``' '.join`` does)."""
  return (
      value in product["Title"].lower()
      or value in " ".join(product["BulletPoints"]).lower()
      or value in product["Description"].lower()
  )


def get_attribute_reward(
    purchased: Mapping[str, Any], goal: Mapping[str, Any]
) -> tuple[float, int]:
  """``(fraction, count)`` of goal attributes the purchased product has."""
  goal_attrs = goal["attributes"]
  matches = 0
  for g_attr in goal_attrs:
    if any(
        token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD
        for p_attr in purchased["Attributes"]
    ):
      matches += 1
    elif in_product_text(g_attr, purchased):
      matches += 1
  return matches / len(goal_attrs), matches


def option_matches(
    name: str,
    value: str,
    goal_values: Sequence[str],
    purchased: Mapping[str, Any],
) -> bool:
  """Whether one purchased option ``name: value`` (colour-normalised) counts
  as matching one of the (normalised) ``goal_values``."""
  if name.lower() in EXACT_MATCH_OPTS:
    if value in goal_values:
      return True
  elif any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in goal_values):
    return True
  return in_product_text(value, purchased)


def get_option_reward(
    purchased: Mapping[str, Any],
    goal_options: Sequence[str],
    purchased_options: Mapping[str, str],
):
  """``(fraction or None, count)``: purchased option values that match one of
  the goal's option values (``None`` fraction when the goal has none)."""
  goal_values = [normalize_color(o) for o in goal_options]
  matches = sum(
      option_matches(k, normalize_color(v), goal_values, purchased)
      for k, v in purchased_options.items()
  )
  fraction = matches / len(goal_values) if goal_values else None
  return fraction, matches


def goal_option_values(goal: Mapping[str, Any]) -> list[str]:
  opts = goal["goal_options"]
  return list(opts.values()) if isinstance(opts, Mapping) else list(opts)


def get_reward(
    purchased: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    verbose: bool = False,
):
  """Total reward of buying ``purchased`` at ``price`` with the chosen
  ``options`` (``{name: value}``) for ``goal``. With ``verbose`` also returns
  upstream's info dict (r_type, r_att, r_option, r_price and weights)."""
  type_info = get_type_reward(purchased, goal)
  r_price = price <= goal["price_upper"]
  r_att, n_att = get_attribute_reward(purchased, goal)
  r_option, n_opt = get_option_reward(
      purchased, goal_option_values(goal), options
  )
  denom = len(goal["attributes"]) + len(goal["goal_options"]) + 1
  total = (n_att + n_opt + r_price) / denom * type_info["r_type"]
  if not verbose:
    return total
  info = dict(
      r_type=type_info["r_type"],
      r_att=r_att,
      w_att=len(goal["attributes"]) / denom,
      query_match=type_info["query_match"],
      category_match=type_info["category_match"],
      title_score=type_info["title_score"],
      r_price=bool(r_price),
      w_price=1 / denom,
  )
  if r_option is not None:
    info["r_option"] = r_option
    info["w_option"] = len(goal["goal_options"]) / denom
  return total, info
