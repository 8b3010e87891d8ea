"""Programs compiled, never run: what they hold and what they communicate.

The train step, the log-prob pass and the rollout engine's prefill and
decode are lowered from abstract inputs (``jax.ShapeDtypeStruct`` with
shardings: no parameter is allocated) and compiled for a mesh; then

  * ``memory(c)`` reads XLA's buffer assignment (``memory_analysis()``),
    per device, in bytes:

        peak = arguments + outputs - aliased + temporaries

    (donated inputs alias their outputs, e.g. the train state);
  * ``collectives(hlo)`` lists the (kind, shape) of every all-gather,
    all-reduce and reduce-scatter in the optimised, partitioned HLO, and
    ``activation_collectives`` those of arrays that are not a parameter
    (nor a shard of one) with ``bound`` elements or more, bar
    tensor-parallel partial sums;
  * ``reductions(hlo, mesh_shape)`` each all-reduce / reduce-scatter with
    its dtypes, the mesh axes its device groups span and how often it runs
    (loop trip counts); ``compile_train_step(..., partitioned=True)`` also
    keeps the HLO right after SPMD partitioning, where each reduction still
    has its own dtype (XLA:CPU widens bfloat16 ones later).

Used by ``tests/hlo_sharding_test.py`` (collectives, temporaries),
``tests/plan_test.py`` (the memory plan against ``memory``) and
``bench/device.py`` (activation-sized collectives of the paper step).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from rspo_jax import sharding as shd
from rspo_jax import train_step as ts
from rspo_jax.models import transformer as tfm
from rspo_jax.models.transformer import Transformer
from rspo_jax.rollout import jax_engine
from rspo_jax.types import Batch

RULES = shd.DEFAULT_RULES

# ------------------------------------------------------------ HLO reading

_DEF = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s" r"([a-z][\w\-]*)\((.*)$"
)
_ARRAY = re.compile(r"\b[a-z]+[0-9]*\[([0-9,]*)\]")
KINDS = ("all-gather", "all-reduce", "reduce-scatter")


def _shapes(text: str) -> list[tuple]:
  return [
      tuple(int(d) for d in dims.split(",") if d)
      for dims in _ARRAY.findall(text)
  ]


def _collective_sites(hlo: str) -> list[tuple[str, list, str]]:
  """(kind, shapes, line) of every collective: the shapes of the arrays it
  produces and takes (operand shapes looked up by name when the HLO text
  omits them)."""
  defs, found = {}, []
  for line in hlo.splitlines():
    m = _DEF.match(line)
    if not m:
      continue
    name, result, op, args = m.groups()
    defs[name] = _shapes(result)
    kind = op[: -len("-start")] if op.endswith("-start") else op
    if kind in KINDS:
      found.append((kind, result, args.split("), ")[0], line))
  out = []
  for kind, result, args, line in found:
    shapes = _shapes(result)
    for operand in re.findall(r"%([\w.\-]+)", args):
      shapes += defs.get(operand, [])
    shapes += _shapes(re.sub(r"%[\w.\-]+", "", args))  # inline types
    out.append((kind, shapes, line))
  return out


def collectives(hlo: str) -> list[tuple[str, tuple]]:
  """(kind, shape) of every array a collective produces or takes."""
  return [
      (kind, s) for kind, shapes, _ in _collective_sites(hlo) for s in shapes
  ]


# ------------------------------------- reductions: their type, axes, count


@dataclasses.dataclass(frozen=True)
class Reduction:
  """One all-reduce or reduce-scatter of the HLO: ``dtypes`` of its
  operands (several when XLA combined them into one op), the mesh ``axes``
  its device groups span, and ``times``, how often it runs per call of the
  program (the trip counts of the loops around it)."""

  kind: str
  dtypes: tuple
  shapes: tuple
  axes: frozenset
  computation: str
  times: int


_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_CALLEE = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|"
    r"false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_TYPED = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")


def _computations(hlo: str) -> tuple[dict, str]:
  """({name: [instruction lines]}, the ENTRY computation's name)."""
  comps, entry, name = {}, None, None
  for line in hlo.splitlines():
    m = _HEADER.match(line)
    if m:
      name = m.group(1)
      comps[name] = []
      if line.lstrip().startswith("ENTRY"):
        entry = name
    elif name is not None and line.strip() == "}":
      name = None
    elif name is not None:
      comps[name].append(line)
  return comps, entry


def executions(hlo: str) -> dict:
  """{computation: times it runs per call of the ENTRY computation}: a
  while body ``known_trip_count`` times per run of its caller (XLA's
  annotation in the optimised HLO; a loop without one raises), other
  callees once (a conditional's branches each once: an upper bound)."""
  comps, entry = _computations(hlo)
  edges = {name: [] for name in comps}
  for name, lines in comps.items():
    for line in lines:
      trip = _TRIP.search(line)
      for role, callee in _CALLEE.findall(line):
        if role == "to_apply":  # a reduction's adder, not a call
          continue
        n = 1
        if role == "body":
          if trip is None:
            raise ValueError(
                f"while loop without a known trip count: "
                f"{line.strip()[:120]}"
            )
          n = int(trip.group(1))
        edges[name].append((callee, n))
      for group in _BRANCHES.findall(line):
        edges[name] += [(c.strip().lstrip("%"), 1) for c in group.split(",")]
  times = {}

  def visit(name, n):
    times[name] = times.get(name, 0) + n
    for callee, k in edges.get(name, ()):
      visit(callee, n * k)

  visit(entry, 1)
  return times


def _iota(dims, perm=None) -> np.ndarray:
  x = np.arange(math.prod(dims)).reshape(dims)
  return x.transpose(perm) if perm else x


def _ints(text: str) -> list:
  return [int(v) for v in text.split(",") if v.strip()]


def replica_groups(line: str) -> list:
  """The device groups of a collective's ``replica_groups`` (ids of the
  program's devices), in any of XLA's printed forms:

    {{0,4},{1,5}}                    explicit
    [4,2]<=[2,4]T(1,0)               iota: arange(8).reshape(2, 4)
                                     .transpose(1, 0).reshape(4, 2)
    mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}
                                     devices laid on a mesh (the iota
                                     of device_ids, else arange), one
                                     group per index of the other axes

  An empty list means every device in one group."""
  m = re.search(
      r"replica_groups=mesh\[([^\]]*)\]"
      r"(?:, device_ids=\(\[([0-9,]*)\](?:T\(([0-9,]*)\))?\))?"
      r" \{([^}]*)\}",
      line,
  )
  if m:
    names = re.findall(r"'(\w+)'=", m.group(1))
    dims = [int(v) for v in re.findall(r"=(\d+)", m.group(1))]
    if m.group(2):
      ids = _iota(
          _ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None
      ).reshape(dims)
    else:
      ids = _iota(dims)
    over = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(4))]
    rest = [i for i in range(len(dims)) if i not in over]
    size = math.prod(dims[i] for i in over)
    return ids.transpose(rest + over).reshape(-1, size).tolist()
  m = re.search(
      r"replica_groups=\[([0-9,]*)\]<=\[([0-9,]*)\]" r"(?:T\(([0-9,]*)\))?",
      line,
  )
  if m:
    perm = _ints(m.group(3)) if m.group(3) else None
    return _iota(_ints(m.group(2)), perm).reshape(_ints(m.group(1))).tolist()
  m = re.search(r"replica_groups=\{((?:\{[0-9,]*\},?)*)\}", line)
  if m:
    return [_ints(g) for g in re.findall(r"\{([0-9,]*)\}", m.group(1))]
  return []


def group_axes(groups: list, mesh_shape, names=shd.MESH_AXES) -> frozenset:
  """The mesh axes along which the devices of some group differ (device i
  at ``numpy.unravel_index(i, mesh_shape)``, the order of ``mesh.devices``);
  all of them (of size > 1) for one group of every device (``[]``)."""
  if not groups:
    return frozenset(a for a, n in zip(names, mesh_shape) if n > 1)
  out = set()
  for group in groups:
    coords = np.array(np.unravel_index(group, mesh_shape)).T
    out.update(
        a for a, varies in zip(names, np.ptp(coords, axis=0) > 0) if varies
    )
  return frozenset(out)


def reductions(hlo: str, mesh_shape, *, loops: bool = True) -> list:
  """Every all-reduce and reduce-scatter of ``hlo`` as a ``Reduction``;
  ``loops=False`` for HLO without trip counts (before optimisation):
  ``times`` is then 1."""
  comps, _ = _computations(hlo)
  times = executions(hlo) if loops else {}
  out = []
  for comp, lines in comps.items():
    for line in lines:
      m = _DEF.match(line)
      if not m:
        continue
      _, result, op, args = m.groups()
      kind = op[: -len("-start")] if op.endswith("-start") else op
      if kind not in ("all-reduce", "reduce-scatter"):
        continue
      typed = _TYPED.findall(result)
      out.append(
          Reduction(
              kind,
              tuple(t for t, _ in typed),
              tuple(tuple(_ints(d)) for _, d in typed),
              group_axes(replica_groups(line), mesh_shape),
              comp,
              times.get(comp, 1) if loops else 1,
          )
      )
  return out


def _compile_partitioned(lowered):
  """(compiled, the module right after SPMD partitioning): each collective
  as the partitioner placed it, in its own dtype. (The optimised CPU
  program widens bfloat16 reductions to float32 -- ``all-reduce-promotion``
  -- and combines them; a GPU's keeps them.) Compiled with the persistent
  cache off: a cached program is not recompiled, so dumps nothing. JAX
  decides once a process whether the cache is used (``is_cache_used``),
  so turning it off takes ``reset_cache`` before and after."""
  import glob
  import os
  import tempfile

  from jax.experimental.compilation_cache import compilation_cache as cc

  cached = jax.config.jax_enable_compilation_cache
  with tempfile.TemporaryDirectory() as d:
    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()
    try:
      compiled = lowered.compile(
          compiler_options={
              "xla_dump_to": d,
              "xla_dump_hlo_pass_re": "spmd-partitioning",
          }
      )
    finally:
      jax.config.update("jax_enable_compilation_cache", cached)
      cc.reset_cache()
    (path,) = glob.glob(os.path.join(d, "*after_spmd-partitioning*.txt"))
    with open(path) as f:
      return compiled, f.read()


def param_shapes(params, mesh_size: int) -> set:
  """Each parameter's shape and its shards (a dim divided by a divisor of
  the device count), with size-1 dims dropped."""
  shapes = set()
  divisors = [d for d in range(1, mesh_size + 1) if mesh_size % d == 0]
  for leaf in jax.tree.leaves(params):
    variants = [()]
    for dim in leaf.shape:
      variants = [
          v + (dim // d,) for v in variants for d in divisors if dim % d == 0
      ]
    shapes.update(tuple(x for x in v if x != 1) for v in variants)
  return shapes


def activation_collectives(hlo, params, mesh_shape, bound, allowed=("tensor",)):
  """Collectives of non-parameter arrays of at least ``bound`` elements
  (one device's share of an activation, ``activation_bound``, or more),
  except all-reduces and reduce-scatters whose device groups span only
  ``allowed`` mesh axes (tensor parallelism's partial sums of the local
  rows): [(kind, shape, elements, axes)].

  An all-reduce of a per-device activation over 'data' or 'fsdp' -- rows
  one device holds, summed with other devices' rows -- is flagged at
  exactly the bound (it passed when only larger arrays were)."""
  skip = param_shapes(params, math.prod(mesh_shape))
  bad = []
  for kind, shapes, line in _collective_sites(hlo):
    axes = group_axes(replica_groups(line), mesh_shape)
    partial_sums = kind != "all-gather" and axes <= set(allowed)
    for shape in shapes:
      n = math.prod(shape)
      if (
          n >= bound
          and not partial_sums
          and tuple(d for d in shape if d != 1) not in skip
      ):
        bad.append((kind, shape, n, tuple(sorted(axes))))
  return bad


# ------------------------------------------------------- abstract inputs


def abstract_model(cfg):
  """(graphdef, params, rest) with ShapeDtypeStruct leaves: the trainable
  params as a Learner splits them (``train_step.split_trainable``; a LoRA
  model's adapters, its frozen base in ``rest``)."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return ts.split_trainable(model)


def placed(mesh, tree, rules=RULES):
  """``tree``'s ShapeDtypeStructs with the shardings of its logical names
  (a LoRA model's frozen base, an argument of the compiled programs)."""
  sh = shd.state_shardings(mesh, tree, rules)
  return jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s), tree, sh)


def sds(shape, dtype, sharding=None):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)


def rows_sharding(mesh, ndim, rules=RULES):
  return shd.named_sharding(mesh, ("batch",) + (None,) * (ndim - 1), rules)


def abstract_batch(mesh, rows, length, rules=RULES):
  f32 = lambda: sds((rows, length), jnp.float32, rows_sharding(mesh, 2, rules))
  i32 = lambda: sds((rows, length), jnp.int32, rows_sharding(mesh, 2, rules))
  return Batch(
      tokens=i32(),
      positions=i32(),
      attention_mask=i32(),
      loss_mask=f32(),
      advantages=f32(),
      old_logp=f32(),
      ref_logp=f32(),
      behavior_logp=f32(),
      returns=f32(),
      old_values=f32(),
      is_offpolicy=sds((rows,), jnp.bool_, rows_sharding(mesh, 1, rules)),
  )


def abstract_state(mesh, params, tx, rules=RULES):
  """(abstract TrainState, its shardings), as create_train_state builds."""
  param_sh = shd.state_shardings(mesh, params, rules)
  opt = jax.eval_shape(tx.init, params)
  opt_sh = optax.tree_map_params(
      tx,
      lambda _, s: s,
      opt,
      param_sh,
      transform_non_params=lambda _: shd.replicated(mesh),
  )
  opt_sh = jax.tree.map(
      lambda s: s if isinstance(s, NamedSharding) else shd.replicated(mesh),
      opt_sh,
  )
  state = ts.TrainState(step=sds((), jnp.int32), params=params, opt_state=opt)
  state_sh = ts.TrainState(
      step=shd.replicated(mesh), params=param_sh, opt_state=opt_sh
  )
  return state, state_sh


# ------------------------------------------------------------- compiling


@dataclasses.dataclass
class Compiled:
  name: str
  hlo: str
  memory: dict  # ``memory()``: bytes per device
  rows: int  # rows one program instance computes (a micro-batch)
  length: int  # sequence (or cache) length
  params: object  # the abstract parameters (for ``param_shapes``)
  compile_s: float = 0.0
  partitioned: str = ""  # the HLO right after SPMD partitioning, if asked


def memory(compiled) -> dict:
  """Per-device bytes of a compiled program (module docstring)."""
  m = compiled.memory_analysis()
  out = {
      "argument": int(m.argument_size_in_bytes),
      "output": int(m.output_size_in_bytes),
      "alias": int(m.alias_size_in_bytes),
      "temp": int(m.temp_size_in_bytes),
  }
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def _compiled(
    name, lowered, rows, length, params, partitioned=False
) -> Compiled:
  import time

  t0 = time.perf_counter()
  text = ""
  if partitioned:
    out, text = _compile_partitioned(lowered)
  else:
    out = lowered.compile()
  return Compiled(
      name,
      out.as_text(),
      memory(out),
      rows,
      length,
      params,
      time.perf_counter() - t0,
      text,
  )


def compile_train_step(
    mesh,
    cfg,
    rows,
    length,
    *,
    n_micro=1,
    window=0,
    rules=RULES,
    donate=True,
    loss=None,
    partitioned=False,
) -> Compiled:
  """The policy's train step (the mixed RSPO loss) on ``rows`` x
  ``length``, ``n_micro`` micro-batches, logits on a response ``window``
  (0: every position); with ``partitioned``, the HLO right after SPMD
  partitioning too."""
  graphdef, params, rest = abstract_model(cfg)
  rest = placed(mesh, rest, rules)
  tx = ts.make_optimizer(1e-6)
  state, state_sh = abstract_state(mesh, params, tx, rules)
  batch = abstract_batch(mesh, rows, length, rules)
  loss = loss or ts.make_policy_loss(
      ts.PolicyLossConfig(alpha=0.25, kl_coef=0.01)
  )
  step = ts.make_train_step(
      graphdef,
      rest,
      loss,
      tx,
      mesh=mesh,
      state_shardings=state_sh,
      batch_sharding_tree=jax.tree.map(lambda x: x.sharding, batch),
      n_micro=n_micro,
      donate=donate,
      window=window,
  )
  lowered = step.lower(state, batch, jax.random.key(0))
  return _compiled(
      "train_step", lowered, -(-rows // n_micro), length, params, partitioned
  )


def compile_logprob(
    mesh,
    cfg,
    rows,
    length,
    *,
    window=0,
    rules=RULES,
    n_chunks=1,
    param_dtype: Optional[str] = None,
) -> Compiled:
  """The log-prob pass (pi_old on the masters; pi_ref with
  ``param_dtype=cfg.inference_dtype``), in ``n_chunks`` calls inside one
  program as ``Learner.apply`` runs it (``learner.chunked``)."""
  from rspo_jax.learner import _row_ways, chunk_rows, chunked

  if param_dtype:
    cfg = dataclasses.replace(cfg, param_dtype=param_dtype)
  graphdef, params, rest = abstract_model(cfg)
  rest = placed(mesh, rest, rules)
  param_sh = shd.state_shardings(mesh, params, rules)
  fn = ts.make_logprob_fn(
      graphdef,
      rest,
      mesh=mesh,
      param_shardings=param_sh,
      rules=rules,
      window=window,
  )
  x = sds((rows, length), jnp.int32, rows_sharding(mesh, 2, rules))
  if n_chunks > 1:
    fn = chunked(fn, n_chunks, mesh, param_sh, rules)
  per = chunk_rows(rows, n_chunks, _row_ways(mesh, rules))  # padded calls
  return _compiled("logprob", fn.lower(params, x, x, x, x), per, length, params)


def _engine_inputs(mesh, cfg, rules):
  """The engine's model as JaxEngine builds it on a mesh: weights and
  activations on ``sharding.inference_rules(rules)``
  (``jax_engine._with_activation_rules``), inference dtype, unscanned and
  without remat (``build.engine_config``: a remat block inside the decode
  loop fails to trace)."""
  weights = shd.inference_rules(rules)
  cfg = dataclasses.replace(
      cfg,
      param_dtype=cfg.inference_dtype,
      scan_layers=False,
      remat=False,
      logical_axis_rules=tuple(weights),
  )
  graphdef, params, rest = abstract_model(cfg)
  psh = shd.state_shardings(mesh, params, weights)
  params = jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s), params, psh)
  static = jax_engine._Static(
      graphdef=graphdef, cfg=cfg, mesh=mesh, rules=rules, pad_id=0
  )
  return cfg, params, rest, static


def compile_prefill(
    mesh, cfg, rows, prompt, new, *, chunk=0, unique=None, rules=RULES
) -> Compiled:
  """The engine's prefill of ``rows`` prompts of bucket ``prompt`` into a
  cache of ``prompt + new`` slots (``chunk``: column blocks, 0 = one
  pass); ``unique`` = Bu: Bu distinct prompts prefilled, their cache
  gathered to the ``rows`` decode rows (prompts repeat); None: the prompts
  are the decode rows (no gather)."""
  cfg, params, rest, static = _engine_inputs(mesh, cfg, rules)
  n = rows if unique is None else unique
  x = sds((n, prompt - 1), jnp.int32, rows_sharding(mesh, 2, rules))
  m = sds((n, prompt - 1), jnp.bool_, rows_sharding(mesh, 2, rules))
  row_map = None if unique is None else sds((rows,), jnp.int32)
  cache = (
      abstract_cache(mesh, cfg, rows, prompt + new, rules)
      if unique is None
      else None
  )  # the engine's donated empty cache
  lowered = jax_engine._prefill.lower(
      params,
      rest,
      x,
      x,
      m,
      row_map,
      None,
      cache,
      cache_len=prompt + new,
      static=static,
      chunk=chunk,
  )
  return _compiled("prefill", lowered, rows, prompt, params)


def abstract_cache(mesh, cfg, rows, slots, rules=RULES):
  """The engine's KV cache of ``rows`` x ``slots`` as ShapeDtypeStructs,
  rows over the batch mesh axes (``jax_engine._constrain_cache``)."""
  cache = jax.eval_shape(lambda: tfm.init_cache(cfg, rows, slots))

  def placed(x, logical):
    spec = shd.logical_to_mesh_spec(logical, rules)
    return sds(
        x.shape,
        x.dtype,
        NamedSharding(mesh, shd.fit_spec_to_shape(mesh, spec, x.shape)),
    )

  kv = lambda xs: tuple(placed(x, jax_engine._CACHE_AXES) for x in xs)
  return tfm.KVCache(
      k=kv(cache.k),
      v=kv(cache.v),
      key_mask=placed(cache.key_mask, ("batch", "cache_length")),
      index=placed(cache.index, ()),
  )


def compile_decode(mesh, cfg, rows, prompt, new, *, rules=RULES) -> Compiled:
  """The engine's decode loop over a cache of ``prompt + new`` slots."""
  cfg, params, rest, static = _engine_inputs(mesh, cfg, rules)
  cache = abstract_cache(mesh, cfg, rows, prompt + new, rules)
  row = lambda dt: sds((rows,), dt, rows_sharding(mesh, 1, rules))
  state = jax_engine._Rows(
      last_tok=row(jnp.int32),
      last_pos=row(jnp.int32),
      active=row(jnp.bool_),
      row_ids=row(jnp.int32),
  )
  knobs = jax_engine._Knobs(
      seed=sds((), jnp.uint32),
      temperature=sds((), jnp.float32),
      top_p=sds((), jnp.float32),
      max_new=sds((), jnp.int32),
      stop_mask=sds((cfg.vocab_size,), jnp.bool_),
  )
  lowered = jax_engine._decode.lower(
      params, rest, cache, state, knobs, slots=new, static=static
  )
  return _compiled("decode", lowered, rows, prompt + new, params)


def activation_bound(c: Compiled, mesh_shape, hidden_size: int) -> int:
  """One device's share of one [rows, length, width] activation, in
  elements: rows / (data * fsdp) * length * hidden (rows that do not
  split: all of them)."""
  ways = mesh_shape[0] * mesh_shape[1]
  ways = ways if c.rows % ways == 0 else 1
  return c.rows // ways * c.length * hidden_size


# ------------------------------------------------------- memory of shapes

# XLA:CPU's default schedule runs ops concurrently and ignores remat's
# savings; memory checks compile with the memory-minimising one, as an
# accelerator's compiler schedules (read when the backend starts: set it in
# XLA_FLAGS before importing jax).
MEMORY_XLA_FLAGS = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def compile_case(case: dict) -> Compiled:
  """Compiles one ``case``: {"kind": train_step | logprob | prefill |
  decode, "mesh": [d, f, t], "model": {ModelConfig overrides of the
  qwen2.5-1.5b preset}, and the compile function's keywords}."""
  from rspo_jax.models.config import get_model_config

  case = dict(case)
  fn = COMPILERS[case.pop("kind")]
  mesh = shd.make_mesh(tuple(case.pop("mesh", (1, 1, 1))))
  cfg = get_model_config("qwen2.5-1.5b", **case.pop("model", {}))
  return fn(mesh, cfg, **case)


COMPILERS = {
    "train_step": compile_train_step,
    "logprob": compile_logprob,
    "prefill": compile_prefill,
    "decode": compile_decode,
}


if __name__ == "__main__":
  # python -m rspo_jax.hlo '<json list of cases>': one JSON line of
  # ``memory`` (and compile seconds) per case.
  import json
  import sys

  for case in json.loads(sys.argv[1]):
    c = compile_case(case)
    print(
        json.dumps(dict(c.memory, compile_s=round(c.compile_s, 2))), flush=True
    )
