"""Scenario schema (pydantic, frozen), YAML loading with mixins, and cross-field checks."""

from rlhfsim.scenario.checks import Setup, build_setup
from rlhfsim.scenario.loader import load_scenario, validate_model
from rlhfsim.scenario.schema import Scenario

__all__ = ["Scenario", "Setup", "build_setup", "load_scenario", "validate_model"]
