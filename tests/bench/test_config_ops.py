"""bench/config_ops.py runs end to end on a real lab and agent (small N; no timing assertion)."""

from __future__ import annotations

import json

import pytest

from bench import config_ops
from tests.isolation import own_name

pytestmark = pytest.mark.datapath


def test_config_ops_harness_runs(tmp_path):
    out = tmp_path / "res.json"
    assert (
        config_ops.main(
            [
                "--ops",
                "30",
                "--batch",
                "16",
                "--window",
                "4",
                "--no-doc",
                "--prefix",
                own_name("ctlbt"),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    rows = {(r["kind"], r["way"]): r for r in res["results"]}
    assert set(rows) == {
        (k, w) for k in ("local_sid", "policy") for w in ("unary", "pipelined", "stream", "batch", "local")
    }
    for (kind, way), r in rows.items():
        assert r["ops"] == 60 and r["ops_per_s"] > 0
        # one RPC per operation, one stream per phase, ceil(30/16)=2 ApplyBatch calls per phase, none locally
        assert r["rpcs"] == {"unary": 60, "pipelined": 60, "stream": 2, "batch": 4, "local": 0}[way], (kind, way, r)
    assert res["machine"]["nproc"] >= 1
