"""In-line (IOAM) measurement end to end against ground truth, on the two disjoint paths of
netlab/topologies/mesh8_two_paths.yaml: the controller applies an intent with `inline_monitors`
(INTENT below) to real agents on every node; A's and B's ioam_tx insert the trace into every
packet (sampling 1 in 1) of four monitored flows — each path in each direction — the kernels of
R1..R4 fill it, the other edge's ioam_rx records it, the agents stream the records to Kafka, the
in-line processor writes inline_delay / inline_hop_delay / inline_loss through Telegraf into
InfluxDB. A STAMP session per path runs at the same time (XDP sender side on A, reflector on B),
through the delay processor.

Ground truth is what the test set and what the relays counted themselves, over the same window,
for exactly each flow's frames (relay_ground_truth + relay_flow; the flows are told apart by their
IPv6 flow label, which the seg6 encapsulation copies to the outer header):
- every hop's inline_hop_delay mean over the run (every packet of the flow) = that link's injected
  delay + the relay's measured lateness for the flow's frames, within +-100 us, for each of the
  six links in each direction; the hop tags name the right nodes and devices;
- inline_delay mean = the STAMP session's stamp_delay mean over the same seconds, within +-50 us,
  forward and reverse;
- inline_loss: `lost` = the frames of the flow the relays dropped (2 % on R1 -> R2, 5 % on
  R4 -> R3, switched on after the first seconds of traffic and off before its end, so the first
  and last packet always arrive), exactly; `reordered` = the frames the relay on R1 -> R2
  released after a later one of the same flow (every 25th held 12 ms), exactly; `duplicated` = 0;
  the seqflow receivers behind the egress count the same (RFC 4737);
- the agents' counters (sampled = instrumented = packets sent, records = packets delivered) and
  `controller status --json` (the same counters, and the worst hop of each flow in the middle of
  the run = the link with the largest injected delay on that path and direction).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from netlab import Lab, relay_ground_truth, teardown
from tests.e2e.inline_lab import (
    EGRESS,
    INGRESS,
    NS,
    Flow,
    InlinePipeline,
    agrees_with_stamp,
    hop_ground_truth,
    median_difference,
    points,
    run_flow_ids,
    stamp_points,
    start_in_step,
    wait_for_records,
    weighted,
)
from tests.isolation import own_name, wait_until_alone

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "mesh8_two_paths.yaml"
PREFIX = own_name("tinm8")
NODES = ("A", "R1", "R2", "R3", "R4", "B")
LINKS = ("a1", "c1", "b1", "a2", "c2", "b2")
INTERVAL_US, DURATION_S, LEAD_S, TAIL_S = 5000, 14, 1.0, 2.0  # 200 packets/s per flow; loss from 1 s after
# the last flow's first packet until 2 s before the first flow's last one
COUNT = DURATION_S * 1_000_000 // INTERVAL_US
HOP_TOLERANCE_US = 100
LOSS = {"c1": (2, 0), "c2": (0, 5)}  # percent a_to_b, b_to_a (the topology's)
REORDER = ("c1", "every:25:12000")  # R1 -> R2: every 25th frame of each flow held 12 ms
F1, F2, F3, F4 = run_flow_ids(510_000_000, 4)  # path 1 A->B, path 2 A->B, path 1 B->A, path 2 B->A

INTENT = """
version: 1
nodes:
  A:  {agent: "${SEGSCOPE_AGENT_A}", tls: &tls {ca: "${SEGSCOPE_CERTS}/ca.pem",
       cert: "${SEGSCOPE_CERTS}/controller.pem", key: "${SEGSCOPE_CERTS}/controller.key"}}
  R1: {agent: "${SEGSCOPE_AGENT_R1}", tls: *tls}
  R2: {agent: "${SEGSCOPE_AGENT_R2}", tls: *tls}
  R3: {agent: "${SEGSCOPE_AGENT_R3}", tls: *tls}
  R4: {agent: "${SEGSCOPE_AGENT_R4}", tls: *tls}
  B:  {agent: "${SEGSCOPE_AGENT_B}", tls: *tls}
local_sids:
  - {node: R1, sid: "fc00:11::e", action: End, dev: r1b}
  - {node: R2, sid: "fc00:12::e", action: End, dev: r2a}
  - {node: R3, sid: "fc00:13::e", action: End, dev: r3a}
  - {node: R4, sid: "fc00:14::e", action: End, dev: r4a}
  - {node: B, sid: "fc00:3::d6", action: End.DT6, lookup_table: 254, dev: b1}
  - {node: A, sid: "fc00:1::d6", action: End.DT6, lookup_table: 254, dev: a1}
policies:
  - {node: A, destination: "fd00:b::/64", mode: encap, segs: ["fc00:11::e", "fc00:12::e", "fc00:3::d6"], dev: a1}
  - {node: A, destination: "fd00:c::/64", mode: encap, segs: ["fc00:13::e", "fc00:14::e", "fc00:3::d6"], dev: a2}
  - {node: B, destination: "fd00:a::/64", mode: encap, segs: ["fc00:12::e", "fc00:11::e", "fc00:1::d6"], dev: b1}
  - {node: B, destination: "fd00:d::/64", mode: encap, segs: ["fc00:14::e", "fc00:13::e", "fc00:1::d6"], dev: b2}
stamp_sessions:
  - {ssid: 61, sender: {node: A, address: "fc00:1::1", dev: a1}, reflector: {node: B, address: "fc00:3::1", dev: b1},
     segs: ["fc00:11::e", "fc00:12::e"], return_segs: ["fc00:12::e", "fc00:11::e"], rate_pps: 100}
  - {ssid: 62, sender: {node: A, address: "fc00:1::1", dev: a2}, reflector: {node: B, address: "fc00:3::1", dev: b2},
     segs: ["fc00:13::e", "fc00:14::e"], return_segs: ["fc00:14::e", "fc00:13::e"], rate_pps: 100}
inline_monitors:
  - {flow_id: FLOW1, ingress: {node: A, dev: a1}, egress: {node: B, dev: b1}, sampling: {every: 1}, transit: [R1, R2],
     segs: ["fc00:11::e", "fc00:12::e", "fc00:3::d6"]}
  - {flow_id: FLOW2, ingress: {node: A, dev: a2}, egress: {node: B, dev: b2}, sampling: {every: 1}, transit: [R3, R4],
     segs: ["fc00:13::e", "fc00:14::e", "fc00:3::d6"], namespace: 7}
  - {flow_id: FLOW3, ingress: {node: B, dev: b1}, egress: {node: A, dev: a1}, sampling: {every: 1}, transit: [R1, R2],
     segs: ["fc00:12::e", "fc00:11::e", "fc00:1::d6"]}
  - {flow_id: FLOW4, ingress: {node: B, dev: b2}, egress: {node: A, dev: a2}, sampling: {every: 1}, transit: [R3, R4],
     segs: ["fc00:14::e", "fc00:13::e", "fc00:1::d6"], namespace: 7}
"""
for _i, _fid in enumerate((F1, F2, F3, F4), 1):
    INTENT = INTENT.replace(f"FLOW{_i},", f"{_fid},")

# flow id -> (traffic, ingress node, egress node, STAMP ssid and direction over the same links,
#             [(link, its direction, the outer destination there, the hop's link tag)])
FLOWS = {
    F1: (Flow("path 1 A->B", "H1", "H2", "fd00:b::1", 9701, 0x51001, COUNT, INTERVAL_US), "A", "B",
           (61, "forward"),
           [("a1", "a_to_b", "fc00:11::e", "A:a1->R1:r1b"), ("c1", "a_to_b", "fc00:12::e", "R1:r1c->R2:r2a"),
            ("b1", "a_to_b", "fc00:3::d6", "R2:r2c->B:b1")]),
    F2: (Flow("path 2 A->B", "H1", "H2", "fd00:c::1", 9702, 0x51002, COUNT, INTERVAL_US), "A", "B",
           (62, "forward"),
           [("a2", "a_to_b", "fc00:13::e", "A:a2->R3:r3a"), ("c2", "a_to_b", "fc00:14::e", "R3:r3c->R4:r4a"),
            ("b2", "a_to_b", "fc00:3::d6", "R4:r4c->B:b2")]),
    F3: (Flow("path 1 B->A", "H2", "H1", "fd00:a::1", 9703, 0x51003, COUNT, INTERVAL_US), "B", "A",
           (61, "reverse"),
           [("b1", "b_to_a", "fc00:12::e", "B:b1->R2:r2c"), ("c1", "b_to_a", "fc00:11::e", "R2:r2a->R1:r1c"),
            ("a1", "b_to_a", "fc00:1::d6", "R1:r1b->A:a1")]),
    F4: (Flow("path 2 B->A", "H2", "H1", "fd00:d::1", 9704, 0x51004, COUNT, INTERVAL_US), "B", "A",
           (62, "reverse"),
           [("b2", "b_to_a", "fc00:14::e", "B:b2->R4:r4c"), ("c2", "b_to_a", "fc00:13::e", "R4:r4a->R3:r3c"),
            ("a2", "b_to_a", "fc00:1::d6", "R3:r3a->A:a2")]),
}  # fmt: skip

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def sleep_until(t: float) -> None:
    """Until wall clock t."""
    time.sleep(max(0.0, t - time.time()))


@pytest.fixture(scope="module")
def run(stack, bpffs, tmp_path_factory):
    t_start = time.monotonic()
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    pipe = InlinePipeline(lab, stack, tmp_path_factory.mktemp("inline-mesh8"), nodes=NODES)
    flows = [f for f, *_ in FLOWS.values()]
    try:
        pipe.start_processors()
        pipe.start_agents()
        # a second address of H1 for the flow B -> A over path 2 (B steers by destination)
        lab.run("H1", ["ip", "-6", "addr", "add", "fd00:d::1/128", "dev", "lo"], check=True)
        lab.run("A", ["ip", "-6", "route", "add", "fd00:d::/64", "via", "fd00:a::1"], check=True)
        for link in LOSS:
            lab.set_loss(link, 0, 0)
        lab.set_reorder(REORDER[0], REORDER[1], None)
        applied = pipe.apply_text(INTENT, "intent.yaml")
        pipe.wait_processors()
        waited = wait_until_alone()  # prepared beside the last parallel groups; the traffic runs alone
        print(f"\n[{PREFIX}] prepared in {time.monotonic() - t_start - waited:.0f} s, waited {waited:.0f} s")
        time.sleep(1.0)
        before = {link: lab.relay_stats(link) for link in LINKS}
        start_at, started = start_in_step(lab, flows)  # every flow's first packet has left
        since = int(start_at * NS)
        sleep_until(started + LEAD_S)
        lossy_from = time.time()
        for link, (ab, ba) in LOSS.items():
            lab.set_loss(link, ab, ba)
        # the worst hop while the traffic runs (the newest second then is a full one); status takes
        # seconds under load, the loss must end on time: a thread
        status: dict = {}
        mid = threading.Timer(
            max(0.0, start_at + DURATION_S - 5 - time.time()),
            lambda: status.setdefault("mid", pipe.status_json("intent.yaml", stack.influx_url)),
        )
        mid.start()
        sleep_until(start_at + DURATION_S - TAIL_S)
        for link in LOSS:
            lab.set_loss(link, 0, 0)
        lossy_s = time.time() - lossy_from  # every flow sent before and after it
        mid.join()
        received = {fid: f.wait() for fid, (f, *_) in FLOWS.items()}
        time.sleep(1.0)  # the last held frames (12 ms) and the STAMP replies land
        after = {link: lab.relay_stats(link) for link in LINKS}
        lab.set_reorder(REORDER[0], None, None)
        window = {link: relay_ground_truth(before[link], after[link]) for link in LINKS}
        counters = {
            fid: (pipe.inline_counters(ing, INGRESS, fid), pipe.inline_counters(eg, EGRESS, fid))
            for fid, (_, ing, eg, *_) in FLOWS.items()
        }
        wait_for_records(stack, {fid: c[1].records for fid, c in counters.items()}, since)
        time.sleep(1.0)  # the same seconds' loss and hop lines are written with them
        status_end = pipe.status_json("intent.yaml", stack.influx_url)
        got = {
            fid: {m: points(stack, m, fid, since) for m in ("inline_delay", "inline_hop_delay", "inline_loss")}
            for fid in FLOWS
        }
        stamp = {ssid: stamp_points(stack, "A", ssid, since - 2_000_000_000) for ssid in (61, 62)}
        yield {
            "lab": lab,
            "applied": applied,
            "received": received,
            "window": window,
            "counters": counters,
            "status_mid": status.get("mid"),
            "lossy_s": lossy_s,
            "status_end": status_end,
            "points": got,
            "stamp": stamp,
        }
    finally:
        for f in flows:
            f.kill()
        pipe.stop()
        lab.down()
        print(f"\n[inline mesh8] module {time.monotonic() - t_start:.0f} s")


def test_the_controller_set_up_every_monitor(run):
    calls = run["applied"].mutating_calls
    for node in ("A", "B"):
        assert calls[node]["StartInlineMonitor"] == 4 and calls[node]["EnableIoam"] == 1, calls[node]
    for node in ("R1", "R2", "R3", "R4"):
        assert calls[node] == {"CreateLocalSid": 1, "EnableIoam": 1}, calls[node]


def test_every_packet_sampled_instrumented_and_recorded(run):
    for fid, (flow, *_) in FLOWS.items():
        r = run["received"][fid]
        ing, eg = run["counters"][fid]
        print(f"\n[inline mesh8] flow {fid} {flow.name}: sent {r['sent']} (from {r['late_s']:.2f} s after the common "
              f"start), ingress {ing.sampled} sampled "
              f"{ing.instrumented} instrumented, egress {eg.records} records, H received {r['distinct']}")  # fmt: skip
        assert r["sent"] == COUNT and r["errors"] == 0 and r["socket_drops"] == 0 and r["bad"] == 0, r
        assert (ing.packets, ing.sampled, ing.instrumented, ing.next_sequence) == (COUNT,) * 4, ing
        assert ing.skipped_mtu == ing.skipped_gso == ing.skipped_other == 0, ing
        assert eg.records == r["distinct"] and eg.ringbuf_full == 0, (eg, r)


def test_hop_delays_are_the_links_delays_and_named_right(run):
    for fid, (flow, _, _, _, hops) in FLOWS.items():
        truth = hop_ground_truth(run["window"], flow, [(link, d, outer) for link, d, outer, _ in hops])
        rows = run["points"][fid]["inline_hop_delay"]
        assert rows, f"no inline_hop_delay of flow {fid}"
        assert all(r["measured"] is True and r["unmeasured"] == 0 for r in rows), fid  # every node filled
        by_hop: dict[str, list[dict]] = {}
        for r in rows:
            by_hop.setdefault(r["hop"], []).append(r)
        assert sorted(by_hop) == ["0", "1", "2"], (fid, sorted(by_hop))
        for i, ((link, d, _, tag), gt) in enumerate(zip(hops, truth)):
            hop = by_hop[str(i)]
            frm, to = tag.split("->")
            assert {(r["link"], r["from_node"], r["from_if"], r["to_node"], r["to_if"]) for r in hop} == {
                (tag, *frm.split(":"), *to.split(":"))
            }, (fid, i, {r["link"] for r in hop})
            mean, n = weighted(hop)
            error = mean - gt["relay_mean_us"]
            injected, late = (gt[k] / gt["released"] / 1000 for k in ("delay_ns_sum", "late_ns_sum"))
            print(f"\n[inline mesh8] flow {fid} hop {i} {tag} ({link} {d}): {mean:.1f} us over {n} packets, relay "
                  f"{gt['relay_mean_us']:.1f} us (injected {injected:.0f} + late {late:.1f}) {error:+.1f}")  # fmt: skip
            assert n == run["counters"][fid][1].records, (fid, i, n)  # every packet measured every hop
            assert abs(error) <= HOP_TOLERANCE_US, (fid, i, tag, mean, gt["relay_mean_us"])


def test_e2e_delay_equals_stamp_over_the_same_seconds(run):
    errors = {}
    for fid, (flow, _, _, (ssid, direction), _) in FLOWS.items():
        inline = {r["time"]: r for r in run["points"][fid]["inline_delay"]}
        stamp = {r["time"]: r for r in run["stamp"][ssid] if r["direction"] == direction}
        seconds = sorted(set(inline) & set(stamp))
        assert len(seconds) >= DURATION_S - 2, (fid, len(seconds))
        mean_i, n_i = weighted([inline[s] for s in seconds])
        mean_s, n_s = weighted([stamp[s] for s in seconds])
        # the two instruments sample different packets: one relay stall of a loaded runner (ms)
        # moves a 15-s mean by tens of us on one side only. The median over the seconds of the
        # per-second median difference is what both must agree on.
        error = median_difference([inline[s] for s in seconds], [stamp[s] for s in seconds])
        print(f"\n[inline mesh8] flow {fid} {flow.name}: inline_delay {mean_i:.1f} us ({n_i} packets), STAMP "
              f"{ssid} {direction} {mean_s:.1f} us ({n_s}) over {len(seconds)} s: means {mean_i - mean_s:+.1f}, "
              f"medians {error:+.1f}")  # fmt: skip
        errors[fid] = (direction, error)
    assert all(agrees_with_stamp(d, e) for d, e in errors.values()), errors


def test_loss_reordering_and_duplicates_exact(run):
    assert run["lossy_s"] >= DURATION_S / 2, run["lossy_s"]  # the senders started in step
    for fid, (flow, _, _, _, hops) in FLOWS.items():
        truth = hop_ground_truth(run["window"], flow, [(link, d, outer) for link, d, outer, _ in hops])
        dropped = sum(
            t["dropped_loss"] + t["dropped_queue_full"] + t["dropped_oversize"] + t["send_errors"] for t in truth
        )
        reordered = sum(t["reordered"] for t in truth)
        rows = run["points"][fid]["inline_loss"]
        got = {k: sum(int(r[k]) for r in rows) for k in ("received", "lost", "duplicated", "reordered")}
        r = run["received"][fid]
        print(f"\n[inline mesh8] flow {fid} {flow.name}: inline_loss {got}; relays dropped {dropped}, reordered "
              f"{reordered}; receiver lost {r['sent'] - r['distinct']}, reordered {r['reordered']}")  # fmt: skip
        assert got["lost"] == dropped == r["sent"] - r["distinct"], (fid, got, dropped, r)
        assert got["reordered"] == reordered == r["reordered"], (fid, got, reordered, r)
        assert got["duplicated"] == 0 == r["duplicates"], (fid, got, r)
        assert got["received"] == r["distinct"], (fid, got, r)
    # the injected loss and reordering did happen, where they were injected
    assert sum(int(x["lost"]) for x in run["points"][F1]["inline_loss"]) > 0
    assert sum(int(x["lost"]) for x in run["points"][F4]["inline_loss"]) > 0
    assert sum(int(x["reordered"]) for x in run["points"][F1]["inline_loss"]) >= COUNT // 25 // 2
    for fid in (F2, F3):
        assert sum(int(x["lost"]) + int(x["reordered"]) for x in run["points"][fid]["inline_loss"]) == 0, fid


def test_controller_status_counters_and_worst_hop(run):
    injected = {
        fid: max(hops, key=lambda h: run["lab"].topo.link(h[0]).__getattribute__(f"delay_{h[1]}_us"))[3]
        for fid, (_, _, _, _, hops) in FLOWS.items()
    }
    mid = {m["flow_id"]: m for m in run["status_mid"]["inline_monitors"]}
    end = {m["flow_id"]: m for m in run["status_end"]["inline_monitors"]}
    for fid in FLOWS:
        ing, eg = run["counters"][fid]
        row = end[fid]
        assert (row["ingress_state"], row["egress_state"]) == ("installed", "installed"), row
        assert (row["sampled"], row["instrumented"], row["skipped"], row["records"]) == (
            ing.sampled, ing.instrumented, 0, eg.records
        ), row  # fmt: skip
        hop = mid[fid]["worst_hop"]
        print(f"\n[inline mesh8] flow {fid}: worst hop in the middle of the run {hop}")
        assert hop is not None and hop["link"] == injected[fid], (fid, hop, injected[fid])
