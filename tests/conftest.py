"""Fixtures shared by test modules."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `from helpers import ...`


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The embedded synthetic-tiny graph, generated once per session."""
    from lightning_granndis.datamodules.ogb import OGBNodeDataModule

    dm = OGBNodeDataModule("synthetic-tiny", root=str(tmp_path_factory.mktemp("graphs")))
    dm.prepare_data()
    dm.setup()
    return dm
