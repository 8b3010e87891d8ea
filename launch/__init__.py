"""Command-line entry points (installed as ``rspo_launch``; console scripts
``rspo-train``, ``rspo-eval``, ``rspo-sft``, ``rspo-train-prm``,
``rspo-serve-rollout``, ``rspo-plot``). In a checkout each file also runs as
``python launch/<name>.py`` once the package is installed (``pip install -e
.``)."""
