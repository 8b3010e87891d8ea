"""Device meshes and the map from logical axis names to mesh axes.

Model code names *logical* axes only (``('embed', 'mlp')``); one table of
rules -- owned by the config (``config.logical_axis_rules``) -- maps each
logical name to a mesh axis (or a tuple of them, or None = replicated).

Mesh axes are always ``('data', 'fsdp', 'tensor')``:
  * ``data``   -- pure data parallelism (params replicated),
  * ``fsdp``   -- batch split *and* params sharded along ``embed`` (ZeRO-3),
  * ``tensor`` -- Megatron-style split of heads / mlp / vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# NNX variables carry logical names as metadata; they are resolved against the
# mesh here, explicitly, rather than eagerly at creation.
flax.config.update("flax_always_shard_variable", False)

MESH_AXES = ("data", "fsdp", "tensor")

# The closed list of logical axis names used anywhere in the code base.
LOGICAL_AXES = (
    "batch",  # examples
    "length",  # sequence positions
    "vocab",  # vocabulary
    "embed",  # model width
    "mlp",  # feed-forward hidden
    "heads",  # query heads
    "kv_heads",  # key/value heads
    "head_dim",  # per-head width
    "norm",  # norm scales (always replicated)
    "cache_length",  # KV-cache positions
)

DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("cache_length", None),
)


def make_mesh(
    shape: Sequence[int] = (-1, 1, 1),
    devices: Optional[Sequence[Any]] = None,
) -> Mesh:
  """Builds a ('data', 'fsdp', 'tensor') mesh; one -1 entry takes the rest.

  Raises ValueError naming the shape when the device count does not divide.
  """
  devices = list(devices if devices is not None else jax.devices())
  shape = list(shape)
  if len(shape) != 3:
    raise ValueError(f"mesh shape must have 3 entries {MESH_AXES}, got {shape}")
  n = len(devices)
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {shape}: at most one -1 entry")
  known = int(np.prod([s for s in shape if s != -1]))
  if known <= 0 or (-1 in shape and n % known) or known > n:
    raise ValueError(
        f"mesh shape {tuple(shape)} does not fit the {n} available devices"
        " (the product must divide the device count; -1 takes the rest)"
    )
  shape = [n // known if s == -1 else s for s in shape]
  devices = devices[: int(np.prod(shape))]  # an explicit shape may use fewer
  return jax.make_mesh(
      tuple(shape),
      MESH_AXES,
      axis_types=(AxisType.Auto,) * 3,
      devices=devices,
  )


def check_rules(rules) -> dict:
  """Validates a rules table; returns it as a dict logical -> mesh axes."""
  table = {}
  for entry in rules:
    if len(entry) != 2:
      raise ValueError(f"logical_axis_rules entry {entry!r} is not a pair")
    name, target = entry
    if name not in LOGICAL_AXES:
      raise ValueError(
          f"unknown logical axis {name!r} in logical_axis_rules; known:"
          f" {LOGICAL_AXES}"
      )
    targets = (target,) if isinstance(target, str) else (target or ())
    for t in targets:
      if t not in MESH_AXES:
        raise ValueError(
            f"logical axis {name!r} maps to unknown mesh axis {t!r}; mesh axes"
            f" are {MESH_AXES}"
        )
    table[name] = tuple(target) if isinstance(target, (list, tuple)) else target
  return table


def logical_to_mesh_spec(
    logical: Optional[Sequence[Optional[str]]], rules
) -> P:
  """PartitionSpec of logical names -> PartitionSpec of mesh axes."""
  if logical is None:
    return P()
  table = check_rules(rules)
  out, used = [], set()
  for name in logical:
    if name is None:
      out.append(None)
      continue
    if name not in table:
      raise ValueError(f"logical axis {name!r} has no rule in {tuple(table)}")
    target = table[name]
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    axes = tuple(a for a in axes if a not in used)  # a mesh axis is used once
    used.update(axes)
    out.append(axes[0] if len(axes) == 1 else (axes or None))
  return P(*out)


def inference_rules(rules) -> tuple:
  """``rules`` for weights only run forward on rows split over ('data',
  'fsdp') (the rollout engine): 'batch' keeps its axes, every other logical
  axis drops 'data' and 'fsdp' -- params split over 'tensor' only, whole on
  each data / fsdp replica, so a decode step reads its weights locally
  instead of gathering every one of them for every token."""
  out = []
  for name, target in check_rules(rules).items():
    if name != "batch":
      axes = (target,) if isinstance(target, str) else tuple(target or ())
      axes = tuple(a for a in axes if a not in ("data", "fsdp"))
      target = axes[0] if len(axes) == 1 else (axes or None)
    out.append((name, target))
  return tuple(out)


def named_sharding(mesh: Mesh, logical, rules) -> NamedSharding:
  return NamedSharding(mesh, logical_to_mesh_spec(logical, rules))


def fit_spec_to_shape(mesh: Mesh, spec: P, shape) -> P:
  """Drops mesh axes that do not divide a dimension (e.g. 2 KV heads on a
  tensor axis of 4): that dimension is replicated instead."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    out.append(axes if dim % size == 0 else None)
  return P(*out)


def state_shardings(mesh: Mesh, state: Any, rules) -> Any:
  """NamedShardings for an NNX state (or abstract state) from its metadata.

  Variables without logical names are replicated.
  """

  def one(var):
    names = var.get_metadata().get("out_sharding", None)
    spec = logical_to_mesh_spec(names, rules) if names else P()
    spec = fit_spec_to_shape(mesh, spec, var.value.shape)
    return var.replace(NamedSharding(mesh, spec))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules, ndim: int = 2) -> NamedSharding:
  """Sharding of a [batch, length, ...] array."""
  logical = ("batch",) + ("length",) + (None,) * (ndim - 2)
  return named_sharding(mesh, logical[:ndim], rules)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# ------------------------------------------------------ activation sharding


def array_mesh(*arrays) -> Any:
  """The mesh the first of ``arrays`` laid out over several devices lives
  on, read from its type (an ``AbstractMesh`` under jit, where a jitted
  function's sharded inputs carry it); None when none is (no mesh, numpy,
  or a single device)."""
  for a in arrays:
    mesh = getattr(getattr(jax.typeof(a), "sharding", None), "mesh", None)
    if mesh is not None and not mesh.empty and mesh.size > 1:
      return mesh
  return None


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
  """``shard(x, logical)``: ``x`` constrained to the mesh axes its logical
  names map to (``rules``; axes that do not divide a dimension dropped, as
  for params). The identity without a mesh. Hashable, so a static
  argument of jitted / rematerialised functions.

  Inside ``jax.shard_map`` (the train step's data-local micro-batch loop)
  the mesh's manual axes are dropped from every spec: a program instance
  holds its own block of them already."""

  mesh: Any = None
  rules: tuple = DEFAULT_RULES

  @classmethod
  def of(cls, rules, *arrays) -> "ActivationSharding":
    """On the mesh of ``arrays`` (``array_mesh``), if any."""
    return cls(array_mesh(*arrays), tuple(rules))

  def spec(self, logical, shape) -> P:
    spec = logical_to_mesh_spec(logical, self.rules)
    return fit_spec_to_shape(self.mesh, self._automatic(spec), shape)

  def __call__(self, x: jax.Array, logical) -> jax.Array:
    if self.mesh is None:
      return x
    return self.put(x, logical_to_mesh_spec(logical, self.rules))

  def put(self, x: jax.Array, spec: P) -> jax.Array:
    """``x`` constrained to the mesh-axis ``spec`` (axes that do not divide
    a dimension dropped); the identity without a mesh."""
    if self.mesh is None:
      return x
    spec = fit_spec_to_shape(self.mesh, self._automatic(spec), x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

  def axes(self, name: str) -> tuple:
    """The mesh axes the logical axis ``name`` maps to (less manual ones)."""
    target = check_rules(self.rules).get(name)
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    return tuple(a for a in axes if a not in self._manual())

  def _manual(self) -> frozenset:
    return frozenset(getattr(self.mesh, "manual_axes", ()) or ())

  def _automatic(self, spec: P) -> P:
    """``spec`` without the mesh's manual axes."""
    manual = self._manual()
    if not manual:
      return spec
    out = []
    for axes in spec:
      names = (axes,) if isinstance(axes, str) else tuple(axes or ())
      names = tuple(a for a in names if a not in manual)
      out.append(names[0] if len(names) == 1 else (names or None))
    return P(*out)

  def _on_shards(self, w, logical):
    """The NamedSharding of ``w``'s own shards, or None (no mesh)."""
    if self.mesh is None or not logical:
      return None
    return NamedSharding(self.mesh, self.spec(logical, w.shape))

  def einsum(self, subscripts: str, x, w, logical, *, out_dtype=None):
    """``jnp.einsum(subscripts, x, w.astype(x.dtype))`` with the weight
    cast on its own shards (its logical names), so FSDP gathers the narrow
    copy, and its gradient taken in float32 (``_cast_einsum``):

      dx = einsum(dy, w_c)                    in x's dtype
      dw = einsum(x, dy), float32 output      then w.dtype

    Rows split over ('data', 'fsdp') make the dw dot a partial sum, which
    SPMD partitioning reduces over those devices right at the dot, in the
    dot's output type: float32 here (the plain einsum's bf16 gradient was
    reduced in bf16, then widened). ``out_dtype``: the forward's
    ``preferred_element_type``. A plain einsum when ``w`` already has x's
    dtype (the engine's bf16 weights, float32 compute).
    """
    if w.dtype == x.dtype:
      return jnp.einsum(subscripts, x, w, preferred_element_type=out_dtype)
    return _cast_einsum(
        subscripts,
        x,
        w,
        self._on_shards(w, logical),
        None if out_dtype is None else jnp.dtype(out_dtype),
    )

  def apply(self, fn, x, w, logical):
    """``fn(x, w.astype(x.dtype))`` for an elementwise ``fn`` (a bias add,
    a norm's scale), the weight cast on its shards, its gradient the vjp of
    ``fn`` on float32 operands: summed over the rows (and reduced over the
    devices) in float32. Plain ``fn`` when ``w`` has x's dtype."""
    if w.dtype == x.dtype:
      return fn(x, w)
    return _cast_apply(fn, x, w, self._on_shards(w, logical))


def _narrow(w, dtype, sharding_):
  """w.astype(dtype), w and the copy both constrained to ``sharding_``
  (None: no constraint)."""
  if sharding_ is None:
    return w.astype(dtype)
  wsc = jax.lax.with_sharding_constraint
  return wsc(wsc(w, sharding_).astype(dtype), sharding_)


def _einsum_terms(subscripts: str) -> tuple[str, str, str]:
  """(x, w, y) index strings of ``"x,w->y"``; each index in exactly two of
  them (a contraction or an index carried to the output), so each
  operand's gradient is the einsum of the other two."""
  xs, rest = subscripts.replace(" ", "").split(",")
  ws, ys = rest.split("->")
  for c in set(xs + ws + ys):
    if (c in xs) + (c in ws) + (c in ys) != 2:
      raise ValueError(
          f"einsum {subscripts!r}: index {c!r} must appear in"
          " exactly two of the operands and output"
      )
  return xs, ws, ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def _cast_einsum(subscripts, x, w, sharding_, out_dtype):
  """y = einsum(x, w.astype(x.dtype)); see ``ActivationSharding.einsum``."""
  return jnp.einsum(
      subscripts,
      x,
      _narrow(w, x.dtype, sharding_),
      preferred_element_type=out_dtype,
  )


def _cast_einsum_fwd(subscripts, x, w, sharding_, out_dtype):
  # Residuals: x and the master w (w's own shards; the backward casts and
  # gathers it again, as the forward did).
  return _cast_einsum(subscripts, x, w, sharding_, out_dtype), (x, w)


def _cast_einsum_bwd(subscripts, sharding_, out_dtype, res, dy):
  del out_dtype
  x, w = res
  xs, ws, ys = _einsum_terms(subscripts)
  dx = jnp.einsum(f"{ys},{ws}->{xs}", dy, _narrow(w, x.dtype, sharding_))
  dw = jnp.einsum(f"{xs},{ys}->{ws}", x, dy, preferred_element_type=jnp.float32)
  if sharding_ is not None:
    dw = jax.lax.with_sharding_constraint(dw, sharding_)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_cast_einsum.defvjp(_cast_einsum_fwd, _cast_einsum_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _cast_apply(fn, x, w, sharding_):
  """fn(x, w.astype(x.dtype)); see ``ActivationSharding.apply``."""
  return fn(x, _narrow(w, x.dtype, sharding_))


def _cast_apply_fwd(fn, x, w, sharding_):
  return _cast_apply(fn, x, w, sharding_), (x, w)


def _cast_apply_bwd(fn, sharding_, res, dy):
  x, w = res
  _, vjp_x = jax.vjp(lambda a: fn(a, _narrow(w, x.dtype, sharding_)), x)
  _, vjp_w = jax.vjp(
      lambda b: fn(x.astype(jnp.float32), b), w.astype(jnp.float32)
  )
  (dw,) = vjp_w(dy.astype(jnp.float32))
  if sharding_ is not None:
    dw = jax.lax.with_sharding_constraint(dw, sharding_)
  return vjp_x(dy)[0], dw.astype(w.dtype)


_cast_apply.defvjp(_cast_apply_fwd, _cast_apply_bwd)
