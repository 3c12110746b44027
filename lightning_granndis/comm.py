"""The communication layer: the one module that calls ``torch.distributed``.

Every collective and point-to-point operation of the package goes through a
:class:`Communicator`, which books it in a :class:`~lightning_granndis.ledger.CommLedger` by
link class (intra-/inter-server, from the :class:`~lightning_granndis.topology.ServerTopology`)
and purpose, and can *emulate* a slow inter-server link by delaying each operation that crosses
servers to at least the duration its :class:`~lightning_granndis.link_model.LinkModel` predicts.

Byte conventions (bytes this rank *sends*, per peer of the group; ``S`` = the tensor's bytes,
``n`` = group size, ``c_j`` = the bytes of chunk ``j`` when the tensor is split into ``n`` near-equal
chunks as :func:`torch.tensor_split` splits it):

==================  ===========================================================================
``all_reduce``      reduce-scatter + all-gather, pairwise: ``c_j + c_i`` to peer ``j`` (rank = index ``i``)
``all_gather``      ``S`` to every peer
``all_to_all``      the rows of ``send_splits[j]`` to peer ``j``
``broadcast``       the source sends ``S`` to every peer; the others send nothing
``reduce``          every rank but the destination sends ``S`` to it
``reduce_scatter``  ``c_j`` (rows) to peer ``j``
``send``/``isend``  ``S`` to the destination
==================  ===========================================================================

With this convention a flat all-reduce over ``N`` servers of ``G`` devices sends
``2(N-1)G·S`` bytes across servers in all, a hierarchical one ``2(N-1)·S``: ``G`` times less.
Measured wall seconds of an operation are booked to the slowest link class it used.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from lightning_granndis.ledger import CommLedger
from lightning_granndis.link_model import LinkModel
from lightning_granndis.topology import ServerTopology

_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


# ---------------------------------------------------------------------- process-level helpers
def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def get_backend() -> str | None:
    return dist.get_backend() if is_initialized() else None


def default_backend(device: torch.device | str | None = None) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_from_env(backend: str | None = None, timeout_s: float = 300.0) -> None:
    """Initialises the default process group from torchrun's environment variables.

    For scripts outside Lightning (Lightning's strategies initialise the group themselves).
    Picks the backend from the accelerator and, under NCCL, binds the process to ``LOCAL_RANK``'s GPU.
    """
    if is_initialized():
        return
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timedelta(seconds=timeout_s)
    if not init_restart_safe(backend, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout):
        dist.init_process_group(backend=backend, timeout=timeout)


def init_restart_safe(backend: str, rank: int, world_size: int, timeout: timedelta,
                      device_id: torch.device | None = None) -> bool:
    """Under torchrun, initialises the default group on a store prefixed by the restart attempt.

    torchrun's agent keeps one store for every attempt of a job. Gloo finds its peers through
    keys of that store, so the ranks of a restarted attempt can read the addresses the previous
    attempt's dead ranks left there (they connect to closed ports and the restart fails) unless
    each attempt keeps its keys apart. Returns whether it initialised the group (``False``
    outside torchrun, or when a group exists)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or is_initialized():
        return False
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    kwargs = {"device_id": device_id} if device_id is not None else {}
    dist.init_process_group(backend, store=dist.PrefixStore(f"lightning_granndis/attempt_{attempt}", store),
                            rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    return True


def exchange_before_group(key: str, value: int, timeout_s: float = 300.0) -> list[int] | None:
    """Every rank's ``value`` for ``key``, in rank order, before the process group exists.

    Under torchrun the agent's store is up before any worker starts, so ranks can agree on
    something Lightning decides before it initialises the group (which checkpoint to resume).
    Keys live under the restart attempt (like the group's). Returns ``None`` outside torchrun
    (Lightning's own launcher creates the store with the group) and once a group exists (use a
    collective then)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true" or is_initialized():
        return None
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(f"lightning_granndis/attempt_{attempt}/exchange/{key}", store)
    store.set(str(rank), str(int(value)))
    store.wait([str(r) for r in range(world_size)])
    return [int(store.get(str(r))) for r in range(world_size)]


@dataclass
class ServerGroups:
    """Process groups of a :class:`ServerTopology`: one per server, plus the server heads."""

    intra: list
    heads: object

    def intra_of(self, topology: ServerTopology, rank: int):
        return self.intra[topology.server_of(rank)]


def server_groups(topology: ServerTopology) -> ServerGroups:
    """The intra-server groups and the heads group of ``topology``, created once (cached on it).

    Collective: every rank calls it, in the same order as any other group creation."""
    if "server" not in topology.process_groups:
        intra = [new_group(topology.ranks_of(s)) for s in range(topology.servers)]
        heads = new_group(topology.heads)
        topology.process_groups["server"] = ServerGroups(intra=intra, heads=heads)
    return topology.process_groups["server"]


def topology_group(topology: ServerTopology, ranks: Sequence[int]):
    """The process group over ``ranks`` of ``topology``, created once (cached on it): per-stage,
    data-parallel and other groups. Collective like ``dist.new_group``: every rank calls it with
    the same ``ranks`` in the same order, also the ranks not in the group."""
    key = tuple(sorted(ranks))
    for r in key:
        topology.check_rank(r)
    cache = topology.process_groups.setdefault("custom", {})
    if key not in cache:
        cache[key] = new_group(list(key))
    return cache[key]


def destroy() -> None:
    if is_initialized():
        dist.destroy_process_group()


def default_timeout() -> timedelta | None:
    """The default group's timeout (``init_process_group(timeout=...)``, Lightning's strategy
    ``timeout``), or ``None`` when it cannot be read."""
    try:
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        return group._get_backend(device).options._timeout
    except (RuntimeError, AttributeError, ValueError):
        return None


def new_group(ranks: Sequence[int]):
    """A process group over ``ranks`` (collective over the world); ``None`` when not distributed.
    It waits as long as the default group: ``dist.new_group`` would otherwise give it torch's
    default (30 minutes), and a hung peer would hold a collective of it that long."""
    if not is_initialized():
        return None
    return dist.new_group(ranks=list(ranks), timeout=default_timeout())


def group_ranks(group=None) -> list[int]:
    if not is_initialized():
        return [0]
    if group is None:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def gather_objects(obj, group=None) -> list:
    """Every rank's ``obj`` (pickled), on every rank. Control traffic: not booked."""
    if not is_initialized():
        return [obj]
    out = [None] * len(group_ranks(group))
    dist.all_gather_object(out, obj, group=group)
    return out


def scatter_objects(objs: list | None, src: int = 0) -> object:
    """``objs[rank]`` from rank ``src`` to every rank (``objs`` only needed on ``src``).
    Set-up traffic (plans, partitions): not booked."""
    if not is_initialized():
        return objs[0]
    out = [None]
    dist.scatter_object_list(out, objs if get_rank() == src else None, src=src)
    return out[0]


def broadcast_object(obj, src: int) -> object:
    """Rank ``src``'s ``obj`` (pickled) on every rank. Recovery traffic: not booked."""
    if not is_initialized():
        return obj
    out = [obj if get_rank() == src else None]
    dist.broadcast_object_list(out, src=src)
    return out[0]


def barrier(group=None) -> None:
    if is_initialized():
        dist.barrier(group=group)


# ---------------------------------------------------------------- errors shared through the store
#: where a failing rank leaves its exception for its peers (in the process group's key-value store),
#: and a counter of the ranks that failed with an error of their own
#: (under a generation number: a failure caught by the user ends with its run, and the next
#: ``fit`` in the same processes starts a new generation with no failure in it)
_ERROR_KEY = "lightning_granndis/{gen}/error/{rank}"
_FAILED_KEY = "lightning_granndis/{gen}/failed"
_PUBLISHED_KEY = "lightning_granndis/{gen}/published"
_generation = 0
#: each rank's watch writes the time here every second: a rank that stops answering (hung,
#: SIGSTOPped, swapped out) stops writing it, and its peers can name it
_HEARTBEAT_KEY = "lightning_granndis/heartbeat/{}"
HEARTBEAT_S = 1.0
#: set while this process handles an exception of its own (its watch then stands down)
_handling = threading.Event()
#: what gloo, NCCL and the store say when a collective breaks off or times out, whatever the cause
_COMM_MARKERS = ("Connection closed by peer", "Connection closed", "Connection reset by peer", "Broken pipe",
                 "pair closure", "Application timeout", "NCCL", "Gloo", "gloo", "Watchdog", "watchdog",
                 "collective operation timeout", "ProcessGroup", "Timed out", "timed out", "Socket Timeout",
                 "DistBackendError", "DistNetworkError", "DistStoreError")


def new_failure_generation() -> int:
    """Starts a new generation of shared errors (call it on every rank as a run starts): errors of
    an earlier run in these processes, raised and caught, are not taken for a peer's failure."""
    global _generation
    _generation += 1
    _handling.clear()
    return _generation


def _key(template: str, rank: int | None = None) -> str:
    return template.format(gen=_generation, rank=rank)


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` is what a rank sees when a *peer* failed or hung (its collective broke off
    or timed out), looking through the exceptions it was raised from."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, getattr(dist, "DistError", ())):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _COMM_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _store():
    try:
        return dist.distributed_c10d._get_default_store() if is_initialized() else None
    except (RuntimeError, ValueError, AttributeError):
        return None


def publish_error(exc: BaseException) -> None:
    """Leaves this rank's exception (type, message, where it was raised) in the store, so that the
    peers whose collectives break off because of it can name it. Best effort: never raises."""
    store = _store()
    if store is None:
        return
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    kind = "comm" if is_communication_error(exc) else "root"
    try:
        store.set(_key(_ERROR_KEY, get_rank()), f"{kind}|{type(exc).__name__}: {exc}{where}"[:4000])
        if kind == "root":
            store.add(_key(_FAILED_KEY), 1)
        store.add(_key(_PUBLISHED_KEY), 1)
    except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
        pass


def peer_errors(wait_s: float = 1.0) -> dict[int, str]:
    """``{rank: "Type: message (raised at file:line)"}`` of the other ranks that failed with an
    error of their own (not a broken-off collective), waiting up to ``wait_s`` for one to appear."""
    store = _store()
    if store is None:
        return {}
    deadline = time.monotonic() + wait_s
    while True:
        found = {}
        try:
            for rank in range(get_world_size()):
                key = _key(_ERROR_KEY, rank)
                if rank != get_rank() and store.check([key]):
                    kind, text = store.get(key).decode().split("|", 1)
                    if kind == "root":
                        found[rank] = text
        except Exception:  # noqa: BLE001 - a store whose host died answers nothing more
            return found
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def explain_failure(exc: BaseException, wait_s: float = 1.0) -> None:
    """Publishes ``exc`` and adds a note naming the rank that failed first: on a rank whose
    collective broke off, the peers' own errors; on the failing rank, its rank. Call it where an
    exception leaves a distributed run (a strategy's ``on_exception``)."""
    if not is_initialized():
        return
    _handling.set()
    _finish_before_terminating()
    publish_error(exc)
    rank, world = get_rank(), get_world_size()
    if not is_communication_error(exc):
        exc.add_note(f"[lightning_granndis] raised on rank {rank} of {world}; the other ranks' errors name it.")
        _wait_for_peers_to_publish(world, wait_s=5.0)
        return
    peers = peer_errors(wait_s)
    for peer, text in sorted(peers.items()):
        exc.add_note(f"[lightning_granndis] rank {peer} of {world} failed first with {text}; this error on rank "
                     f"{rank} is its consequence (a collective with rank {peer} broke off).")
    if not peers:
        failed = _ranks_that_published()  # they failed too, as a consequence: not the hung one
        for peer, silent_s in sorted(stalled_peers().items()):
            if peer in failed:
                continue
            exc.add_note(f"[lightning_granndis] rank {peer} of {world} stopped answering (no heartbeat for "
                         f"{silent_s:.0f} s: hung, stopped or starved); this error on rank {rank} is its consequence "
                         "(a collective with it timed out; the strategy's `timeout` sets how long ranks wait).")


def _ranks_that_published() -> set[int]:
    store = _store()
    try:
        return {r for r in range(get_world_size()) if store is not None and store.check([_key(_ERROR_KEY, r)])}
    except Exception:  # noqa: BLE001
        return set()


def stalled_peers(stale_s: float = 5 * HEARTBEAT_S) -> dict[int, float]:
    """``{rank: seconds since its last heartbeat}`` of the peers silent for over ``stale_s``
    (only ranks whose watch has beaten at least once; see :class:`FailureWatch`)."""
    store = _store()
    if store is None:
        return {}
    now, found = time.time(), {}
    try:
        for peer in range(get_world_size()):
            key = _HEARTBEAT_KEY.format(peer)
            if peer != get_rank() and store.check([key]):
                silent = now - float(store.get(key).decode())
                if silent > stale_s:
                    found[peer] = silent
    except Exception:  # noqa: BLE001 - a store whose host died answers nothing more
        pass
    return found


def _wait_for_peers_to_publish(world: int, wait_s: float) -> None:
    """Holds the failing rank until its peers have taken up its error (each published its own),
    or ``wait_s`` passes: its exit makes the launcher terminate them, and a peer terminated first
    could not say which rank failed. A peer blocked on a live rank is ended by its watch."""
    store = _store()
    deadline = time.monotonic() + wait_s
    while store is not None and time.monotonic() < deadline:
        try:
            if store.add(_key(_PUBLISHED_KEY), 0) >= world:
                return
        except Exception:  # noqa: BLE001 - the store's host is gone: nothing to wait for
            return
        time.sleep(0.05)


def _finish_before_terminating() -> None:
    """Lets this rank print its error before it ends. Once the first failing rank exits, the
    launcher (torchrun's agent) SIGTERMs the others at once, and on a loaded machine a rank still
    waiting for the peers' errors would die before saying why. The deferred SIGTERM only records
    the request; the rank is raising anyway and ends moments later (the agent SIGKILLs a rank that
    does not)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return

    def deferred(signum, frame):  # noqa: ARG001 - the exception already unwinding ends this process
        pass

    try:
        signal.signal(signal.SIGTERM, deferred)
    except (ValueError, OSError):  # not the main interpreter
        pass


def ignore_sigterm_while_failing() -> None:
    """Wraps this process's SIGTERM handler so that a SIGTERM arriving while the rank is already
    raising is ignored. Call it once the trainer's handlers are in place (they are re-registered
    for every ``fit``).

    torchrun's agent SIGTERMs every worker once one fails. Lightning's handler answers with a
    broadcast to the peers, which cannot complete when a peer is dead or hung: on a rank that is
    already unwinding an error, it would replace that error (and its note naming the failing
    rank) with a broadcast timeout."""
    import signal
    import sys

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "_lightning_granndis_guard", False) or not callable(previous):
        return

    def guarded(signum, frame):
        handled = sys.exc_info()[1]  # what the interrupted frames are handling, if anything
        if _handling.is_set() or (handled is not None and is_communication_error(handled)):
            return  # failing already: the exception unwinding ends this process
        previous(signum, frame)

    guarded._lightning_granndis_guard = True
    signal.signal(signal.SIGTERM, guarded)


#: held by the watch thread around each store call, and by a forking thread across ``fork()``: a
#: DataLoader worker forked while the watch was inside a store call would inherit its locks held
#: and hang at its first step
_watch_busy = threading.Lock()
_held_for_fork = False


def _before_fork() -> None:
    global _held_for_fork
    # bounded: a store call stuck on a dead host must not stop the process from forking
    _held_for_fork = _watch_busy.acquire(timeout=5.0)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _watch_busy.release()


def _after_fork_in_child() -> None:
    global _watch_busy, _held_for_fork
    _watch_busy, _held_for_fork = threading.Lock(), False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


class FailureWatch:
    """A daemon thread that ends this rank when a peer fails while this rank waits, and writes
    this rank's heartbeat (:func:`stalled_peers` names a peer that stopped answering).

    A rank blocked in a collective with a *live* peer (rank 0 waiting for rank 1, which waits for
    the failed rank 2) would otherwise wait for the process group's timeout, and a launcher's
    SIGTERM cannot interrupt a wait inside gloo or NCCL. The watch polls the store every
    ``interval_s``; once a peer has published an error of its own, it gives this rank ``grace_s``
    to raise (its collective broken off, :func:`explain_failure` names the cause), and otherwise
    prints which rank failed and why, and exits the process with status 1.
    """

    def __init__(self, interval_s: float = 0.2, grace_s: float = 2.0) -> None:
        self.interval_s, self.grace_s = interval_s, grace_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "FailureWatch":
        store = _store()
        if store is not None and self._thread is None:
            try:  # a connection of its own: a store client is not safe to share between threads
                store = store.clone()
            except (RuntimeError, AttributeError):
                pass
            _handling.clear()
            try:  # the first beat now: a rank that hangs at once is still named
                store.set(_HEARTBEAT_KEY.format(get_rank()), repr(time.time()))
            except Exception:  # noqa: BLE001
                pass
            self._thread = threading.Thread(target=self._run, args=(store,), name="lightning_granndis-failure-watch",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        # joined, not left running: a daemon thread still inside a store call when the interpreter
        # exits is ended mid-C++ and aborts the process ("terminate called without an active exception")
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._thread = None

    def _run(self, store) -> None:
        heartbeat, last_beat = _HEARTBEAT_KEY.format(get_rank()), 0.0
        failed = _key(_FAILED_KEY)  # this run's generation
        while not self._stop.wait(self.interval_s):
            try:
                with _watch_busy:
                    if time.monotonic() - last_beat >= HEARTBEAT_S:
                        store.set(heartbeat, repr(time.time()))
                        last_beat = time.monotonic()
                    if not store.check([failed]):
                        continue
            except Exception:  # noqa: BLE001 - no store, nothing to watch
                return
            if self._stop.wait(self.grace_s) or _handling.is_set():
                return  # finished, or raising on its own (with the note)
            import sys

            peers = peer_errors(wait_s=0.0)
            cause = "; ".join(f"rank {r} of {get_world_size()} failed with {t}" for r, t in sorted(peers.items()))
            sys.stderr.write(f"\n[lightning_granndis] rank {get_rank()} of {get_world_size()} stops: "
                             f"{cause or 'a peer failed'}. This rank was waiting in a collective that cannot "
                             "complete.\n")
            sys.stderr.flush()
            try:
                store.add(_key(_PUBLISHED_KEY), 1)  # said why: the failing rank need not wait for it
            except Exception:  # noqa: BLE001
                pass
            os._exit(1)


def _chunk_sizes(total: int, parts: int) -> list[int]:
    """Sizes of :func:`torch.tensor_split` into ``parts`` near-equal chunks."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _sync(tensor: torch.Tensor) -> None:
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def _reduce_op(op: str):
    if op not in _REDUCE_OPS and op != "avg":
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join([*_REDUCE_OPS, 'avg'])}.")
    return getattr(dist.ReduceOp, _REDUCE_OPS.get(op, "SUM"))


# ---------------------------------------------------------------------- the communicator
class Communicator:
    """Booked, optionally emulated, wrappers around ``torch.distributed``.

    Args:
        topology: which ranks share a server. Defaults to one server spanning the world.
        link_model: the link model (or a preset name) for modelled time and emulation.
        emulate: delay every operation that crosses servers to at least its modelled duration.
        ledger: where to book; a fresh :class:`CommLedger` by default.

    Every wrapper takes ``purpose`` (``"halo"``, ``"grad_sync"``, …) and ``group`` (a process group
    from the topology; ``None`` = the world). Ranks (``src``, ``dst``) are global ranks. Outside a
    distributed run, or on a group of one rank, the wrappers return their input and book nothing.
    """

    def __init__(
        self,
        topology: ServerTopology | None = None,
        link_model: LinkModel | str | dict | None = None,
        emulate: bool = False,
        ledger: CommLedger | None = None,
    ) -> None:
        self.topology = topology or ServerTopology(world_size=get_world_size())
        self.link_model = LinkModel.resolve(link_model)
        self.emulate = emulate
        self.ledger = ledger if ledger is not None else CommLedger()

    @property
    def rank(self) -> int:
        return get_rank()

    # ------------------------------------------------------------------ booking
    def _sharers(self, inter_senders: Sequence[int]) -> int:
        me = self.topology.server_of(self.rank)
        return sum(1 for r in inter_senders if self.topology.server_of(r) == me)

    def _book(
        self,
        purpose: str,
        sent: dict[int, int],
        received: dict[int, int],
        wall: float,
        inter_senders: Sequence[int],
        may_sleep: bool = True,
    ) -> None:
        """Books one finished operation; when emulating, first sleeps up to its modelled time."""
        # per link class: bytes sent, bytes received, messages sent, messages received
        per_link: dict[str, list[int]] = {"intra": [0, 0, 0, 0], "inter": [0, 0, 0, 0]}
        for peer, nbytes in sent.items():
            cell = per_link[self.topology.link(self.rank, peer)]
            cell[0] += nbytes
            cell[2] += 1 if nbytes > 0 else 0
        for peer, nbytes in received.items():
            cell = per_link[self.topology.link(self.rank, peer)]
            cell[1] += nbytes
            cell[3] += 1 if nbytes > 0 else 0
        sharers = {"intra": 1, "inter": max(1, self._sharers(inter_senders))}
        # A transfer takes the link's time at both ends: the larger of what this rank pushes through
        # its (shared) card and what it receives decides.
        modelled = {
            lk: self.link_model.time(lk, max(c[0] * sharers[lk], c[1]), max(c[2], c[3]))
            for lk, c in per_link.items()
        }
        slowest = "inter" if per_link["inter"][0] or per_link["inter"][1] else "intra"
        if self.emulate and may_sleep and slowest == "inter":
            target = max(modelled.values())
            if target > wall:
                time.sleep(target - wall)
                wall = target
        for lk, (nbytes, nrecv, msgs, _) in per_link.items():
            if nbytes or nrecv or lk == slowest:
                self.ledger.book(
                    lk,
                    purpose,
                    nbytes=nbytes,
                    bytes_received=nrecv,
                    messages=msgs,
                    seconds=wall if lk == slowest else 0.0,
                    modelled_seconds=modelled[lk],
                    ops=1 if lk == slowest else 0,
                )

    def _timed(self, tensor: torch.Tensor, fn: Callable[[], object]) -> tuple[object, float]:
        _sync(tensor)
        t0 = time.perf_counter()
        out = fn()
        _sync(tensor)
        return out, time.perf_counter() - t0

    def _inter_members(self, ranks: list[int]) -> list[int]:
        """Members of a symmetric collective that have a peer on another server."""
        servers = {self.topology.server_of(r) for r in ranks}
        return ranks if len(servers) > 1 else []

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, tensor: torch.Tensor, purpose: str = "other", group=None, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce (``op`` in sum, avg, max, min, product); returns ``tensor``."""
        ranks = group_ranks(group)
        reduce_op = _reduce_op(op)
        if len(ranks) == 1:
            return tensor
        n, i = len(ranks), ranks.index(self.rank)
        es = tensor.element_size()
        chunks = _chunk_sizes(tensor.numel(), n)
        traffic = {ranks[j]: (chunks[j] + chunks[i]) * es for j in range(n) if j != i}
        _, wall = self._timed(tensor, lambda: dist.all_reduce(tensor, op=reduce_op, group=group))
        self._book(purpose, traffic, traffic, wall, self._inter_members(ranks))
        if op == "avg":
            tensor.div_(n)
        return tensor

    def all_gather(self, tensor: torch.Tensor, purpose: str = "other", group=None) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (all of one shape), in group order."""
        ranks = group_ranks(group)
        if len(ranks) == 1:
            return [tensor]
        out = [torch.empty_like(tensor) for _ in ranks]
        nbytes = tensor.numel() * tensor.element_size()
        traffic = {r: nbytes for r in ranks if r != self.rank}
        _, wall = self._timed(tensor, lambda: dist.all_gather(out, tensor.contiguous(), group=group))
        self._book(purpose, traffic, traffic, wall, self._inter_members(ranks))
        return out

    def exchange_counts(self, send_splits: Sequence[int], purpose: str = "other", group=None) -> list[int]:
        """Tells every peer how many rows it will receive from this rank (a small all-to-all)."""
        counts = torch.tensor(list(send_splits), dtype=torch.long)
        out, _ = self.all_to_all(counts, [1] * len(counts), purpose, group, recv_splits=[1] * len(counts))
        return out.tolist()

    def all_to_all(
        self,
        tensor: torch.Tensor,
        send_splits: Sequence[int],
        purpose: str = "other",
        group=None,
        recv_splits: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Sends ``send_splits[j]`` consecutive rows of ``tensor`` to the group's ``j``-th rank.

        Splits may be uneven. Without ``recv_splits`` the counts are exchanged first (booked too).
        Returns the received rows, concatenated in group order, and the ``recv_splits``.
        """
        ranks = group_ranks(group)
        send_splits = [int(s) for s in send_splits]
        if len(send_splits) != len(ranks):
            raise ValueError(f"all_to_all needs one split per rank of the group ({len(ranks)}), got {len(send_splits)}.")
        if sum(send_splits) != tensor.shape[0]:
            raise ValueError(f"send_splits sum to {sum(send_splits)} rows but the tensor has {tensor.shape[0]}.")
        if len(ranks) == 1:
            return tensor, send_splits
        if recv_splits is None:
            recv_splits = self.exchange_counts(send_splits, purpose, group)
        recv_splits = [int(s) for s in recv_splits]
        row = (tensor.numel() // max(1, tensor.shape[0])) * tensor.element_size()
        out = tensor.new_empty((sum(recv_splits), *tensor.shape[1:]))
        src = tensor.contiguous()
        _, wall = self._timed(
            tensor, lambda: dist.all_to_all_single(out, src, recv_splits, send_splits, group=group)
        )
        sent = {r: send_splits[j] * row for j, r in enumerate(ranks) if r != self.rank}
        received = {r: recv_splits[j] * row for j, r in enumerate(ranks) if r != self.rank}
        self._book(purpose, sent, received, wall, self._inter_members(ranks))
        return out, recv_splits

    def broadcast(self, tensor: torch.Tensor, src: int, purpose: str = "other", group=None) -> torch.Tensor:
        """In-place broadcast from global rank ``src``."""
        ranks = group_ranks(group)
        if len(ranks) == 1:
            return tensor
        if src not in ranks:
            raise ValueError(f"broadcast source {src} is not in the group {ranks}.")
        nbytes = tensor.numel() * tensor.element_size()
        sent = {r: nbytes for r in ranks if r != src} if self.rank == src else {}
        received = {} if self.rank == src else {src: nbytes}
        src_server = self.topology.server_of(src)
        crosses = any(self.topology.server_of(r) != src_server for r in ranks)
        _, wall = self._timed(tensor, lambda: dist.broadcast(tensor, src=src, group=group))
        self._book(purpose, sent, received, wall, [src] if crosses else [])
        return tensor

    def reduce(self, tensor: torch.Tensor, dst: int, purpose: str = "other", group=None, op: str = "sum") -> torch.Tensor:
        """Reduces into global rank ``dst`` in place (other ranks' tensors are left unspecified)."""
        ranks = group_ranks(group)
        reduce_op = _reduce_op(op)
        if len(ranks) == 1:
            return tensor
        if dst not in ranks:
            raise ValueError(f"reduce destination {dst} is not in the group {ranks}.")
        nbytes = tensor.numel() * tensor.element_size()
        sent = {} if self.rank == dst else {dst: nbytes}
        received = {r: nbytes for r in ranks if r != dst} if self.rank == dst else {}
        dst_server = self.topology.server_of(dst)
        senders = [r for r in ranks if r != dst and self.topology.server_of(r) != dst_server]
        _, wall = self._timed(tensor, lambda: dist.reduce(tensor, dst=dst, op=reduce_op, group=group))
        self._book(purpose, sent, received, wall, senders)
        if op == "avg" and self.rank == dst:
            tensor.div_(len(ranks))
        return tensor

    def reduce_scatter(self, tensor: torch.Tensor, purpose: str = "other", group=None) -> torch.Tensor:
        """Sums ``tensor`` over the group and returns this rank's row chunk of the sum.

        Rows are split into near-equal chunks as :func:`torch.tensor_split` splits them.
        Implemented as a pairwise all-to-all plus a local sum, which every backend supports.
        """
        ranks = group_ranks(group)
        if len(ranks) == 1:
            return tensor
        i = ranks.index(self.rank)
        chunks = _chunk_sizes(tensor.shape[0], len(ranks))
        received, _ = self.all_to_all(tensor, chunks, purpose, group, recv_splits=[chunks[i]] * len(ranks))
        return received.view(len(ranks), chunks[i], *tensor.shape[1:]).sum(0)

    # ------------------------------------------------------------------ point to point
    def isend(self, tensor: torch.Tensor, dst: int, purpose: str = "other", group=None) -> "BookedWork":
        """Non-blocking send. When emulating, an inter-server send first holds the sender for its
        modelled time (the link serialises it), so the receiver sees the data that much later."""
        nbytes = tensor.numel() * tensor.element_size()
        _sync(tensor)
        t0 = time.perf_counter()
        if self.emulate and self.topology.link(self.rank, dst) == "inter":
            time.sleep(self.link_model.time("inter", nbytes, 1))
        work = dist.isend(tensor.contiguous(), dst=dst, group=group)
        return BookedWork(self, work, tensor, purpose, sent={dst: nbytes}, received={}, senders=[self.rank],
                          may_sleep=False, t0=t0)

    def irecv(self, tensor: torch.Tensor, src: int, purpose: str = "other", group=None) -> "BookedWork":
        """Non-blocking receive (never delayed by emulation: the sender carries the link's time)."""
        nbytes = tensor.numel() * tensor.element_size()
        work = dist.irecv(tensor, src=src, group=group)
        return BookedWork(self, work, tensor, purpose, sent={}, received={src: nbytes}, senders=[src],
                          may_sleep=False)

    def send(self, tensor: torch.Tensor, dst: int, purpose: str = "other", group=None) -> None:
        self.isend(tensor, dst, purpose, group).wait()

    def recv(self, tensor: torch.Tensor, src: int, purpose: str = "other", group=None) -> torch.Tensor:
        self.irecv(tensor, src, purpose, group).wait()
        return tensor

    def scatter_object(self, objs: list | None, src: int, purpose: str = "other", group=None) -> object:
        """``objs[i]`` (pickled) from global rank ``src`` to the ``i``-th rank of ``group``; ``objs``
        is read on ``src`` only. Booked on the sender: the pickled bytes that leave it."""
        ranks = group_ranks(group)
        if len(ranks) == 1:
            return objs[0]
        t0 = time.perf_counter()
        out = [None]
        dist.scatter_object_list(out, objs if self.rank == src else None, src=src, group=group)
        wall = time.perf_counter() - t0
        if self.rank == src:
            sent = {r: len(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)) for r, o in zip(ranks, objs)
                    if r != src}
            self._book(purpose, sent, {}, wall, [src] if self._inter_members(ranks) else [])
        return out[0]

    # ------------------------------------------------------------------ autograd-aware
    def exchange(
        self,
        tensor: torch.Tensor,
        send_splits: Sequence[int],
        purpose: str = "halo",
        group=None,
        recv_splits: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """:meth:`all_to_all` through which gradients flow back (the reverse all-to-all)."""
        if recv_splits is None and len(group_ranks(group)) > 1:
            recv_splits = self.exchange_counts(send_splits, purpose, group)
        return _AllToAll.apply(tensor, self, list(send_splits), recv_splits, purpose, group)

    def all_gather_autograd(self, tensor: torch.Tensor, purpose: str = "other", group=None) -> torch.Tensor:
        """Concatenation of every rank's ``tensor`` along dim 0; backward is a reduce-scatter."""
        return _AllGather.apply(tensor, self, purpose, group)

    def all_reduce_autograd(self, tensor: torch.Tensor, purpose: str = "other", group=None) -> torch.Tensor:
        """Sum over the group; backward sums the gradients over the group."""
        return _AllReduce.apply(tensor, self, purpose, group)


class BookedWork:
    """An in-flight isend/irecv that books itself in the ledger when waited on."""

    def __init__(self, comm, work, tensor, purpose, sent, received, senders, may_sleep: bool = True,
                 t0: float | None = None) -> None:
        self._comm, self._work, self._tensor = comm, work, tensor
        self._purpose, self._sent, self._received, self._senders = purpose, sent, received, senders
        self._may_sleep = may_sleep
        self._t0 = time.perf_counter() if t0 is None else t0
        self._done = False

    def wait(self) -> None:
        if self._done:
            return
        self._work.wait()
        _sync(self._tensor)
        wall = time.perf_counter() - self._t0
        self._comm._book(self._purpose, self._sent, self._received, wall, self._senders, self._may_sleep)
        self._done = True


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, send_splits, recv_splits, purpose, group):
        ctx.comm, ctx.splits, ctx.purpose, ctx.group = comm, (send_splits, recv_splits), purpose, group
        out, _ = comm.all_to_all(tensor, send_splits, purpose, group, recv_splits=recv_splits)
        return out.clone() if out is tensor else out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        back, _ = ctx.comm.all_to_all(grad.contiguous(), recv_splits, ctx.purpose, ctx.group, recv_splits=send_splits)
        return back, None, None, None, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, purpose, group):
        ctx.comm, ctx.purpose, ctx.group = comm, purpose, group
        return torch.cat(comm.all_gather(tensor.contiguous(), purpose, group), dim=0)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.reduce_scatter(grad.contiguous(), ctx.purpose, ctx.group), None, None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, purpose, group):
        ctx.comm, ctx.purpose, ctx.group = comm, purpose, group
        return comm.all_reduce(tensor.clone(), purpose, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.clone(), ctx.purpose, ctx.group), None, None, None
