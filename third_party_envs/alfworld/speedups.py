"""Output-preserving speed-ups for textworld's PDDL engine (opt-in, global).

textworld re-does pure work all the time. Per step it derives every
admissible command's text from its template again (re-parsing the template
with tatsu, deep-copying symbols and the entity infos of every derivation
context, sorting a signature's facts again for every query, copying the
list of all facts once per command); per ``load`` it re-parses the game's
whole PDDL domain + grammar text; per ``load`` + ``reset`` it builds the
initial state twice (reading ~1,400 atoms back from downward and parsing
each) and translates the PDDL problem to SAS four times.
``install()`` memoises the pure functions and makes copies structural:

  * ``textgen._parse_and_convert(text)``: cached symbols, copied per call
    (derivation mutates symbols' contexts);
  * ``textgen.deepcopy`` (``Symbol.copy``, ``ContextSensitiveGrammar.
    replace``): ``_copy_symbols``, a structural copy of symbol trees
    (``copy.deepcopy``, same memo, for anything else);
  * ``textgen.copy_context``: new dicts for ``variables``/``mapping`` whose
    values (entity infos, variables) derivation only reads;
  * ``Rule.parse_conjunctive_query(text)`` (via ``logic._parse_and_convert``):
    cached ``Rule`` (only read afterwards);
  * ``pddl_logic._parse_and_convert(text)`` (``GameLogic``'s parse of a
    game's ``grammar`` field: actions, templates, grammar rules): the last
    64 kept in memory and, given ``sas_cache_dir``, all on disk, copied per
    call (``_GameLogicParses``);
  * ``State._all_applicable_assignments``: ``sorted(facts of a signature)``
    read from a cache keyed by the facts' frozenset (Propositions are
    totally ordered: the sorted list is a function of the set);
  * ``PddlEnv._gather_infos``: one list of the facts for the derivation
    contexts of all admissible commands (derivation passes
    ``context['facts']`` along and never reads it), and each command's text
    looked up when the game derived it before from the same template, the
    same values of the placeholders the template reads and the same facts
    of the predicates it queries (``_template_reads``, ``_Game``);
  * ``PddlEnv.load`` / ``reset``: ``reset`` right after ``load`` uses the
    initial state ``load`` built, and the intro text is derived once per
    game (``_reset``);
  * ``PddlState.__init__``: the initial facts (downward's state read back
    and parsed atom by atom) looked up per game (``_InitialFacts``);
  * ``fast_downward.pddl2sas(domain, problem)``: translations kept in a
    small LRU and, given ``sas_cache_dir``, on disk, so a reset of a game
    seen before skips the translator (see ``_Translations``).

A game new to the process is then read from disk (its parse in ~0.2 ms, its
translation in ~10 ms for a kitchen); one of the last 64 it played is not.

Entity infos (the names the game shows) are taken as fixed from the first
``reset`` after ``load`` on, as ALFWorld's wrappers leave them. Observations,
admissible commands, facts, wins and plans are unchanged
(``tests/alfworld_test.py`` compares transcripts with and without).
``uninstall()`` restores the originals.
"""

# pylint: disable=protected-access

from __future__ import annotations

import ast
import collections
import copy
import dataclasses
import hashlib
import itertools
import os
import pickle
import tempfile
import threading
import zlib
from typing import Optional

import fast_downward
import textworld
import textworld.core as tw_core
import textworld.logic as tw_logic
from textworld.utils import check_flag
from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl import pddl as tw_pddl
from textworld.envs.pddl import textgen

_ORIG = {}
_LOCK = threading.Lock()


def _memo(orig, copy_out=None):
  """``orig(text, **kwargs)`` cached; callers get ``copy_out(cached)``
  (the cached object itself when None)."""
  cache = {}

  def parse(text, **kwargs):
    key = (text, tuple(sorted(kwargs.items())))
    if key not in cache:
      cache[key] = orig(text, **kwargs)
    return cache[key] if copy_out is None else copy_out(cache[key])

  return parse


_SYMBOL_TYPES = frozenset(
    (
        textgen.TerminalSymbol,
        textgen.NonterminalSymbol,
        textgen.EvalSymbol,
        textgen.ListSymbol,
        textgen.ConditionalSymbol,
    )
)


def _copy_symbols(x, memo=None):
  """``copy.deepcopy(x)`` for textgen's symbol trees, done structurally.

  Lists, textgen symbols (attributes: strings, None, symbols, context
  dicts) and dicts are rebuilt here, with deepcopy's memo (an object met
  twice is copied once); strings and None are kept (immutable); anything
  else goes to ``copy.deepcopy`` with the same memo.
  """
  if memo is None:
    memo = {}
  if x is None or type(x) is str:  # pylint: disable=unidiomatic-typecheck
    return x
  done = memo.get(id(x))
  if done is not None:
    return done
  kind = type(x)
  if kind is list:
    out = []
    memo[id(x)] = out
    out.extend(_copy_symbols(v, memo) for v in x)
  elif kind in _SYMBOL_TYPES:
    out = object.__new__(kind)
    memo[id(x)] = out
    out.__dict__.update(
        (k, _copy_symbols(v, memo)) for k, v in x.__dict__.items()
    )
  elif kind is dict:
    out = {}
    memo[id(x)] = out
    out.update(
        (copy.deepcopy(k, memo), _copy_symbols(v, memo)) for k, v in x.items()
    )
  else:
    return copy.deepcopy(x, memo)
  return out


class _SortedFacts:
  """``sorted(facts)`` for a set of Propositions, cached by its frozenset
  (cleared when it holds ``size`` sets)."""

  def __init__(self, size: int = 4096):
    self.size, self.cache = size, {}

  def __call__(self, facts):
    if len(facts) < 2:
      return list(facts)
    key = frozenset(facts)
    out = self.cache.get(key)
    if out is None:
      if len(self.cache) >= self.size:
        self.cache.clear()
      out = self.cache[key] = tuple(sorted(key))
    return out


_SORTED_FACTS = _SortedFacts()


def _all_applicable_assignments(
    self, rule, mapping, used_vars, new_phs_by_depth, depth
):
  """``textworld.logic.State._all_applicable_assignments`` with its
  ``sorted(self.facts_with_signature(signature))`` read from
  ``_SORTED_FACTS``; otherwise line for line the original."""
  new_phs = new_phs_by_depth[depth]
  if depth >= len(rule.preconditions):
    yield from self._all_assignments(new_phs, mapping, used_vars, False)
    return
  pred = rule.preconditions[depth]
  types = [self._logic.types.get(t) for t in pred.signature.types]
  for subtypes in self._logic.types.multi_subtypes(types):
    signature = tw_logic.Signature(
        pred.signature.name, [t.name for t in subtypes]
    )
    for prop in _SORTED_FACTS(self.facts_with_signature(signature)):
      for ph, var in zip(pred.parameters, prop.arguments):
        existing = mapping.get(ph)
        if existing is None:
          if var in used_vars:
            break
          mapping[ph] = var
          used_vars.add(var)
        elif existing != var:
          break
      else:
        yield from self._all_applicable_assignments(
            rule, mapping, used_vars, new_phs_by_depth, depth + 1
        )
      for ph in new_phs:  # the mapping as it was before this fact
        var = mapping.pop(ph, None)
        used_vars.discard(var)


_LIST_RULES = ("list_empty", "list_separator", "list_last_separator")
_DERIVE_LOCALS = frozenset(("self", "context"))  # EvalSymbol.derive's own


@dataclasses.dataclass(frozen=True)
class _Reads:
  """What deriving a command template reads besides its text: the state's
  facts of predicates ``predicates``, the mapping's values of the
  placeholders named ``names`` (``{eval}`` names and query placeholders),
  and, unless every placeholder of ``queried`` is bound by the action's
  mapping, the whole mapping (an unbound one is matched against facts and
  must differ from every mapped value)."""

  predicates: frozenset
  names: frozenset
  queried: frozenset  # Placeholders of all queries and conditions


def _template_reads(grammar, template: str) -> Optional[_Reads]:
  """``_Reads`` of ``template`` under ``grammar``, or None when it cannot
  be told (an ``{eval}`` naming derive's locals, an unknown rule).

  Walks the parsed symbols: ``{eval}`` reads the names in its expression;
  ``{x | query}`` and a rule's condition read the facts of their
  conjuncts' predicates and their placeholders; ``[list]`` derives its
  symbol and may insert the ``list_*`` rules; ``#rule#`` derives any of
  its productions. Entity infos (``{r.name}``) are read too: they are the
  game's, fixed from ``load`` on.
  """
  predicates, names, queried, seen = set(), set(), set(), set()

  def query(text: str) -> None:
    rule = tw_logic.Rule.parse_conjunctive_query(text)
    predicates.update(pred.name for pred in rule.preconditions)
    queried.update(rule.placeholders)
    names.update(ph.name for ph in rule.placeholders)

  def rule(name: str) -> bool:
    if name in seen:
      return True
    seen.add(name)
    productions = grammar._rules.get(name)
    if not productions:
      return False
    for production in productions:
      if production.condition:
        query(production.condition)
      if not all(map(walk, production.rhs)):
        return False
    return True

  def walk(symbol) -> bool:
    kind = type(symbol)
    if kind is textgen.TerminalSymbol:
      return True
    if kind is textgen.EvalSymbol:
      try:
        tree = ast.parse(symbol.expression.strip(), mode="eval")
      except SyntaxError:
        return False
      used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
      names.update(used)
      return not used & _DERIVE_LOCALS
    if kind is textgen.ListSymbol:
      return walk(symbol.symbol) and all(map(rule, _LIST_RULES))
    if kind is textgen.ConditionalSymbol:
      if symbol.given:
        query(symbol.given)
      return walk(symbol.expression)
    if kind is textgen.NonterminalSymbol:
      return rule(str(symbol))
    return False

  symbols = textgen._parse_and_convert(template, rule_name="symbols")
  if not all(map(walk, symbols)):
    return None
  return _Reads(frozenset(predicates), frozenset(names), frozenset(queried))


def _frozen(value):
  return tuple(value) if isinstance(value, list) else value


class _Game:
  """What derivations of one game's texts share, across loads and
  engines: the game is its PDDL domain, grammar and problem text and its
  entity infos (names as the wrappers set them); ``texts`` holds derived
  command templates, ``(template, the mapping's items it reads, token of
  the facts it reads) -> text``, ``intro`` the first feedback."""

  _LIVE: "collections.OrderedDict" = collections.OrderedDict()
  SIZE = 64  # games kept
  MAX_TOKENS = 1024  # fact sets numbered per game

  def __init__(self):
    self.texts, self.tokens, self.reads = {}, {}, {}
    self.numbers = itertools.count()
    self.intro: Optional[str] = None

  @classmethod
  def of(cls, env) -> "_Game":
    """The game ``env`` has loaded (looked up once per ``load``)."""
    bound = env.__dict__.get("_speedups_game")
    if (
        bound is not None
        and bound[0] is env._logic
        and bound[1] is env._entity_infos
    ):
      return bound[2]
    data = env._game_data
    key = (
        data["pddl_domain"],
        data["grammar"],
        data["pddl_problem"],
        tuple(
            sorted(
                (
                    k,
                    tuple(
                        _frozen(getattr(info, slot)) for slot in info.__slots__
                    ),
                )
                for k, info in env._entity_infos.items()
            )
        ),
    )
    with _LOCK:
      game = cls._LIVE.get(key)
      if game is None:
        game = cls._LIVE[key] = cls()
        while len(cls._LIVE) > cls.SIZE:
          cls._LIVE.popitem(last=False)
      cls._LIVE.move_to_end(key)
    env._speedups_game = (env._logic, env._entity_infos, game)
    return game

  def template_reads(self, grammar, template: str) -> Optional[_Reads]:
    if template not in self.reads:
      self.reads[template] = _template_reads(grammar, template)
    return self.reads[template]

  def token(self, pddl_state, predicates: frozenset) -> int:
    """A number for the state's facts of ``predicates`` (equal sets of
    facts, equal numbers, never reused: texts and tokens are dropped
    together once ``MAX_TOKENS`` sets were met, as templates querying
    changing facts would have them grow)."""
    facts = frozenset(
        fact
        for sig, group in pddl_state._facts.items()
        if sig.name in predicates
        for fact in group
    )
    token = self.tokens.get((predicates, facts))
    if token is None:
      if len(self.tokens) >= self.MAX_TOKENS:
        self.texts.clear()
        self.tokens.clear()
      token = self.tokens[predicates, facts] = next(self.numbers)
    return token

  def key(self, env, template: str, mapping: dict, tokens: dict):
    """The key of deriving ``template`` for ``mapping`` in ``env``'s
    state (None: do not cache); ``tokens`` holds that state's tokens by
    predicates, for its other commands."""
    pddl_state = env._pddl_state
    reads = self.template_reads(env._logic.grammar, template)
    if reads is None:
      return None
    if reads.predicates not in tokens:
      tokens[reads.predicates] = self.token(pddl_state, reads.predicates)
    if reads.queried.issubset(mapping):
      items = tuple(
          (ph, v) for ph, v in mapping.items() if ph.name in reads.names
      )
    else:
      items = tuple(mapping.items())
    return template, items, tokens[reads.predicates]


def _gather_infos(self):
  """``PddlEnv._gather_infos`` with one list of the facts for all the
  derivation contexts (the original builds one per admissible command) and
  each command template's derivation looked up (``_Game``) when the
  template, the action's mapping and the facts it queries were seen
  before in this game; otherwise line for line the original."""
  pddl_state = self._pddl_state
  self.state["command_templates"] = sorted(
      set(action.template for action in self._logic.actions.values())
  )
  self.state["won"] = pddl_state.check_goal()
  self.state["lost"] = False
  self.state["_entity_infos"] = dict(self._entity_infos)
  self.state["_facts"] = list(pddl_state.facts)
  if self.request_infos.facts:
    self.state["facts"] = list(
        map(self._get_human_readable_fact, self.state["_facts"])
    )
  self.state["last_action"] = None
  self.state["_last_action"] = self._last_action
  self.state["_valid_actions"] = list(pddl_state.all_applicable_actions())

  mapping = {k: info.name for k, info in self._entity_infos.items()}
  facts = list(self.state["_facts"])
  game, tokens = _Game.of(self), {}
  self.state["_valid_commands"] = []
  for action in self.state["_valid_actions"]:
    template = action.command_template
    key = game.key(self, template, action.mapping, tokens)
    derived = game.texts.get(key)
    if derived is None:
      context = {
          "state": pddl_state,
          "facts": facts,
          "variables": {
              ph.name: self._entity_infos[var.name]
              for ph, var in action.mapping.items()
          },
          "mapping": action.mapping,
          "entity_infos": self._entity_infos,
      }
      derived = self._logic.grammar.derive(template, context)
      if key is not None:
        game.texts[key] = derived
    action.command_template = derived
    self.state["_valid_commands"].append(action.format_command(mapping))
  self.state["admissible_commands"] = sorted(set(self.state["_valid_commands"]))
  if self.request_infos.moves:
    self.state["moves"] = self._moves
  if self.request_infos.policy_commands:
    self.state["policy_commands"] = pddl_state.replan(self._entity_infos)


def _load(self, filename_or_data) -> None:
  """``PddlEnv.load``, noting the PddlState it built (``_reset``)."""
  _ORIG["load"](self, filename_or_data)
  self._speedups_loaded = (self._pddl_state, self.__dict__.get("state"))


def _reset(self):
  """``PddlEnv.reset``, less two repeats: the PddlState that ``load`` just
  built is the game's initial state and has loaded its SAS into the
  planner, so it is used when nothing happened since (the original builds
  and loads another), and the intro text, a function of the game
  (``_Game``), is derived once. Otherwise line for line the original."""
  loaded = self.__dict__.pop("_speedups_loaded", None)
  if (
      loaded is None
      or loaded[0] is not self._pddl_state
      or loaded[1] is not self.__dict__.get("state")
  ):
    self._pddl_state = pddl_logic.PddlState(
        self.downward_lib, self._game_data["pddl_problem"], self._logic
    )
  self.prev_state = None
  self.state = tw_core.GameState()
  self._last_action = None
  self._moves = 0
  game = _Game.of(self)
  if game.intro is None:
    context = {
        "state": self._pddl_state,
        "facts": list(self._pddl_state.facts),
        "variables": {},
        "mapping": {},
        "entity_infos": self._entity_infos,
    }
    game.intro = self._logic.grammar.derive("#intro#", context)
  self.state.feedback = game.intro
  self.state.raw = self.state.feedback
  self._gather_infos()
  if "walkthrough" in self.request_infos.extras:
    self.state["extra.walkthrough"] = (
        self.walkthrough or self._pddl_state.replan(self._entity_infos)
    )
  return self.state


def _atom_to_proposition(atom, name2type):
  """``PddlState.__init__``'s ``_atom2proposition``, verbatim."""
  if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
    if atom.predicate == "=":
      return None
    return tw_logic.Proposition(
        atom.predicate,
        [tw_logic.Variable(arg, name2type[arg]) for arg in atom.args],
    )
  elif isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
    if atom.fluent.symbol == "total-cost":
      return None
    name = "{}".format(atom.expression.value)
    if str.isdigit(name):  # Discard distance relations.
      return None
    return tw_logic.Proposition(
        name,
        [tw_logic.Variable(arg, name2type[arg]) for arg in atom.fluent.args],
    )
  return None


class _InitialFacts:
  """A game's initial facts as ``PddlState.__init__`` adds them (the PDDL
  task's ``init`` atoms, then downward's initial state read back with
  ``get_state`` and parsed atom by atom, negations dropped): a function of
  the PDDL domain and problem, kept for the ``size`` last games."""

  def __init__(self, size: int = 64):
    self.size, self.cache = size, collections.OrderedDict()

  def __call__(self, pddl_state, domain: str, problem: str):
    key = (domain, problem)
    with _LOCK:
      if key in self.cache:
        self.cache.move_to_end(key)
        return self.cache[key]
    name2type = pddl_state.name2type
    task_facts = tuple(
        filter(
            None,
            (
                _atom_to_proposition(atom, name2type)
                for atom in pddl_state.task.init
            ),
        )
    )
    lib = pddl_state.downward_lib
    atoms = (pddl_logic.Atom * lib.get_state_size())()
    lib.get_state(atoms)
    state_facts = tuple(
        fact
        for fact in (atom.get_fact(name2type) for atom in atoms)
        if not fact.is_negation
    )
    with _LOCK:
      self.cache[key] = task_facts, state_facts
      while len(self.cache) > self.size:
        self.cache.popitem(last=False)
    return task_facts, state_facts


_INITIAL_FACTS = _InitialFacts()


def _pddl_state_init(self, downward_lib, pddl_problem: str, logic):
  """``PddlState.__init__`` with the initial facts looked up
  (``_InitialFacts``: reading downward's state back and parsing its ~1,400
  atoms were 3/4 of the time); otherwise line for line the original."""
  self._facts = collections.defaultdict(set)
  self._vars_by_name = {}
  self._vars_by_type = collections.defaultdict(set)
  self._var_counts = collections.Counter()
  self._logic = logic
  self.downward_lib = downward_lib
  self.pddl_problem = pddl_problem
  verbose = check_flag("TW_PDDL_DEBUG")
  self.task, self.sas = fast_downward.pddl2sas(
      logic.domain, pddl_problem, verbose=verbose
  )
  _, self.sas_replan = fast_downward.pddl2sas(
      logic.domain, pddl_problem, verbose=verbose, optimize=True
  )
  self._actions = {a.name: a for a in self.task.actions}
  for type_ in self.task.types:
    try:
      type_ = tw_logic.Type(type_.name, type_.supertype_names)
      self._logic.types.add(type_)
    except ValueError:
      pass
  self.downward_lib.load_sas(self.sas.encode("utf-8"))
  self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
  self.name2type = {o.name: o.type_name for o in self.task.objects}
  task_facts, state_facts = _INITIAL_FACTS(self, logic.domain, pddl_problem)
  self.add_facts(task_facts)
  self.add_facts(state_facts)


def _copy_pddl_parse(parsed):
  """A copy of ``pddl_logic._parse_and_convert``'s ``(actions, grammar)``
  as ``copy.deepcopy`` makes it: actions hold strings only, production
  rules strings, a weight and symbol trees (``_copy_symbols``)."""
  actions, grammar = parsed
  grammar_copy = textgen.ContextSensitiveGrammar()
  for rules in grammar._rules.values():
    for rule in rules:
      grammar_copy.add_rule(
          textgen.ProductionRule(
              rule.lhs, _copy_symbols(rule.rhs), rule.weight, rule.condition
          )
      )
  return {k: copy.copy(a) for k, a in actions.items()}, grammar_copy


class _DiskCache:
  """An LRU of ``size`` entries in memory in front of zlib-compressed
  pickles on disk (under ``cache_dir``, when set), keyed by a hex digest."""

  def __init__(self, cache_dir: Optional[str] = None, size: int = 8):
    self.cache_dir, self.size = cache_dir, size
    self.mem = collections.OrderedDict()

  def _path(self, key: str) -> str:
    return os.path.join(self.cache_dir, key[:2], key + ".pkl.z")

  def get(self, key: str, make):
    """The entry of ``key``: from memory, else from disk, else ``make()``
    (then stored in both)."""
    with _LOCK:
      if key in self.mem:
        self.mem.move_to_end(key)
        return self.mem[key]
    out = None
    if self.cache_dir and os.path.exists(self._path(key)):
      try:
        with open(self._path(key), "rb") as f:
          out = pickle.loads(zlib.decompress(f.read()))
      except Exception:  # pylint: disable=broad-except
        out = None  # a torn or stale file: make it again
    if out is None:
      out = make()
      if self.cache_dir:
        self._store(key, out)
    with _LOCK:
      self.mem[key] = out
      while len(self.mem) > self.size:
        self.mem.popitem(last=False)
    return out

  def _store(self, key, out) -> None:
    path = self._path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      f.write(zlib.compress(pickle.dumps(out, protocol=5), 6))
    os.replace(tmp, path)


class _Translations(_DiskCache):
  """``fast_downward.pddl2sas`` memoised in memory (LRU) and on disk.

  Disk entries are zlib-compressed pickles of ``(task, sas)`` keyed by
  sha256(domain, problem, optimize): a furnished kitchen translates in
  ~1 s of CPU and unpickles in ~10 ms. With ``share_replan`` the
  ``optimize=True`` translation (only fast-downward's ``replan`` uses it)
  is the plain one: loading halves, the stock planner still works but
  searches much longer, so turn it off to use that planner.
  """

  def __init__(self, orig, cache_dir=None, share_replan=True, size=8):
    super().__init__(cache_dir, size)
    self.orig, self.share_replan = orig, share_replan

  def __call__(self, domain, problem, verbose=False, optimize=False):
    optimize = bool(optimize) and not self.share_replan
    key = hashlib.sha256(
        f"{optimize}\0{domain}\0{problem}".encode()
    ).hexdigest()
    return self.get(
        key,
        lambda: self.orig(domain, problem, verbose=verbose, optimize=optimize),
    )


class _GameLogicParses(_DiskCache):
  """``pddl_logic._parse_and_convert`` (``GameLogic``'s tatsu parse of a
  game's ``grammar`` field, ~13 ms) memoised for the last 64 games and on
  disk next to the translations (unpickling takes ~0.2 ms); each caller
  gets a copy (``_copy_pddl_parse``)."""

  def __init__(self, orig, cache_dir=None, size=64):
    super().__init__(cache_dir, size)
    self.orig = orig

  def __call__(self, text, **kwargs):
    key = hashlib.sha256(
        f"GameLogic parse\0{textworld.__version__}\0"
        f"{sorted(kwargs.items())}\0{text}".encode()
    ).hexdigest()
    return _copy_pddl_parse(self.get(key, lambda: self.orig(text, **kwargs)))


def _shallow_copy_context(context):
  return {
      "state": context["state"],
      "facts": context["facts"],
      "variables": dict(context["variables"]),
      "mapping": dict(context["mapping"]),
      "entity_infos": context["entity_infos"],
  }


def installed() -> bool:
  return bool(_ORIG)


def install(
    sas_cache_dir: Optional[str] = None, share_replan: Optional[bool] = None
) -> None:
  """Patches textworld/fast_downward in this process.

  Idempotent; a later call only updates ``sas_cache_dir`` (translations
  and GameLogic parses on disk) and ``share_replan`` (default True) where
  given: the settings are per process, the last one wins (see
  ``_Translations``).
  """
  if _ORIG:
    if share_replan is not None:
      fast_downward.pddl2sas.share_replan = share_replan
    if sas_cache_dir:
      fast_downward.pddl2sas.cache_dir = sas_cache_dir
      pddl_logic._parse_and_convert.cache_dir = sas_cache_dir
    return
  _ORIG["textgen_parse"] = textgen._parse_and_convert
  _ORIG["logic_parse"] = tw_logic._parse_and_convert
  _ORIG["pddl_parse"] = pddl_logic._parse_and_convert
  _ORIG["pddl2sas"] = fast_downward.pddl2sas
  _ORIG["copy_context"] = textgen.copy_context
  _ORIG["deepcopy"] = textgen.deepcopy
  _ORIG["assignments"] = tw_logic.State._all_applicable_assignments
  _ORIG["gather_infos"] = tw_pddl.PddlEnv._gather_infos
  _ORIG["load"] = tw_pddl.PddlEnv.load
  _ORIG["state_init"] = pddl_logic.PddlState.__init__
  _ORIG["reset"] = tw_pddl.PddlEnv.reset
  textgen._parse_and_convert = _memo(_ORIG["textgen_parse"], _copy_symbols)
  tw_logic._parse_and_convert = _memo(_ORIG["logic_parse"])
  pddl_logic._parse_and_convert = _GameLogicParses(
      _ORIG["pddl_parse"], cache_dir=sas_cache_dir
  )
  fast_downward.pddl2sas = _Translations(
      _ORIG["pddl2sas"],
      cache_dir=sas_cache_dir,
      share_replan=share_replan is not False,
  )
  textgen.copy_context = _shallow_copy_context
  textgen.deepcopy = _copy_symbols
  tw_logic.State._all_applicable_assignments = _all_applicable_assignments
  tw_pddl.PddlEnv._gather_infos = _gather_infos
  tw_pddl.PddlEnv.load = _load
  pddl_logic.PddlState.__init__ = _pddl_state_init
  tw_pddl.PddlEnv.reset = _reset


def uninstall() -> None:
  """Restores the original functions."""
  if not _ORIG:
    return
  textgen._parse_and_convert = _ORIG.pop("textgen_parse")
  tw_logic._parse_and_convert = _ORIG.pop("logic_parse")
  pddl_logic._parse_and_convert = _ORIG.pop("pddl_parse")
  fast_downward.pddl2sas = _ORIG.pop("pddl2sas")
  textgen.copy_context = _ORIG.pop("copy_context")
  textgen.deepcopy = _ORIG.pop("deepcopy")
  tw_logic.State._all_applicable_assignments = _ORIG.pop("assignments")
  tw_pddl.PddlEnv._gather_infos = _ORIG.pop("gather_infos")
  tw_pddl.PddlEnv.load = _ORIG.pop("load")
  pddl_logic.PddlState.__init__ = _ORIG.pop("state_init")
  tw_pddl.PddlEnv.reset = _ORIG.pop("reset")
