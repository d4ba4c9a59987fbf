"""Device and interconnect profiles for the analytic cost model and the simulator.

Figures are vendor peak numbers times an achievable-efficiency factor; they are starting
points, replaced by a measured profile (``slimdata profile``) when one is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimdata.errors import ConfigError

__all__ = ["DEVICE_PRESETS", "DeviceProfile", "Interconnect", "load_device"]


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """Throughput of one accelerator for dense matmul (linear) and attention kernels."""

    name: str
    """Label used in reports."""
    peak_tflops: float
    """Dense bf16 peak, TFLOP/s."""
    linear_efficiency: float = 0.60
    """Achieved fraction of peak for the linear layers (GEMMs)."""
    attention_fwd_efficiency: float = 0.55
    """Achieved fraction of peak for the attention forward kernel (flash-attn varlen)."""
    attention_bwd_efficiency: float = 0.45
    """Achieved fraction of peak for the attention backward kernel."""
    launch_overhead_s: float = 20e-6
    """Fixed cost per layer per slice (kernel launches, norms), seconds."""
    memory_gib: float = 80.0
    """Device memory, GiB."""

    def __post_init__(self) -> None:
        if self.peak_tflops <= 0:
            raise ConfigError(f"device {self.name!r}: peak_tflops must be > 0")
        for f in ("linear_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ConfigError(f"device {self.name!r}: {f}={v} must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """Simple alpha-beta model of collectives: time = latency + bytes / bandwidth.

    Ring collectives over ``n`` ranks move ``(n - 1) / n`` of the buffer per rank (all-gather,
    reduce-scatter) or twice that (all-reduce). A group spanning several nodes runs at the
    inter-node bandwidth.
    """

    intra_node_gbps: float = 450.0
    """Per-GPU intra-node bandwidth, GB/s (NVLink 4 on H100 SXM: ~450 GB/s per direction)."""
    inter_node_gbps: float = 50.0
    """Per-GPU inter-node bandwidth, GB/s (400 Gb/s InfiniBand NDR: 50 GB/s)."""
    latency_s: float = 10e-6
    """Per-collective latency, seconds."""

    def bandwidth(self, spans_nodes: bool) -> float:
        return (self.inter_node_gbps if spans_nodes else self.intra_node_gbps) * 1e9

    def all_gather(self, bytes_total: float, n: int, spans_nodes: bool = False) -> float:
        """Time for ``n`` ranks to all-gather a buffer of ``bytes_total`` (the gathered size)."""
        if n <= 1:
            return 0.0
        return self.latency_s + bytes_total * (n - 1) / n / self.bandwidth(spans_nodes)

    reduce_scatter = all_gather

    def all_reduce(self, bytes_total: float, n: int, spans_nodes: bool = False) -> float:
        """Ring all-reduce of a ``bytes_total`` buffer over ``n`` ranks."""
        if n <= 1:
            return 0.0
        return self.latency_s + 2 * bytes_total * (n - 1) / n / self.bandwidth(spans_nodes)

    def p2p(self, nbytes: float, spans_nodes: bool = False) -> float:
        """Point-to-point send of ``nbytes`` (pipeline activations)."""
        return self.latency_s + nbytes / self.bandwidth(spans_nodes)


DEVICE_PRESETS: dict[str, DeviceProfile] = {
    "h100": DeviceProfile(name="h100", peak_tflops=989.0, memory_gib=80.0),
    "h200": DeviceProfile(name="h200", peak_tflops=989.0, memory_gib=141.0),
    "a100": DeviceProfile(name="a100", peak_tflops=312.0, memory_gib=80.0),
}


def load_device(spec: str | DeviceProfile) -> DeviceProfile:
    """Resolve a device preset name (``h100``, ``h200``, ``a100``)."""
    if isinstance(spec, DeviceProfile):
        return spec
    try:
        return DEVICE_PRESETS[spec]
    except KeyError:
        raise ConfigError(f"unknown device {spec!r}: use one of {sorted(DEVICE_PRESETS)}") from None
