"""A DataLoader stand-in for ranks that receive their inputs from another rank instead of reading
them (pipeline stages after the first)."""

from __future__ import annotations

from typing import Any, Callable, Iterator


class RelayPlaceholder:
    """What a rank that reads no data gets as its batch: the step's index, nothing loaded."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"RelayPlaceholder({self.index})"


class StageLoader:
    """Iterates ``loader`` when ``loads()`` says this rank reads data now, else yields as many
    :class:`RelayPlaceholder` batches (its length comes from the sampler: nothing is read).
    Everything else (``sampler``, ``batch_size``, ``dataset``…) is ``loader``'s."""

    def __init__(self, loader: Any, loads: Callable[[], bool]) -> None:
        self.__dict__["loader"] = loader
        self.__dict__["loads"] = loads

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self.loads():
            return iter(self.loader)
        return (RelayPlaceholder(i) for i in range(len(self.loader)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)
