"""rlhfsim: predict how long an RLHF (PPO/GRPO) step takes, on which GPUs, under which schedule, and why.

Importing this package is cheap and needs neither torch nor pydantic; the heavy parts live in
subpackages (``rlhfsim.scenario``, ``rlhfsim.sim``, ``rlhfsim.report``) imported on demand.
"""

__version__ = "0.1.0"
