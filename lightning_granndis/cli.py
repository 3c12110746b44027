"""The ``granndis`` command: LightningCLI over the suite's strategies, models and DataModules.

    granndis fit --config recipes/demo.yaml
    granndis validate --config recipes/demo.yaml --ckpt_path runs/demo/.../last.ckpt
"""

from __future__ import annotations

import time

from lightning.pytorch.cli import LightningCLI

import lightning_granndis  # noqa: F401  (registers the strategies)


class GranndisCLI(LightningCLI):
    """LightningCLI that prints a readable summary after ``fit``, ``validate`` and ``test``."""

    def before_fit(self) -> None:
        self._t0 = time.perf_counter()

    def after_fit(self) -> None:
        self._summary("fit")

    def after_validate(self) -> None:
        self._summary("validate")

    def after_test(self) -> None:
        self._summary("test")

    def _summary(self, stage: str) -> None:
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        lines = [f"== {stage} summary =="]
        if stage == "fit":
            lines.append(f"epochs: {trainer.current_epoch}   steps: {trainer.global_step}   "
                         f"wall: {time.perf_counter() - getattr(self, '_t0', time.perf_counter()):.1f} s")
        strategy = trainer.strategy
        topology = getattr(strategy, "topology", None)
        lines.append(f"strategy: {type(strategy).__name__}" + (f" on {topology.describe()}" if topology else ""))
        for key, value in sorted(trainer.callback_metrics.items()):
            lines.append(f"{key:>24}: {float(value):.4f}")
        ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        if ckpt:
            lines.append(f"checkpoint: {ckpt}")
        print("\n".join(lines), flush=True)


def run(args: list[str] | None = None) -> GranndisCLI:
    """Runs the CLI and returns it (for tests and notebooks)."""
    return GranndisCLI(save_config_kwargs={"overwrite": True}, args=args)


def main() -> int:
    run()
    return 0


if __name__ == "__main__":
    main()
