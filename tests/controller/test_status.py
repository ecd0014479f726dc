"""status reads the latest delay and loss from the real InfluxDB (InfluxQL over the v1 HTTP API)."""

from __future__ import annotations

import time

import pytest

from controller.status import latest_delay, latest_loss, render

pytestmark = pytest.mark.e2e


def test_latest_delay_and_loss(stack):
    now = time.time_ns() // 1_000_000_000 * 1_000_000_000
    node, ssid, flow = f"ctlst{now % 100000}", 4242, 900000 + now % 90000
    lines = []
    for age, mean in ((2, 2100.5), (1, 2050.25)):  # the newer second must win
        t = now - age * 1_000_000_000
        for direction, scale in (("forward", 1.0), ("reverse", 0.5), ("round_trip", 1.5)):
            lines.append(
                f"stamp_delay,node={node},ssid={ssid},direction={direction} count=100i,"
                f"min_us={mean * scale - 10},mean_us={mean * scale},max_us={mean * scale + 50},"
                f"p50_us={mean * scale},p99_us={mean * scale + 40},ipdv_mean_us=3.0 {t}"
            )
    lines.append(
        f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node=A,rx_node=B tx_packets=1000i,"
        f"rx_packets=990i,lost=10i,loss_ratio=0.01,tx_bytes=1i,rx_bytes=1i,complete=true,reason=\"ok\" "
        f"{now - 2_000_000_000}"
    )
    lines.append(
        f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node=A,rx_node=B tx_packets=500i,"
        f"tx_bytes=1i,complete=false,reason=\"missing_rx\" {now - 1_000_000_000}"
    )
    stack.influx_write(lines)
    delay = latest_delay(stack.influx_url, stack.influx_db, node, ssid)
    assert {d: p["mean_us"] for d, p in delay.items()} == {
        "forward": 2050.25,
        "reverse": 1025.125,
        "round_trip": 3075.375,
    }
    assert latest_delay(stack.influx_url, stack.influx_db, node, ssid + 1) == {}
    loss = latest_loss(stack.influx_url, stack.influx_db, flow)
    assert loss["complete"] is False and loss["reason"] == "missing_rx" and loss["tx_packets"] == 500
    status = {
        "nodes": {"A": {"agent": "127.0.0.1:1", "reachable": True}},
        "sessions": [
            {
                "ssid": ssid,
                "sender": node,
                "reflector": "B",
                "sender_state": "running",
                "reflector_state": "running",
                "packets_sent": 0,
                "delay": {d: {**p, "age_s": 1.0} for d, p in delay.items()},
            }
        ],
        "flows": [
            {
                "flow_id": flow,
                "method": "dscp",
                "ingress": "A",
                "egress": "B",
                "tx": "installed",
                "rx": "installed",
                "loss": {**loss, "age_s": 1.0},
            }
        ],
        "influx_error": None,
    }
    table = render(status)
    assert "2050.2 us" in table and "1025.1 us" in table and "3075.4 us" in table and "missing_rx" in table
