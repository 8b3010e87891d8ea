"""Tests of rollout prompts (snapshots, token budgets) and action parsing."""

import hypothesis
from hypothesis import strategies as st
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers
import transformers

from rspo_jax.rollout import prompts

_CHOOSE = (
    "\n"
    "Now it is your turn to choose one action for the current step.\n"
    "First reason step by step about the current situation{goal}. This "
    "reasoning MUST be enclosed within <think> </think> tags.\n"
    "Then pick one admissible action for the current step and give it "
    "within <action> </action> tags.\n"
)
_ALF_INTRO = (
    "You are an expert agent acting in the ALFRED household text "
    "environment. Your task is to: put a mug in the sink\n"
)


# --------------------------------------------------------------- snapshots


def test_alfworld_first_step_snapshot():
  text = prompts.build_prompt(
      "alfworld",
      "put a mug in the sink",
      "You are in the kitchen.",
      ["go to sink 1", "help", "look"],
      [],
      0,
  )
  assert text == (
      _ALF_INTRO + "Your current observation is: You are in the kitchen.\n"
      "Your admissible actions in the current situation are: "
      "['go to sink 1'\n 'look'].\n" + _CHOOSE.format(goal="")
  )


def test_alfworld_later_step_shows_last_two_numbered():
  history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
  text = prompts.build_prompt(
      "alfworld",
      "put a mug in the sink",
      "You see a sink.",
      ["look"],
      history,
      3,
  )
  assert text == (
      _ALF_INTRO
      + "Prior to this step, you have already taken 3 step(s). Below are "
      "the most recent 2 observation(s) and the action(s) you took:\n"
      "[Observation 2: 'o2', Action 2: 'a2']\n"
      "[Observation 3: 'o3', Action 3: 'a3']\n"
      "You are now at step 4 and your current observation is: "
      "You see a sink.\n"
      "Your admissible actions in the current situation are: ['look'].\n"
      + _CHOOSE.format(goal="")
  )
  # Only the recent entries given: same numbering, same text.
  assert text == prompts.build_prompt(
      "alfworld",
      "put a mug in the sink",
      "You see a sink.",
      ["look"],
      history[1:],
      3,
  )


def test_history_window_sizes():
  history = [("o1", "a1"), ("o2", "a2")]
  one = prompts.build_prompt("toy", "t", "now", ["inc"], history, 2, 1)
  assert "most recent 1 observation(s)" in one
  assert "[Observation 2: 'o2', Action 2: 'a2']\nYou are now at step 3" in one
  assert "Observation 1" not in one
  none = prompts.build_prompt("toy", "t", "now", ["inc"], history, 2, 0)
  assert none == prompts.build_prompt("toy", "t", "now", ["inc"], [], 0)
  assert "Your current observation is: now\n" in none


def test_webshop_snapshot_strips_instruction_and_quotes_parts():
  task = "i need a red shirt, and price lower than 30.00 dollars"
  obs = f"WebShop [SEP] Instruction: [SEP] {task} [SEP] Search"
  results = (
      f"WebShop [SEP] Instruction: [SEP] {task} [SEP] Back to Search [SEP] "
      "B0001 [SEP] Red Shirt [SEP] $12.00"
  )
  first = prompts.build_prompt(
      "webshop", task, obs, ["search[<your query>]"], [], 0
  )
  assert first == (
      "You are an expert autonomous agent shopping in the WebShop "
      f"e-commerce environment.\nYour task is to: {task}.\n"
      "Your current observation is: 'Search'\n"
      "Your admissible actions in the current situation are:\n"
      "[\n'search[<your query>]',\n].\n"
      + _CHOOSE.format(
          goal=", then about which admissible action best advances the "
          "shopping goal"
      )
  )
  later = prompts.build_prompt(
      "webshop",
      task,
      results,
      ["click[back to search]", "click[b0001]"],
      [(obs, "search[red shirt]")],
      1,
  )
  assert "[Observation 1: ''Search'', Action 1: 'search[red shirt]']" in later
  assert (
      "current observation is: 'Back to Search' [SEP] 'B0001' [SEP] "
      "'Red Shirt' [SEP] '$12.00'\n" in later
  )
  assert "[\n'click[back to search]',\n'click[b0001]',\n]" in later


def test_build_prompt_rejects_bad_input():
  with pytest.raises(ValueError, match="unknown env_name 'nethack'"):
    prompts.build_prompt("nethack", "t", "o", [], [], 0)
  with pytest.raises(ValueError, match="len\\(history\\)=2"):
    prompts.build_prompt("toy", "t", "o", [], [("a", "b")] * 2, 1)


# ------------------------------------------------------------------ tokens


@pytest.fixture(scope="module")
def tokenizer():
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=400,
      special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  corpus = [prompts.build_prompt("toy", "reach 3", "x is 1", ["inc"], [], 0)]
  tok.train_from_iterator(corpus * 5, trainer)
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
  )
  hf.chat_template = (
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
      "{{ m['content'] }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
  )
  return hf


def test_render_chat_uses_template_and_generation_prompt(tokenizer):
  ids = prompts.render_chat(tokenizer, "hello")
  assert tokenizer.decode(ids) == (
      "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
  )
  assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
  tokenizer_without = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tokenizer.backend_tokenizer
  )
  with pytest.raises(ValueError, match="chat_template"):
    prompts.render_chat(tokenizer_without, "hello")


def test_truncate_prompt():
  assert prompts.truncate_prompt([1, 2, 3], 3) == ([1, 2, 3], False)
  assert prompts.truncate_prompt([1, 2, 3], 2) == ([2, 3], True)
  with pytest.raises(ValueError, match="max_len"):
    prompts.truncate_prompt([1], 0)


def test_build_prompt_ids_drops_oldest_history_then_truncates(tokenizer):
  history = [("x is 0", "inc"), ("x is 1", "inc"), ("x is 2", "dec")]
  args = ("toy", "reach 3", "x is 1", ["inc", "dec"], history, 3)
  full = [
      prompts.render_chat(
          tokenizer, prompts.build_prompt(*args, history_length=h)
      )
      for h in (2, 1, 0)
  ]
  assert len(full[0]) > len(full[1]) > len(full[2])
  build = lambda n: prompts.build_prompt_ids(
      tokenizer, *args, max_prompt_tokens=n
  )
  assert build(len(full[0])) == (full[0], 0, False)
  assert build(len(full[0]) - 1) == (full[1], 1, False)
  assert build(len(full[1])) == (full[1], 1, False)
  assert build(len(full[2])) == (full[2], 2, False)
  assert build(10) == (full[2][-10:], 2, True)
  first = prompts.build_prompt_ids(
      tokenizer,
      "toy",
      "reach 3",
      "x is 1",
      ["inc"],
      [],
      0,
      max_prompt_tokens=5,
  )
  assert first[1:] == (0, True) and len(first[0]) == 5


# ----------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "reply, env_name, expected",
    [
        (
            "<think>go</think><action>Go To Sink 1</action>",
            "alfworld",
            ("go to sink 1", True),
        ),
        (
            "<think>a</think> <ACTION>  click[Buy Now] \n</Action>",
            "webshop",
            ("click[buy now]", True),
        ),
        (
            "<think>a</think><action>inc</action><action>dec</action>",
            "",
            ("inc", True),
        ),  # the first one, as verl-agent
        ("<action>inc</action>", "", ("inc", False)),  # no <think>
        ("<think>a<action>inc</action>", "", ("inc", False)),  # no </think>
        ("I will go to sink 1", "", ("I will go to sink 1", False)),
        (
            "<think>a</think><action>inc",
            "",
            ("<think>a</think><action>inc", False),
        ),
        ("</action>inc<action>", "", ("</action>inc<action>", False)),
        (
            "<think>a</think><action>   </action>",
            "",
            ("<think>a</think><action>   </action>", False),
        ),
        (
            "<think>a</think><action><action>in</action></action>",
            "",
            ("<think>a</think><action><action>in</action></action>", False),
        ),
        (
            "<think>é</think><action>Click[Café ☕ Größe]</action>",
            "webshop",
            ("click[café ☕ größe]", True),
        ),
        (
            "<think>去厨房</think><action>look</action>",
            "alfworld",
            ("look", False),
        ),  # verl-agent's ALFWorld rejects CJK replies
        (
            "<think>去厨房</think><action>look</action>",
            "webshop",
            ("look", True),
        ),
        ("", "", ("", False)),
    ],
)
def test_parse_action_cases(reply, env_name, expected):
  assert prompts.parse_action(reply, env_name) == expected


def test_parse_action_bytes_and_bad_types():
  raw = b"<think>\xff</think><action>INC</action>"
  assert prompts.parse_action(raw) == ("inc", True)
  assert prompts.parse_action(b"\x00\xfe\xff") == ("\x00\ufffd\ufffd", False)
  with pytest.raises(ValueError, match="reply must be str or bytes"):
    prompts.parse_action(None)


def test_parse_action_huge_replies():
  filler = "x" * (1 << 20)
  reply = filler + "<think>t</think><action>look</action>"
  assert prompts.parse_action(reply) == ("look", True)
  assert prompts.parse_action(filler) == (filler, False)
  opens = "<action>" * (1 << 17)  # 1 MiB of opening tags, never closed
  assert prompts.parse_action(opens) == (opens, False)
  nested = opens + "look</action>"
  assert prompts.parse_action(nested) == (nested, False)


@hypothesis.given(st.text() | st.binary().map(bytes))
@hypothesis.settings(max_examples=300, deadline=None)
def test_parse_action_fuzz_never_fails(reply):
  action, valid = prompts.parse_action(reply, "alfworld")
  assert isinstance(action, str) and isinstance(valid, bool)
  if valid:
    assert action and action == action.strip().lower()


@hypothesis.given(st.text(alphabet=st.characters(exclude_characters="<")))
@hypothesis.settings(max_examples=300, deadline=None)
def test_parse_action_fuzz_round_trip(text):
  assert prompts.parse_action(text) == (text, False)  # no tags at all
  wrapped = f"<think>t</think><action>{text}</action>"
  expected = text.strip().lower()
  if expected:
    assert prompts.parse_action(wrapped) == (expected, True)
  else:
    assert prompts.parse_action(wrapped) == (wrapped, False)


def test_invalid_action_penalty():
  assert prompts.INVALID_ACTION_PENALTY == -0.1
