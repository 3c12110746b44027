"""Communicator wrappers on 4 real gloo processes (2 virtual servers x 2): results, exact bytes per
link class, autograd adjoints, and emulation as a lower bound."""

import pytest

from helpers import read_ranks, torchrun

WORLD = 4
INTRA_PEER = {0: 1, 1: 0, 2: 3, 3: 2}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("comm")
    torchrun("comm_worker.py", WORLD, str(out))
    return read_ranks(out, WORLD)


def cell(rank_result, op, link, purpose):
    return rank_result["ops"][op].get(f"{link}/{purpose}", {"bytes": 0, "messages": 0, "bytes_received": 0})


def test_all_reduce_values_and_pairwise_bytes(ranks):
    # 10 float32 split into chunks of 3,3,2,2 elements; peer j gets (c_j + c_i) * 4 bytes.
    chunks = [3, 3, 2, 2]
    for r, res in enumerate(ranks):
        assert res["values"]["all_reduce"] == [4 * k + 6.0 for k in range(10)]
        intra = (chunks[INTRA_PEER[r]] + chunks[r]) * 4
        inter = sum((chunks[j] + chunks[r]) * 4 for j in range(4) if j // 2 != r // 2)
        assert cell(res, "all_reduce", "intra", "grad_sync")["bytes"] == intra
        assert cell(res, "all_reduce", "inter", "grad_sync")["bytes"] == inter
        assert cell(res, "all_reduce", "inter", "grad_sync")["messages"] == 2


def test_all_gather_bytes(ranks):
    for res in ranks:
        assert res["values"]["all_gather"] == [0.0, 1.0, 2.0, 3.0]
        assert cell(res, "all_gather", "intra", "other")["bytes"] == 20
        assert cell(res, "all_gather", "inter", "other")["bytes"] == 40


def test_uneven_all_to_all_bytes(ranks):
    # Rank r sends j+1 rows of 2 float64 (16 bytes) to peer j; receives r+1 rows from everyone.
    for r, res in enumerate(ranks):
        assert res["values"]["all_to_all"]["recv_splits"] == [r + 1] * 4
        starts = [0, 1, 3, 6]
        expected_first = []
        for src in range(4):
            expected_first += [100 * src + 2 * (starts[r] + k) for k in range(r + 1)]
        assert res["values"]["all_to_all"]["rows"] == expected_first
        intra = (INTRA_PEER[r] + 1) * 16
        inter = sum((j + 1) * 16 for j in range(4) if j // 2 != r // 2)
        assert cell(res, "all_to_all", "intra", "halo")["bytes"] == intra
        assert cell(res, "all_to_all", "inter", "halo")["bytes"] == inter
        assert cell(res, "all_to_all", "intra", "halo")["bytes_received"] == (r + 1) * 16


def test_broadcast_and_reduce_bytes(ranks):
    for r, res in enumerate(ranks):
        assert res["values"]["broadcast"] == [1] * 8
        sent = (cell(res, "broadcast", "intra", "teacher_relay")["bytes"],
                cell(res, "broadcast", "inter", "teacher_relay")["bytes"])
        assert sent == ((64, 128) if r == 1 else (0, 0))
        reduce_sent = (cell(res, "reduce", "intra", "grad_sync")["bytes"], cell(res, "reduce", "inter", "grad_sync")["bytes"])
        assert reduce_sent == {0: (0, 24), 1: (0, 24), 2: (0, 0), 3: (24, 0)}[r]
    assert ranks[2]["values"]["reduce"] == [10.0] * 6


def test_reduce_scatter_values_and_bytes(ranks):
    # sum over ranks of arange(16).view(8, 2) * (r + 1) = arange * 10; rank r keeps rows 2r, 2r+1.
    for r, res in enumerate(ranks):
        assert res["values"]["reduce_scatter"] == [[10.0 * (4 * r + k * 2 + j) for j in range(2)] for k in range(2)]
        assert cell(res, "reduce_scatter", "intra", "other")["bytes"] == 16
        assert cell(res, "reduce_scatter", "inter", "other")["bytes"] == 32


def test_point_to_point_bytes_by_link(ranks):
    assert ranks[0]["values"]["p2p"] == [5.0, 5.0, 5.0]
    assert ranks[2]["values"]["p2p"] == [1.0] * 7
    assert cell(ranks[0], "p2p", "inter", "activation")["bytes"] == 28
    assert cell(ranks[1], "p2p", "intra", "activation_grad")["bytes"] == 12
    assert cell(ranks[2], "p2p", "inter", "activation")["bytes_received"] == 28
    assert cell(ranks[2], "p2p", "inter", "activation")["bytes"] == 0


def test_groups_built_by_topology(ranks):
    for r, res in enumerate(ranks):
        assert res["values"]["intra_group_sum"] == {0: 1.0, 1: 1.0, 2: 5.0, 3: 5.0}[r]
        if r in (0, 2):
            assert res["values"]["heads_sum"] == 2.0


@pytest.mark.parametrize("name", ["exchange", "all_gather_autograd", "all_reduce_autograd"])
def test_autograd_exchanges_are_exact_adjoints(ranks, name):
    lhs, rhs = ranks[0]["adjoint"][name]
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
    assert ranks[0]["adjoint"]["all_reduce_grad_max_err"] < 1e-12


def test_modelled_time_is_latency_plus_bytes_over_bandwidth(ranks):
    m = ranks[0]["slow_model"]
    for res in ranks:
        for t in res["emulation"]["all_reduce"]:
            # 1000 float32 on 4 ranks: 2 inter peers x (250 + 250) x 4 bytes; the 2 ranks of a server
            # share its network card, so the card carries twice this rank's bytes.
            assert t["bytes"] == 4000
            assert t["modelled"] == pytest.approx(m["inter_latency"] + 2 * 4000 / m["inter_bw"], rel=1e-9)
    send = ranks[0]["emulation"]["send"]
    assert send["bytes"] == 100_000
    assert send["modelled"] == pytest.approx(m["inter_latency"] + 100_000 / m["inter_bw"], rel=1e-9)


def test_emulation_never_shortens_an_inter_server_operation(ranks):
    for res in ranks:
        for t in res["emulation"]["all_reduce"]:
            assert t["wall"] >= t["modelled"]
            assert t["booked"] >= t["modelled"] - 1e-12
    # A point-to-point transfer holds the sender for the modelled time; the receiver, which posted its
    # receive at the same barrier, waits for it, less the barrier's exit skew: on a busy 2-core CI
    # machine that skew reached 1.4 ms, so the transfer is modelled at ~100 ms to keep it small beside.
    sender, receiver = ranks[0]["emulation"]["send"], ranks[3]["emulation"]["send"]
    assert sender["booked"] >= sender["modelled"] - 1e-12 and sender["modelled"] > 0.05
    assert receiver["booked"] >= 0.5 * receiver["modelled"]
