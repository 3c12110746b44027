"""A picture of predictions: test images with their top predicted relationships drawn on them."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_granndis.report import save_figure
from lightning_granndis.vrd.samples import stack_samples


@torch.no_grad()
def draw_predictions(model, images: list[list[dict]], object_names: list[str], predicate_names: list[str],
                     path: str | Path, per_image: int = 3) -> Path:
    """Draws each image (a list of its samples, as evaluation batches hold them) with the subject
    and object boxes of its ``per_image`` most confident predictions and their triplets: correct
    predicates in green, wrong ones in red. Saves a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches as patches
    import matplotlib.pyplot as plt
    from PIL import Image

    model.eval()
    cols = min(3, len(images))
    rows = (len(images) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, samples in zip(axes.flat, images):
        probs = torch.softmax(model(stack_samples(samples, model.device)), -1).cpu()
        best, pred = probs.max(-1)
        picture = samples[0].get("image_path")
        if picture:
            with Image.open(picture) as im:
                ax.imshow(im.convert("RGB"))
        lines = []
        for i in best.argsort(descending=True)[:per_image].tolist():
            s = samples[i]
            ok = int(pred[i]) == int(s["predicate"])
            colour = "tab:green" if ok else "tab:red"
            for box in (s["subject_box"], s["object_box"]):
                x1, y1, x2, y2 = box.tolist()
                ax.add_patch(patches.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, lw=1.5))
            lines.append((f"{object_names[int(s['subject'])]} {predicate_names[int(pred[i])]} "
                          f"{object_names[int(s['object'])]} ({float(best[i]):.2f})", colour))
        ax.set_title(f"image {samples[0]['image_id']}", fontsize=9)
        for k, (text, colour) in enumerate(lines):
            ax.text(0.0, -0.06 - 0.07 * k, text, transform=ax.transAxes, fontsize=8, color=colour, va="top")
    return save_figure(fig, path)
