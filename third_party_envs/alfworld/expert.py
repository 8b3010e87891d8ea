"""Full-knowledge expert for the six ALFWorld task types, read off PDDL facts.

fast-downward (the engine's ``policy_commands``) needs from 0.1 s to minutes
per plan on a furnished kitchen, so the adapter plans with this expert and
keeps the stock planner for cross-checks (``tw.plan``). Like ALFWorld's
hand-coded expert it knows the task types; unlike it, it reads the true state
(where every object is), so its plan is as short as the planner's:

  goal  = ALFWorld goal-library predicate for the task's pddl_params;
  plan  = argmin over target objects o, receptacles r (and drop spots for a
          held non-target object) of the command count of
          [drop held] -> fetch o -> [go to tool, clean/heat/cool o]
          -> go to r, [open r], move o to r        (pick / clean / heat / cool)
          two fetch-and-place legs into one r      (pick_two)
          fetch o -> go to a desk lamp, [use lamp]  (look_at_obj_in_light)
where ``go to x`` costs 0 when the agent already stands at x and ``open x``
0 when x is open or not openable. Commands use the demangled names the game
shows (``take egg 1 from countertop 2``).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Optional

_TOOLS = {
    "pick_clean_then_place_in_recep": ("sinkbasintype", "isclean", "clean"),
    "pick_heat_then_place_in_recep": ("microwavetype", "ishot", "heat"),
    "pick_cool_then_place_in_recep": ("fridgetype", "iscool", "cool"),
}


# The predicates World.from_facts reads.
_READ = frozenset(
    (
        "atlocation",
        "holds",
        "receptacleatlocation",
        "inreceptacle",
        "objecttype",
        "receptacletype",
        "openable",
        "opened",
        "isclean",
        "ishot",
        "iscool",
        "istoggled",
        "cancontain",
    )
)


@dataclasses.dataclass
class World:
  """The parts of a PDDL state the expert needs (ids are PDDL names)."""

  agent_loc: str
  holding: Optional[str]
  recep_loc: dict  # receptacle -> location
  obj_recep: dict  # object -> receptacle it is in (absent when held)
  otype: dict  # object -> 'eggtype'
  rtype: dict  # receptacle -> 'countertoptype'
  openable: set
  opened: set
  props: dict  # predicate -> set of objects (isclean, ishot, istoggled...)
  can_contain: set  # (rtype, otype)

  @classmethod
  def from_facts(cls, facts) -> "World":
    args = collections.defaultdict(list)
    for fact in facts:
      if fact.name in _READ:  # the others (~40 % of a room's) go unread
        args[fact.name].append(tuple(v.name for v in fact.arguments))
    holds = [o for _, o in args["holds"]]
    return cls(
        agent_loc=args["atlocation"][0][1],
        holding=holds[0] if holds else None,
        recep_loc=dict(args["receptacleatlocation"]),
        obj_recep=dict(args["inreceptacle"]),
        otype=dict(args["objecttype"]),
        rtype=dict(args["receptacletype"]),
        openable={r for (r,) in args["openable"]},
        opened={r for (r,) in args["opened"]},
        props={
            p: {o for (o,) in args[p]}
            for p in ("isclean", "ishot", "iscool", "istoggled")
        },
        can_contain=set(args["cancontain"]),
    )

  def of_rtype(self, rtype: str) -> list[str]:
    return sorted(r for r, t in self.rtype.items() if t == rtype)

  def of_otype(self, otype: str) -> list[str]:
    return sorted(o for o, t in self.otype.items() if t == otype)


class _Plan:
  """A command list being built, tracking location, hands and objects."""

  def __init__(self, world: World, names: dict):
    self.w, self.names, self.loc = world, names, world.agent_loc
    self.cmds: list[str] = []
    self.opened = set(world.opened)
    self.holding = world.holding
    self.where = dict(world.obj_recep)

  def n(self, pddl_id: str) -> str:
    return self.names[pddl_id]

  def go(self, r: str) -> "_Plan":
    if self.w.recep_loc[r] != self.loc:
      self.cmds.append(f"go to {self.n(r)}")
      self.loc = self.w.recep_loc[r]
    return self

  def open(self, r: str) -> "_Plan":
    if r in self.w.openable and r not in self.opened:
      self.cmds.append(f"open {self.n(r)}")
      self.opened.add(r)
    return self

  def fetch(self, o: str) -> "_Plan":
    """Ends holding ``o`` (hands must be empty unless they hold ``o``)."""
    if self.holding == o:
      return self
    r = self.where.pop(o)
    self.go(r).open(r).cmds.append(f"take {self.n(o)} from {self.n(r)}")
    self.holding = o
    return self

  def put(self, r: str) -> "_Plan":
    o = self.holding
    self.go(r).open(r).cmds.append(f"move {self.n(o)} to {self.n(r)}")
    self.where[o], self.holding = r, None
    return self

  def use(self, verb: str, r: str) -> "_Plan":
    """``clean/heat/cool <held> with r`` at r."""
    self.go(r).cmds.append(f"{verb} {self.n(self.holding)} with {self.n(r)}")
    return self

  def copy(self) -> "_Plan":
    out = _Plan(self.w, self.names)
    out.loc, out.cmds, out.opened = self.loc, list(self.cmds), set(self.opened)
    out.holding, out.where = self.holding, dict(self.where)
    return out


def _type_key(name: str) -> str:
  return name.lower() + "type"


def _bases(w: World, names: dict, keep: str) -> list[_Plan]:
  """Starting plans: as is when hands are empty or hold ``keep``, else one
  per receptacle that can take the held object."""
  base = _Plan(w, names)
  if w.holding is None or w.holding == keep:
    return [base]
  held_t = w.otype[w.holding]
  spots = [r for r in w.recep_loc if (w.rtype[r], held_t) in w.can_contain]
  return [base.copy().put(r) for r in spots]


def _best(plans) -> Optional[list[str]]:
  if not plans:
    return None
  return min(plans, key=lambda p: (len(p.cmds), p.cmds)).cmds


def _single(w, names, params, task_type) -> Optional[list[str]]:
  targets = w.of_otype(_type_key(params["object_target"]))
  parents = w.of_rtype(_type_key(params["parent_target"]))
  tool = _TOOLS.get(task_type)
  done_prop = w.props[tool[1]] if tool else set()
  for o in targets:  # goal already holds?
    if w.obj_recep.get(o) in parents and (tool is None or o in done_prop):
      return []
  plans = []
  for o in targets:
    for base in _bases(w, names, keep=o):
      p = base.fetch(o)
      if tool is not None and o not in done_prop:
        options = [p.copy().use(tool[2], t) for t in w.of_rtype(tool[0])]
        if not options:
          continue
        p = min(options, key=lambda q: (len(q.cmds), q.cmds))
      plans += [
          p.copy().put(r)
          for r in parents
          if (w.rtype[r], w.otype[o]) in w.can_contain
      ]
  return _best(plans)


def _two(w, names, params) -> Optional[list[str]]:
  targets = w.of_otype(_type_key(params["object_target"]))
  parents = w.of_rtype(_type_key(params["parent_target"]))
  plans = []
  for r in parents:
    inside = [o for o in targets if w.obj_recep.get(o) == r]
    if len(inside) >= 2:
      return []
    others = [o for o in targets if o not in inside]
    for seq in itertools.permutations(others, 2 - len(inside)):
      for p in _bases(w, names, keep=seq[0]):
        for o in seq:
          p = p.fetch(o).put(r)
        plans.append(p)
  return _best(plans)


def _look(w, names, params) -> Optional[list[str]]:
  targets = w.of_otype(_type_key(params["object_target"]))
  lamps = w.of_otype(_type_key(params["toggle_target"]))
  plans = []
  for lamp in lamps:
    lr = w.obj_recep.get(lamp)
    if lr is None:
      continue
    toggled = lamp in w.props["istoggled"]
    use_lamp = f"use {names[lamp]}"
    for o in targets:
      for base in _bases(w, names, keep=o):
        for lamp_first in (False, True) if not toggled else (False,):
          p = base.copy()
          if lamp_first:
            p.go(lr).cmds.append(use_lamp)
          p.fetch(o).go(lr)
          if not toggled and not lamp_first:
            p.cmds.append(use_lamp)
          plans.append(p)
  return _best(plans)


def expert_plan(facts, names: dict, traj: dict) -> Optional[list[str]]:
  """Shortest command list reaching the goal from ``facts``; [] when the
  goal holds, None when it cannot be reached.

  Args:
    facts: the engine's current facts (``state['_facts']``).
    names: PDDL id -> shown name (``{k: info.name for entity infos}``).
    traj: ``traj_data`` with ``task_type`` and ``pddl_params``.
  """
  w = World.from_facts(facts)
  task_type, params = traj["task_type"], traj["pddl_params"]
  if task_type == "look_at_obj_in_light":
    lamps = w.of_otype(_type_key(params["toggle_target"]))
    held = w.holding
    if (
        held
        and w.otype[held] == _type_key(params["object_target"])
        and any(
            l in w.props["istoggled"]
            and w.recep_loc.get(w.obj_recep.get(l)) == w.agent_loc
            for l in lamps
        )
    ):
      return []
    return _look(w, names, params)
  if task_type == "pick_two_obj_and_place":
    return _two(w, names, params)
  if task_type in ("pick_and_place_simple",) or task_type in _TOOLS:
    return _single(w, names, params, task_type)
  raise ValueError(f"unsupported task type {task_type!r}")
