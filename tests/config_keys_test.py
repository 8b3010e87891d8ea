"""Every config key the library reads exists in the locked base config.

The base config (configs/base.py, locked by `make_config`) owns every
default, so library code reads ``cfg.section.key`` directly: a typo'd key
then fails at once instead of silently falling back to a second default
written at the call site (``cfg.section.get("key", default)``).

The scan parses (``ast``) every .py file under rspo_jax/ and launch/ and
collects, per function, the attribute chains read from a run config:

  * roots: ``cfg``, ``config``, ``run_cfg``, ``c``, ``self.cfg``,
    ``self.config`` -- a root counts as a run config in a function where
    some chain from it starts with a config section (``cfg.train...``);
    elsewhere the same names hold a model config or a JSON dict,
  * section aliases: ``algo_cfg`` (``cfg.algo`` passed down), ``mesh_cfg``,
    and any ``x = cfg.<section>`` assignment in the same function.

Each chain must name keys of every env x algo config in configs/ at both
scales (env.kwargs, which differ per env, and the mesh keys that
``launch/train.py --mesh=configs/mesh/*.py`` copies in, may exist in any
one of them); each ``.get("key")`` on a config section must name an
existing key and stand in a file of the small exemption list.
"""

import ast
import dataclasses
import glob
import importlib
import os

import ml_collections
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("rspo_jax", "launch")

GET_EXEMPT = frozenset()  # no file may read a config key with .get

CONFIG_ROOTS = frozenset(
    {"cfg", "config", "run_cfg", "c", "self.cfg", "self.config"}
)
# Parameters that hold one section of the run config.
SECTION_PARAMS = {"algo_cfg": ("algo",), "mesh_cfg": ("mesh",)}
# Methods of ConfigDict: a chain that reaches one stops being a key path.
METHODS = frozenset(
    n for n in dir(ml_collections.ConfigDict) if not n.startswith("_")
)


@dataclasses.dataclass(frozen=True)
class Read:
  """One config read: ``path`` from the run config's root, e.g.
  ('train', 'lr'); ``get`` when the read is ``<path>.get(<key>)`` (the key
  then ends ``path``, or None when it is not a string literal)."""

  where: str  # file:line
  path: tuple
  get: bool = False


def _config_keys():
  """(sections, leaves): the dotted keys every config must hold, plus
  those that may exist in any one (env.kwargs.*, mesh.*)."""
  every, anyone = None, (set(), set())
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
    mod = importlib.import_module("configs." + os.path.basename(path)[:-3])
    if not hasattr(mod, "get_config"):
      continue
    for arg in (None, "model=qwen2.5-1.5b"):  # the CPU and paper scales
      keys = _walk(mod.get_config(arg))
      every = (
          keys if every is None else tuple(a & b for a, b in zip(every, keys))
      )
      for a, b in zip(anyone, keys):
        a |= b
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "mesh", "*.py"))):
    mod = importlib.import_module("configs.mesh." + os.path.basename(path)[:-3])
    if hasattr(mod, "get_config"):
      anyone[1].update(f"mesh.{k}" for k in mod.get_config().keys())
  varying = ("env.kwargs.", "mesh.")
  sections = every[0] | {k for k in anyone[0] if k.startswith(varying)}
  leaves = every[1] | {k for k in anyone[1] if k.startswith(varying)}
  return sections, leaves


def _walk(c, prefix=""):
  sections, leaves = set(), set()
  for name, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      sections.add(prefix + name)
      s, l = _walk(value, f"{prefix}{name}.")
      sections |= s
      leaves |= l
    else:
      leaves.add(prefix + name)
  return sections, leaves


SECTIONS, LEAVES = _config_keys()
TOP_SECTIONS = frozenset(k for k in SECTIONS if "." not in k)


def _root(node) -> str | None:
  """'cfg' / 'self.cfg' for a Name or a one-level self attribute."""
  if isinstance(node, ast.Name):
    return node.id
  if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id == "self"
  ):
    return f"self.{node.attr}"
  return None


def _chain(node, parents):
  """(attrs, outermost node) climbing from a root through `.a` and
  `["a"]`."""
  attrs = []
  while True:
    up = parents.get(node)
    if isinstance(up, ast.Attribute) and up.value is node:
      attrs.append(up.attr)
    elif (
        isinstance(up, ast.Subscript)
        and up.value is node
        and isinstance(up.slice, ast.Constant)
        and isinstance(up.slice.value, str)
    ):
      attrs.append(up.slice.value)
    else:
      return attrs, node
    node = up


def _get_key(top, parents):
  """The literal key of ``<...>.get("key", ...)`` ending at `top`."""
  call = parents.get(top)
  if (
      isinstance(call, ast.Call)
      and call.func is top
      and call.args
      and isinstance(call.args[0], ast.Constant)
      and isinstance(call.args[0].value, str)
  ):
    return call.args[0].value
  return None


def _scopes(tree):
  """Each function (and the module) with the nodes it owns directly."""
  out = []

  def visit(scope, owned):
    for child in ast.iter_child_nodes(scope):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = [child]
        out.append(inner)
        visit(child, inner)
      else:
        owned.append(child)
        visit(child, owned)

  module = [tree]
  out.append(module)
  visit(tree, module)
  return out


def scan(source: str, name: str) -> list[Read]:
  """Every run-config read in `source` (file `name`)."""
  tree = ast.parse(source)
  parents = {}
  for node in ast.walk(tree):
    for child in ast.iter_child_nodes(node):
      parents[child] = node
  reads = []
  for owned in _scopes(tree):
    chains = []  # (root, attrs, top node)
    for node in owned:
      root = _root(node)
      if root is None:
        continue
      attrs, top = _chain(node, parents)
      if attrs:
        chains.append((root, attrs, top))
    configs = {
        r
        for r, attrs, _ in chains
        if r in CONFIG_ROOTS and attrs[0] in TOP_SECTIONS
    }
    prefixes = {r: () for r in configs}
    prefixes.update({r: p for r, p in SECTION_PARAMS.items()})
    for node in owned:  # x = cfg.<section> (also a, b = cfg.x, ...)
      if isinstance(node, ast.Assign) and len(node.targets) == 1:
        pairs = [(node.targets[0], node.value)]
        if isinstance(node.targets[0], ast.Tuple) and isinstance(
            node.value, ast.Tuple
        ):
          pairs = zip(node.targets[0].elts, node.value.elts)
        for target, value in pairs:
          path = _path_of(value, prefixes)
          if (
              isinstance(target, ast.Name)
              and path
              and ".".join(path) in SECTIONS
          ):
            prefixes[target.id] = path
    for root, attrs, top in chains:
      if root not in prefixes:
        continue
      path = prefixes[root] + tuple(attrs)
      where = f"{name}:{top.lineno}"
      if path[-1] == "get":
        reads.append(
            Read(where, path[:-1] + (_get_key(top, parents),), get=True)
        )
      else:
        reads.append(Read(where, path))
  return reads


def _path_of(node, prefixes):
  """The config path of an expression `cfg.a.b` (None if it is not one)."""
  attrs = []
  while isinstance(node, ast.Attribute):
    if _root(node) in prefixes:
      return prefixes[_root(node)] + tuple(reversed(attrs))
    attrs.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name) and node.id in prefixes:
    return prefixes[node.id] + tuple(reversed(attrs))
  return None


def unknown_key(read: Read) -> str | None:
  """The first dotted key of `read` no config holds, else None."""
  prefix = ""
  for i, attr in enumerate(read.path):
    if attr is None:  # .get(<not a literal>)
      return f"{prefix}<non-literal key>"
    key = prefix + attr
    if key in LEAVES:
      return None  # what follows reads the value (str methods, ...)
    if key in SECTIONS:
      prefix = key + "."
      continue
    if attr in METHODS and not (read.get and i == len(read.path) - 1):
      return None
    return key
  return None


def _library_files():
  for top in SCANNED:
    for path in sorted(
        glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True)
    ):
      yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


@pytest.fixture(scope="module")
def library_reads():
  reads = []
  for rel, path in _library_files():
    with open(path) as f:
      reads += scan(f.read(), rel)
  return reads


def test_the_scan_sees_the_library_read_its_configs(library_reads):
  # A guard on the scan itself: it must see the reads it exists to check.
  paths = {r.path for r in library_reads}
  assert ("train", "lr") in paths and ("rollout", "engine") in paths
  assert ("algo", "credit_mode") in paths  # through algo_cfg
  assert ("train", "updates_per_step") in paths  # through t = cfg.train
  assert len(library_reads) > 300


def test_every_key_the_library_reads_exists_in_the_base_config(library_reads):
  missing = sorted(
      {f"{r.where}: {unknown_key(r)}" for r in library_reads if unknown_key(r)}
  )
  assert not missing, (
      "config keys no config in configs/ holds (add them to configs/base.py"
      " or fix the name):\n" + "\n".join(missing)
  )


def test_no_get_with_a_default_on_config_sections(library_reads):
  gets = sorted(
      f"{r.where}: .get({r.path[-1]!r})"
      for r in library_reads
      if r.get and not _exempt(r.where.split(":")[0])
  )
  assert not gets, (
      "read config keys directly (cfg.section.key): the base config owns"
      " every default:\n" + "\n".join(gets)
  )


def _exempt(path: str) -> bool:
  return any(
      path == e or e.endswith("/") and path.startswith(e) for e in GET_EXEMPT
  )


def test_the_scan_catches_a_typo_and_a_get():
  source = """
def f(cfg):
  lr = cfg.train.lr
  t = cfg.train
  return lr * t.lerning_rate + cfg.rollout.get("temprature", 1.0)


def g(algo_cfg):
  return algo_cfg.gae_gama


def h(cfg):
  return cfg.hidden_size  # a model config: not read as a run config
"""
  reads = scan(source, "x.py")
  assert sorted(unknown_key(r) for r in reads if unknown_key(r)) == [
      "algo.gae_gama",
      "rollout.temprature",
      "train.lerning_rate",
  ]
  assert [r.where for r in reads if r.get] == ["x.py:5"]
