"""The sections of the record's intervals (experiments/record_intervals.py,
docs/results/record_intervals.json), one module per study family:

  common       the archive's outcome matrices and B's logged lifts, and
               the records every section prints: contrast, gain, level,
               by_seed_max, lift_summary, task_lift;
  spell        the spell studies: contrasts, levels, lifts, by_seed;
  webshop      the WebShop studies: contrasts, gains, levels, lifts;
  toy          the toy mechanism study: toy, toy_more;
  default_run  the default run and GRPO alone against their start;
  replay       per archived RSPO run, its replay setting and ratios.

Imports point one way: record_intervals.py -> the family modules ->
common.
"""
