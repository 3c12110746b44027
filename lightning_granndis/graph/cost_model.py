"""Choosing a GraNNDis mode from the paper's cost model (PACT'24, §5.1, Eqs. 1–5).

With ``N_s`` servers of ``N_g`` devices (``N = N_s N_g``), ``V`` vertices, ``E`` edges, compute
throughput ``C`` (vertices/s) and per-device bandwidths ``B_intra``, ``B_inter`` (vertices/s):

.. math::
    T_{fb} = \\frac{V}{N C} + \\frac{E}{N}\\Big[\\frac{(N_g-1)/(N_g N_s)}{B_{intra}}
             + \\frac{1 - 1/N_s}{B_{inter}}\\Big]                                   \\quad (1)

    T_{pre}(R) = \\frac{V R}{N C} + \\frac{E R}{N}\\cdot\\frac{(N_g-1)/N_g}{B_{intra}}   \\quad (2\\text{–}3)

where ``R`` is the measured expansion (vertices all servers hold together over ``V``; the paper's
:math:`D^{\\alpha L}`). Preloading pays when :math:`T_{pre} < T_{fb}` (Eqs. 4–5). Memory decides
what can run at all: FLX needs the preloaded subgraph to fit a server's devices, EAS its sampled
one; CoB fits by construction (its co-batch size is a knob).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch


@dataclass
class SubgraphSize:
    """Largest per-device share of a mode's subgraphs: ``vertices`` and ``edges``."""

    vertices: int
    edges: int


@dataclass
class ModeChoice:
    """The chosen mode, the reason in words, and the estimates behind it."""

    mode: str
    reason: str
    estimates: dict = field(default_factory=dict)


def memory_bytes(size: SubgraphSize, features: int, hidden: int, layers: int) -> int:
    """Training memory of one device's share: features, per-layer activations and their gradients
    per vertex, and per layer one message per edge (PyG materialises ``x_j``) plus the edge index."""
    per_vertex = 4 * (features + 3 * hidden * layers)
    per_edge = 16 + 4 * 2 * hidden * layers
    return size.vertices * per_vertex + size.edges * per_edge


def available_memory(device: torch.device, processes_per_device_pool: int) -> int:
    """Bytes one rank may use: 80% of the GPU, or 80% of free RAM shared by the local ranks."""
    if device.type == "cuda":
        return int(0.8 * torch.cuda.get_device_properties(device).total_memory)
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return int(0.8 * available / max(1, processes_per_device_pool))


def epoch_times(V: int, E: int, servers: int, devices: int, C: float, B_intra: float, B_inter: float,
                R_flx: float, R_eas: float) -> dict[str, float]:
    """Modelled epoch times (s) of full-graph training (Eq. 1) and of preloading with expansion
    ``R`` (Eqs. 2–3) for FLX and EAS."""
    N = servers * devices
    t_fb = V / (N * C) + E / N * (((devices - 1) / (devices * servers)) / B_intra + (1 - 1 / servers) / B_inter)

    def preload(R: float) -> float:
        return V * R / (N * C) + E * R / N * (((devices - 1) / devices) / B_intra)

    return {"fb": t_fb, "flx": preload(R_flx), "eas": preload(R_eas)}


def choose_mode(*, V: int, E: int, servers: int, devices: int, C: float, B_intra: float, B_inter: float,
                R_flx: float, R_eas: float, flx_bytes: int, eas_bytes: int, budget: int) -> ModeChoice:
    """FLX if its preloaded subgraph fits and preloading pays (exact); else EAS if its subgraph fits;
    else CoB. The reason names the numbers."""
    t = epoch_times(V, E, servers, devices, C, B_intra, B_inter, R_flx, R_eas)
    gib = 2.0 ** 30
    est = {"modelled_epoch_s": t, "expansion": {"flx": R_flx, "eas": R_eas},
           "memory_gib": {"flx": flx_bytes / gib, "eas": eas_bytes / gib, "budget": budget / gib},
           "C_vertices_per_s": C, "B_intra_vertices_per_s": B_intra, "B_inter_vertices_per_s": B_inter}
    fits_flx, fits_eas = flx_bytes <= budget, eas_bytes <= budget
    mem = f"FLX needs {flx_bytes / gib:.2f} GiB per device, EAS {eas_bytes / gib:.2f} GiB, budget {budget / gib:.2f} GiB"
    times = f"modelled epoch FB {t['fb']:.3g}s, FLX {t['flx']:.3g}s, EAS {t['eas']:.3g}s (expansion R: FLX {R_flx:.2f}, EAS {R_eas:.2f})"
    if fits_flx and t["flx"] <= t["fb"]:
        return ModeChoice("flx", f"flx: full preloading fits and pays off (Eqs. 1-5); {times}; {mem}", est)
    if fits_eas:
        why = "FLX does not fit" if not fits_flx else "FLX's expansion costs more than full-graph exchange"
        return ModeChoice("eas", f"eas: {why}, the expansion-aware subgraph fits; {times}; {mem}", est)
    return ModeChoice("cob", f"cob: neither FLX nor EAS fits in memory, co-batches do; {times}; {mem}", est)
