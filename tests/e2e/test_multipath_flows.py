"""Exact loss per path with alternate marking, on the two disjoint paths of
netlab/topologies/mesh8_two_paths.yaml (controller/examples/mesh8_flows.yaml): A colours flow 101
on a1 (path R1-R2) and flow 102 on a2 (path R3-R4), B counts them on b1 and b2 - one altmark_tx
program on two devices of A, one altmark_rx on two devices of B. The relays inject 2 % loss on
R1 -> R2 and 3 % on R3 -> R4 and count every frame they drop, per outer Traffic Class (the
colour bit is a DSCP bit of the outer header).

Asserted per flow, from InfluxDB (agents -> altmark_collector -> Kafka -> loss processor ->
Telegraf): every block that carried traffic is complete; the sum of `lost` over the blocks = the
frames the relay on that path dropped; over the blocks of the marked colour alone = the drops of
marked frames (the Traffic Class with the colour bit); tx_packets = what H1 sent on that path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from controller.intent import load_intent
from controller.pipeline import ControlledPipeline
from netlab import Lab, teardown
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "mesh8_two_paths.yaml"
INTENT = REPO / "controller" / "examples" / "mesh8_flows.yaml"
NODES = ("A", "R1", "R2", "R3", "R4", "B")
FLOWS = {101: ("fd00:b::1", "c1"), 102: ("fd00:c::1", "c2")}  # flow: (destination, lossy core link)
PER_FLOW, RATE_PPS = 4000, 500  # per destination: 8 s
NS = 1_000_000_000

SENDER = r"""
import socket, sys, time
dsts, n, rate = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
t0 = time.monotonic()
for i in range(n):
    for d in dsts:
        s.sendto(b"m" * 200, (d, 40009))
    wait = t0 + (i + 1) / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
print(n)
"""

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


class MidBlockSnapshots(threading.Thread):
    """The relays' drop counters at the middle of every block (TAI): frames of block k (one colour)
    reach the relay between the middles of blocks k-1 and k+1, where no other block of that colour
    does, so the difference of that colour's Traffic Class counter is block k's drops exactly."""

    def __init__(self, lab, links):
        super().__init__(daemon=True)
        self.lab, self.links, self.stop = lab, links, threading.Event()
        self.at: dict[int, dict[str, dict]] = {}  # block index -> {link: a_to_b stats}

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.clock_gettime_ns(time.CLOCK_TAI)
            k = now // NS if now % NS < NS // 2 else now // NS + 1
            self.stop.wait((k * NS + NS // 2 - now) / NS)
            if not self.stop.is_set():
                self.at[k] = {link: self.lab.relay_stats(link)["a_to_b"] for link in self.links}


def tai_offset_s() -> int:
    return round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / NS)


@pytest.fixture(scope="module")
def run(stack, bpffs, tmp_path_factory):
    teardown(own_name("tmflw"))
    lab = Lab.up(TOPOLOGY, prefix=own_name("tmflw"))
    tmp = tmp_path_factory.mktemp("mesh-flows")
    pipe = ControlledPipeline(lab, stack, tmp, nodes=NODES)
    loss_proc = None
    try:
        pipe.start_agents()
        offset = tai_offset_s()
        env = {
            **os.environ,
            "SEGSCOPE_KAFKA": stack.kafka_bootstrap,
            "SEGSCOPE_LOSS_APP_ID": f"segscope-loss-mesh-{uuid.uuid4().hex[:8]}",
            "SEGSCOPE_LOSS_DATADIR": str(tmp / "loss-datadir"),
            "SEGSCOPE_TAI_UTC_OFFSET_S": str(offset),
        }
        with open(tmp / "loss.log", "w") as log:
            loss_proc = subprocess.Popen(
                [sys.executable, "-m", "processors.loss"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        lab.set_loss("c2", 3, 0)  # the flows are one-way: loss A -> B on both paths
        since = time.time_ns()
        applied = pipe.apply(load_intent(INTENT))
        # the block the flows were installed in is partial: start two blocks later
        time.sleep(2.5 - (time.clock_gettime_ns(time.CLOCK_TAI) % NS) / NS + 0.3)
        before = {link: lab.relay_stats(link) for _, link in FLOWS.values()}
        snaps = MidBlockSnapshots(lab, [link for _, link in FLOWS.values()])
        snaps.start()
        dsts = ",".join(d for d, _ in FLOWS.values())
        sender = lab.run("H1", [sys.executable, "-c", SENDER, dsts, str(PER_FLOW), str(RATE_PPS)], timeout=120)
        assert sender.returncode == 0, sender.stderr
        time.sleep(1.5)  # the last frames cross the relays
        snaps.stop.set()
        snaps.join(timeout=5)
        after = {link: lab.relay_stats(link) for _, link in FLOWS.values()}
        flows = " OR ".join(f"\"flow\" = '{fid}'" for fid in FLOWS)
        query = f'SELECT * FROM "altmark_loss" WHERE ({flows}) AND time >= {since - 2 * NS}'

        def by_flow(rows: list[dict]) -> dict[int, list[dict]]:
            return {fid: [r for r in rows if r["flow"] == str(fid)] for fid in FLOWS}

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            points = by_flow(stack.influx_query(query))
            sums = {fid: sum(p.get("tx_packets") or 0 for p in pts if p.get("complete")) for fid, pts in points.items()}
            if all(sums[fid] >= PER_FLOW for fid in FLOWS):
                break
            time.sleep(1)
        # the loop judged `complete` and `tx_packets` only: the newest points may still be mid-write
        # with `lost` or `reason` null (InfluxDB 1.x, influxdata/influxdb#8546); the tests read these
        points = by_flow(stack.influx_query_settled(query, settle_s=0.5))
        yield {
            "snaps": snaps.at,
            "applied": applied,
            "before": before,
            "after": after,
            "points": points,
            "offset": offset,
        }
    finally:
        if loss_proc is not None:
            loss_proc.terminate()
            try:
                loss_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loss_proc.kill()
                loss_proc.wait()
        pipe.stop()
        lab.down()


def traffic_blocks(points: list[dict]) -> list[dict]:
    return [p for p in points if (p.get("tx_packets") or 0) > 0]


def test_flows_on_two_devices_of_each_edge(run):
    calls = run["applied"].mutating_calls
    assert calls["A"]["StartFlowMonitor"] == 2 and calls["B"]["StartFlowMonitor"] == 2, calls


def test_every_block_with_traffic_is_complete_and_counts_every_packet(run):
    for fid in FLOWS:
        blocks = traffic_blocks(run["points"][fid])
        assert blocks, f"no block of flow {fid} in InfluxDB"
        assert all(p["complete"] is True and p["reason"] == "ok" for p in blocks), [
            (p["time"], p["reason"]) for p in blocks if not p["complete"]
        ]
        assert sum(p["tx_packets"] for p in blocks) == PER_FLOW, fid


def test_loss_per_path_equals_the_relay_drops_in_total_and_per_colour(run):
    for fid, (_, link) in FLOWS.items():
        b, a = run["before"][link]["a_to_b"], run["after"][link]["a_to_b"]
        dropped = a["dropped_loss"] - b["dropped_loss"]
        by_tc = {
            int(tc): n - b["dropped_loss_by_tc"].get(tc, 0)
            for tc, n in a["dropped_loss_by_tc"].items()
            if n - b["dropped_loss_by_tc"].get(tc, 0)
        }
        blocks = traffic_blocks(run["points"][fid])
        lost = sum(p["lost"] for p in blocks)
        # the colour of a block: its index (TAI block start / period) modulo 2
        marked_colour = {((p["time"] // NS + run["offset"]) & 1) for p in blocks}
        lost_by_colour = {
            c: sum(p["lost"] for p in blocks if ((p["time"] // NS + run["offset"]) & 1) == c) for c in marked_colour
        }
        print(
            f"\n[mesh flows] flow {fid}: lost {lost} = relay {link} drops {dropped} {by_tc}, by colour {lost_by_colour}"
        )
        assert lost == dropped > 0, (fid, lost, dropped)
        # colour-1 frames carry the L bit (DSCP bit 0, dscp_l_bit: 0) = Traffic Class 4, colour 0 none
        want = {tc: lost_by_colour.get(colour, 0) for colour, tc in ((0, 0), (1, 4))}
        assert by_tc == {tc: n for tc, n in want.items() if n}, (by_tc, lost_by_colour)


def test_every_block_loss_equals_the_relay_drops_of_that_block(run):
    """Per block, not only in sum: block k's drops = its colour's Traffic Class counter between the
    middles of blocks k-1 and k+1."""
    checked = 0
    for fid, (_, link) in FLOWS.items():
        for p in traffic_blocks(run["points"][fid]):
            k = p["time"] // NS + run["offset"]  # TAI block index (period 1 s)
            if k - 1 not in run["snaps"] or k + 1 not in run["snaps"]:
                continue  # the first and last blocks: covered by the sums above
            tc = "4" if k & 1 else "0"
            drops = run["snaps"][k + 1][link]["dropped_loss_by_tc"].get(tc, 0) - run["snaps"][k - 1][link][
                "dropped_loss_by_tc"
            ].get(tc, 0)
            assert p["lost"] == drops, (fid, k, p["lost"], drops)
            checked += 1
    print(f"\n[mesh flows] {checked} blocks equal to their relay drops one by one")
    assert checked >= 2 * (PER_FLOW // RATE_PPS - 2)
