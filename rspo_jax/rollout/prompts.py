"""Prompts shown to the agent each turn, and parsing of its replies.

Shape follows verl-agent (``agent_system/environments/prompts/`` and the
environment managers): the first step shows the task, the current
observation and the admissible actions; a later step adds how many steps were
already taken, the last ``history_length`` turns as
``[Observation i: '...', Action i: '...']`` (numbered from 1) and "You are now
at step k". Every prompt ends by asking for reasoning in ``<think> </think>``
and one action in ``<action> </action>``. With ``history_length <= 0`` later
steps use the first-step template, as in verl-agent.

Per environment, a ``PromptSpec`` holds the pieces that differ: the task
line, how the admissible actions are listed, the history entry, how an
observation is shown, a reasoning hint. The built-in environments' specs are
verl-agent's; a user environment (``env.name=package.module:Class``) sets
the class attribute ``prompt_spec`` or gets the defaults (``PromptSpec()``).

Reply parsing (verl-agent's ``alfworld_projection`` / ``webshop_projection``):
the action is the text between the *first* ``<action>`` and the next
``</action>`` (tags matched case-insensitively), stripped and lower-cased.
  * no tags, empty content, or nested ``<action>`` -> ``(reply, False)``: the
    raw reply goes to the environment unchanged (it changes nothing there);
  * tags present but ``<think>``/``</think>`` missing (or, for ALFWorld, CJK
    characters in the reply) -> ``(action, False)``: verl-agent still sends
    the extracted action but marks the step invalid.
An invalid step is penalised by ``INVALID_ACTION_PENALTY`` in the rollout.

Prompt length: ``build_prompt_ids`` renders with the chat template and, past
``max_prompt_tokens``, first drops history entries oldest-first (down to the
first-step template), then left-truncates the token ids.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Sequence

INVALID_ACTION_PENALTY = -0.1
HISTORY_LENGTH = 2  # verl-agent's default window

_CHOOSE = (
    "Now it is your turn to choose one action for the current step.\n"
    "First reason step by step about the current situation{goal}. This "
    "reasoning MUST be enclosed within <think> </think> tags.\n"
    "Then pick one admissible action for the current step and give it "
    "within <action> </action> tags.\n"
)
_FIRST = "Your current observation is: {observation}\n"
_LATER = (
    "Prior to this step, you have already taken {step_count} step(s). Below "
    "are the most recent {n_history} observation(s) and the action(s) you "
    "took:\n{history}\n"
    "You are now at step {current_step} and your current observation is: "
    "{observation}\n"
)


def quoted_list(actions: Sequence[str]) -> str:
  """``'a', 'b'`` (the toy and default action list)."""
  return ", ".join(f"'{a}'" for a in actions)


def same_observation(observation: str, task: str) -> str:
  del task
  return observation


@dataclasses.dataclass(frozen=True)
class PromptSpec:
  """One environment's prompt pieces (verl-agent's templates by default).

  A user environment (``env.name=package.module:Class``) may set the class
  attribute ``prompt_spec = PromptSpec(...)`` with any of these; the rest
  keep the defaults below. docs/custom_env.md shows one.

  Attributes:
    intro: the task line; ``{task}`` and ``{env}`` (the class's ``name``)
      are filled.
    actions: introduces the admissible actions; ``{actions}`` is filled with
      ``format_actions(admissible_actions)``.
    goal: text added to "reason step by step about the current situation"
      ('' = nothing).
    history_entry: one entry of the history window; ``{i}`` (the step's
      number, from 1), ``{observation}`` and ``{action}`` are filled.
    format_actions: admissible actions -> the text between the brackets.
    format_observation: ``(observation, task) -> text``, for the current
      observation and the ones in the history window.
    reject_cjk: a reply with CJK characters is an invalid action.
  """

  intro: str = (
      "You are an expert agent acting in the {env} environment. "
      "Your task is to: {task}\n"
  )
  actions: str = (
      "Your admissible actions in the current situation are: " "[{actions}].\n"
  )
  goal: str = ""
  history_entry: str = (
      "[Observation {i}: '{observation}', " "Action {i}: '{action}']"
  )
  format_actions: Callable[[Sequence[str]], str] = quoted_list
  format_observation: Callable[[str, str], str] = same_observation
  reject_cjk: bool = False


def format_webshop_observation(observation: str, task: str) -> str:
  """verl-agent's WebShop view: the ``[SEP]`` parts after the instruction,
  each quoted; the raw text if the instruction is not among the parts."""
  parts = observation.split(" [SEP] ")
  if task not in parts:
    return observation
  rest = parts[parts.index(task) + 1 :]
  return " [SEP] ".join(f"'{p}'" for p in rest)


# The built-in environments' prompts, as verl-agent writes them.
_SPECS = {
    "alfworld": PromptSpec(
        intro="You are an expert agent acting in the ALFRED household text "
        "environment. Your task is to: {task}\n",
        # verl-agent hides 'help'
        format_actions=lambda actions: "\n ".join(
            f"'{a}'" for a in actions if a != "help"
        ),
        reject_cjk=True,  # verl-agent's alfworld_projection does this
    ),
    "webshop": PromptSpec(
        intro="You are an expert autonomous agent shopping in the WebShop "
        "e-commerce environment.\nYour task is to: {task}.\n",
        actions="Your admissible actions in the current situation are:\n"
        "[\n{actions}\n].\n",
        goal=", then about which admissible action best advances the "
        "shopping goal",
        format_actions=lambda actions: "\n".join(f"'{a}'," for a in actions),
        format_observation=format_webshop_observation,
    ),
    "toy": PromptSpec(
        intro="You are an agent on a number line. Your task is to: {task}.\n",
    ),
    "spell": PromptSpec(
        intro="You type a hidden word, one letter a turn. Your task is to:"
        " {task}.\n",
    ),
}
ENV_NAMES = tuple(_SPECS)


@functools.lru_cache(maxsize=None)
def spec_for(env_name: str) -> tuple[PromptSpec, str]:
  """``(spec, display name)`` of a built-in name or a user environment's
  import path (its class's ``prompt_spec``, else the defaults)."""
  if env_name in _SPECS:
    return _SPECS[env_name], env_name
  from third_party_envs import registry

  if not registry.is_import_path(env_name):
    raise ValueError(
        f"unknown env_name {env_name!r}; known: "
        f"{list(ENV_NAMES)} or an import path "
        "'package.module:ClassName'"
    )
  cls = registry.env_class(env_name)
  spec = getattr(cls, "prompt_spec", None) or PromptSpec()
  if not isinstance(spec, PromptSpec):
    raise ValueError(
        f"{env_name}.prompt_spec is {type(spec).__name__}, "
        "expected rspo_jax.rollout.prompts.PromptSpec"
    )
  name = getattr(cls, "name", "base")
  return spec, (cls.__name__ if name == "base" else name)


def build_prompt(
    env_name: str,
    task: str,
    observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[tuple[str, str]],
    step_idx: int,
    history_length: int = HISTORY_LENGTH,
) -> str:
  """The user message for step ``step_idx`` (0-based) of an episode.

  Args:
    env_name: 'alfworld', 'webshop', 'toy' or a user environment's import
      path (its ``PromptSpec``, see ``spec_for``).
    task: the task / instruction text.
    observation: the current observation text.
    admissible_actions: actions valid now.
    history: ``(observation, action)`` of earlier steps, oldest first; the
      last one is step ``step_idx - 1`` (it may hold only the recent ones).
    step_idx: steps already taken.
    history_length: how many earlier steps to show.
  """
  spec, display_name = spec_for(env_name)
  if step_idx < 0 or len(history) > step_idx:
    raise ValueError(
        f"step_idx={step_idx} must be >= 0 and >= len(history)={len(history)}"
    )
  window = list(history[-history_length:]) if history_length > 0 else []
  observation = spec.format_observation(observation, task)
  text = spec.intro.format(task=task, env=display_name)
  if step_idx == 0 or history_length <= 0:
    text += _FIRST.format(observation=observation)
  else:
    first = step_idx - len(window) + 1  # number of the oldest shown step
    entries = "\n".join(
        spec.history_entry.format(
            i=first + j,
            observation=spec.format_observation(obs, task),
            action=act,
        )
        for j, (obs, act) in enumerate(window)
    )
    text += _LATER.format(
        step_count=step_idx,
        n_history=len(window),
        history=entries,
        current_step=step_idx + 1,
        observation=observation,
    )
  text += spec.actions.format(actions=spec.format_actions(admissible_actions))
  return text + "\n" + _CHOOSE.format(goal=spec.goal)


# ------------------------------------------------------------------ tokens


def render_chat(tokenizer, user_text: str) -> list[int]:
  """Token ids of one user turn under the tokenizer's chat template, with
  the assistant generation prompt appended."""
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("the tokenizer has no chat_template")
  text = tokenizer.apply_chat_template(
      [{"role": "user", "content": user_text}],
      tokenize=False,
      add_generation_prompt=True,
  )
  # The template already wrote the special tokens: add none.
  return list(tokenizer.encode(text, add_special_tokens=False))


def truncate_prompt(ids: Sequence[int], max_len: int) -> tuple[list[int], bool]:
  """Keeps the last ``max_len`` ids (left truncation, as verl does):
  the generation prompt and current observation survive."""
  if max_len < 1:
    raise ValueError(f"max_len must be >= 1, got {max_len}")
  ids = list(ids)
  if len(ids) <= max_len:
    return ids, False
  return ids[-max_len:], True


def build_prompt_ids(
    tokenizer,
    env_name: str,
    task: str,
    observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[tuple[str, str]],
    step_idx: int,
    *,
    max_prompt_tokens: int,
    history_length: int = HISTORY_LENGTH,
) -> tuple[list[int], int, bool]:
  """``build_prompt`` + ``render_chat`` within ``max_prompt_tokens``.

  Returns:
    (ids, n_truncated_history, truncated): ids of at most
    ``max_prompt_tokens``; how many history entries were dropped from the
    window to fit; whether the ids were left-truncated on top of that.
  """
  shown = min(max(history_length, 0), len(history))
  for h in range(shown, -1, -1):
    text = build_prompt(
        env_name,
        task,
        observation,
        admissible_actions,
        history,
        step_idx,
        history_length=h,
    )
    ids = render_chat(tokenizer, text)
    if len(ids) <= max_prompt_tokens:
      return ids, shown - h, False
  ids, truncated = truncate_prompt(ids, max_prompt_tokens)
  return ids, shown, truncated


# ----------------------------------------------------------------- parsing

_OPEN = re.compile(re.escape("<action>"), re.IGNORECASE)
_CLOSE = re.compile(re.escape("</action>"), re.IGNORECASE)
_CJK = re.compile("[\u4e00-\u9fff]")


def parse_action(reply, env_name: str = "") -> tuple[str, bool]:
  """``(action, valid)`` from a model reply (rules in the module docstring).

  Linear time in ``len(reply)``; ``bytes`` are decoded as UTF-8 with
  replacement characters.
  """
  if isinstance(reply, (bytes, bytearray)):
    reply = bytes(reply).decode("utf-8", errors="replace")
  if not isinstance(reply, str):
    raise ValueError(f"reply must be str or bytes, got {type(reply).__name__}")
  opened = _OPEN.search(reply)
  closed = _CLOSE.search(reply, opened.end()) if opened else None
  if closed is None:
    return reply, False
  content = reply[opened.end() : closed.start()]
  action = content.strip().lower()
  if not action or _OPEN.search(content):
    return reply, False
  valid = "<think>" in reply and "</think>" in reply
  if _CJK.search(reply) and _rejects_cjk(env_name):
    valid = False
  return action, valid


def _rejects_cjk(env_name: str) -> bool:
  """The environment's ``reject_cjk``; False for a name that is neither a
  built-in nor an import path (parsing needs no environment)."""
  if env_name in _SPECS:
    return _SPECS[env_name].reject_cjk
  from third_party_envs import registry

  return registry.is_import_path(env_name) and spec_for(env_name)[0].reject_cjk
