"""One factor for every host-side cost of a profile: the profile states its host terms for a reference host CPU, the
GPU's server has its own (``rlhfsim.hardware.hosts``), and the CostModel reads every host term times

    f = tau(GPU's host) / tau(profile's reference host)          (hosts.host_scale)

so an engine's host work per step, a framework's dispatch per layer, FSDP's hooks, the driver's advantage step and
the fitted per-call overheads move together from one server to another (an A100's EPYC 7742 runs the H100 Xeon's
host work 1.37 times as long, a GH200's Grace 1.24 times). The terms (``HOST_*`` below) are those the cost model
prices as time on the host CPU; device work (kernels, the sampler's kernels, copies, allocator calls on the device,
collectives) is not scaled. A CPU device (``GpuSpec.host_cpu`` empty) has no separate host: its profile measured
everything on it, f = 1.

Profile key ``host_cpu`` (optional): the reference host of the profile's host terms; absent, ``hosts.REFERENCE_HOST``
(the H100/H200 servers' Xeon 8480C), which the bundled profiles' host terms are stated for.
"""

from __future__ import annotations

from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import GpuSpec
from rlhfsim.hardware.hosts import HOSTS, REFERENCE_HOST, host_scale

# operations.OP: the fitted fixed time per call and per layer beside the kernels (Python, launches; an eager engine's
# per-layer launches)
HOST_OPERATION_KEYS = ("overhead_s", "overhead_per_layer_s")
# generation.RT: the engine's host work per step and sequence; a static runtime's generate() call and hand-over
HOST_GENERATION_KEYS = ("step_host_s", "step_host_per_seq_s", "call_overhead_s", "handoff_s", "handoff_per_row_s")
# framework: dispatch per layer of forward and training calls, FSDP's hooks per unit
HOST_FRAMEWORK_KEYS = ("host_forward_per_layer_s", "host_train_per_layer_s", "fsdp_host_per_unit_s")
# step: the framework's time per piece, the driver's advantage step, re-tokenizing
HOST_STEP_SCALARS = ("microbatch_forward_s", "microbatch_train_s", "adv_per_op_s", "adv_per_strided_s",
                     "adv_per_element_s", "adv_per_row_s", "retokenize_s", "retokenize_per_token_s")


def reference_host(profile: dict, where: str = "profile") -> str:
    """The host CPU the profile's host terms are stated for (``host_cpu``, else ``REFERENCE_HOST``)."""
    ref = profile.get("host_cpu", REFERENCE_HOST)
    if ref not in HOSTS:
        raise ProfileError(f"{where}.host_cpu: expected one of {', '.join(HOSTS)}, got {ref!r}")
    return ref


def host_factor(gpu: GpuSpec, profile: dict) -> float:
    """f for ``gpu`` priced with ``profile`` (module docstring); 1 on a CPU device."""
    if not gpu.host_cpu:
        return 1.0
    return host_scale(gpu.host_cpu, reference_host(profile))


def _scaled(section: dict, keys: tuple[str, ...], f: float) -> dict:
    return {k: (v * f if k in keys and isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in section.items()}


def scaled_profile(profile: dict, f: float) -> dict:
    """A copy of ``profile`` with its host terms times ``f`` (the same object when f = 1); step scalars the profile
    leaves to their defaults are scaled where the CostModel applies them (``HOST_STEP_SCALARS``)."""
    if f == 1.0:
        return profile
    out = dict(profile)
    out["operations"] = {op: _scaled(d, HOST_OPERATION_KEYS, f) for op, d in profile["operations"].items()}
    if isinstance(profile.get("generation"), dict):
        out["generation"] = {rt: (_scaled(d, HOST_GENERATION_KEYS, f) if isinstance(d, dict) else d)
                             for rt, d in profile["generation"].items()}
    if isinstance(profile.get("framework"), dict):
        out["framework"] = _scaled(profile["framework"], HOST_FRAMEWORK_KEYS, f)
    return out
