"""What-if capacity planning: sweep a base scenario over axes of dotted scenario paths, list the
configurations that cannot run with the reason, and find the Pareto front of step time against cost
and the best configuration for an objective. Backends: local processes or Ray tasks."""

from rlhfsim.plan.backends import LocalBackend, RayBackend
from rlhfsim.plan.results import explain, pareto_front, pick_best
from rlhfsim.plan.spec import Config, Plan, load_plan
from rlhfsim.plan.sweep import Outcome, run_plan

BACKENDS = {"local": LocalBackend, "ray": RayBackend}

__all__ = ["BACKENDS", "Config", "Outcome", "Plan", "explain", "load_plan", "pareto_front", "pick_best", "run_plan"]
