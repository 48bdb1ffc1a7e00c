"""Model shapes: the catalog of real architectures and loading a local Hugging Face ``config.json``."""

from rlhfsim.models.catalog import CATALOG, ModelShape, load_model, shape_from_hf_config

__all__ = ["CATALOG", "ModelShape", "load_model", "shape_from_hf_config"]
