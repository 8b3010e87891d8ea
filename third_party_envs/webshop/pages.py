"""WebShop's pages as the text environment sees them.

Upstream renders HTML templates and, in ``observation_mode='text'``, joins
the stripped visible texts with ``' [SEP] '``. These functions return those
visible texts directly, in template order (empty texts dropped):

  search   WebShop | Instruction: | {instr} | Search
  results  Instruction: | {instr} | Back to Search |
           Page {n} (Total results: {total}) | [< Prev |] Next > |
           {ASIN} | {Title} | {Price}  (x up to 10)
  item     Instruction: | {instr} | Back to Search | < Prev |
           {option name} | {values...} (per option) | {Title} |
           Price: {Price} | Rating: {Rating} | Description | Features |
           Reviews | Buy Now
  sub      Instruction: | {instr} | Back to Search | < Prev | {content}
           (Description text; one text per bullet; per review
           '"{title}"' | {score} | {body})
  done     Thank you for shopping with us! |
           Your score (min 0.0, max 1.0) | {score}

As upstream's newest template, ``Next >`` is shown on every results page,
even past the last hit. The done page keeps only the visible score (upstream
also prints MTurk and debug texts there). Clickables are the lower-cased
button texts, product ASINs and option values, in upstream's order (buttons,
product links, then option radios).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
END_BUTTON = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")


def join(texts: Sequence[str]) -> str:
  return SEP.join(t.strip() for t in texts if t and t.strip())


def search_page(instruction: str) -> list[str]:
  return ["WebShop", "Instruction:", instruction, "Search"]


def results_page(
    instruction: str,
    products: Sequence[Mapping[str, Any]],
    page: int,
    total: int,
) -> list[str]:
  texts = [
      "Instruction:",
      instruction,
      BACK_TO_SEARCH,
      f"Page {page} (Total results: {total})",
  ]
  texts += [PREV_PAGE, NEXT_PAGE] if page > 1 else [NEXT_PAGE]
  for p in products:
    texts += [p["asin"], p["Title"], p["Price"]]
  return texts


def item_page(instruction: str, product: Mapping[str, Any]) -> list[str]:
  texts = ["Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE]
  for name, values in product["options"].items():
    texts += [name, *values]
  texts += [
      product["Title"],
      f"Price: {product['Price']}",
      f"Rating: {product['Rating']}",
      *SUB_PAGES,
      END_BUTTON,
  ]
  return texts


def sub_page(
    instruction: str, product: Mapping[str, Any], sub: str
) -> list[str]:
  texts = ["Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE]
  if sub == "Description":
    texts.append(product["Description"])
  elif sub == "Features":
    texts += list(product["BulletPoints"])
  elif sub == "Reviews":
    for r in product["Reviews"]:
      texts += [f'"{r["title"]}"', str(r["score"]), r["body"]]
  else:
    raise ValueError(f"unknown sub page {sub!r}; expected one of {SUB_PAGES}")
  return texts


def done_page(score: float) -> list[str]:
  return [
      "Thank you for shopping with us!",
      "Your score (min 0.0, max 1.0)",
      str(score),
  ]


def results_clickables(asins: Sequence[str], page: int) -> list[str]:
  buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if page > 1 else []) + [NEXT_PAGE]
  return [b.lower() for b in buttons] + [a.lower() for a in asins]


def item_clickables(product: Mapping[str, Any]) -> dict[str, str]:
  """``{clickable text: option name or ''}`` for an item page."""
  out = {
      b.lower(): "" for b in (BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON)
  }
  for name, values in product["options"].items():
    for v in values:
      out[v] = name
  return out


SUB_CLICKABLES = (BACK_TO_SEARCH.lower(), PREV_PAGE.lower())
