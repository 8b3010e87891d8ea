"""A searching expert: ALFWorld's six task types played from the text alone.

Unlike ``expert.py`` (which reads where every object is), this expert is a
policy over what the agent has been shown: the task sentence, the current
observation, the admissible commands and the earlier (observation, action)
pairs. Its only other knowledge is the game's public rules (ALFWorld's
``gen/constants.py``: which receptacle types can hold which object types;
desk lamps stand on desks, side tables and dressers).

  goal      = (kind, obj, recep, toggle) parsed from the task sentence with
              ALFWorld's goal templates (``gen/goal_library.py``);
  here      = the receptacle the last feedback names ("You arrive at R",
              "You open the R", "You pick up the o from the R", ...);
  held      = x for an admissible ``examine x`` with x != here;
  order(S)  = the receptacles of S (the ``go to`` targets and ``here``) by
              type name, then number (cabinet 1, 2, ..., 10, countertop 1);
  next(S)   = the first r of order(S) after ``here``, wrapping around.

  not holding obj:  take obj k from here    if admissible (here not a
                                            goal receptacle), smallest k;
                    open here               if closed and here is searched;
                    go to next(S_obj)       S_obj = types that can hold obj,
                                            minus the goal receptacle type;
  holding obj:      look: use toggle k if admissible, else go to next(lamp
                    holders);  clean / heat / cool (not yet done in the
                    history): <verb> obj with R if admissible, else go to
                    the first tool receptacle;  then place: move obj to
                    here if here is a goal receptacle (open it first when
                    closed), else go to the first goal receptacle.

Before each command it states what it sees or pursues (``next_thought``:
'mug 1 is here', 'mug is not here', 'desklamp 2 is here', 'heat egg with
microwave', 'put mug in shelf'), which the warm start writes as the reply's
``<think>`` text.

Every decision but the clean / heat / cool "done yet" test reads only the
current observation and admissible commands (and, after ``use``, the last
history entry), so the policy's prompt (history window 2) holds what the
expert used. Nothing here touches the engine's state.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional, Sequence

from alfworld.gen import constants
from alfworld.gen import goal_library

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# clean / heat / cool: (verb, tool receptacle type)
TOOLS = {
    "pick_clean_then_place_in_recep": ("clean", "sinkbasin"),
    "pick_heat_then_place_in_recep": ("heat", "microwave"),
    "pick_cool_then_place_in_recep": ("cool", "fridge"),
}
LAMP_HOLDERS = ("desk", "dresser", "sidetable")  # where desk lamps stand
_PLACES = re.compile(
    r"You (?:arrive at|open the|close the) ([a-z]+ \d+)\."
    r"|You pick up the [a-z]+ \d+ from the ([a-z]+ \d+)\."
    r"|You move the [a-z]+ \d+ to the ([a-z]+ \d+)\."
    r"|You (?:clean|heat|cool) the [a-z]+ \d+ using the ([a-z]+ \d+)\."
)


@dataclasses.dataclass(frozen=True)
class Goal:
  kind: str  # one of TASK_TYPES
  obj: str  # 'spraybottle'
  recep: str = ""  # 'garbagecan' ("" for look_at_obj_in_light)
  toggle: str = ""  # 'desklamp' (look_at_obj_in_light only)


@functools.lru_cache(maxsize=1)
def _task_patterns() -> tuple:
  out = []
  for kind in TASK_TYPES:
    for template in goal_library.gdict[kind]["templates"]:
      regex = re.escape(template)
      for field in ("obj", "recep", "toggle"):
        regex = regex.replace(
            re.escape("{" + field + "}"), f"(?P<{field}>[a-z]+)"
        )
      out.append((kind, re.compile(regex + r"\.?")))
  return tuple(out)


def parse_task(task: str) -> Goal:
  """The goal a task sentence states ('put some spraybottle on garbagecan.'
  -> Goal('pick_and_place_simple', 'spraybottle', 'garbagecan'))."""
  text = task.strip().lower()
  for kind, pattern in _task_patterns():
    m = pattern.fullmatch(text)
    if m:
      return Goal(kind, **m.groupdict())
  raise ValueError(f"not a task sentence of {TASK_TYPES}: {task!r}")


@functools.lru_cache(maxsize=None)
def _holder_types(obj: str) -> frozenset:
  """Receptacle types (lower case) that can hold objects of type ``obj``."""
  return frozenset(
      r.lower()
      for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items()
      if obj in {o.lower() for o in objs}
  )


def kind_of(name: str) -> str:
  """'cabinet 3' -> 'cabinet'."""
  return name.rsplit(" ", 1)[0]


def location(observation: str, history: Sequence[tuple[str, str]] = ()):
  """The receptacle the agent stands at, read off the latest feedback that
  names one (None in the middle of the room)."""
  for obs in [observation] + [o for o, _ in reversed(history)]:
    m = _PLACES.search(obs)
    if m:
      return next(g for g in m.groups() if g)
    if "Welcome to TextWorld" in obs:
      return None
  return None


def place_key(name: str) -> tuple[str, int]:
  """'cabinet 10' -> ('cabinet', 10): by type, then number (cabinet 2
  before cabinet 10)."""
  kind, _, number = name.rpartition(" ")
  return kind, int(number)


def _after(names, here: Optional[str]) -> Optional[str]:
  """The first of ``names`` in ``place_key`` order after ``here`` (wrapping
  around), never ``here`` itself."""
  order = sorted(set(names) - {here}, key=place_key)
  if not order:
    return None
  return next(
      (r for r in order if here is None or place_key(r) > place_key(here)),
      order[0],
  )


def _held(admissible: Sequence[str], here: Optional[str]) -> list[str]:
  """What the agent holds: x for each admissible ``examine x``, x != here."""
  return sorted(
      a[len("examine ") :]
      for a in admissible
      if a.startswith("examine ") and a[len("examine ") :] != here
  )


def _done(
    goal: Goal,
    held_obj: str,
    observation: str,
    history: Sequence[tuple[str, str]],
) -> bool:
  """Whether the held object was cleaned / heated / cooled already."""
  verb = TOOLS[goal.kind][0]
  return any(
      f"You {verb} the {held_obj} using" in o
      for o in [observation] + [o for o, _ in history]
  )


def _takes(
    goal: Goal, admissible: Sequence[str], here: Optional[str]
) -> list[str]:
  """The admissible ``take <obj> k from here`` (none at a goal
  receptacle), smallest k first."""
  if not here or kind_of(here) == goal.recep:
    return []
  return sorted(
      a
      for a in admissible
      if re.fullmatch(rf"take {goal.obj} \d+ from {re.escape(here)}", a)
  )


def _uses(goal: Goal, admissible: Sequence[str]) -> list[str]:
  """The admissible ``use <toggle> k``, smallest k first."""
  return sorted(
      a for a in admissible if re.fullmatch(rf"use {goal.toggle} \d+", a)
  )


def _seen(thing: str, found: Optional[str]) -> str:
  """'mug 1 is here' / 'mug is not here': the searched thing first."""
  return f"{found} is here" if found else f"{thing} is not here"


def next_thought(
    task: str,
    observation: str,
    admissible: Sequence[str],
    history: Sequence[tuple[str, str]] = (),
) -> str:
  """What the expert states before acting: while searching, whether the
  thing it searches is here, the thing named first; then its sub-goal.

    not holding obj          '<obj> k is here' (it takes it) or
                             '<obj> is not here' (it opens or moves on)
    look, holding obj        '<toggle> k is here' (it uses it) or
                             '<toggle> is not here'
    clean / heat / cool,     '<verb> <obj> with <tool>'
      holding obj, not done
    else                     'put <obj> in <recep>'
  """
  goal = parse_task(task)
  here = location(observation, history)
  held_obj = next(
      (h for h in _held(admissible, here) if kind_of(h) == goal.obj), None
  )
  if held_obj is None:
    takes = _takes(goal, admissible, here)
    return _seen(
        goal.obj, takes[0].split(" from ")[0][len("take ") :] if takes else None
    )
  if goal.kind == "look_at_obj_in_light":
    uses = _uses(goal, admissible)
    return _seen(goal.toggle, uses[0][len("use ") :] if uses else None)
  if goal.kind in TOOLS and not _done(goal, held_obj, observation, history):
    verb, tool = TOOLS[goal.kind]
    return f"{verb} {goal.obj} with {tool}"
  return f"put {goal.obj} in {goal.recep}"


def next_action(
    task: str,
    observation: str,
    admissible: Sequence[str],
    history: Sequence[tuple[str, str]] = (),
) -> Optional[str]:
  """The searching expert's command (module docstring); None when it has
  nothing to do (e.g. its rules do not cover the state)."""
  goal = parse_task(task)
  adm = set(admissible)
  here = location(observation, history)
  places = [a[len("go to ") :] for a in admissible if a.startswith("go to ")]
  places += [here] if here else []
  held = _held(admissible, here)
  held_obj = next((h for h in held if kind_of(h) == goal.obj), None)

  def go_first(kind: str) -> Optional[str]:
    if here and kind_of(here) == kind:
      return None
    target = _after([p for p in places if kind_of(p) == kind], None)
    return f"go to {target}" if target else None

  if held_obj is None:
    if held:  # a stray object in hand: the expert never takes one
      return None
    takes = _takes(goal, admissible, here)
    if takes:
      return takes[0]
    searched = [
        p
        for p in places
        if kind_of(p) in _holder_types(goal.obj) and kind_of(p) != goal.recep
    ]
    if here in searched and f"open {here}" in adm:
      return f"open {here}"
    target = _after(searched, here)
    return f"go to {target}" if target else None

  if goal.kind == "look_at_obj_in_light":
    uses = _uses(goal, admissible)
    if uses:
      return uses[0]
    target = _after([p for p in places if kind_of(p) in LAMP_HOLDERS], here)
    return f"go to {target}" if target else None

  if goal.kind in TOOLS:
    verb, tool = TOOLS[goal.kind]
    if not _done(goal, held_obj, observation, history):
      if here and kind_of(here) == tool:
        command = f"{verb} {held_obj} with {here}"
        if command in adm:
          return command
        return f"open {here}" if f"open {here}" in adm else None
      return go_first(tool)

  if here and kind_of(here) == goal.recep:
    command = f"move {held_obj} to {here}"
    if command in adm:
      return command
    return f"open {here}" if f"open {here}" in adm else None
  return go_first(goal.recep)
