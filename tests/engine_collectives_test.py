"""What the in-process engine's decode loop communicates, per token, on a mesh.

The engine holds its weights whole on every row shard
(``sharding.inference_rules``) and runs its activations by the same rules
(``jax_engine._with_activation_rules``), so a decode step needs no weight
gather and no activation exchange. Counted in the optimised HLO of the
``_decode`` program a real ``generate`` call runs on the 8 fake CPU devices
(the arguments are captured, then lowered again as shapes):

  * per token = collectives in the computations the decode ``while`` loop's
    body and condition reach;
  * data x fsdp meshes (1, 8, 1) and (2, 4, 1): one per token, the
    condition's all-reduce of "every row done" (a scalar), and none in the
    prefill;
  * a tensor axis (1, 4, 2): the Megatron pattern, the partial sums of the
    attention output and the MLP output all-reduced in each of the L layers
    (2 L of [rows / (data fsdp), 1, D]), plus a few [rows]-sized exchanges of
    the vocabulary-split logits for sampling (a bound, not a count: XLA's
    choice);
  * no all-gather of a parameter's shape: with a tensor axis the embedding
    is looked up vocabulary-parallel (one more all-reduce of [rows, 1, D] a
    token) instead of gathering the table once per call.

With the learner's FSDP rules for its activations, as before, the engine
ran 3 collectives per token on (1, 8, 1) (the condition, the rows' token
ids all-gathered, the embedding vectors exchanged all-to-all), gathered the
whole tied embedding once per call, and on (1, 4, 2) also gathered weights.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from flax import nnx

from rspo_jax import sharding as shd
from rspo_jax.models.config import get_model_config
from rspo_jax.models.transformer import Transformer
from rspo_jax.rollout import jax_engine
from rspo_jax.rollout.engine import SamplingParams
from rspo_jax.rollout.jax_engine import JaxEngine

CFG = get_model_config(
    "qwen2.5-1.5b",
    num_layers=2,
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    dtype="float32",
    param_dtype="float32",
)
ROWS = 16
PROMPTS = [
    [3 + (7 * r + i) % 500 for i in range(5 + r % 4)] for r in range(ROWS)
]
_OPS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
_OP = re.compile(r"=\s*(.+?)\s+(%s)(?:-start)?\(" % "|".join(_OPS))


def computations(hlo: str) -> dict:
  """name -> body text of each computation in an HLO module's text."""
  out, name, lines = {}, None, []
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
    if head and not line.startswith(" "):
      name, lines = head.group(1), []
    elif line.startswith("}") and name:
      out[name] = "\n".join(lines)
      name = None
    elif name:
      lines.append(line)
  return out


def reached(comps: dict, roots) -> set:
  """The computations ``roots`` call, transitively (themselves included)."""
  seen, todo = set(), list(roots)
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    todo += re.findall(
        r"(?:calls|to_apply|body|condition|branch_computations)="
        r"\{?%?([\w.\-]+)",
        comps[c],
    )
  return seen


def collectives(text: str) -> list[tuple[str, str]]:
  """(op, result shape) of each collective in ``text``."""
  return [(op, shape) for shape, op in _OP.findall(text)]


def _shape_of(x):
  """``x`` as a shape, with its placement when committed to one."""
  sharding = x.sharding if x.committed else None
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def engine_hlo(
    mesh_shape, fn: str = "_decode", prompts=PROMPTS, **engine_kw
) -> str:
  """Optimised HLO of the engine's ``fn`` (``_decode``, ``_prefill``) as a
  ``generate`` call of ``prompts`` on ``mesh_shape`` runs it."""
  model = Transformer(CFG, rngs=nnx.Rngs(0))
  kw = dict(batch_buckets=(ROWS,), prompt_buckets=(16,), length_group_rows=0)
  engine = JaxEngine(
      model,
      CFG,
      mesh=shd.make_mesh(mesh_shape),
      pad_id=0,
      eos_ids=(1,),
      **(kw | engine_kw),
  )
  seen = []
  run = getattr(jax_engine, fn)

  def spy(*args, **kw):
    seen.append((jax.tree.map(_shape_of, args), kw))
    return run(*args, **kw)

  setattr(jax_engine, fn, spy)
  try:
    engine.generate(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    )
  finally:
    setattr(jax_engine, fn, run)
  ((args, kw),) = seen
  if fn == "_prefill":  # its 7th argument: the shared prefix blocks or None
    engine_hlo.shared_prefix = len(args) > 6 and args[6] is not None
  return run.lower(*args, **kw).compile().as_text()


decode_hlo = engine_hlo


def per_token_and_all(hlo: str):
  comps = computations(hlo)
  loops = re.findall(r"while\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)", hlo)
  # The decode loop: the one whose body runs the model (a dot).
  decode = [
      (c, b)
      for c, b in loops
      if any(
          " dot(" in comps[x]
          or "dot_general" in comps[x]
          or "__onednn$matmul" in comps[x]
          for x in reached(comps, [b])
      )
  ]
  assert len(decode) == 1, loops
  step = reached(comps, decode[0])
  per_token = [c for name in step for c in collectives(comps[name])]
  return per_token, collectives(hlo)


def dims(shape: str) -> list[int]:
  """[4, 2] of 'f32[4,2]{0,1}' (a tuple shape: its first element's)."""
  inside = re.search(r"\[([\d,]*)\]", shape).group(1)
  return [int(d) for d in inside.split(",") if d]


def param_shapes() -> set:
  """Shapes ((a, b), ...) of every parameter, whole."""
  state = nnx.state(nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0))))
  return {tuple(x.shape) for x in jax.tree.leaves(state)}


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 4, 1)], ids=str)
def test_data_parallel_decode_has_one_collective_per_token(mesh_shape):
  """Whole weights on every row shard: the only collective of the program
  is the loop condition's, once per token."""
  assert len(jax.devices()) == 8
  per_token, everywhere = per_token_and_all(decode_hlo(mesh_shape))
  assert per_token == [("all-reduce", "pred[]")], per_token
  assert everywhere == per_token, everywhere
  # The prefill (unique prompts, then each row shard's own decode rows):
  # none at all.
  assert collectives(engine_hlo(mesh_shape, "_prefill")) == []
  # With shared prefix blocks (4 groups of 4 rows, 8 common tokens): the
  # prefixes reach their prompts, and those their rows, on each device.
  grouped = [
      [3 + g] * 8 + [100 + r] * (1 + r % 3) for g in range(4) for r in range(4)
  ]
  prefill = engine_hlo(
      mesh_shape,
      "_prefill",
      grouped,
      prefill_chunk=4,
      batch_buckets=(1, 2, 4, ROWS),
      shared_prefix_prefill=True,
  )
  assert engine_hlo.shared_prefix
  assert collectives(prefill) == []


def test_tensor_parallel_decode_all_reduces_two_per_layer():
  """(1, 4, 2): per token, the 2 L all-reduces of [rows_local, 1, D]
  partial sums and one more of the vocabulary-parallel embedding lookup
  (each 'tensor' shard looks up the tokens in its half of the table), a
  few exchanges of [rows_local, k] sampling statistics (none of the logits'
  width V / 2) and the loop condition; no gather of any parameter, the
  embedding table included, in the decode program or the prefill's."""
  per_token, everywhere = per_token_and_all(decode_hlo((1, 4, 2)))
  rows_local = ROWS // 4
  layer = [
      (op, s)
      for op, s in per_token
      if op == "all-reduce" and dims(s) == [rows_local, 1, CFG.hidden_size]
  ]
  assert len(layer) == 2 * CFG.num_layers + 1, per_token
  rest = [(op, s) for op, s in per_token if (op, s) not in layer]
  assert ("all-reduce", "pred[]") in rest
  assert len(rest) <= 8, rest
  for _, shape in rest:
    assert np.prod(dims(shape)) < rows_local * CFG.vocab_size // 2, rest
  whole = param_shapes()
  prefill = collectives(engine_hlo((1, 4, 2), "_prefill"))
  for op, s in everywhere + prefill:
    assert not (op == "all-gather" and tuple(dims(s)) in whole), (op, s)
    # Nothing the table's size moves at all (V x D / 2 = 64 k elements).
    assert np.prod(dims(s)) < CFG.vocab_size * CFG.hidden_size // 2, (op, s)
