"""status reads the latest delay and loss from the real InfluxDB (InfluxQL over the v1 HTTP API)."""

from __future__ import annotations

import time

import pytest

from controller.status import latest_delay, latest_loss, render, session_loss, window_loss

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


def test_window_loss_sums_complete_blocks_and_counts_incomplete_ones(stack):
    now = time.time_ns() // 1_000_000_000 * 1_000_000_000
    flow = 800000 + now % 90000
    blocks = [(40, 1000, 990, True), (20, 1000, 1000, True), (10, 2000, 1970, True), (5, 700, None, False)]
    blocks.append((200, 5000, 1, True))  # outside a 60 s window
    lines = []
    for age, tx, rx, complete in blocks:
        fields = f"tx_packets={tx}i,tx_bytes=1i,complete={'true' if complete else 'false'}"
        if rx is not None:
            fields += f",rx_packets={rx}i,rx_bytes=1i,lost={tx - rx}i,loss_ratio={(tx - rx) / tx}"
        fields += f',reason="{"ok" if complete else "missing_rx"}"'
        lines.append(
            f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node=A,rx_node=B {fields} {now - age * 10**9}"
        )
    stack.influx_write(lines)
    w = window_loss(stack.influx_url, stack.influx_db, flow, 60)
    assert w == {
        "window_s": 60,
        "blocks": 3,
        "tx_packets": 4000,
        "rx_packets": 3960,
        "lost": 40,
        "loss_ratio": 0.01,
        "incomplete_blocks": 1,
    }
    assert window_loss(stack.influx_url, stack.influx_db, flow, 300)["blocks"] == 4


def test_session_loss_is_exact_once_stopped():
    from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb

    stopped = pb.StampSessionStatus(state=pb.STAMP_SESSION_STATE_STOPPED, packets_sent=1000, results_collected=997)
    assert session_loss(stopped) == {"packets_received": 997, "packets_lost": 3, "loss_ratio": 0.003}
    running = pb.StampSessionStatus(state=pb.STAMP_SESSION_STATE_RUNNING, packets_sent=500, results_collected=503)
    assert session_loss(running) == {"packets_received": 503, "packets_lost": None, "loss_ratio": None}
    assert session_loss(None)["packets_lost"] is None


def test_worst_hop_is_the_highest_mean_of_the_newest_second(stack):
    from controller.status import worst_hop

    now = time.time_ns() // 1_000_000_000 * 1_000_000_000
    flow = 800000 + now % 90000
    lines = []
    hops = {0: ("A", "R1", 310.0), 1: ("R1", "R2", 1250.5), 2: ("R2", "B", 505.0)}
    for age, factor in ((2, 3.0), (1, 1.0)):  # an older second where hop 0 was worst: not it
        t = now - age * 1_000_000_000
        for hop, (a, b, mean) in hops.items():
            m = mean * (factor if hop == 0 else 1.0)
            lines.append(
                f"inline_hop_delay,flow={flow},path=fc00:11::e\\,fc00:12::e,hop={hop},link={a}-{b},from_node={a},"
                f"to_node={b},from_if=1,to_if=2 count=10i,mean_us={m},measured=true {t}"
            )
    # an unmeasured hop with a larger value does not count
    lines.append(
        f"inline_hop_delay,flow={flow},path=x,hop=9,link=X-Y,from_node=X,to_node=Y,from_if=1,to_if=2 "
        f"count=0i,mean_us=99999.0,measured=false {now - 1_000_000_000}"
    )
    stack.influx_write(lines)
    hop = worst_hop(stack.influx_url, stack.influx_db, flow, 60)
    assert (hop["from_node"], hop["to_node"], hop["mean_us"], hop["link"]) == ("R1", "R2", 1250.5, "R1-R2")
    # the next second half written (Telegraf's batches: hop 1's point not in yet): the second
    # before it is still the one compared, not a lesser hop of the newest
    stack.influx_write([line.replace(f" {now - 1_000_000_000}", f" {now}") for line in (lines[3], lines[5])])
    hop = worst_hop(stack.influx_url, stack.influx_db, flow, 60)
    assert (hop["link"], hop["mean_us"], hop["time"]) == ("R1-R2", 1250.5, now - 1_000_000_000), hop
    assert worst_hop(stack.influx_url, stack.influx_db, flow + 1, 60) is None
    row = {
        "flow_id": flow, "ingress": "A", "egress": "B", "ingress_state": "installed", "egress_state": "installed",
        "sampled": 100, "instrumented": 99, "skipped": 1, "records": 99, "worst_hop": {**hop, "age_s": 1.0},
    }  # fmt: skip
    table = render({"nodes": {}, "sessions": [], "flows": [], "inline_monitors": [row], "influx_error": None})
    assert "R1->R2 (R1-R2)" in table and "1250.5 us" in table
    table = render(
        {
            "nodes": {},
            "sessions": [],
            "flows": [],
            "inline_monitors": [{**row, "worst_hop": None}],
            "influx_error": None,
        }
    )
    assert "n/a" in table.splitlines()[-1]
