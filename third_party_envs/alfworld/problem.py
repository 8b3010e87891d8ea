"""PDDL problem text for one ALFWorld game, in ALFWorld's own format.

Mirrors what ALFWorld's ``augment_pddl_states.py`` writes for a THOR scene
(``initial_state.pddl``): typed objects, receptacles and locations, then the
facts ``receptacleType, objectType, canContain, pickupable,
isReceptacleObject, openable, atLocation, cleanable, heatable, coolable,
toggleable, sliceable, inReceptacle, objectAtLocation, receptacleAtLocation``
and the goal from the wheel's goal library (``alfworld/gen/goal_library.py``)
with ``{obj}``/``{recep}``/``{toggle}`` filled in. Names go through the same
character escapes as ALFWorld (``|`` -> ``_bar_``, ``-`` -> ``_minus_``,
``.`` -> ``_dot_``, ``+`` -> ``_plus_``, and ``#`` -> ``-`` for typing).
"""

from __future__ import annotations

import dataclasses
import re

from alfworld.gen import constants
from alfworld.gen import goal_library

from third_party_envs.alfworld import scenes

AGENT = "agent1"
_ESCAPES = {
    "-": "_minus_",
    "#": "-",
    "|": "_bar_",
    "+": "_plus_",
    ".": "_dot_",
    ",": "_comma_",
}
_ESCAPE_RE = re.compile("|".join(re.escape(k) for k in _ESCAPES))
_OTYPES = sorted(constants.OBJECTS_SET - scenes.STATIC_RECEPTACLES)
_RTYPES = sorted(scenes.STATIC_RECEPTACLES)


def escape(text: str) -> str:
  """ALFWorld's ``fix_pddl_str_chars`` (all replacements in one pass)."""
  return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], text)


@dataclasses.dataclass(frozen=True)
class PlacedObject:
  id: str  # ALFRED object id
  type: str
  receptacle: scenes.Receptacle


@dataclasses.dataclass(frozen=True)
class TaskParams:
  """``traj_data['pddl_params']`` of ALFRED; '' where a slot is unused."""

  task_type: str
  object_target: str
  parent_target: str = ""
  toggle_target: str = ""
  mrecep_target: str = ""
  object_sliced: bool = False

  def as_pddl_params(self) -> dict:
    return {
        "object_target": self.object_target,
        "parent_target": self.parent_target,
        "toggle_target": self.toggle_target,
        "mrecep_target": self.mrecep_target,
        "object_sliced": self.object_sliced,
    }


def goal_pddl(params: TaskParams) -> str:
  """The goal-library PDDL for ``params`` (ends by closing the define)."""
  if params.task_type not in goal_library.gdict:
    raise ValueError(f"unknown task type {params.task_type!r}")
  return goal_library.gdict[params.task_type]["pddl"].format(
      obj=params.object_target,
      recep=params.parent_target,
      toggle=params.toggle_target,
      mrecep=params.mrecep_target,
  )


def problem_pddl(
    problem_name: str,
    scene: scenes.Scene,
    objects: list[PlacedObject],
    agent_loc: str,
    params: TaskParams,
) -> str:
  """The full PDDL problem text (see module docstring)."""
  receptacles = scene.receptacles
  locs = sorted({r.loc for r in receptacles} | {agent_loc})
  present = {o.type for o in objects}
  val = constants.VAL_ACTION_OBJECTS
  lines = [
      f"(define (problem plan_{problem_name})",
      "(:domain alfred)",
      "(:objects",
      f"{AGENT} # agent",
  ]
  lines += [f"{t}Type # otype" for t in _OTYPES]
  lines += [f"{t}Type # rtype" for t in _RTYPES]
  lines += [f"{o.id} # object" for o in objects]
  lines += [f"{r.id} # receptacle" for r in receptacles]
  lines += [f"{loc} # location" for loc in locs]
  lines += [")", "(:init"]
  init = []
  init += [f"(receptacleType {r.id} {r.type}Type)" for r in receptacles]
  init += [f"(objectType {o.id} {o.type}Type)" for o in objects]
  for rtype in sorted({r.type for r in receptacles}):
    holdable = constants.VAL_RECEPTACLE_OBJECTS.get(rtype, set())
    init += [
        f"(canContain {rtype}Type {t}Type)" for t in sorted(holdable & present)
    ]
  init += [
      f"(pickupable {o.id})" for o in objects if o.type in scenes.PICKUPABLE
  ]
  init += [
      f"(isReceptacleObject {o.id})"
      for o in objects
      if o.type in constants.MOVABLE_RECEPTACLES_SET
  ]
  init += [
      f"(openable {r.id})"
      for r in receptacles
      if r.type in constants.OPENABLE_CLASS_SET
  ]
  init.append(f"(atLocation {AGENT} {agent_loc})")
  for prop, key in (
      ("cleanable", "Cleanable"),
      ("heatable", "Heatable"),
      ("coolable", "Coolable"),
      ("toggleable", "Toggleable"),
      ("sliceable", "Sliceable"),
  ):
    init += [f"({prop} {o.id})" for o in objects if o.type in val[key]]
  init += [f"(inReceptacle {o.id} {o.receptacle.id})" for o in objects]
  init += [f"(objectAtLocation {o.id} {o.receptacle.loc})" for o in objects]
  init += [f"(receptacleAtLocation {r.id} {r.loc})" for r in receptacles]
  lines += ["        " + fact for fact in init]
  lines.append(")")
  text = "\n".join(lines) + "\n" + goal_pddl(params)
  return "\n" + escape(text)
