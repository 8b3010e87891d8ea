"""BM25 product search, standing in for upstream's Pyserini/Lucene index.

Upstream indexes, per product, the lower-cased
``' '.join([Title, Description, BulletPoints[0], option_text])`` with
``option_text = ', and '.join(f'{name}: {", ".join(values)}')``, analyses it
with Lucene's English analyzer (standard tokenizer, English stop words,
possessive removal, Porter stemmer) and ranks with BM25 (Pyserini defaults
``k1 = 0.9, b = 0.4``), keeping the top 50 hits that match at least one query
term; the results page shows them 10 at a time.

Here the same document text goes through an equivalent analyzer (word tokens,
Lucene's 33 English stop words, trailing "'s" dropped, Porter stemming via
PyStemmer) into ``bm25s`` (Lucene scoring variant). Ties keep catalogue
order, as Lucene keeps doc-id order.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Sequence

import bm25s
import numpy as np
import Stemmer

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
K1, B = 0.9, 0.4

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such "
    "that the their then there these they this to was will with".split()
)
_WORD_RE = re.compile(r"\w+(?:'\w+)?")
_stemmer = Stemmer.Stemmer("porter")


@functools.lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
  return _stemmer.stemWord(word)


def analyze(text: str) -> list[str]:
  """Lucene-English-like analysis: lower-case word tokens, stop words
  removed, possessive "'s" stripped, Porter-stemmed."""
  out = []
  for tok in _WORD_RE.findall(text.lower()):
    if tok.endswith("'s"):
      tok = tok[:-2]
    tok = tok.replace("'", "")
    if tok and tok not in LUCENE_STOPWORDS:
      out.append(_stem(tok))
  return out


def option_text(options: Mapping[str, Sequence[str]]) -> str:
  return ", and ".join(
      f"{name}: {', '.join(values)}" for name, values in options.items()
  )


def document_text(product: Mapping[str, Any]) -> str:
  """The text upstream indexes for one product (lower-cased)."""
  bullets = product["BulletPoints"]
  return " ".join(
      [
          product["Title"],
          product["Description"],
          bullets[0] if bullets else "",
          option_text(product["options"]),
      ]
  ).lower()


class SearchEngine:
  """BM25 index over a product list; ``search`` returns ranked ASINs."""

  def __init__(
      self, products: Sequence[Mapping[str, Any]], k1: float = K1, b: float = B
  ):
    if not products:
      raise ValueError("SearchEngine needs at least one product")
    self.asins = [p["asin"] for p in products]
    corpus = [analyze(document_text(p)) for p in products]
    self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
    self._bm25.index(corpus, show_progress=False)
    # The indexed terms. Not bm25s's vocab_dict: that also holds "", its
    # placeholder, with no column in the index, and a query holding it
    # raises; "s" (as in "men s") stems to "" (Snowball's Porter).
    self._terms = frozenset(t for doc in corpus for t in doc)

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every product for ``query`` (unknown terms ignored)."""
    tokens = [t for t in analyze(query) if t in self._terms]
    if not tokens:
      return np.zeros(len(self.asins), np.float32)
    return self._bm25.get_scores(tokens)

  def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
    """Top ``k`` ASINs with a positive score, best first."""
    scores = self.scores(query)
    order = np.argsort(-scores, kind="stable")[:k]
    return [self.asins[i] for i in order if scores[i] > 0]


def page_slice(hits: Sequence[str], page: int) -> list[str]:
  """The hits shown on results page ``page`` (1-based, 10 a page)."""
  return list(hits[(page - 1) * PRODUCT_WINDOW : page * PRODUCT_WINDOW])
