"""ALFRED floor plans as text-world scenes, read from the alfworld wheel.

The wheel ships, for each of its 120 floor plans, ``FloorPlanN-objects.json``
(the object and receptacle types in the room), ``FloorPlanN-openable.json``
(ALFRED receptacle ids, e.g. ``Sink|-01.90|+00.97|-01.50|SinkBasin``, with
the agent pose ``[x, z, rotation, horizon]`` to use them from) and
``FloorPlanN-layout.npy`` (the navigable ``(x, z)`` grid points, 0.25 m
apart). A ``Scene`` keeps the static receptacles of a floor plan with their
ids and a unique navigation location each; receptacle types the room has but
the openable file lacks (stove burners, toasters, ...) get ALFRED-style ids
placed next to a navigable point. All of it depends on the floor plan only,
so every task in a room sees the same furniture.

Locations follow ALFRED's planner: ``loc|X|Z|R|H`` with ``X = round(x/0.25)``,
``Z = round(z/0.25)``, ``R = rotation/90`` and ``H`` the camera horizon.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random

import numpy as np

from alfworld.gen import constants

LAYOUT_DIR = os.path.join(os.path.dirname(constants.__file__), "layouts")
STEP = constants.AGENT_STEP_SIZE  # 0.25 m grid
STATIC_RECEPTACLES = frozenset(
    constants.RECEPTACLES - constants.MOVABLE_RECEPTACLES_SET
)
# Pickable objects: everything some receptacle may hold (sliced parts aside).
PICKUPABLE = frozenset(
    o
    for objs in constants.VAL_RECEPTACLE_OBJECTS.values()
    for o in objs
    if o in constants.OBJECTS_SET
)
LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser")  # where desk lamps stand
# Instances made up for receptacle types the openable file does not list.
_SYNTH_COUNT = {"StoveBurner": 4, "Cabinet": 3, "Drawer": 3, "Shelf": 2}
_SYNTH_HEIGHT = {
    "StoveBurner": 0.92,
    "Toaster": 0.90,
    "CoffeeMachine": 0.90,
    "GarbageCan": 0.0,
    "Toilet": 0.0,
    "LaundryHamper": 0.0,
    "Ottoman": 0.0,
    "TowelHolder": 1.10,
    "HandTowelHolder": 1.60,
    "ToiletPaperHanger": 0.70,
    "Shelf": 0.80,
    "Drawer": 0.40,
    "Cabinet": 0.40,
    "SinkBasin": 0.90,
    "Safe": 0.0,
}


def room_type(scene_num: int) -> str:
  for name, nums in constants.SCENE_TYPE.items():
    if scene_num in nums:
      return name
  raise ValueError(f"scene {scene_num} is not an ALFRED floor plan")


def fmt_coord(v: float) -> str:
  """ALFRED id coordinate: '+00.68', '-02.20', '00.00'."""
  v = round(v, 2)
  sign = "+" if v > 0 else ("-" if v < 0 else "")
  return f"{sign}{abs(v):05.2f}"


def make_id(obj_type: str, xyz) -> str:
  """ALFRED object id, e.g. ``Apple|-01.75|+00.97|-00.52``; basins get the
  ``Sink|...|SinkBasin`` form ALFWorld's demangler names 'sinkbasin'."""
  coords = "|".join(fmt_coord(c) for c in xyz)
  if obj_type in ("SinkBasin", "BathtubBasin"):
    return f"{obj_type[:-len('Basin')]}|{coords}|{obj_type}"
  return f"{obj_type}|{coords}"


def id_type(obj_id: str) -> str:
  parts = obj_id.split("|")
  return parts[-1] if len(parts) == 5 else parts[0]


def id_xyz(obj_id: str) -> tuple[float, float, float]:
  parts = obj_id.split("|")
  return tuple(float(p) for p in parts[1:4])


def loc_name(x_cells: int, z_cells: int, rot: int, horizon: int) -> str:
  return f"loc|{x_cells}|{z_cells}|{rot}|{horizon}"


@dataclasses.dataclass(frozen=True)
class Receptacle:
  id: str  # ALFRED object id
  type: str  # e.g. 'CounterTop'
  loc: str  # navigation location, unique within the scene
  xyz: tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class Scene:
  num: int  # ALFRED floor plan number
  room: str  # Kitchen / LivingRoom / Bedroom / Bathroom
  object_types: frozenset[str]  # every type listed in objects.json
  receptacles: tuple[Receptacle, ...]
  nav_points: np.ndarray  # [n, 2] navigable (x, z) in metres

  @property
  def receptacle_types(self) -> frozenset[str]:
    return frozenset(r.type for r in self.receptacles)

  @property
  def pickupable_types(self) -> tuple[str, ...]:
    return tuple(sorted(self.object_types & PICKUPABLE))

  def of_type(self, rtype: str) -> list[Receptacle]:
    return [r for r in self.receptacles if r.type == rtype]


def available_scenes() -> tuple[int, ...]:
  nums = []
  for name in os.listdir(LAYOUT_DIR):
    if name.startswith("FloorPlan") and name.endswith("-objects.json"):
      nums.append(int(name[len("FloorPlan") : -len("-objects.json")]))
  return tuple(sorted(nums))


def _read(scene_num: int, suffix: str):
  path = os.path.join(LAYOUT_DIR, f"FloorPlan{scene_num}-{suffix}")
  if not os.path.exists(path):
    raise ValueError(f"no layout file {path} for scene {scene_num}")
  if suffix.endswith(".npy"):
    return np.load(path)
  with open(path) as f:
    return json.load(f)


def _unique_loc(used: set, x: int, z: int, rot: int, horizon: int) -> str:
  """A location name not in ``used``; collisions shift the horizon by 15
  degrees so that 'go to X' always names one receptacle."""
  name = loc_name(x, z, rot, horizon)
  while name in used:
    horizon += 15
    name = loc_name(x, z, rot, horizon)
  used.add(name)
  return name


@functools.lru_cache(maxsize=None)
def load_scene(scene_num: int) -> Scene:
  """The static part of floor plan ``scene_num`` (deterministic)."""
  object_types = frozenset(_read(scene_num, "objects.json"))
  openable = _read(scene_num, "openable.json")
  nav = np.asarray(_read(scene_num, "layout.npy"), dtype=np.float64)
  rng = random.Random(f"alfworld-scene:{scene_num}")
  used_locs: set = set()
  receptacles = []
  for obj_id in sorted(openable):
    rtype = id_type(obj_id)
    if rtype not in STATIC_RECEPTACLES:
      continue
    x, z, rot, horizon = openable[obj_id]
    loc = _unique_loc(
        used_locs,
        round(x / STEP),
        round(z / STEP),
        round(rot / 90) % 4,
        int(horizon),
    )
    receptacles.append(Receptacle(obj_id, rtype, loc, id_xyz(obj_id)))
  listed = {r.type for r in receptacles}
  for rtype in sorted((object_types & STATIC_RECEPTACLES) - listed):
    for _ in range(_SYNTH_COUNT.get(rtype, 1)):
      px, pz = nav[rng.randrange(len(nav))]
      rot = rng.randrange(4)
      dx, dz = [(0, 1), (1, 0), (0, -1), (-1, 0)][rot]  # THOR: 0 deg = +z
      xyz = (
          px + 0.5 * dx + rng.uniform(-0.2, 0.2),
          _SYNTH_HEIGHT.get(rtype, 0.5) + rng.uniform(0.0, 0.1),
          pz + 0.5 * dz + rng.uniform(-0.2, 0.2),
      )
      horizon = 0 if xyz[1] > 1.2 else 30
      loc = _unique_loc(
          used_locs, round(px / STEP), round(pz / STEP), rot, horizon
      )
      receptacles.append(Receptacle(make_id(rtype, xyz), rtype, loc, xyz))
  ids = [r.id for r in receptacles]
  if len(set(ids)) != len(ids):
    raise RuntimeError(f"duplicate receptacle ids in scene {scene_num}")
  return Scene(
      num=scene_num,
      room=room_type(scene_num),
      object_types=object_types,
      receptacles=tuple(receptacles),
      nav_points=nav,
  )
