"""Pipeline schedules as data: what each stage does, in order.

A schedule is a list of :class:`Action` per stage. ``GPipe`` (Huang et al., 2019) runs every
micro-batch forward, then every backward. ``1F1B`` (PipeDream-Flush, Narayanan et al., 2021) runs
``S - s - 1`` warm-up forwards on stage ``s``, then alternates one forward and one backward
(steady state), then drains the remaining backwards (cool-down). Optimus-CC's epilogue-only
compression (ASPLOS'23) compresses just the backward sends of the cool-down plus the last
steady-state one: those are flagged ``epilogue``.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Action:
    """``kind`` ``"F"`` or ``"B"`` of micro-batch ``micro``; ``epilogue`` marks a backward whose
    gradient send lies in the flush (cool-down) of the schedule."""

    kind: str
    micro: int
    epilogue: bool = False


def gpipe(stages: int, micro_batches: int) -> list[list[Action]]:
    """All forwards, then all backwards (in reverse micro-batch order), on every stage. Every
    backward is in the flush."""
    return [[Action("F", i) for i in range(micro_batches)]
            + [Action("B", i, epilogue=True) for i in reversed(range(micro_batches))] for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Action]]:
    """1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    out = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        steady = micro_batches - warmup
        actions = [Action("F", i) for i in range(warmup)]
        f, b = warmup, 0
        for k in range(steady):
            actions.append(Action("F", f))
            f += 1
            actions.append(Action("B", b, epilogue=k == steady - 1))
            b += 1
        actions += [Action("B", i, epilogue=True) for i in range(b, micro_batches)]
        out.append(actions)
    return out


def build_schedule(name: str, stages: int, micro_batches: int) -> list[list[Action]]:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need stages >= 1 and micro_batches >= 1, got {stages} and {micro_batches}.")
    if name == "gpipe":
        return gpipe(stages, micro_batches)
    if name == "1f1b":
        return one_f_one_b(stages, micro_batches)
    raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}.")


def peak_in_flight(actions: list[Action]) -> int:
    """Most micro-batches whose activations a stage holds at once (forwarded, not yet backwarded)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak
