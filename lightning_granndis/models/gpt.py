"""A small GPT (decoder-only transformer) as an ordered list of pipeline blocks, with tied
input/output embeddings: block 0 embeds, the last block projects back with the same weight."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lightning_granndis.pipeline.module import PipelinedModule


class Embedding(nn.Module):
    """Token plus learned position embedding: ``[B, T]`` ids → ``[B, T, d]``."""

    def __init__(self, vocab_size: int, block_size: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(block_size, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > self.pos.num_embeddings:
            raise ValueError(f"sequence of {ids.shape[1]} tokens is longer than block_size={self.pos.num_embeddings}.")
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.tok(ids) + self.pos(pos))


class TransformerBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual: ``[B, T, d]`` → ``[B, T, d]``."""

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}.")
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.ln2(x))


class TiedHead(nn.Module):
    """Final LayerNorm and the output projection, sharing its weight with the token embedding."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(embedding.embedding_dim)
        self.weight = embedding.weight  # the same Parameter: tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln(x), self.weight)


class GPT(PipelinedModule):
    """Decoder-only language model, ``layers + 2`` blocks: embedding, transformer blocks, tied head.

    Args:
        vocab_size: tokens (default 256, byte level).
        block_size: longest sequence (default 128).
        hidden: model width ``d`` (default 128).
        layers: transformer blocks (default 4).
        heads: attention heads (default 4).
        dropout: dropout probability (default 0.0).
        lr: AdamW learning rate (default 3e-3), cosine-decayed over ``max_steps`` when set.
        weight_decay: AdamW weight decay on matrices (default 0.01).
        warmup_steps: linear learning-rate warm-up (default 0).
        lr_schedule: ``"cosine"`` (default: decay to 0.1 x ``lr`` over ``max_steps`` when set) or
            ``"constant"``.

    Batches are ``(x, y)`` with ``x, y: [B, T]`` token ids; the loss is the mean next-token
    cross-entropy.
    """

    def __init__(self, vocab_size: int = 256, block_size: int = 128, hidden: int = 128, layers: int = 4,
                 heads: int = 4, dropout: float = 0.0, lr: float = 3e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 0, lr_schedule: str = "cosine") -> None:
        super().__init__()
        if lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"lr_schedule must be 'cosine' or 'constant', got {lr_schedule!r}.")
        self.save_hyperparameters()
        embed = Embedding(vocab_size, block_size, hidden, dropout)
        self.blocks = nn.Sequential(
            embed, *[TransformerBlock(hidden, heads, dropout) for _ in range(layers)], TiedHead(embed.tok)
        )
        self.apply(self._init)
        self.example_input_array = torch.zeros(2, block_size, dtype=torch.long)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def pipeline_loss(self, output: torch.Tensor, batch) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), batch[1].reshape(-1))

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr, betas=(0.9, 0.95),
        )
        cosine = self.hparams.lr_schedule == "cosine" and self.trainer is not None and self.trainer.max_steps > 0
        total = self.trainer.max_steps if cosine else 0
        warm = self.hparams.warmup_steps
        if not total and not warm:
            return optimizer

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            if not total:
                return 1.0
            progress = min(1.0, (step - warm) / max(1, total - warm))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
