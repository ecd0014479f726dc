"""Fixtures of the topology tests: `arango`, the ArangoDB to write to (topo_arango.py: the
in-process stand-in by default, a real ArangoDB with SEGSCOPE_ARANGO_URL)."""

from __future__ import annotations

import pytest
from topo_arango import arango_target


@pytest.fixture
def arango():
    with arango_target() as target:
        yield target
