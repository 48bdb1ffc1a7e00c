"""Cost models: FLOP/byte counts from shapes, the roofline-with-efficiency CostModel, Profiles."""

from rlhfsim.costs.model import CostModel, OpParams
from rlhfsim.costs.profile import SCHEMA_VERSION, load_profile

__all__ = ["CostModel", "OpParams", "SCHEMA_VERSION", "load_profile"]
