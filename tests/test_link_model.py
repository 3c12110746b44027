import pytest

from lightning_granndis.link_model import LinkModel, LinkSpec


def test_granndis_paper_preset_matches_the_papers_cluster():
    m = LinkModel.preset("granndis_paper")
    assert m.bandwidth("intra") == 112e9
    assert m.bandwidth("inter") == 32e9 / 8


def test_optimus_cc_paper_preset_is_a100_nodes_on_200_gbit_infiniband():
    m = LinkModel.preset("optimus_cc_paper")
    assert m.bandwidth("inter") == 200e9 / 8
    assert m.bandwidth("intra") > 10 * m.bandwidth("inter")


def test_time_is_latency_plus_bytes_over_bandwidth():
    m = LinkModel.custom(intra_gbps=80, inter_gbps=8, intra_latency_us=3, inter_latency_us=7)
    assert m.time("inter", 1_000_000) == pytest.approx(7e-6 + 1_000_000 / 1e9)
    assert m.time("intra", 1_000_000) == pytest.approx(3e-6 + 1_000_000 / 1e10)
    assert m.time("inter", 1_000_000, sharers=4) == pytest.approx(7e-6 + 4_000_000 / 1e9)
    assert m.time("inter", 0) == 0.0


def test_scaling_divides_every_bandwidth_by_the_same_factor():
    m = LinkModel.preset("10gbe")
    s = m.scaled(50.0)
    assert s.bandwidth("inter") == pytest.approx(m.bandwidth("inter") / 50)
    assert s.bandwidth("intra") == pytest.approx(m.bandwidth("intra") / 50)
    assert s.time("inter", 10**6) > m.time("inter", 10**6)
    ref = m.scaled_to_reference(40e12, local_flops=20e9)
    assert ref.scale == pytest.approx(2000.0)
    assert "scaled down 2e+03x" in ref.describe()


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown link preset 'infiniband'.*granndis_paper, optimus_cc_paper, 10gbe, 1gbe"):
        LinkModel.preset("infiniband")
    with pytest.raises(ValueError, match="Unknown reference accelerator"):
        LinkModel.preset("1gbe").scaled_to_reference("tpu9", local_flops=1e9)


def test_resolve_accepts_names_dicts_and_models():
    assert LinkModel.resolve("1GbE").name == "1gbe"
    assert LinkModel.resolve({"intra_gbps": 100, "inter_gbps": 10}).bandwidth("inter") == 10e9 / 8
    with pytest.raises(TypeError):
        LinkModel.resolve(3.0)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        LinkSpec(0, 0)
