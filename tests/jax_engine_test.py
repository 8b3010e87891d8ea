"""Tests of rollout/sampling.py and rollout/jax_engine.py on a tiny model."""

import dataclasses
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rspo_jax import sharding as shd
from rspo_jax.models.config import get_model_config
from rspo_jax.models.transformer import Transformer, token_logprobs
from rspo_jax.rollout import jax_engine
from rspo_jax.rollout import sampling
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine

sample_token = jax.jit(sampling.sample_token)

CFG = get_model_config(
    "tiny",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
PAD, EOS = 0, 1
# Different lengths (left padding), a duplicate (prefix sharing).
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [5, 6, 7], [20, 21]]


@jax.jit
def _init_state(seed, scale):
  model = Transformer(CFG, rngs=nnx.Rngs(jax.random.key(seed)))
  return jax.tree.map(lambda x: x * scale, nnx.state(model))


def make_model(seed=0, scale=4.0):
  """Random tiny model; weights scaled up so next-token distributions are
  peaked (greedy margins far above float noise). Built under one jit: eager
  init is slow on a busy CPU."""
  graphdef = nnx.graphdef(
      nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0)))
  )
  return nnx.merge(graphdef, _init_state(seed, scale))


def make_engine(model, **kw):
  defaults = dict(
      pad_id=PAD, eos_ids=(), batch_buckets=(4, 8), prompt_buckets=(8, 16)
  )
  return JaxEngine(model, CFG, **(defaults | kw))


@pytest.fixture(scope="module")
def model():
  return make_model()


@pytest.fixture(scope="module")
def engine(model):
  return make_engine(model)


_REF_LEN = 32


@nnx.jit
def _forward(model, tokens, mask):
  positions = jnp.cumsum(mask, axis=1) - 1
  logits, _, _ = model(tokens, positions, mask)
  return logits, token_logprobs(logits, tokens)


def full_forward(model, prompt, generated):
  """(logits [T, V], token_logprobs [T]) of prompt + generated, unpadded
  (right-padded to a fixed length inside, so it compiles once)."""
  ids = list(prompt) + list(generated)
  t = len(ids)
  tokens = np.full((1, _REF_LEN), PAD, np.int32)
  tokens[0, :t] = ids
  mask = np.arange(_REF_LEN)[None] < t
  logits, lp = _forward(model, jnp.asarray(tokens), jnp.asarray(mask))
  return np.asarray(logits[0, :t]), np.asarray(lp[0, :t])


# ------------------------------------------------------------ sampling.py


def test_top_p_filter_keeps_hand_computed_nucleus():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  # Mass strictly before each token: 0, .5, .8, .95.
  for top_p, kept in ((0.4, 1), (0.7, 2), (0.9, 3), (1.0, 4)):
    out = np.asarray(sampling.top_p_filter(logits, top_p))[0]
    assert np.isfinite(out).tolist() == [True] * kept + [False] * (4 - kept)
    np.testing.assert_allclose(out[:kept], np.asarray(logits)[0, :kept])


def test_sample_token_greedy_topp_and_frequencies():
  probs = np.asarray([0.5, 0.3, 0.15, 0.05])
  logits = jnp.log(jnp.tile(probs, (4000, 1)))
  key = jax.random.key(0)
  greedy = sample_token(logits, key, 0.0)
  assert np.all(np.asarray(greedy) == 0)
  narrow = sample_token(logits, key, 1.0, top_p=0.4)
  assert np.all(np.asarray(narrow) == 0)
  drawn = np.asarray(sample_token(logits, key, 1.0))
  freq = np.bincount(drawn, minlength=4) / drawn.size
  np.testing.assert_allclose(freq, probs, atol=0.03)
  # T = 0.5 squares the odds: p^2 / sum p^2.
  drawn = np.asarray(sample_token(logits, key, 0.5))
  freq = np.bincount(drawn, minlength=4) / drawn.size
  np.testing.assert_allclose(freq, probs**2 / np.sum(probs**2), atol=0.03)


def test_sample_token_row_keys_are_independent_of_the_batch():
  logits = jax.random.normal(jax.random.key(1), (6, 50))
  keys = jax.random.split(jax.random.key(2), 6)
  full = np.asarray(sample_token(logits, keys, 1.0))
  part = np.asarray(sample_token(logits[2:4], keys[2:4], 1.0))
  np.testing.assert_array_equal(full[2:4], part)
  with pytest.raises(ValueError, match="3 row keys"):
    sample_token(logits, keys[:3], 1.0)


def test_token_logprob_is_untempered_log_softmax():
  logits = jnp.asarray([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
  lp = np.asarray(sampling.token_logprob(logits, jnp.asarray([2, 1])))
  expected = [3.0 - np.log(np.exp(1) + np.exp(2) + np.exp(3)), -np.log(3)]
  np.testing.assert_allclose(lp, expected, rtol=1e-6)


# ---------------------------------------------------------- jax_engine.py


def test_greedy_equals_full_forward_argmax_and_logprobs(model, engine):
  res = engine.generate(
      PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12)
  )
  assert len(res) == len(PROMPTS)
  for prompt, r in zip(PROMPTS, res):
    assert r.finish_reason == "length" and len(r.token_ids) == 12
    logits, lp = full_forward(model, prompt, r.token_ids)
    p = len(prompt)
    np.testing.assert_array_equal(
        np.argmax(logits[p - 1 : -1], axis=-1), r.token_ids
    )
    np.testing.assert_allclose(r.logprobs, lp[p:], atol=1e-4)
  assert len(set(res[1].token_ids.tolist())) > 1  # not a degenerate model


def test_sampled_logprobs_are_untempered(model, engine):
  params = SamplingParams(temperature=0.7, max_new_tokens=10, seed=3)
  for prompt, r in zip(PROMPTS, engine.generate(PROMPTS, params)):
    logits, lp = full_forward(model, prompt, r.token_ids)
    p = len(prompt)
    np.testing.assert_allclose(r.logprobs, lp[p:], atol=1e-4)
    tempered = np.asarray(jax.nn.log_softmax(logits[p - 1 : -1] / 0.7))
    tempered = tempered[np.arange(len(r.token_ids)), r.token_ids]
    assert np.max(np.abs(tempered - r.logprobs)) > 1e-2


def test_stop_token_and_length(model, engine):
  base = SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
  ref = engine.generate(PROMPTS, base)
  toks = ref[1].token_ids.tolist()
  k = next(i for i in range(2, 16) if toks[i] not in toks[:i])
  stop = SamplingParams(
      temperature=1.0, max_new_tokens=16, seed=5, stop_token_ids=(toks[k],)
  )
  out = engine.generate(PROMPTS, stop)
  assert out[1].finish_reason == "stop"
  np.testing.assert_array_equal(out[1].token_ids, toks[: k + 1])
  np.testing.assert_array_equal(out[1].logprobs, ref[1].logprobs[: k + 1])
  for r_ref, r in zip(ref, out):  # every row cut at its first stop, if any
    hits = np.flatnonzero(r_ref.token_ids == toks[k])
    n = hits[0] + 1 if hits.size else 16
    np.testing.assert_array_equal(r.token_ids, r_ref.token_ids[:n])
    assert r.finish_reason == ("stop" if hits.size else "length")
  # Engine-level eos ids act the same way.
  eos_engine = make_engine(model, eos_ids=(toks[k],))
  np.testing.assert_array_equal(
      eos_engine.generate(PROMPTS, base)[1].token_ids, toks[: k + 1]
  )
  short = engine.generate(
      PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=5, seed=5)
  )
  for r_ref, r in zip(ref, short):
    assert r.finish_reason == "length"
    np.testing.assert_array_equal(r.token_ids, r_ref.token_ids[:5])


def test_shapes_inside_buckets_compile_once(model):
  # Buckets no other test uses, so the first call must trace.
  eng = make_engine(model, batch_buckets=(2, 4), prompt_buckets=(6, 12))
  t0 = jax_engine.trace_count()
  eng.generate([[3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=5))
  assert eng.num_compilations == 2  # one prefill, one decode
  assert jax_engine.trace_count() == t0 + 2
  eng.generate(
      [[7] * 6, [8, 9]],
      SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=9, seed=1),
  )
  assert eng.num_compilations == 2
  assert jax_engine.trace_count() == t0 + 2
  eng.generate([[7] * 7], SamplingParams(max_new_tokens=5))  # bucket 12
  assert eng.num_compilations == 4
  assert jax_engine.trace_count() == t0 + 4
  # A second engine of the same model structure reuses the compiled code.
  other = make_engine(
      make_model(seed=2),
      batch_buckets=(2, 4),
      prompt_buckets=(6, 12),
      eos_ids=(EOS,),
  )
  other.generate([[3, 4]], SamplingParams(max_new_tokens=3))
  assert other.num_compilations == 2
  assert jax_engine.trace_count() == t0 + 4


@pytest.mark.parametrize(
    "prompts,gathered",
    [
        # 2 unique of 4 rows: prefilled once each, gathered to the 4 rows.
        ([[5, 6, 7], [9, 10], [5, 6, 7], [9, 10]], True),
        # 3 unique: the same batch bucket, so prefilled in place (no gather).
        ([[5, 6, 7], [9, 10], [5, 6, 7], [11]], False),
    ],
)
def test_prefix_sharing_equals_no_sharing(model, prompts, gathered):
  params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
  engine = make_engine(model, batch_buckets=(2, 4, 8))
  shared = engine.generate(prompts, params)
  (key,) = [k for k in engine._shape_keys if k[0] == "prefill"]
  assert (key[1], key[2], key[-1]) == (
      (2, 4, False) if gathered else (4, 4, True)
  )
  plain = make_engine(
      model, batch_buckets=(2, 4, 8), prefix_sharing=False
  ).generate(prompts, params)
  for a, b in zip(shared, plain):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
  # Members of a group draw different samples (row-indexed keys).
  assert shared[0].token_ids.tolist() != shared[2].token_ids.tolist()


def test_rows_per_call_by_hand():
  b = jax_engine.BATCH_BUCKETS
  assert jax_engine.rows_per_call(b) == 256
  assert jax_engine.rows_per_call(b, group_rows=8) == 8
  assert jax_engine.rows_per_call(b, max_rows=64) == 64
  # Rounded down to a batch bucket: 48 rows would pad to 64.
  assert jax_engine.rows_per_call(b, max_rows=48) == 32
  assert jax_engine.rows_per_call(b, group_rows=8, max_rows=4) == 4
  assert jax_engine.rows_per_call((4, 8), max_rows=3) == 4  # smallest
  with pytest.raises(ValueError, match="max_rows must be >= 0"):
    make_engine(make_model(), max_rows=-1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_row_cap_gives_the_same_tokens_and_logprobs(model, temperature):
  """``max_rows`` splits a batch into calls of fewer rows: each row keeps
  its rng stream (its index in the request), so the tokens are the same
  and the log-probs equal within float rounding (matmuls over fewer
  rows). 8 prompts with repeats (a prefill of the distinct ones,
  gathered) and without."""
  prompts = VARIED + [[5, 6, 7], [44, 45, 46, 47]]
  params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=5)
  kw = dict(batch_buckets=(1, 2, 4, 8), length_group_rows=0, prefill_chunk=0)
  whole = make_engine(model, **kw)
  capped = make_engine(model, max_rows=3, **kw)  # calls of 2 rows
  for batch in (prompts, [[i + 3, i + 4, 2 * i + 5] for i in range(8)]):
    want, got = whole.generate(batch, params), capped.generate(batch, params)
    for a, b in zip(want, got):
      np.testing.assert_array_equal(a.token_ids, b.token_ids)
      np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
      assert a.finish_reason == b.finish_reason
  assert {k[2] for k in whole._shape_keys if k[0] == "prefill"} == {8}
  assert {k[2] for k in capped._shape_keys if k[0] == "prefill"} == {2}
  assert len({tuple(r.token_ids.tolist()) for r in got}) > 4


def test_prefix_width_by_hand():
  """cost(W) = shards * bucket(distinct W-prefixes) * W + Bu (pb - 1 - W)
  over W = 4, 8 (the grain times powers of 2 below the shortest prompt),
  here pb = 16, base Bu * 15."""
  a = list(range(1, 11)) + [20, 21]  # a, e, b share 10 tokens, c only 6
  e = list(range(1, 11)) + [25]
  b = list(range(1, 11)) + [30]
  c = list(range(1, 7)) + [40, 41, 42, 43, 44]
  width = lambda rows, shards=1, min_len=10: jax_engine.prefix_width(
      rows, min_len, shards, 4, (1, 2, 4, 8), 16
  )
  # W=4: 1 prefix -> 4 + 4 * 11 = 48; W=8: 2 -> 2 * 8 + 4 * 7 = 44 (< 60).
  assert width([a, e, b, c]) == 8
  assert width([a, e, b, c], min_len=8) == 4  # W <= min_len - 1
  # Two shards [a, e] | [b, c]: W=4: 2 * 1 * 4 + 44 = 52; W=8: 2 * 2 * 8
  # + 28 = 60.
  assert width([a, e, b, c], shards=2) == 4
  # Nothing shared: W=4: 4 prefixes -> 4 * 4 + 44 = 60, not < 60.
  d = [50 + i for i in range(10)]
  f = [60 + i for i in range(10)]
  assert width([a, c, d, f]) == 0
  assert width([a, e, b, c], min_len=4) == 0  # no W below the shortest
  # A dummy ([pad], shorter than every prompt) adds no prefix; its prefix
  # row is its shard's first prompt's.
  assert width([a, [0]], min_len=12) == 8  # 1 * 8 + 2 * 7 = 22 < 30
  assert jax_engine._prefix_rows([a, [0], [0], [0]], 2, 8) == [a[:8]] * 4
  tokens, positions, mask = jax_engine._layout([e, [0]], 16, 0, head=8)
  np.testing.assert_array_equal(tokens[0], e[:8] + [0] * 5 + e[8:])
  np.testing.assert_array_equal(
      positions[0], list(range(8)) + [0] * 5 + [8, 9, 10]
  )
  np.testing.assert_array_equal(mask[0], [1] * 8 + [0] * 5 + [1] * 3)
  np.testing.assert_array_equal(tokens[1], [0] * 16)
  np.testing.assert_array_equal(mask[1], [0] * 15 + [1])


# A group's prompts at a later turn: a common head, different histories.
HEAD = list(range(30, 52))  # 22 tokens
GROUPED = [HEAD + [60 + r] * (1 + r % 4) for r in range(6)] + [
    list(range(70, 81)),
    HEAD[:5] + [90, 91],
]


@pytest.mark.parametrize("chunk", [4, 0])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_blocks_equal_the_plain_prefill(
    model, monkeypatch, chunk, temperature
):
  """Prefilling the shared head once (blocks of 4, or one pass with a
  grain of 8) gives the tokens and log-probs of the plain left-padded
  prefill, for rows that share it and rows that do not, and prefills the
  columns ``prefix_width`` counts."""
  monkeypatch.setattr(jax_engine, "PREFIX_GRAIN", 8)
  params = SamplingParams(temperature=temperature, max_new_tokens=10, seed=5)
  kw = dict(prompt_buckets=(32,), prefill_chunk=chunk, length_group_rows=0)
  shared = make_engine(model, shared_prefix_prefill=True, **kw)
  plain = make_engine(model, **kw)  # the default: off
  # 8 rows, pb 32: 8 * 31 = 248 columns plain. Shortest prompt 7: W = 4
  # with blocks of 4 (2 distinct heads, bucket 4: 4 * 4 + 8 * 27 = 232),
  # none with a grain of 8. Without the 7-token row (shortest 11): W = 8
  # (4 * 8 + 8 * 23 = 216) either way.
  expected = {4: (232, 216), 0: (248, 216)}[chunk]
  for prompts, columns in zip((GROUPED, GROUPED[:7]), expected):
    before = shared.prefill_columns
    got, ref = shared.generate(prompts, params), plain.generate(prompts, params)
    for a, b in zip(got, ref):  # sums in another order: rounding only
      np.testing.assert_array_equal(a.token_ids, b.token_ids)
      np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    done, without = np.subtract(shared.prefill_columns, before)
    assert (done, without) == (columns, 248)
  assert plain.prefill_columns == (496, 496)


def test_shared_prefix_blocks_on_a_mesh_match_one_device(model):
  """Rows split 4 ways on (2, 2, 2), two a shard: each row shard prefills
  its own prefix; same tokens and log-probs as one plain device."""
  mesh = shd.make_mesh((2, 2, 2))
  kw = dict(
      prompt_buckets=(32,),
      prefill_chunk=4,
      length_group_rows=0,
      batch_buckets=(1, 2, 4, 8),
  )
  params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
  prompts = GROUPED[:6] + [HEAD + [99], HEAD + [98, 98]]
  sharded = make_engine(model, mesh=mesh, shared_prefix_prefill=True, **kw)
  got = sharded.generate(prompts, params)
  ref = make_engine(model, **kw).generate(prompts, params)
  for a, b in zip(got, ref):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
  # W = 16 (4 x 2^k below the shortest, 23): 4 shards x 1 prefix x 16
  # + 8 x 15 = 184 of 248.
  assert sharded.prefill_columns == (184, 248)


def test_seed_determinism(engine):
  params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=42)
  a = engine.generate(PROMPTS, params)
  b = engine.generate(PROMPTS, params)
  c = engine.generate(
      PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=16, seed=43)
  )
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x.token_ids, y.token_ids)
    np.testing.assert_array_equal(x.logprobs, y.logprobs)
  assert any(x.token_ids.tolist() != z.token_ids.tolist() for x, z in zip(a, c))


def test_batches_beyond_largest_bucket_are_chunked(model, engine):
  prompts = [[i + 2, i + 3] for i in range(6)]
  params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
  whole = engine.generate(prompts, params)
  chunked = make_engine(model, batch_buckets=(4,)).generate(prompts, params)
  for a, b in zip(whole, chunked):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_stop_strings_cut_after_the_completing_token(model):
  decode = lambda ids: "".join(chr(0x100 + int(i)) for i in ids)
  eng = make_engine(model, decode_fn=decode)
  base = SamplingParams(temperature=1.0, max_new_tokens=16, seed=9)
  toks = eng.generate(PROMPTS[:1], base)[0].token_ids.tolist()
  k = next(i for i in range(3, 15) if toks[i] not in toks[:i])
  pair = decode(toks[k : k + 2])  # two-token stop string ends at k + 1
  out = eng.generate(
      PROMPTS[:1],
      SamplingParams(
          temperature=1.0, max_new_tokens=16, seed=9, stop_strings=("zz", pair)
      ),
  )
  assert out[0].finish_reason == "stop"
  np.testing.assert_array_equal(out[0].token_ids, toks[: k + 2])
  assert len(out[0].logprobs) == k + 2
  with pytest.raises(ValueError, match="decode_fn"):
    make_engine(model).generate(PROMPTS, SamplingParams(stop_strings=("x",)))


def test_update_weights(model):
  eng = make_engine(model)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
  before = eng.generate(PROMPTS, greedy)
  other = make_model(seed=1)
  eng.update_weights(nnx.state(other, nnx.Param), version=3)
  assert eng.weight_version == 3
  nnx.update(other, jax.tree.map(jnp.zeros_like, nnx.state(other)))
  other = make_model(seed=1)  # the engine holds a snapshot, not `other`
  after = eng.generate(PROMPTS, greedy)
  fresh = make_engine(other).generate(PROMPTS, greedy)
  for a, f in zip(after, fresh):
    np.testing.assert_array_equal(a.token_ids, f.token_ids)
  assert any(
      a.token_ids.tolist() != b.token_ids.tolist()
      for a, b in zip(after, before)
  )
  assert eng.num_compilations == 2
  wrong = nnx.state(other, nnx.Param)
  wrong["embedding"].set_value(jnp.zeros((CFG.vocab_size + 1, 64)))
  with pytest.raises(ValueError, match="embedding has shape"):
    eng.update_weights(wrong, version=4)
  assert eng.weight_version == 3


def test_engine_owns_its_buffers(model, engine):
  """The trainer donates (deletes) its param buffers at every step."""
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  ref = engine.generate(PROMPTS, greedy)
  copy_state = jax.jit(lambda s: jax.tree.map(jnp.copy, s))
  donor = nnx.merge(nnx.graphdef(model), copy_state(nnx.state(model)))
  eng = make_engine(donor)
  params = copy_state(nnx.state(model, nnx.Param))
  eng.update_weights(params, version=1)
  for leaf in jax.tree.leaves(nnx.state(donor)) + jax.tree.leaves(params):
    leaf.delete()
  for a, b in zip(ref, eng.generate(PROMPTS, greedy)):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)


@pytest.mark.parametrize("mesh_shape", [None, (1, 4, 2)], ids=str)
def test_update_weights_frees_the_old_weights_before_placing_the_new(
    model, monkeypatch, mesh_shape
):
  """A sync holds one engine copy at a time: every old weight is freed
  before the first new one is placed (before: old, given and placed copies
  at once, up to 3x the engine's weights a device). After a refused update
  the old weights still serve."""
  mesh = None if mesh_shape is None else shd.make_mesh(mesh_shape)
  eng = make_engine(model, mesh=mesh)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  wrong = nnx.state(make_model(seed=1), nnx.Param)
  wrong["embedding"].set_value(jnp.zeros((CFG.vocab_size + 1, 64)))
  with pytest.raises(ValueError, match="embedding has shape"):
    eng.update_weights(wrong, version=4)
  ref = eng.generate(PROMPTS, greedy)
  for a, b in zip(ref, make_engine(model).generate(PROMPTS, greedy)):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)

  old = [weakref.ref(x) for x in jax.tree.leaves(eng._params)]  # pylint: disable=protected-access
  seen = []
  place = jax_engine._own_copy  # pylint: disable=protected-access

  def spy(new, dtype, sharding):
    seen.append(all(ref() is None for ref in old))
    return place(new, dtype, sharding)

  monkeypatch.setattr(jax_engine, "_own_copy", spy)
  other = make_model(seed=1)
  eng.update_weights(nnx.state(other, nnx.Param), version=5)
  assert len(seen) == len(old) and all(seen)
  for a, b in zip(
      eng.generate(PROMPTS, greedy),
      make_engine(other).generate(PROMPTS, greedy),
  ):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_update_weights_from_hf_dir(model, tmp_path):
  from rspo_jax.models import hf_io

  eng = make_engine(model)
  other = make_model(seed=4)
  hf_io.save_hf_model(other, CFG, str(tmp_path / "ckpt"))
  eng.update_weights(str(tmp_path / "ckpt"), version=7)
  assert eng.weight_version == 7
  greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
  for prompt, r in zip(PROMPTS, eng.generate(PROMPTS, greedy)):
    logits, _ = full_forward(other, prompt, r.token_ids)
    np.testing.assert_array_equal(
        np.argmax(logits[len(prompt) - 1 : -1], axis=-1), r.token_ids
    )
  with pytest.raises(ValueError, match="missing"):
    eng.update_weights(str(tmp_path / "nowhere"), version=8)
  assert eng.weight_version == 7


def test_accepts_split_model_tuples(model, engine):
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  ref = engine.generate(PROMPTS, greedy)
  for parts in (nnx.split(model), nnx.split(model, nnx.Param, ...)):
    out = make_engine(parts).generate(PROMPTS, greedy)
    for a, b in zip(ref, out):
      np.testing.assert_array_equal(a.token_ids, b.token_ids)
  with pytest.raises(ValueError, match="nnx.Module"):
    make_engine([model])


def test_bad_inputs_raise(engine):
  p = SamplingParams()
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    engine.generate([[3], []], p)
  with pytest.raises(ValueError, match="outside"):
    engine.generate([[3, 500]], p)
  with pytest.raises(ValueError, match="largest prompt bucket"):
    engine.generate([[3] * 17], p)
  with pytest.raises(ValueError, match="top_p"):  # SamplingParams checks
    engine.generate([[3]], SamplingParams(top_p=0.0))
  with pytest.raises(ValueError, match="max_new_tokens"):
    engine.generate([[3]], SamplingParams(max_new_tokens=-1))
  (empty,) = engine.generate([[3]], SamplingParams(max_new_tokens=0))
  assert len(empty.token_ids) == len(empty.logprobs) == 0
  assert empty.finish_reason == "length"
  with pytest.raises(ValueError, match="stop_token_ids"):
    engine.generate([[3]], SamplingParams(stop_token_ids=(128,)))
  assert engine.generate([], p) == []


def test_mesh_matches_single_device(model, engine):
  assert len(jax.devices()) == 8
  mesh = shd.make_mesh((2, 2, 2))
  sharded = make_engine(model, mesh=mesh, batch_buckets=(8,))
  params = SamplingParams(temperature=0.0, max_new_tokens=12)
  ref = engine.generate(PROMPTS, params)
  out = sharded.generate(PROMPTS, params)
  for a, b in zip(ref, out):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
  emb = sharded._params["embedding"].get_value()
  # Weights split over 'tensor' only: whole on each row shard.
  assert (
      emb.sharding.spec
      == shd.logical_to_mesh_spec(
          ("vocab", "embed"), shd.inference_rules(shd.DEFAULT_RULES)
      )
      == P("tensor", None)
  )


# ------------------------------------- stop strings, length groups, blocks


def test_stop_string_automaton_by_hand():
  # "aab": state q = longest suffix of the text that is a prefix of "aab".
  texts = ["a", "b", "ab", "x", "aab", ""]
  table, lengths = sampling.stop_string_tables(texts, ("aab",))
  assert lengths.tolist() == [3]
  np.testing.assert_array_equal(
      table[0],
      [
          [1, 0, 0, 0, 3, 0],  # from "": a -> "a", aab -> seen
          [2, 0, 3, 0, 3, 1],  # from "a": a -> "aa", ab -> "aab"
          [2, 3, 3, 0, 3, 2],  # from "aa": a -> "aaa" ends in "aa", b -> seen
          [3, 3, 3, 3, 3, 3],  # seen: absorbing
      ],
  )
  rng = np.random.default_rng(0)
  stops = ("aab", "ba", "xa")
  table, lengths = sampling.stop_string_tables(texts, stops)
  for _ in range(300):  # first hit == first prefix whose text contains one
    seq = rng.integers(0, len(texts), size=rng.integers(1, 9))
    states, hit = np.zeros(3, np.int32), None
    for k, t in enumerate(seq):
      states = table[np.arange(3), states, t]
      if hit is None and np.any(states == lengths):
        hit = k
    text_hits = [
        k
        for k in range(len(seq))
        if any(s in "".join(texts[t] for t in seq[: k + 1]) for s in stops)
    ]
    assert hit == (text_hits[0] if text_hits else None)


def _chars(ids):
  return "".join(chr(0x100 + int(i)) for i in ids)


# Lengths spread over both prompt buckets (8, 16), so length groups of 2
# rows pad to different buckets; prefill blocks of 3 columns.
VARIED = [
    [5, 6, 7],
    [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
    [20, 21],
    [5, 6, 7],
    [30, 31, 32, 33, 34, 35, 36],
    [40],
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grouped_blocked_engine_equals_full_forward_sampling(
    model, temperature
):
  """Token i of row r is sample_token(full-forward logits, key
  fold_in(fold_in(key(seed), r), i)); the log-prob is the untempered
  full-forward one; and the old path (no length groups, one prefill pass)
  gives the same tokens and log-probs."""
  params = SamplingParams(temperature=temperature, max_new_tokens=10, seed=7)
  new = make_engine(model, length_group_rows=2, prefill_chunk=3)
  old = make_engine(model, length_group_rows=0, prefill_chunk=0)
  got, ref = new.generate(VARIED, params), old.generate(VARIED, params)
  for row, (prompt, r) in enumerate(zip(VARIED, got)):
    row_key = jax.random.fold_in(jax.random.key(7), row)
    p = len(prompt)
    logits, lp = full_forward(model, prompt, r.token_ids)
    for i, t in enumerate(r.token_ids):
      key = jax.random.fold_in(row_key, i)[None]
      want = sample_token(logits[p - 1 + i][None], key, temperature)
      assert int(want[0]) == int(t), (row, i)
    np.testing.assert_allclose(r.logprobs, lp[p:], atol=1e-4)
    np.testing.assert_array_equal(r.token_ids, ref[row].token_ids)
    np.testing.assert_allclose(
        r.logprobs, ref[row].logprobs, rtol=1e-5, atol=1e-5
    )
  assert len({tuple(r.token_ids.tolist()) for r in got}) > 3


def test_stop_strings_end_rows_inside_the_decode_loop(model):
  """Each row's stop string is the text of its own third token: rows come
  back cut after it (what the host cut gave before), the loop runs 3 steps,
  not 16, and no row needs the host cut."""
  eng = make_engine(model, decode_fn=_chars)
  base = SamplingParams(temperature=0.0, max_new_tokens=16)
  full = eng.generate(VARIED, base)
  stops = tuple(sorted({_chars(r.token_ids[2:3]) for r in full}))
  want = []
  for r in full:  # the first token whose prefix text holds a stop string
    toks = r.token_ids.tolist()
    k = next(
        k for k in range(16) if any(s in _chars(toks[: k + 1]) for s in stops)
    )
    want.append(toks[: k + 1])
  cuts = []
  eng._cut_at_stop_string = lambda r, s: cuts.append(r) or r
  steps = eng.decode_steps
  out = eng.generate(VARIED, dataclasses.replace(base, stop_strings=stops))
  for r, w in zip(out, want):
    assert r.finish_reason == "stop"
    np.testing.assert_array_equal(r.token_ids, w)
  assert max(len(w) for w in want) <= 3
  # Length groups of 8 rows on CPU: one chunk, one loop of 3 steps.
  assert eng.decode_steps - steps == max(len(w) for w in want)
  assert cuts == []


def test_stop_strings_fall_back_when_texts_do_not_concatenate(model):
  """decode_fn joins tokens with '-': a stop string made of two tokens'
  texts is never in a decoded text; the automaton, built from single-token
  texts, would stop there. The engine notices, regenerates with host-side
  cutting, and keeps it so."""
  dashed = lambda ids: "-".join(chr(0x100 + int(i)) for i in ids)
  eng = make_engine(model, decode_fn=dashed)
  params = SamplingParams(temperature=0.0, max_new_tokens=12)
  ref = eng.generate(VARIED, params)
  toks = ref[0].token_ids.tolist()
  stop = _chars(toks[1:3])  # the concatenation of tokens 1 and 2
  out = eng.generate(VARIED, dataclasses.replace(params, stop_strings=(stop,)))
  for r, w in zip(out, ref):
    np.testing.assert_array_equal(r.token_ids, w.token_ids)
    assert r.finish_reason == "length"
  assert not eng._stop_in_loop
