"""The visual relationship detection model: language + spatial and spatial + visual + word
modules fused by elementwise product into a softmax over predicates.

Jung and Park, `Visual Relationship Detection with Language prior and Softmax
<https://arxiv.org/abs/1904.07798>`_ (IPAS'18), §3. For a subject-object pair with word
embeddings ``w_s, w_o``, spatial vector ``g`` (7-d) and union-box crop ``I``:

.. math::
    \\mathrm{LS} = W_L [g; w_s; w_o], \\qquad
    \\mathrm{SVW} = W_V [g; f(I); w_s; w_o], \\qquad
    p(\\text{predicate}) = \\mathrm{softmax}(\\mathrm{LS} \\odot \\mathrm{SVW})

with ``f`` a CNN ending in one score per predicate (the paper's VGG16 fc8). The ablations keep
one module and drop inputs: ``L`` (words), ``LS``, ``V`` (the CNN alone), ``SV``, ``SVW`` and
the full ``LS+SVW``.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from lightning_granndis.models.small_vision import small_image_net
from lightning_granndis.vrd.metrics import PredicateDetectionRecall
from lightning_granndis.vrd.samples import stack_samples

VARIANTS = ("L", "LS", "V", "SV", "SVW", "LS+SVW")


def load_word_vectors(path: str | Path, names: list[str], dim: int) -> torch.Tensor:
    """``[len(names), dim]`` vectors from a word2vec/GloVe text file (``word v1 v2 ...`` per line);
    a multi-word name averages its words; a name with no known word keeps a random vector."""
    wanted = {w for n in names for w in n.split()}
    found: dict[str, torch.Tensor] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            parts = line.rstrip().split(" ")
            if parts[0] in wanted:
                if len(parts) - 1 != dim:
                    raise ValueError(f"{path}:{number}: {len(parts) - 1} numbers for {parts[0]!r}, expected word_dim={dim}.")
                found[parts[0]] = torch.tensor([float(v) for v in parts[1:]])
    out = torch.randn(len(names), dim) * 0.1
    for i, name in enumerate(names):
        vecs = [found[w] for w in name.split() if w in found]
        if vecs:
            out[i] = torch.stack(vecs).mean(0)
    return out


class VisualRelationshipModel(pl.LightningModule):
    """Predicate classification for given subject/object boxes and classes.

    Args:
        num_objects, num_predicates: object and predicate classes. Default ``None``: the
            DataModule's ``object_names`` / ``predicate_names`` decide at ``setup`` (the layers are
            built then, and the sizes saved with the hyperparameters so checkpoints rebuild them).
        variant: one of ``L, LS, V, SV, SVW, LS+SVW`` (default ``LS+SVW``).
        word_dim: word embedding size (default 64; 300 for word2vec files).
        word_vectors: a word2vec/GloVe text file to initialise the embeddings from; default:
            learned from scratch.
        object_names: the object vocabulary, in class order, for ``word_vectors`` (default: the
            DataModule's, when the sizes come from it).
        backbone: torchvision ``mobilenet_v2`` (default) or ``resnet18``, random init, adapted to
            small crops; ``backbone_weights``: a state_dict file for it.
        width_mult: the backbone's width (default 0.5).
        lr: Adam learning rate (default 1e-3, the paper's), weight_decay 5e-3 (the paper's).

    Batches are the :class:`~lightning_granndis.datamodules.VisualGenomeDataModule`'s: training
    one relationship per row; evaluation a list of images, each a list of its relationships.
    Logs ``train_loss``, ``val_acc`` and ``{val,test}_R@{50,100}_k1`` / ``_kall`` with
    ``zs_`` (zero-shot) variants.
    """

    def __init__(self, num_objects: int | None = None, num_predicates: int | None = None, variant: str = "LS+SVW",
                 word_dim: int = 64, word_vectors: str | None = None, object_names: list[str] | None = None,
                 backbone: str = "mobilenet_v2", backbone_weights: str | None = None, width_mult: float = 0.5,
                 lr: float = 1e-3, weight_decay: float = 5e-3) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
        if (num_objects is None) != (num_predicates is None):
            raise ValueError("give both num_objects and num_predicates, or neither (then the DataModule's are used).")
        self.save_hyperparameters()
        self.recall_k1 = nn.ModuleDict({s: PredicateDetectionRecall((50, 100), top_predicates=1) for s in ("val", "test")})
        self.recall_all = nn.ModuleDict({s: PredicateDetectionRecall((50, 100), top_predicates=None)
                                         for s in ("val", "test")})
        self.words = None
        if num_objects is not None:
            self._build(num_objects, num_predicates, object_names)

    def _build(self, num_objects: int, num_predicates: int, object_names: list[str] | None) -> None:
        hp = self.hparams
        variant, word_dim = hp.variant, hp.word_dim
        self.words = nn.Embedding(num_objects, word_dim)
        if hp.word_vectors is not None:
            if not object_names or len(object_names) != num_objects:
                raise ValueError("word_vectors need object_names: the object vocabulary in class order.")
            self.words.weight.data.copy_(load_word_vectors(hp.word_vectors, object_names, word_dim))
        self.language = None
        if variant in ("L", "LS", "LS+SVW"):
            self.language = nn.Linear((7 if variant != "L" else 0) + 2 * word_dim, num_predicates)
        self.cnn = None
        self.visual = None
        if variant in ("V", "SV", "SVW", "LS+SVW"):
            width = hp.width_mult if hp.backbone == "mobilenet_v2" else 1.0
            self.cnn = small_image_net(hp.backbone, num_predicates, 3, width)
            if hp.backbone_weights is not None:
                self.cnn.load_state_dict(torch.load(hp.backbone_weights, map_location="cpu", weights_only=True))
            if variant != "V":
                extra = 7 + (2 * word_dim if variant in ("SVW", "LS+SVW") else 0)
                self.visual = nn.Linear(extra + num_predicates, num_predicates)

    def setup(self, stage: str) -> None:
        # Lightning sets the DataModule up first. A model built without sizes takes the data's
        # vocabularies (and records them, so its checkpoints rebuild it); one built with sizes must
        # fit them.
        dm = self.trainer.datamodule if self._trainer is not None else None
        names = {kind: getattr(dm, f"{kind}_names", None) for kind in ("object", "predicate")}
        if self.words is None:
            if not names["object"] or not names["predicate"]:
                raise ValueError("num_objects/num_predicates were not given and the DataModule has no object_names/"
                                 "predicate_names to take them from: pass them to the model.")
            self.hparams.num_objects, self.hparams.num_predicates = len(names["object"]), len(names["predicate"])
            self._build(len(names["object"]), len(names["predicate"]), self.hparams.object_names or names["object"])
            return
        for kind, want in (("object", self.hparams.num_objects), ("predicate", self.hparams.num_predicates)):
            if names[kind] and len(names[kind]) != want:
                raise ValueError(
                    f"the model was built for {want} {kind} classes but the data has {len(names[kind])}: set the "
                    f"model's num_{kind}s to {len(names[kind])} (the DataModule's num_{kind}_classes), or leave "
                    f"num_objects/num_predicates unset to take the data's."
                )

    def forward(self, batch: dict) -> torch.Tensor:
        """Predicate logits ``[B, predicates]``."""
        v = self.hparams.variant
        pair = torch.cat([self.words(batch["subject"]), self.words(batch["object"])], -1)
        spatial = batch["spatial"].float()
        ls = None
        if self.language is not None:
            ls = self.language(pair if v == "L" else torch.cat([spatial, pair], -1))
            if v in ("L", "LS"):
                return ls
        fc8 = self.cnn(batch["crop"])
        if v == "V":
            return fc8
        inputs = [spatial, fc8] + ([pair] if v in ("SVW", "LS+SVW") else [])
        svw = self.visual(torch.cat(inputs, -1))
        return svw if ls is None else ls * svw  # the paper's elementwise product, then softmax

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch), batch["predicate"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, images: list[list[dict]], split: str) -> None:
        for samples in images:
            if not samples:  # padding (see ImageGroups)
                continue
            batch = stack_samples(samples, self.device)
            scores = F.softmax(self(batch), -1)
            # a pair is a (subject box, object box, classes); several predicates may share it
            keys = [(tuple(s["subject_box"].tolist()), tuple(s["object_box"].tolist()), int(s["subject"]), int(s["object"]))
                    for s in samples]
            first_row: dict[tuple, int] = {}  # pair -> its first row, in order of appearance
            for row, key in enumerate(keys):
                first_row.setdefault(key, row)
            pair_of = {key: i for i, key in enumerate(first_row)}
            gt_pairs = torch.tensor([pair_of[key] for key in keys])
            pair_rows = torch.tensor(list(first_row.values()))
            zs = torch.tensor([bool(s["zero_shot"]) for s in samples])
            for metric in (self.recall_k1[split], self.recall_all[split]):
                metric.update(scores[pair_rows], gt_pairs, batch["predicate"], zs)
            acc = (scores.argmax(-1) == batch["predicate"]).float().sum()
            self.log(f"{split}_acc", acc / len(samples), batch_size=len(samples), sync_dist=True)

    def _epoch_end(self, split: str) -> None:
        for name, metric in (("k1", self.recall_k1[split]), ("kall", self.recall_all[split])):
            for key, value in metric.compute().items():
                self.log(f"{split}_{key}_{name}", float(value), sync_dist=True)  # equal on every rank already
            metric.reset()

    def validation_step(self, images, batch_idx: int) -> None:
        self._evaluate(images, "val")

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def test_step(self, images, batch_idx: int) -> None:
        self._evaluate(images, "test")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
