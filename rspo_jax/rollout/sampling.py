"""Pure token-sampling functions used inside the jitted decode loop.

Sampling at temperature ``T`` and nucleus ``top_p``:

    z = logits / T
    keep = the smallest set of most likely tokens of softmax(z) whose mass
           reaches top_p (ties at the threshold are all kept)
    token ~ softmax(z restricted to keep)       (Gumbel-max: argmax(z + g))

``T <= 0`` means greedy, ``token = argmax(logits)``. ``temperature`` and
``top_p`` may be traced scalars, so changing them does not recompile.

The log-prob recorded for the chosen token is always the *untempered* one,
``log softmax(logits)[token]`` (see ``rollout/engine.py``): it is what the
learner recomputes as the behaviour policy.

Stop strings are matched inside the loop by a token-level automaton (see
``stop_string_tables``), so rows end at the token that completes one.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

_MIN_TEMPERATURE = 1e-6


def top_p_filter(logits: jax.Array, top_p) -> jax.Array:
  """Sets logits outside the top-p nucleus to -inf.

  A token is kept when the probability mass of the tokens strictly more
  likely than it is below ``top_p``; the most likely token is always kept.

  Args:
    logits: float [B, V].
    top_p: scalar in (0, 1]; 1 keeps everything.
  Returns:
    float [B, V], same values on the nucleus, -inf elsewhere.
  """
  logits = logits.astype(jnp.float32)

  def nucleus(x):
    desc = -jnp.sort(-x, axis=-1)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p
    keep = keep.at[:, 0].set(True)
    thresh = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(x >= thresh, x, -jnp.inf)

  return jax.lax.cond(top_p < 1.0, nucleus, lambda x: x, logits)


def sample_token(
    logits: jax.Array, rng: jax.Array, temperature, top_p=1.0
) -> jax.Array:
  """Draws one token per row.

  Args:
    logits: float [B, V] next-token logits.
    rng: one PRNG key (split over rows) or a batch of keys [B] (one per row;
      a row's draw then depends only on its own key).
    temperature: scalar; <= 0 means greedy.
    top_p: scalar nucleus mass in (0, 1].
  Returns:
    int32 [B] tokens.
  """
  if logits.ndim != 2:
    raise ValueError(f"sample_token: logits must be [B, V], got {logits.shape}")
  logits = logits.astype(jnp.float32)
  batch, vocab = logits.shape
  keys = _row_keys(rng, batch)
  temperature = jnp.asarray(temperature, jnp.float32)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  z = logits / jnp.maximum(temperature, _MIN_TEMPERATURE)
  z = top_p_filter(z, jnp.asarray(top_p, jnp.float32))
  gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32))(keys)
  sampled = jnp.argmax(z + gumbel, axis=-1).astype(jnp.int32)
  return jnp.where(temperature > 0, sampled, greedy)


def token_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """log softmax(logits)[b, tokens[b]] at temperature 1.

  Computed as ``logits[token] - logsumexp(logits)`` in float32.

  Args:
    logits: float [B, V].
    tokens: int [B].
  Returns:
    float32 [B].
  """
  logits = logits.astype(jnp.float32)
  chosen = jnp.take_along_axis(logits, tokens[:, None].astype(jnp.int32), -1)
  return chosen[:, 0] - jax.nn.logsumexp(logits, axis=-1)


def _row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """[B] keys from one key (split) or a batch of keys (checked)."""
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  single = rng.ndim == 0 if typed else rng.shape == (2,)
  if single:
    return jax.random.split(rng, batch)
  n = rng.shape[0]
  if n != batch:
    raise ValueError(f"sample_token: {n} row keys for a batch of {batch} rows")
  return rng


# ------------------------------------------------------------ stop strings
# A row stops once its decoded text contains a stop string s (m = len(s)).
# Inside the decode loop this is a token-level automaton: the state q in
# [0, m] is the length of the longest suffix of the text so far that is a
# prefix of s (Knuth-Morris-Pratt); q = m (s seen) is absorbing, and
#
#     q_next = table[q, token]   (the token's text fed character by character)
#
# ``table`` is built on the host from each token's text, assuming a decoded
# sequence is its tokens' texts concatenated (byte-level BPE and the local
# tokenizers are; the engine verifies every row it stops this way).


def stop_string_tables(
    token_texts: Sequence[str], stop_strings: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
  """(table int32 [n, M + 1, V], lengths int32 [n]) for n stop strings.

  ``table[j, q, t]`` is the state of string j after token t from state q
  (rows q > len(s_j) are unused padding, M = the longest length).
  """
  if not stop_strings or any(not s for s in stop_strings):
    raise ValueError(f"stop strings must be non-empty: {stop_strings!r}")
  longest = max(len(s) for s in stop_strings)
  tables = [_token_automaton(token_texts, s, longest) for s in stop_strings]
  lengths = np.asarray([len(s) for s in stop_strings], np.int32)
  return np.stack(tables), lengths


def advance_stop_states(
    table: jax.Array,
    lengths: jax.Array,
    states: jax.Array,
    tokens: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """One token per row: (new states [B, n], hit [B]: a stop string is now
  contained in the row's text)."""
  n = table.shape[0]
  new = table[jnp.arange(n)[None, :], states, tokens[:, None]]
  return new, jnp.any(new == lengths[None, :], axis=-1)


def _char_automaton(s: str) -> tuple[dict, np.ndarray]:
  """KMP transitions: (char -> column, delta [m + 1, columns + 1]); the
  last column is every character outside ``s``; state m is absorbing."""
  m = len(s)
  chars = {c: i for i, c in enumerate(dict.fromkeys(s))}
  fail = [0] * m
  k = 0
  for i in range(1, m):
    while k and s[i] != s[k]:
      k = fail[k - 1]
    if s[i] == s[k]:
      k += 1
    fail[i] = k
  delta = np.zeros((m + 1, len(chars) + 1), np.int32)
  for q in range(m + 1):
    for c, col in chars.items():
      if q == m:
        delta[q, col] = m
        continue
      k = q
      while k and s[k] != c:
        k = fail[k - 1]
      delta[q, col] = k + 1 if s[k] == c else 0
  delta[m, -1] = m
  return chars, delta


def _token_automaton(token_texts, s: str, longest: int) -> np.ndarray:
  """[longest + 1, V] token transitions of ``s``'s automaton (vectorised
  over tokens, one character position at a time)."""
  chars, delta = _char_automaton(s)
  m, other = len(s), len(chars)
  vocab = len(token_texts)
  width = max((len(t) for t in token_texts), default=0)
  cols = np.full((vocab, max(width, 1)), -1, np.int32)  # -1: past the end
  for v, text in enumerate(token_texts):
    if text:
      cols[v, : len(text)] = [chars.get(c, other) for c in text]
  state = np.broadcast_to(
      np.arange(m + 1, dtype=np.int32)[:, None], (m + 1, vocab)
  ).copy()
  for j in range(cols.shape[1]):
    c = cols[:, j]
    live = c >= 0
    state[:, live] = delta[state[:, live], c[live][None, :]]
  table = np.zeros((longest + 1, vocab), np.int32)
  table[: m + 1] = state
  return table
