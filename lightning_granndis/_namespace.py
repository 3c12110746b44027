"""A clear error for users of the old ``pytorch_lightning`` namespace.

Our strategies subclass ``lightning.pytorch`` classes; a ``pytorch_lightning.Trainer`` rejects
them with a generic "invalid strategy" message (the most common complaint across Lightning
plugins). We register our names in the old namespace's registry too, as factories that raise an
error saying what to change. Registration happens when ``pytorch_lightning`` is imported, before or
after us, without importing it ourselves.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_OLD = "pytorch_lightning.strategies"


class OldNamespaceError(ImportError):
    pass


def _refuse(name: str):
    def factory(*args, **kwargs):
        raise OldNamespaceError(
            f"Strategy {name!r} from lightning_granndis is built on the `lightning` package "
            "(`import lightning.pytorch as pl`), but it was requested from a `pytorch_lightning.Trainer`. "
            "Replace `import pytorch_lightning as pl` / `from pytorch_lightning import Trainer` with "
            "`import lightning.pytorch as pl` / `from lightning.pytorch import Trainer`."
        )

    return factory


def _register_in_old_namespace(names: list[str]) -> None:
    registry = sys.modules[_OLD].StrategyRegistry
    for name in names:
        registry.register(name, _refuse(name), description="lightning_granndis (needs lightning.pytorch)", override=True)


class _PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname != _OLD:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module, names = spec.loader.exec_module, self.names

        def exec_and_register(module):
            exec_module(module)
            _register_in_old_namespace(names)

        spec.loader.exec_module = exec_and_register
        return spec


def install(names: list[str]) -> None:
    if _OLD in sys.modules:
        _register_in_old_namespace(names)
    elif not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook(names))
