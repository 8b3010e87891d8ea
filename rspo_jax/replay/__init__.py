"""Replay for RSPO: array-record shards, streaming, trajectory selection.

numpy in, numpy out; this package never imports jax (grain, which does, is
imported only inside ``as_grain_source``).

  records.py    versioned byte encoding of a StepRecord
  shards.py     atomic shard writer, reader, crash recovery, streamer, grain
  buffer.py     ReplayBuffer (the RSPO buffer D)
  selection.py  which trajectories a step of A replays (reward / variance /
                random, unused first); alpha as a share of samples
  replayed.py   replayed rows, advantages against their whole group, metrics
"""

from rspo_jax.replay import replayed
from rspo_jax.replay import selection
from rspo_jax.replay.buffer import STRATEGIES
from rspo_jax.replay.buffer import ReplayBuffer
from rspo_jax.replay.buffer import group_score
from rspo_jax.replay.buffer import rank_by_score
from rspo_jax.replay.records import SCHEMA_VERSION
from rspo_jax.replay.records import ReplayFormatError
from rspo_jax.replay.records import decode_record
from rspo_jax.replay.records import encode_record
from rspo_jax.replay.shards import COMPLETE_MARKER
from rspo_jax.replay.shards import ShardStreamer
from rspo_jax.replay.shards import ShardWriter
from rspo_jax.replay.shards import as_grain_source
from rspo_jax.replay.shards import is_complete
from rspo_jax.replay.shards import list_shards
from rspo_jax.replay.shards import mark_complete
from rspo_jax.replay.shards import read_shard
from rspo_jax.replay.shards import recover

__all__ = [
    "COMPLETE_MARKER",
    "ReplayBuffer",
    "ReplayFormatError",
    "SCHEMA_VERSION",
    "STRATEGIES",
    "ShardStreamer",
    "ShardWriter",
    "as_grain_source",
    "decode_record",
    "encode_record",
    "group_score",
    "is_complete",
    "list_shards",
    "mark_complete",
    "rank_by_score",
    "read_shard",
    "recover",
    "replayed",
    "selection",
]
