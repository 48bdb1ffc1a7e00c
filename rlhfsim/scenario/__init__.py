"""Scenario schema (pydantic, frozen), YAML loading with mixins, and cross-field checks.

Names are imported on first use, so that a plug-in importing ``rlhfsim.scenario.fields`` (and the schema
importing the plug-ins) does not pull in the whole package."""

import importlib

__all__ = ["Scenario", "Setup", "build_setup", "load_scenario", "validate_model"]
_HOME = {"Scenario": "schema", "Setup": "checks", "build_setup": "checks", "load_scenario": "loader",
         "validate_model": "loader"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f"rlhfsim.scenario.{_HOME[name]}"), name)
    raise AttributeError(f"module 'rlhfsim.scenario' has no attribute {name!r}")
