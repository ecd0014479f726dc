"""Two disjoint SRv6 paths between two multi-homed nodes, end to end: a topology we did not
measure on before (netlab/topologies/mesh8_two_paths.yaml: 8 nodes, a delay relay with its own
delay per direction on every core link, loss on two of them), set up by the controller
(controller/examples/mesh8_two_paths.yaml), one agent per SRv6 node, A sending on a1 and a2, B
reflecting on b1 and b2.

First a BASE run (sessions 11 and 12 on the same paths, every link 100 us each way, no loss)
measures each path's own latency (sender syscall, veth hops, three relays' receive paths, two SRv6
End, XDP collector: 60-110 us here), as tests/e2e/test_stamp_pipeline.py does for one path; then
the MAIN run (sessions 1 and 2, the topology's delays and loss).

Asserted, per path (= per session):
- one-way delay in InfluxDB (mean over the run, weighted by count) = the injected delays of the
  path's links in that direction + the relays' measured release lateness + the path's own latency
  measured by BASE, within +-100 us;
- packets lost = the frames the relays dropped on that path (the relays count injected loss per
  direction; nothing else travels those links during the run), per direction: forward losses on
  path 1 (2 % R1 -> R2), reverse losses on path 2 (5 % R4 -> R3), and none elsewhere;
- records in InfluxDB = replies received; `controller status --json` shows the agent's sent,
  received and lost, and the delay InfluxDB holds for the last second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.intent import load_intent
from controller.pipeline import ControlledPipeline
from netlab import Lab, relay_lateness_us, teardown
from scripts.results import StampSessionSpec, delay_points
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "mesh8_two_paths.yaml"
INTENT = REPO / "controller" / "examples" / "mesh8_two_paths.yaml"
NODES = ("A", "R1", "R2", "R3", "R4", "B")
RATE, DURATION_S, TOLERANCE_US = 100, 12, 100
BASE_SSIDS, BASE_DELAY_US, BASE_S = {1: 11, 2: 12}, 100.0, 8
# (link, direction of the link that the session's forward / reverse packets take)
PATHS = {
    1: {"forward": [("a1", "a_to_b"), ("c1", "a_to_b"), ("b1", "a_to_b")],
        "reverse": [("b1", "b_to_a"), ("c1", "b_to_a"), ("a1", "b_to_a")]},
    2: {"forward": [("a2", "a_to_b"), ("c2", "a_to_b"), ("b2", "a_to_b")],
        "reverse": [("b2", "b_to_a"), ("c2", "b_to_a"), ("a2", "b_to_a")]},
}  # fmt: skip

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def latest_views(bootstrap: str, nodes) -> dict[str, dict]:
    """The newest node view of each node on segscope.topology (what the agents published)."""
    from processors.worker import read_topic
    from segscope_schemas import names

    views: dict[str, dict] = {}
    for key, value in read_topic(bootstrap, names.TOPIC_TOPOLOGY, "mesh-views"):
        if (key or b"").decode() in nodes:
            views[key.decode()] = json.loads(value)
    return views


def finite_intent(base: bool = False):
    intent = load_intent(INTENT)
    intent.stamp_sessions = [
        dataclasses.replace(s, ssid=BASE_SSIDS[s.ssid], duration_s=BASE_S)
        if base
        else dataclasses.replace(s, duration_s=DURATION_S)
        for s in intent.stamp_sessions
    ]
    return intent


def mean_delays(stack, ssid: int, since: int, settled: bool = False) -> dict[str, tuple[float, int]]:
    """(count-weighted mean us, records) per direction over every point of the session; a point
    still mid-write (count or mean_us null yet) is left out unless settled (then there is none)."""
    by_dir: dict[str, list] = {}
    for p in delay_points(stack, StampSessionSpec(ssid=ssid), since, settled=settled):
        if p.get("count") is None or p.get("mean_us") is None:
            continue
        by_dir.setdefault(p["direction"], []).append(p)
    out = {}
    for d, points in by_dir.items():
        n = sum(int(p["count"]) for p in points)
        out[d] = (sum(p["mean_us"] * int(p["count"]) for p in points) / n, n)
    return out


def injected_and_late(lab, hops, before, after) -> tuple[float, float]:
    injected = late = 0.0
    for link, ld in hops:
        t = lab.topo.link(link)
        injected += t.delay_a_to_b_us if ld == "a_to_b" else t.delay_b_to_a_us
        late += relay_lateness_us(before[link], after[link])[ld]
    return injected, late


@pytest.fixture(scope="module")
def run(stack, bpffs, tmp_path_factory):
    teardown(own_name("tmesh"))
    lab = Lab.up(TOPOLOGY, prefix=own_name("tmesh"))
    pipe = ControlledPipeline(lab, stack, tmp_path_factory.mktemp("mesh"), nodes=NODES)
    links = sorted({link for p in PATHS.values() for d in p.values() for link, _ in d})
    try:
        pipe.start()
        # BASE: the paths' own latency, every link at the same small delay, no loss
        wanted = {name: lab.topo.link(name) for name in links}
        main_delays = {
            n: (t.delay_a_to_b_us, t.delay_b_to_a_us, t.loss_a_to_b_pct, t.loss_b_to_a_pct) for n, t in wanted.items()
        }
        for name in links:
            lab.set_delay(name, BASE_DELAY_US, BASE_DELAY_US)
            lab.set_loss(name, 0, 0)
        base_since = time.time_ns()
        base_before = {link: lab.relay_stats(link) for link in links}
        pipe.apply(finite_intent(base=True))
        for ssid in BASE_SSIDS.values():
            pipe.wait_stopped("A", ssid, timeout_s=BASE_S + 30)
        time.sleep(1.0)
        base_after = {link: lab.relay_stats(link) for link in links}
        base_own: dict[int, dict[str, float]] = {}
        for path_ssid, ssid in BASE_SSIDS.items():
            received = pipe.session_status("A", ssid).results_collected
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                means = mean_delays(stack, ssid, base_since)
                if all(means.get(d, (0, 0))[1] >= received for d in ("forward", "reverse")):
                    break
                time.sleep(1)
            means = mean_delays(stack, ssid, base_since, settled=True)
            base_own[path_ssid] = {}
            for d, hops in PATHS[path_ssid].items():
                injected, late = injected_and_late(lab, hops, base_before, base_after)
                base_own[path_ssid][d] = means[d][0] - injected - late
        # MAIN: the topology's delays and loss
        for name, (ab, ba, lab_loss, bal) in main_delays.items():
            lab.set_delay(name, ab, ba)
            lab.set_loss(name, lab_loss, bal)
        since = time.time_ns()
        before = {link: lab.relay_stats(link) for link in links}
        applied = pipe.apply(finite_intent())
        for ssid in PATHS:
            pipe.wait_stopped("A", ssid, timeout_s=DURATION_S + 30)
        time.sleep(1.0)  # the last replies (up to ~4 ms of delay) land
        after = {link: lab.relay_stats(link) for link in links}
        sent = {ssid: pipe.sender_summary("A", ssid) for ssid in PATHS}
        received = {ssid: pipe.session_status("A", ssid).results_collected for ssid in PATHS}

        def by_direction(settled: bool) -> dict[int, dict[str, list]]:
            got: dict[int, dict[str, list]] = {}
            for ssid in PATHS:
                for p in delay_points(stack, StampSessionSpec(ssid=ssid), since, settled=settled):
                    got.setdefault(ssid, {}).setdefault(p["direction"], []).append(p)
            return got

        def forward_records(points: list) -> int:
            return sum(int(p["count"]) for p in points if p.get("count") is not None)  # null: mid-write

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = by_direction(settled=False)
            if all(forward_records(got.get(s, {}).get("forward", [])) >= received[s] for s in PATHS):
                break
            time.sleep(1)
        # the loop judged the forward counts only: the newest points (their mean_us, the same
        # second's reverse and round_trip) may still be mid-write (InfluxDB 1.x,
        # influxdata/influxdb#8546); the tests read these settled points
        got = by_direction(settled=True)
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
        status = subprocess.run(
            [sys.executable, "-m", "controller", "status", "--json", str(INTENT), "--influx-url", stack.influx_url],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=60,
        )
        views = latest_views(stack.kafka_bootstrap, NODES)
        yield {
            "views": views,
            "lab": lab,
            "base_own": base_own,
            "applied": applied,
            "before": before,
            "after": after,
            "sent": sent,
            "received": received,
            "points": got,
            "status": status,
        }
    finally:
        pipe.stop()
        lab.down()


def test_both_sessions_ran_on_their_own_devices(run):
    calls = run["applied"].mutating_calls
    assert calls["A"]["Init"] == 2 and calls["B"]["Init"] == 2, calls  # a1 + a2, b1 + b2
    assert all(run["sent"][s]["sent"] == RATE * DURATION_S and run["sent"][s]["send_errors"] == 0 for s in PATHS)


def relay_drops(run, link: str, direction: str) -> int:
    return run["after"][link][direction]["dropped_loss"] - run["before"][link][direction]["dropped_loss"]


def test_loss_per_path_equals_the_relays_drops(run):
    for ssid, path in PATHS.items():
        dropped = {d: sum(relay_drops(run, link, ld) for link, ld in hops) for d, hops in path.items()}
        lost = run["sent"][ssid]["sent"] - run["received"][ssid]
        print(f"\n[mesh] ssid {ssid}: sent {run['sent'][ssid]['sent']}, lost {lost}, relay drops {dropped}")
        assert lost == dropped["forward"] + dropped["reverse"], (ssid, lost, dropped)
    # where the loss was injected: path 1 forward (c1 a_to_b 2 %), path 2 reverse (c2 b_to_a 5 %)
    c1, c2 = relay_drops(run, "c1", "a_to_b"), relay_drops(run, "c2", "b_to_a")
    n = RATE * DURATION_S
    assert 0.005 * n < c1 < 0.05 * n and 0.02 * n < c2 < 0.1 * n, (c1, c2)


def test_records_in_influx_equal_replies(run):
    for ssid in PATHS:
        for direction in ("forward", "reverse", "round_trip"):
            points = run["points"][ssid][direction]
            assert sum(int(p["count"]) for p in points) == run["received"][ssid], (ssid, direction)


def test_one_way_delay_per_path_is_the_injected_sum(run):
    lab = run["lab"]
    for ssid, path in PATHS.items():
        for direction, hops in path.items():
            injected, late = injected_and_late(lab, hops, run["before"], run["after"])
            points = run["points"][ssid][direction]
            n = sum(int(p["count"]) for p in points)
            mean = sum(p["mean_us"] * int(p["count"]) for p in points) / n
            own = run["base_own"][ssid][direction]
            error = mean - injected - late - own
            print(
                f"\n[mesh] ssid {ssid} {direction}: mean {mean:.1f} us = injected {injected:.0f} "
                f"+ relay lateness {late:.1f} + path latency (BASE) {own:.1f} {error:+.1f}"
            )
            assert 0 <= own <= 300, (ssid, direction, own)  # the path's own latency is small, never negative
            assert abs(error) <= TOLERANCE_US, (ssid, direction, mean, injected, late, own)


def test_controller_status_json_matches_agents_and_influx(run):
    assert run["status"].returncode == 0, run["status"].stderr
    st = json.loads(run["status"].stdout)
    for row in st["sessions"]:
        ssid = row["ssid"]
        assert row["sender_state"] == "stopped" and row["reflector_state"] == "running", row
        assert row["packets_sent"] == run["sent"][ssid]["sent"]
        assert row["packets_received"] == run["received"][ssid]
        assert row["packets_lost"] == run["sent"][ssid]["sent"] - run["received"][ssid]
        assert row["reflector_tx_dropped"] == 0
        last = max(run["points"][ssid]["forward"], key=lambda p: p["time"])
        assert row["delay"]["forward"]["mean_us"] == last["mean_us"], (row["delay"], last)


def test_topology_has_both_paths_with_their_links_in_each_direction(run):
    """The topology processor's model on the agents' real node views: each session's forward and
    reverse path documents resolve hop by hop to links; the reverse ones with the return SID list
    the reflector (B) holds, not the sender's empty one."""
    from processors.topology.model import TopologyModel

    model = TopologyModel()
    for node in NODES:
        assert node in run["views"], f"no node view of {node} on the topology topic"
        model.apply_view(run["views"][node])
    docs = model.path_docs()
    want = {
        (1, "forward"): (["A", "R1", "R2", "B"], ["fc00:11::e", "fc00:12::e", "fc00:3::1"]),
        (1, "reverse"): (["B", "R2", "R1", "A"], ["fc00:12::e", "fc00:11::e", "fc00:1::1"]),
        (2, "forward"): (["A", "R3", "R4", "B"], ["fc00:13::e", "fc00:14::e", "fc00:3::1"]),
        (2, "reverse"): (["B", "R4", "R3", "A"], ["fc00:14::e", "fc00:13::e", "fc00:1::1"]),
    }
    for (ssid, direction), (hops, sids) in want.items():
        doc = next(
            d
            for d in docs.values()
            if {"node": "A", "ssid": ssid, "direction": direction} in d.get("stamp_sessions", [])
        )
        assert doc["sid_list"] == sids and doc["hops"] == hops, (ssid, direction, doc)
        assert doc["links"] is not None and len(doc["links"]) == 3, (ssid, direction, doc)
