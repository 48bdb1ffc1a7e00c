"""Response and prompt length distributions (sampling only; the schema lives in rlhfsim.scenario)."""

from rlhfsim.workload.lengths import read_lengths_file, sampler_for

__all__ = ["read_lengths_file", "sampler_for"]
