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
    Everything else (``sampler``, ``batch_size``, ``dataset``…) is ``loader``'s.

    Its ``state_dict`` (which Lightning checkpoints) is the reading loader's, or, on a rank that
    reads nothing, how many placeholders it gave: either way a resumed epoch continues where the
    saved one stood."""

    def __init__(self, loader: Any, loads: Callable[[], bool]) -> None:
        self.__dict__.update(loader=loader, loads=loads, _given=0, _skip=0)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self.loads():
            return iter(self.loader)
        return self._placeholders()

    def _placeholders(self) -> Iterator[RelayPlaceholder]:
        start, self.__dict__["_skip"] = self._skip, 0
        for i in range(start, len(self.loader)):
            self.__dict__["_given"] = i + 1
            yield RelayPlaceholder(i)

    def state_dict(self) -> dict[str, Any]:
        if self.loads():
            inner = getattr(self.loader, "state_dict", None)
            return {"loader": inner()} if inner is not None else {}
        return {"placeholders": self._given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "loader" in state and hasattr(self.loader, "load_state_dict"):
            self.loader.load_state_dict(state["loader"])
        given = state.get("placeholders", 0)
        self.__dict__["_skip"] = given if given < len(self.loader) else 0  # after the last: a new epoch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)
