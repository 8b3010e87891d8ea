"""The pieces of the RSPO loop; rspo_jax/rspo.py composes them.

  seeds.py        every random stream of the loop, by role and step
  state.py        LoopState (what a resumed run restores besides the
                  learners), the checkpoint's step and fingerprint
  collection.py   fresh groups: task draws, play on the engine, the
                  collection's statistics and dense rewards
  host_stats.py   means and counts over every host's records
  prefetch.py     overlap: A's next collection during A's update
  driver.py       the main loop: B's phase when due, A's steps, evaluation,
                  checkpoints, a loop's end
  b_phase.py      B := copy(A) and B's k steps on the dense reward
  b_store.py      B's stored collection: B's lift, the reward swap, D
  decoupled_b.py  decoupled placement: B's stored collection on B's own
                  engine beside A's phase
  history.py      RSPO_H: A's groups of a loop become the next loop's D
  replay_rows.py  A's replayed rows: n_off and the selection from D
  prm_refresh.py  the PRM refit on A's trajectories every N loops
  progress.py     the run's name, progress bar and per-phase timing rows

Nothing here imports rspo_jax/rspo.py.

Multi-host (``jax.process_count() = P > 1``; every process runs the loop
in lockstep, the learners' meshes span all hosts):
  * each collection's task list is drawn as with one process (same seed),
    and process ``p`` plays the whole groups ``distributed.host_share``
    gives it, on its own engine (a mesh of its local devices), with
    globally unique group / trajectory ids (collection.py);
  * an A step's n_on fresh groups are shared out the same way, and so are
    its n_off replayed trajectories: every host ranks the same D with the
    same generator and used set and keeps its share of the selected ones
    (replay_rows.py);
  * B's stored groups are written by each host as shards named
    ``p<process index>-...`` in the shared ``<workdir>/replay``; after a
    barrier the leader marks the buffer complete (b_store.py);
  * each host builds its rows into a batch; row count and length are
    agreed (cross-host max, zero padding) and the blocks become global
    arrays (``distributed.host_local_to_global``) for ``Learner.train`` /
    ``Learner.apply`` (host_batches.py);
  * statistics are summed over hosts (host_stats.py); only the leader
    (process 0) writes metrics and shows progress; checkpoints are
    written by all (orbax);
  * the PRM (``rspo.dense_reward=prm``) is fitted by the leader alone on
    every host's trajectories (prm_refresh.py).
Decoupled placement and overlap are single-process only.
"""
