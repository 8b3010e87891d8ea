"""Offline WebShop: upstream's text interface and reward over a generated
catalogue (``WebShopEnv``), plus an adapter for the original site
(``original.WebShopOriginalEnv``) where its code and data exist."""

from third_party_envs.webshop.catalogue import make_catalogue
from third_party_envs.webshop.catalogue import make_goals
from third_party_envs.webshop.catalogue import search_words
from third_party_envs.webshop.env import WebShopEnv
from third_party_envs.webshop.env import parse_action
from third_party_envs.webshop.reward import get_reward
from third_party_envs.webshop.search import SearchEngine
from third_party_envs.webshop.world import World
from third_party_envs.webshop.world import make_world

__all__ = [
    "WebShopEnv",
    "World",
    "SearchEngine",
    "get_reward",
    "make_catalogue",
    "make_goals",
    "make_world",
    "parse_action",
    "search_words",
]
