"""The host CPUs GPU servers ship with, and how fast each runs host work: the factor that carries a host-side cost
(the engine's host work per step, a framework's dispatch per layer, FSDP's hooks, the driver's advantage step)
stated for one host to another.

Host work in an RL step is one Python thread per process (the engine's scheduler and output processing, the
trainer's kernel launches, the driver), so it scales with one core's speed: clock x instructions per clock. A host's
time per unit of such work::

    tau(host) = mean( 1 / (boost_ghz x ipc),  1 / (allcore_ghz x ipc) )

the mean over its datasheet's maximum single-core boost and its all-core turbo (the low end: the other engine and
trainer processes keep the other cores busy), and a cost stated for host A costs tau(B) / tau(A) times as much on
host B (``host_scale``). IPC is relative to AMD Zen 5, chained from the vendors' generational claims (``IPC``); the
factor is good to about +-25% (+-30% for Grace): the claims are the vendors' own suites, not CPython
(docs/calibration.md, "From this CPU to a GPU server's host", where ``calibrate.enginehost.cpuspeed`` measures this
project's VM the same way: 1.35 from it to the Xeon 8480C).

Which host each GPU has (``catalog.GpuSpec.host_cpu``): the vendor's own server where there is one (DGX A100: 2x
EPYC 7742; DGX H100 and DGX H200: 2x Xeon Platinum 8480C; DGX B200: 2x Xeon Platinum 8570; GH200 and GB200: their
Grace), the
cloud instance most of them are rented as where that is documented (AWS G5, A10G: EPYC 7R32; G6, L4, and G6e,
L40S: EPYC 7R13), else a choice, said here: an HGX H20 board sits in the same OEM servers as HGX H100 (4th-generation
Xeon); an H100 PCIe in a 4th-generation Xeon server; MI300X in AMD's platform servers on EPYC 9004, and MI355X
there too (its platforms also ship on the newer EPYC 9005, which HOSTS does not hold); an A40 in a
3rd-generation EPYC server like an L40S; an RTX 4090 (a consumer card, rented in whatever box holds it, from desktop
CPUs faster than any of these to old dual Xeons) in a 3rd-generation EPYC server too, the middle of that range.

Profiles state their host terms for a reference host (profile key ``host_cpu``; absent: ``REFERENCE_HOST``, the
H100/H200 servers' Xeon, for which the bundled profiles' host terms are stated). A CPU device has no separate host:
its profile measured everything on it (factor 1).
"""

from __future__ import annotations

from dataclasses import dataclass

# Per-clock single-thread speed relative to AMD Zen 5: Zen 5 = +16% IPC over Zen 4 (AMD, Computex 2024); Zen 4 = +13%
# over Zen 3 (AMD, Ryzen 7000 launch, 2022); Zen 3 = +19% over Zen 2 (AMD, Zen 3 launch, 2020). Golden Cove
# (Sapphire Rapids; Raptor Cove of Emerald Rapids taken the same) equal to Zen 4 (Intel's +19% over Sunny Cove puts it
# at 0.90; reviews of client parts put Zen 4 and Golden Cove within a few percent: 0.86 kept, the lower). Neoverse
# V2 (Grace) 0.75: Arm's +13% over V1, V1 at about Zen 3's per-clock speed on integer code; the least certain.
IPC = {"zen5": 1.0, "zen4": 1.0 / 1.16, "zen3": 1.0 / 1.16 / 1.13, "zen2": 1.0 / 1.16 / 1.13 / 1.19,
       "golden_cove": 1.0 / 1.16, "neoverse_v2": 0.75}


@dataclass(frozen=True)
class HostCpu:
    """A GPU server's host CPU: microarchitecture, datasheet clocks (GHz), the servers it is in, the source."""

    name: str
    uarch: str
    boost_ghz: float
    allcore_ghz: float
    servers: str
    source: str

    @property
    def tau(self) -> float:
        """Time per unit of single-thread host work (module docstring), relative units."""
        ipc = IPC[self.uarch]
        return (1.0 / (self.boost_ghz * ipc) + 1.0 / (self.allcore_ghz * ipc)) / 2.0


HOSTS: dict[str, HostCpu] = {h.name: h for h in (
    HostCpu("xeon-8480", "golden_cove", 3.8, 3.0, "DGX H100 / DGX H200 (2x 8480C), HGX H100 builds (8480+)",
            "Intel Xeon Platinum 8480+ spec: base 2.0, max turbo 3.8, all-core turbo 3.0 GHz; NVIDIA DGX H100/H200 "
            "user guide: 2x Xeon Platinum 8480C"),
    HostCpu("xeon-8468", "golden_cove", 3.8, 3.1, "HGX H100/H200 builds (Supermicro, Dell XE9680)",
            "Intel Xeon Platinum 8468 spec: base 2.1, max turbo 3.8, all-core turbo 3.1 GHz"),
    HostCpu("xeon-8570", "golden_cove", 4.0, 3.0, "DGX B200 (2x 8570)",
            "NVIDIA DGX B200 datasheet: 2x Intel Xeon Platinum 8570; Intel spec: max turbo 4.0 GHz; all-core turbo "
            "not published, taken as the 8480's 3.0 GHz"),
    HostCpu("epyc-9004", "zen4", 3.7, 3.55, "HGX builds on Genoa (e.g. EPYC 9654, 9554); MI300X platform servers",
            "AMD EPYC 9654 datasheet: base 2.4, max boost 3.7, all-core boost 3.55 GHz"),
    HostCpu("epyc-7742", "zen2", 3.4, 3.2, "DGX A100 (2x)", "AMD EPYC 7742 datasheet: base 2.25, max boost 3.4 GHz; "
            "NVIDIA DGX A100 datasheet: 2x AMD Rome 7742"),
    HostCpu("epyc-7r13", "zen3", 3.6, 3.6, "AWS G6 (L4), G6e (L40S); 3rd-generation EPYC servers",
            "AWS EC2 G6/G6e instance pages: 3rd generation AMD EPYC (7R13); AWS: all-core turbo up to 3.6 GHz"),
    HostCpu("epyc-7r32", "zen2", 3.3, 3.3, "AWS G5 (A10G)",
            "AWS EC2 G5 instance page: 2nd generation AMD EPYC (7R32), up to 3.3 GHz all-core"),
    HostCpu("grace", "neoverse_v2", 3.1, 3.1, "GH200 / GB200 (Grace, 72 Neoverse V2 cores per chip)",
            "NVIDIA Grace datasheet: Neoverse V2 cores up to 3.1 GHz (no separate boost)"),
)}
REFERENCE_HOST = "xeon-8480"


def scale_from_clock(clock_ghz: float, uarch: str, host: str = REFERENCE_HOST) -> float:
    """How many times as long host work measured on a core of ``uarch`` at ``clock_ghz`` takes on ``host`` (this
    project's VM: Zen 5 at 3.9 GHz, ``calibrate.enginehost.cpuspeed``'s quiet clock, to the Xeon 8480C: 1.35)."""
    return HOSTS[host].tau * clock_ghz * IPC[uarch]


def host_scale(host: str, reference: str = REFERENCE_HOST) -> float:
    """How many times as long host work stated for ``reference`` takes on ``host``: tau(host) / tau(reference)."""
    return HOSTS[host].tau / HOSTS[reference].tau
