"""Training-framework launches as scenarios (``rlhfsim import verl|openrlhf``): one importer per
framework, each ``(text, ImportOptions, source) -> ImportResult``."""

from __future__ import annotations

from rlhfsim.importers.common import ImportError_, ImportOptions, ImportResult, Setting, render_yaml
from rlhfsim.importers.openrlhf import import_openrlhf
from rlhfsim.importers.verl import import_verl

IMPORTERS = {"verl": import_verl, "openrlhf": import_openrlhf}

__all__ = ["IMPORTERS", "ImportError_", "ImportOptions", "ImportResult", "Setting", "render_yaml"]
