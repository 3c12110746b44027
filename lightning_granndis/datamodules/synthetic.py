"""The embedded default graph: a degree-corrected stochastic block model in OGB's on-disk layout.

No data set can be downloaded where this package is built and tested, so the default graph is
generated: communities that are the classes, power-law degrees, and features that correlate with
the class but do not give it away. It is written in OGB's raw layout (``raw/edge.csv.gz``,
``raw/node-feat.csv.gz``, ``raw/node-label.csv.gz``, ``split/<name>/{train,valid,test}.csv.gz``)
and read back through ``ogb.nodeproppred.PygNodePropPredDataset``, the loader real data uses.

Generation (vectorised, deterministic by seed):

- class sizes follow a Zipf-like law (real graphs are imbalanced);
- each vertex draws a weight :math:`\\theta_i` from a Pareto law (tail exponent ``degree_exponent``);
  an edge picks its source with probability :math:`\\propto\\theta`, and its target
  :math:`\\propto\\theta` from the source's class with probability ``homophily``, else from the
  whole graph (degree-corrected SBM), so degrees are heavy-tailed;
- features are :math:`x_i = s\\,\\mu_{z_i} + \\epsilon_i` with community centroids
  :math:`\\mu_c\\sim N(0, I)` and noise :math:`\\epsilon\\sim N(0, I)`: a feature-only classifier does
  clearly worse than one that also reads the neighbours;
- the label is the community :math:`z_i`, except for a share ``label_noise`` of vertices whose label
  is drawn at random (real labels are noisy too): no model can reach 100 %.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

#: the release file the ogb loader checks for (it prompts for an update when missing)
_VERSION = 1


@dataclass(frozen=True)
class SyntheticGraphSpec:
    """Parameters of a generated graph.

    Args:
        num_nodes: vertices.
        num_edges: directed edges drawn before de-duplication (made undirected when loaded).
        num_features: feature width.
        num_classes: classes (= communities).
        homophily: probability that an edge stays inside its source's class.
        degree_exponent: Pareto tail exponent of the vertex weights (smaller = heavier tail).
        signal: scale of the class centroid in the features (larger = easier from features alone).
        label_noise: share of vertices whose label is redrawn at random.
        split: fractions of (train, valid, test).
        seed: random seed.
    """

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    homophily: float = 0.75
    degree_exponent: float = 1.8
    signal: float = 0.35
    label_noise: float = 0.25
    split: tuple[float, float, float] = (0.54, 0.18, 0.28)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.homophily <= 1.0:
            raise ValueError(f"homophily must lie in [0, 1], got {self.homophily}.")
        if abs(sum(self.split) - 1.0) > 1e-6 or min(self.split) <= 0:
            raise ValueError(f"split fractions must be positive and sum to 1, got {self.split}.")
        if self.num_classes < 2 or self.num_nodes < self.num_classes:
            raise ValueError("need at least 2 classes and at least one vertex per class.")


PRESETS: dict[str, SyntheticGraphSpec] = {
    "tiny": SyntheticGraphSpec(num_nodes=2_000, num_edges=16_000, num_features=32, num_classes=8),
    "small": SyntheticGraphSpec(num_nodes=20_000, num_edges=180_000, num_features=64, num_classes=20),
    # about ogbn-arxiv's size: 169,343 vertices, 1,166,243 edges, 128 features, 40 classes
    "arxiv": SyntheticGraphSpec(num_nodes=169_343, num_edges=1_200_000, num_features=128, num_classes=40),
    # four times ogbn-arxiv's vertices (GraNNDis at scale: FLX's 3-hop closure is the whole graph)
    "arxiv4x": SyntheticGraphSpec(num_nodes=677_372, num_edges=4_800_000, num_features=128, num_classes=40),
    # ogbn-products' size: 2,449,029 vertices, 61,859,140 undirected edges, 100 features, 47 classes
    # (generation and OGB's processing take ~10 min here; both are cached under the data root)
    "products": SyntheticGraphSpec(num_nodes=2_449_029, num_edges=62_000_000, num_features=100, num_classes=47),
}


def generate(spec: SyntheticGraphSpec) -> dict[str, np.ndarray]:
    """The graph as arrays: ``edge`` [E, 2], ``x`` [N, F] float32, ``y`` [N] int64, and the splits."""
    rng = np.random.default_rng(spec.seed)
    n, c = spec.num_nodes, spec.num_classes
    class_p = 1.0 / np.arange(1, c + 1) ** 0.6
    y = rng.choice(c, size=n, p=class_p / class_p.sum())
    y[:c] = np.arange(c)  # every class is present
    theta = rng.pareto(spec.degree_exponent, size=n) + 1.0

    # vertices ordered by class, with cumulative weights, so "a target from class k, ∝ θ" is a
    # uniform draw inside class k's slice of the cumulative sum followed by a binary search.
    order = np.argsort(y, kind="stable")
    cum = np.cumsum(theta[order])
    starts = np.searchsorted(y[order], np.arange(c), side="left")
    ends = np.searchsorted(y[order], np.arange(c), side="right")
    lo = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    hi = cum[ends - 1]

    m = spec.num_edges
    src = rng.choice(n, size=m, p=theta / theta.sum())
    inside = rng.random(m) < spec.homophily
    k = np.where(inside, y[src], 0)
    u = np.where(inside, lo[k] + rng.random(m) * (hi[k] - lo[k]), rng.random(m) * cum[-1])
    dst = order[np.minimum(np.searchsorted(cum, u, side="right"), n - 1)]
    keep = src != dst
    edge = np.unique(np.stack([src[keep], dst[keep]], axis=1), axis=0)

    centroids = rng.standard_normal((c, spec.num_features)).astype(np.float32)
    x = spec.signal * centroids[y] + rng.standard_normal((n, spec.num_features)).astype(np.float32)
    noisy = rng.random(n) < spec.label_noise
    noisy[:c] = False
    y = np.where(noisy, rng.choice(c, size=n, p=class_p / class_p.sum()), y)

    perm = rng.permutation(n)
    n_train = int(spec.split[0] * n)
    n_valid = int(spec.split[1] * n)
    return {
        "edge": edge.astype(np.int64),
        "x": x.astype(np.float32),
        "y": y.astype(np.int64),
        "train": np.sort(perm[:n_train]),
        "valid": np.sort(perm[n_train : n_train + n_valid]),
        "test": np.sort(perm[n_train + n_valid :]),
    }


def dataset_name(preset: str, seed: int = 0) -> str:
    return f"synthetic-{preset}" + (f"-s{seed}" if seed else "")


def meta_dict(directory: Path, spec: SyntheticGraphSpec) -> dict[str, str]:
    """The ``meta_dict`` that makes ``PygNodePropPredDataset`` read a custom dataset from disk."""
    return {
        "dir_path": str(directory),
        "version": _VERSION,
        "download_name": directory.name,
        "url": "(generated locally; nothing to download)",
        "num tasks": 1,
        "task type": "multiclass classification",
        "eval metric": "acc",
        "num classes": spec.num_classes,
        "is hetero": "False",
        "binary": "False",
        "has_node_attr": "True",
        "has_edge_attr": "False",
        "add_inverse_edge": "False",
        "additional node files": "None",
        "additional edge files": "None",
        "split": "random",
    }


def _write_csv_gz(path: Path, array: np.ndarray, fmt: str) -> None:
    """A headerless CSV, gzip level 1 (the ogb reader only needs pandas-readable CSV)."""
    if array.ndim == 1:
        array = array[:, None]
    row = ",".join([fmt] * array.shape[1]) + "\n"
    with gzip.open(path, "wt", compresslevel=1) as f:
        # one big format per chunk is ~10x faster than np.savetxt's per-row loop
        for start in range(0, len(array), 65_536):
            chunk = array[start : start + 65_536]
            f.write((row * len(chunk)) % tuple(chunk.ravel()))


def write_ogb_layout(root: str | os.PathLike, preset: str = "tiny", seed: int = 0,
                     spec: SyntheticGraphSpec | None = None) -> tuple[Path, dict[str, str]]:
    """Generates the graph (once) under ``root/<name>`` in OGB's raw layout; returns its directory
    and ``meta_dict``. An existing, complete directory is reused."""
    if spec is None:
        if preset not in PRESETS:
            raise ValueError(f"Unknown synthetic preset {preset!r}; known: {', '.join(PRESETS)}.")
        spec = PRESETS[preset]
    if seed:
        spec = SyntheticGraphSpec(**{**asdict(spec), "seed": seed})
    directory = Path(root) / dataset_name(preset, seed).replace("-", "_")
    done = directory / "SPEC.json"
    if done.exists() and json.loads(done.read_text()) == _jsonable(spec):
        return directory, meta_dict(directory, spec)
    from tqdm.auto import tqdm

    steps = tqdm(total=6, desc=f"generating {dataset_name(preset, seed)}", leave=False)
    arrays = generate(spec)
    steps.update()
    raw, split = directory / "raw", directory / "split" / "random"
    raw.mkdir(parents=True, exist_ok=True)
    split.mkdir(parents=True, exist_ok=True)
    _write_csv_gz(raw / "edge.csv.gz", arrays["edge"], "%d")
    steps.update()
    _write_csv_gz(raw / "node-feat.csv.gz", arrays["x"], "%.4f")
    steps.update()
    _write_csv_gz(raw / "node-label.csv.gz", arrays["y"], "%d")
    _write_csv_gz(raw / "num-node-list.csv.gz", np.array([spec.num_nodes]), "%d")
    _write_csv_gz(raw / "num-edge-list.csv.gz", np.array([len(arrays["edge"])]), "%d")
    steps.update()
    for name in ("train", "valid", "test"):
        _write_csv_gz(split / f"{name}.csv.gz", arrays[name], "%d")
    steps.update()
    (directory / f"RELEASE_v{_VERSION}.txt").write_text("generated by lightning_granndis\n")
    done.write_text(json.dumps(_jsonable(spec)))
    steps.update()
    steps.close()
    return directory, meta_dict(directory, spec)


def _jsonable(spec: SyntheticGraphSpec) -> dict:
    return json.loads(json.dumps(asdict(spec)))
