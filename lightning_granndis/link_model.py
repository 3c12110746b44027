"""Bandwidth and latency of the two link classes, and the time they model.

The papers behind this package ran on clusters whose inter-server link is far slower than the
link between GPUs of one server (GraNNDis, PACT'24, §8.1: NVLink 112 GB/s inside, InfiniBand QDR
32 Gbit/s between). A :class:`LinkModel` turns bytes booked in the :class:`~lightning_granndis.
ledger.CommLedger` into the time such a cluster would need:

.. math::
    t = \\lambda_c + \\frac{b \\cdot s}{\\beta_c}

for link class :math:`c` with latency :math:`\\lambda_c`, bandwidth :math:`\\beta_c`, ``b`` bytes and
``s`` ranks of one server sending through the server's network card at once (``sharers``;
the inter-server link is one card per server, shared by its devices).

Because this machine computes far slower than the papers' GPUs, a model can be *scaled*: every
bandwidth is divided by ``factor = reference FLOP/s / local FLOP/s``, so an emulated run keeps the
reference cluster's compute-to-communication ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class LinkSpec:
    """One link class: ``bandwidth`` in bytes/s, ``latency`` in seconds, a human ``name``."""

    bandwidth: float
    latency: float
    name: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bandwidth} bytes/s.")
        if self.latency < 0:
            raise ValueError(f"link latency must be non-negative, got {self.latency} s.")


#: Peak dense FP32 throughput of reference accelerators, FLOP/s (vendor data sheets).
REFERENCE_FLOPS: dict[str, float] = {
    "rtx_a6000": 38.7e12,  # GraNNDis' cluster (PACT'24, Table 2)
    "rtx_2080ti": 13.4e12,  # GraNNDis' low-end cluster (§8.4)
    "v100": 15.7e12,
    "a100": 19.5e12,
    "a100_fp16": 312e12,  # dense FP16 tensor cores: Megatron/Optimus-CC train GPT in FP16
    "h100": 67.0e12,
    "h200": 67.0e12,
}

#: Peak memory bandwidth (B/s) of the same accelerators. GNN layers are memory-bound (gathers and
#: scatters over edges), so this ratio is the fairer speed scale for GNN workloads.
REFERENCE_MEMORY_BW: dict[str, float] = {
    "rtx_a6000": 768e9,
    "rtx_2080ti": 616e9,
    "v100": 900e9,
    "a100": 1555e9,
    "a100_fp16": 1555e9,
    "h100": 3350e9,
    "h200": 4800e9,
}


@dataclass(frozen=True)
class LinkModel:
    """Modelled cost of the intra-server and inter-server links.

    Args:
        intra: the link between devices of one server.
        inter: one server's network card to another server (shared by the server's devices).
        name: a label for tables and plots.
        scale: every bandwidth is divided by this factor (1 = the real cluster).

    Build one from a preset with :meth:`preset` (``granndis_paper``, ``optimus_cc_paper``, ``10gbe``, ``1gbe``) or with
    :meth:`custom`.
    """

    intra: LinkSpec
    inter: LinkSpec
    name: str = "custom"
    scale: float = 1.0
    #: scale to this accelerator (a :data:`REFERENCE_FLOPS` name) once the run measures its speed
    reference: str | None = None
    #: what "speed" means for ``reference``: ``"flops"`` (dense compute) or ``"memory"`` (bandwidth)
    reference_by: str = "flops"

    PRESETS = ("granndis_paper", "optimus_cc_paper", "10gbe", "1gbe")

    @classmethod
    def preset(cls, name: str) -> "LinkModel":
        key = name.lower().replace("-", "_")
        nvlink = LinkSpec(112 * GB, 5e-6, "NVLink bridge 112 GB/s")
        if key == "granndis_paper":
            return cls(nvlink, LinkSpec(32e9 / 8, 2e-6, "InfiniBand QDR 32 Gbit/s"), "granndis_paper")
        if key == "optimus_cc_paper":  # ASPLOS'23 artifact README: A100 nodes, 200 Gbit/s InfiniBand
            return cls(LinkSpec(300 * GB, 3e-6, "NVLink3/NVSwitch 300 GB/s"),
                       LinkSpec(200e9 / 8, 5e-6, "InfiniBand HDR 200 Gbit/s"), "optimus_cc_paper")
        if key == "10gbe":
            return cls(nvlink, LinkSpec(10e9 / 8, 30e-6, "10 GbE"), "10gbe")
        if key == "1gbe":
            pcie = LinkSpec(16 * GB, 5e-6, "PCIe 3.0 x16 16 GB/s")
            return cls(pcie, LinkSpec(1e9 / 8, 50e-6, "1 GbE"), "1gbe")
        raise ValueError(
            f"Unknown link preset {name!r}. Known presets: {', '.join(cls.PRESETS)}; or build one with "
            f"LinkModel.custom(intra_gbps=..., inter_gbps=...)."
        )

    @classmethod
    def custom(
        cls,
        intra_gbps: float,
        inter_gbps: float,
        intra_latency_us: float = 5.0,
        inter_latency_us: float = 10.0,
        name: str = "custom",
    ) -> "LinkModel":
        """A model from bandwidths in Gbit/s and latencies in microseconds."""
        return cls(
            LinkSpec(intra_gbps * 1e9 / 8, intra_latency_us * 1e-6, f"{intra_gbps:g} Gbit/s"),
            LinkSpec(inter_gbps * 1e9 / 8, inter_latency_us * 1e-6, f"{inter_gbps:g} Gbit/s"),
            name,
        )

    @classmethod
    def resolve(cls, spec: "LinkModel | str | dict | None") -> "LinkModel":
        """Accepts a model, a preset name, or a dict (for YAML): :meth:`custom`'s arguments, or
        ``{"preset": name}`` with an optional ``"scale": factor`` or ``"scale_to": accelerator``
        (bandwidths scaled to this machine's measured speed when the run starts; ``"by": "flops"``
        compares dense FLOP/s, ``"by": "memory"`` memory bandwidth — the fairer one for GNNs)."""
        if spec is None:
            return cls.preset("granndis_paper")
        if isinstance(spec, LinkModel):
            return spec
        if isinstance(spec, str):
            return cls.preset(spec)
        if isinstance(spec, dict) and "preset" in spec:
            extra = set(spec) - {"preset", "scale", "scale_to", "by"}
            if extra or ("scale" in spec and "scale_to" in spec):
                raise ValueError(f"a preset link model takes 'scale' or 'scale_to', got {sorted(spec)}.")
            model = cls.preset(spec["preset"])
            if "scale" in spec:
                model = model.scaled(float(spec["scale"]))
            if "scale_to" in spec:
                if spec["scale_to"] not in REFERENCE_FLOPS:
                    raise ValueError(f"Unknown reference accelerator {spec['scale_to']!r}; known: {', '.join(REFERENCE_FLOPS)}.")
                by = spec.get("by", "flops")
                if by not in ("flops", "memory"):
                    raise ValueError(f"'by' must be 'flops' or 'memory', got {by!r}.")
                model = replace(model, reference=spec["scale_to"], reference_by=by)
            return model
        if isinstance(spec, dict):
            return cls.custom(**spec)
        raise TypeError(f"link_model must be a LinkModel, a preset name or a dict, got {type(spec).__name__}.")

    # ------------------------------------------------------------------ time
    def spec(self, link: str) -> LinkSpec:
        if link == "intra":
            return self.intra
        if link == "inter":
            return self.inter
        raise ValueError(f"unknown link class {link!r}; expected 'intra' or 'inter'.")

    def bandwidth(self, link: str) -> float:
        """Effective bandwidth in bytes/s after scaling."""
        return self.spec(link).bandwidth / self.scale

    def time(self, link: str, nbytes: int, messages: int = 1, sharers: int = 1) -> float:
        """Modelled seconds to move ``nbytes`` over ``link``; zero when nothing is sent."""
        if nbytes <= 0 or messages <= 0:
            return 0.0
        return self.spec(link).latency + nbytes * max(1, sharers) / self.bandwidth(link)

    # ------------------------------------------------------------------ scaling
    def scaled(self, factor: float) -> "LinkModel":
        if not factor > 0:
            raise ValueError(f"scale factor must be positive, got {factor}.")
        return replace(self, scale=self.scale * factor)

    def scaled_to_reference(self, reference: str | float, local_flops: float | None = None) -> "LinkModel":
        """Scales bandwidths so that this machine's compute/communication ratio matches a reference.

        Args:
            reference: a name from :data:`REFERENCE_FLOPS` or a FLOP/s figure.
            local_flops: this machine's measured FLOP/s; measured with :func:`measure_local_flops`
                when omitted.
        """
        if isinstance(reference, str):
            if reference not in REFERENCE_FLOPS:
                raise ValueError(f"Unknown reference accelerator {reference!r}; known: {', '.join(REFERENCE_FLOPS)}.")
            reference = REFERENCE_FLOPS[reference]
        local = local_flops if local_flops is not None else measure_local_flops()
        return self.scaled(reference / local)

    def resolve_reference(self, local_speed: float) -> "LinkModel":
        """Applies a pending ``scale_to``: bandwidths divided by the reference's speed over
        ``local_speed`` (FLOP/s or memory B/s, per :attr:`reference_by`, of one rank here)."""
        if self.reference is None:
            return self
        table = REFERENCE_FLOPS if self.reference_by == "flops" else REFERENCE_MEMORY_BW
        return replace(self, reference=None).scaled(table[self.reference] / local_speed)

    def describe(self) -> str:
        text = (
            f"{self.name}: intra {self.intra.bandwidth / GB:.3g} GB/s ({self.intra.name}), "
            f"inter {self.inter.bandwidth / GB:.3g} GB/s ({self.inter.name})"
        )
        if self.scale != 1.0:
            text += f", bandwidths scaled down {self.scale:.3g}x to this machine's compute speed"
        return text


def measure_local_flops(n: int = 512, repeats: int = 5) -> float:
    """This process's dense float32 matmul throughput in FLOP/s (best of ``repeats``)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def measure_local_memory_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """This process's memory bandwidth in B/s: bytes read plus written by a large copy (best of
    ``repeats``), the bound of gather/scatter-heavy GNN layers."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best
