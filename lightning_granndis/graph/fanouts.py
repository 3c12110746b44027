"""Per-hop fan-outs in PyG's ``num_neighbors`` form.

``NeighborLoader(num_neighbors=[15, 10, 5])`` keeps 15 neighbours of every seed, 10 of every
vertex one hop out and 5 two hops out (``-1``: every neighbour); the list has one entry per
message-passing layer. The sampled modes read ``fanout`` the same way, and an ``int`` is
shorthand for the same number at every hop. EAS's expansion fan-out has one entry per expansion
hop (``eas_hops``).
"""

from __future__ import annotations

from collections.abc import Sequence

Fanout = int | Sequence[int]


def check_fanout_type(fanout, name: str = "fanout") -> None:
    """Refuses what can never be a fan-out, whatever the model (an ``int`` or a list of them)."""
    if fanout is None:
        return
    values = [fanout] if isinstance(fanout, int) and not isinstance(fanout, bool) else fanout
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} must be an int or a non-empty list of ints with one entry per hop (PyG's "
                         f"num_neighbors, e.g. [15, 10, 5]; -1 = every neighbour), got {fanout!r}.")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
            raise ValueError(f"{name} entries must be -1 (every neighbour) or a positive number of neighbours, "
                             f"got {value!r} in {fanout!r}.")


def resolve_fanouts(fanout: Fanout | None, hops: int, default: int, name: str = "fanout",
                    what: str = "the model's message-passing layers") -> list[int]:
    """``fanout`` as one entry per hop: an ``int`` (or ``None``: ``default``) repeated ``hops``
    times, a list checked to have ``hops`` entries, each ``-1`` or ``>= 1``.

    Raises:
        ValueError: naming the hop count it expected (``what``) and the fix.
    """
    if fanout is None:
        fanout = default
    check_fanout_type(fanout, name)
    if isinstance(fanout, int):
        return [int(fanout)] * hops
    values = [int(v) for v in fanout]
    if len(values) != hops:
        raise ValueError(
            f"{name}={values} has {len(values)} entries but {what} number {hops}: give one fan-out per hop "
            f"(PyG's num_neighbors), e.g. {name}={([15, 10, 5] + [5] * hops)[:hops]}, or one int for every hop."
        )
    return values
