"""In-line (IOAM) measurement end to end against ground truth on netlab/topologies/ring6_inline.yaml
(ingress I, egress E, a primary path over three End nodes P1-P2-P3, an alternative over Q1 whose
first link I-Q1 has a 1400-byte MTU), brought up without its own IOAM settings: the agents set
IOAM as the controller's intent (INTENT below) says. Four monitored flows, sampling 1 in 1: the
primary and the alternative path, each way; STAMP sessions over both paths at the same time.

Phase 1 (every transit node fills the trace):
- each hop's inline_hop_delay mean = the relay's injected delay + measured lateness for exactly
  that flow's frames on that link and direction (relay_ground_truth, relay_flow), +-100 us; the
  hops are named by the nodes and devices of the links they cross;
- inline_delay mean = the STAMP session's stamp_delay mean over the same seconds, +-50 us;
- loss: nftables on P2 drops 3 % of the primary forward flow's packets (matched by their flow
  label, from a second after every flow's first packet until two seconds before the end, so the
  first and last packet arrive): inline_loss `lost` = the rule's counter, exactly; the relay on P3 -> P2 holds every
  20th frame 12 ms: `reordered` of the primary reverse flow = the relay's count for it, exactly;
  duplicated = 0; the seqflow receivers agree;
- MTU: the alternative forward flow carries, beside its small packets, 1300-byte packets that fit
  the 1400-byte link only without the 96 bytes of IOAM options: the ingress counts them
  skipped_mtu (API and `controller status`), sends them uninstrumented, they arrive intact (sizes
  and padding at H2, the relay saw them all on I -> Q1), the small ones are instrumented and
  recorded, no sequence number is lost to a skipped packet;
- `controller status --json`: sampled / instrumented / skipped per monitor as the agents count,
  and the worst hop in the middle of the run = the link with the largest injected delay.

Phase 2: the intent no longer lists P2 under `transit:` of the primary monitors, so the
controller disables IOAM on P2 (DisableIoam): its hops are reported measured=false (P1 -> P2 and
P2 -> P3, the node named by the SID it owns), the span P1 -> P3 over it is measured (= the two
links' delays together), the other hops stay right.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from netlab import Lab, relay_flow, relay_ground_truth, teardown
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
TOPOLOGY = REPO / "netlab" / "topologies" / "ring6_inline.yaml"
PREFIX = own_name("tinr6")
NODES = ("I", "P1", "P2", "P3", "Q1", "E")
LINKS = ("ip1", "p12", "p23", "p3e", "iq1", "q1e")
INTERVAL_US, DURATION_S, LEAD_S, TAIL_S, PHASE2_S = 5000, 12, 1.0, 2.0, 6
COUNT = DURATION_S * 1_000_000 // INTERVAL_US
BIG_INTERVAL_US, BIG_SIZE = 50_000, 1252  # UDP payload: a 1300-byte inner packet, 1380 bytes encapsulated
HOP_TOLERANCE_US = 100
NFT_LOSS_PCT = 3
REORDER = ("p23", "every:20:12000")  # P3 -> P2 (b_to_a): every 20th frame of each flow held 12 ms
R1, R2, R3, R4 = run_flow_ids(520_000_000, 4)  # primary I->E, primary E->I, alternative I->E, alternative E->I

INTENT = """
version: 1
nodes:
  I:  {agent: "${SEGSCOPE_AGENT_I}", tls: &tls {ca: "${SEGSCOPE_CERTS}/ca.pem",
       cert: "${SEGSCOPE_CERTS}/controller.pem", key: "${SEGSCOPE_CERTS}/controller.key"}}
  P1: {agent: "${SEGSCOPE_AGENT_P1}", tls: *tls}
  P2: {agent: "${SEGSCOPE_AGENT_P2}", tls: *tls}
  P3: {agent: "${SEGSCOPE_AGENT_P3}", tls: *tls}
  Q1: {agent: "${SEGSCOPE_AGENT_Q1}", tls: *tls}
  E:  {agent: "${SEGSCOPE_AGENT_E}", tls: *tls}
# what the topology file installs: the intent owns it now (no call: it is there already)
local_sids:
  - {node: P1, sid: "fc00:21::e", action: End, dev: p1a, count: true}
  - {node: P2, sid: "fc00:22::e", action: End, dev: p2a, count: true}
  - {node: P3, sid: "fc00:23::e", action: End, dev: p3a, count: true}
  - {node: Q1, sid: "fc00:31::e", action: End, dev: q1a, count: true}
  - {node: I, sid: "fc00:1::d6", action: End.DT6, lookup_table: 254, dev: i1, count: true}
  - {node: E, sid: "fc00:9::d6", action: End.DT6, lookup_table: 254, dev: e1, count: true}
policies:
  - {node: I, destination: "fd00:b::/64", mode: encap, segs: ["fc00:21::e", "fc00:22::e", "fc00:23::e", "fc00:9::d6"],
     dev: i1}
  - {node: I, destination: "fd00:c::/64", mode: encap, segs: ["fc00:31::e", "fc00:9::d6"], dev: i2}
  - {node: E, destination: "fd00:a::/64", mode: encap, segs: ["fc00:23::e", "fc00:22::e", "fc00:21::e", "fc00:1::d6"],
     dev: e1}
  - {node: E, destination: "fd00:d::/64", mode: encap, segs: ["fc00:31::e", "fc00:1::d6"], dev: e2}
stamp_sessions:
  - {ssid: 63, sender: {node: I, address: "fc00:1::1", dev: i1}, reflector: {node: E, address: "fc00:9::1", dev: e1},
     segs: ["fc00:21::e", "fc00:22::e", "fc00:23::e"], return_segs: ["fc00:23::e", "fc00:22::e", "fc00:21::e"],
     rate_pps: 100}
  - {ssid: 64, sender: {node: I, address: "fc00:1::1", dev: i2}, reflector: {node: E, address: "fc00:9::1", dev: e2},
     segs: ["fc00:31::e"], return_segs: ["fc00:31::e"], rate_pps: 100}
inline_monitors:
  - {flow_id: FLOW1, ingress: {node: I, dev: i1}, egress: {node: E, dev: e1}, sampling: {every: 1},
     segs: ["fc00:21::e", "fc00:22::e", "fc00:23::e", "fc00:9::d6"], transit: [P1, P2, P3]}
  - {flow_id: FLOW2, ingress: {node: E, dev: e1}, egress: {node: I, dev: i1}, sampling: {every: 1},
     segs: ["fc00:23::e", "fc00:22::e", "fc00:21::e", "fc00:1::d6"], transit: [P1, P2, P3]}
  - {flow_id: FLOW3, ingress: {node: I, dev: i2}, egress: {node: E, dev: e2}, sampling: {every: 1},
     segs: ["fc00:31::e", "fc00:9::d6"], transit: [Q1]}
  - {flow_id: FLOW4, ingress: {node: E, dev: e2}, egress: {node: I, dev: i2}, sampling: {every: 1},
     segs: ["fc00:31::e", "fc00:1::d6"], transit: [Q1]}
"""
for _i, _fid in enumerate((R1, R2, R3, R4), 1):
    INTENT = INTENT.replace(f"FLOW{_i},", f"{_fid},")
# phase 2: P2 fills for no monitor any more (the controller disables its IOAM)
INTENT_NO_P2 = INTENT.replace("transit: [P1, P2, P3]", "transit: [P1, P3]")

# flow id -> (traffic, ingress, egress, STAMP ssid and direction over the same links,
#             [(link, its direction, the outer destination there, the hop's link tag)])
FLOWS = {
    R1: (Flow("primary I->E", "H1", "H2", "fd00:b::1", 9711, 0x52001, COUNT, INTERVAL_US), "I", "E", (63, "forward"),
         [("ip1", "a_to_b", "fc00:21::e", "I:i1->P1:p1a"), ("p12", "a_to_b", "fc00:22::e", "P1:p1b->P2:p2a"),
          ("p23", "a_to_b", "fc00:23::e", "P2:p2b->P3:p3a"), ("p3e", "a_to_b", "fc00:9::d6", "P3:p3b->E:e1")]),
    R2: (Flow("primary E->I", "H2", "H1", "fd00:a::1", 9712, 0x52002, COUNT, INTERVAL_US), "E", "I", (63, "reverse"),
         [("p3e", "b_to_a", "fc00:23::e", "E:e1->P3:p3b"), ("p23", "b_to_a", "fc00:22::e", "P3:p3a->P2:p2b"),
          ("p12", "b_to_a", "fc00:21::e", "P2:p2a->P1:p1b"), ("ip1", "b_to_a", "fc00:1::d6", "P1:p1a->I:i1")]),
    R3: (Flow("alternative I->E", "H1", "H2", "fd00:c::1", 9713, 0x52003, COUNT, INTERVAL_US, src_addr="fd00:d::1"),
         "I", "E", (64, "forward"),
         [("iq1", "a_to_b", "fc00:31::e", "I:i2->Q1:q1a"), ("q1e", "a_to_b", "fc00:9::d6", "Q1:q1b->E:e2")]),
    R4: (Flow("alternative E->I", "H2", "H1", "fd00:d::1", 9714, 0x52004, COUNT, INTERVAL_US, src_addr="fd00:c::1"),
         "E", "I", (64, "reverse"),
         [("q1e", "b_to_a", "fc00:31::e", "E:e2->Q1:q1b"), ("iq1", "b_to_a", "fc00:1::d6", "Q1:q1a->I:i2")]),
}  # fmt: skip
# R3's big packets: the same monitored flow (its SID list), their own port and flow label
BIG = Flow("alternative I->E, 1300 bytes", "H1", "H2", "fd00:c::1", 9715, 0x52005,
           DURATION_S * 1_000_000 // BIG_INTERVAL_US, BIG_INTERVAL_US, size=BIG_SIZE, src_addr="fd00:d::1")  # fmt: skip
PHASE2 = {
    R1: Flow("primary I->E, P2 without IOAM", "H1", "H2", "fd00:b::1", 9721, 0x52011, PHASE2_S * 200, INTERVAL_US),
    R2: Flow("primary E->I, P2 without IOAM", "H2", "H1", "fd00:a::1", 9722, 0x52012, PHASE2_S * 200, INTERVAL_US),
}

PHASE2_ENDS = {R1: ("P1", "P3"), R2: ("P3", "P1")}  # the nodes before and after P2

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def sleep_until(t: float) -> None:
    """Until wall clock t."""
    time.sleep(max(0.0, t - time.time()))


@pytest.fixture(scope="module")
def run(stack, bpffs, tmp_path_factory):
    t_start = time.monotonic()
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX, ioam=False)
    pipe = InlinePipeline(lab, stack, tmp_path_factory.mktemp("inline-ring6"), nodes=NODES)
    flows = [f for f, *_ in FLOWS.values()] + [BIG]
    try:
        pipe.start_processors()
        pipe.start_agents()
        lab.set_reorder(REORDER[0], None, REORDER[1])
        applied = pipe.apply_text(INTENT, "intent.yaml")
        pipe.wait_processors()
        waited = wait_until_alone()  # prepared beside the last parallel groups; the traffic runs alone
        print(f"\n[{PREFIX}] prepared in {time.monotonic() - t_start - waited:.0f} s, waited {waited:.0f} s")
        time.sleep(1.0)
        before = {link: lab.relay_stats(link) for link in LINKS}
        start_at, started = start_in_step(lab, flows)  # every flow's first packet has left
        since = int(start_at * NS)
        # nftables on P2 (forward, after End rewrote the destination): the primary forward flow's
        # packets while their flow label is in the set `lossy` (so the rule's counter stays readable)
        label = f"{{ {FLOWS[R1][0].label:#x} }}"
        for cmd in (["add", "table", "inet", "netlab"],
                    ["add", "set", "inet", "netlab", "lossy", "{ typeof ip6 flowlabel; }"]):  # fmt: skip
            lab.run("P2", ["nft", *cmd], check=True)
        nft = lab.add_loss("P2", NFT_LOSS_PCT, match="ip6 daddr fc00:23::e ip6 flowlabel @lossy")
        sleep_until(started + LEAD_S)
        lossy_from = time.time()
        lab.run("P2", ["nft", "add", "element", "inet", "netlab", "lossy", label], check=True)
        status: dict = {}
        mid = threading.Timer(
            max(0.0, start_at + DURATION_S - 5 - time.time()),
            lambda: status.setdefault("mid", pipe.status_json("intent.yaml", stack.influx_url)),
        )
        mid.start()
        sleep_until(start_at + DURATION_S - TAIL_S)
        lab.run("P2", ["nft", "delete", "element", "inet", "netlab", "lossy", label], check=True)
        lossy_s = time.time() - lossy_from  # every flow sent before and after it
        mid.join()
        received = {fid: f.wait() for fid, (f, *_) in FLOWS.items()}
        nft_dropped = lab.loss_counter(nft)
        received["big"] = BIG.wait()
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
        status_text = pipe.status("intent.yaml", stack.influx_url, json_out=False)
        got = {
            fid: {m: points(stack, m, fid, since) for m in ("inline_delay", "inline_hop_delay", "inline_loss")}
            for fid in FLOWS
        }
        stamp = {ssid: stamp_points(stack, "I", ssid, since - 2 * NS) for ssid in (63, 64)}

        # phase 2: P2 out of the primary monitors' transit nodes
        applied2 = pipe.apply_text(INTENT_NO_P2, "intent-no-p2.yaml")
        before2 = {link: lab.relay_stats(link) for link in LINKS}
        start2, _ = start_in_step(lab, list(PHASE2.values()))
        received2 = {fid: f.wait() for fid, f in PHASE2.items()}
        time.sleep(1.0)
        after2 = {link: lab.relay_stats(link) for link in LINKS}
        window2 = {link: relay_ground_truth(before2[link], after2[link]) for link in LINKS}
        since2 = int(start2 * NS)
        records2 = {fid: pipe.inline_counters(FLOWS[fid][2], EGRESS, fid).records for fid in PHASE2}
        total = {fid: records2[fid] - counters[fid][1].records for fid in PHASE2}
        wait_for_records(stack, total, since2)
        time.sleep(1.0)
        hops2 = {fid: points(stack, "inline_hop_delay", fid, since2) for fid in PHASE2}
        yield {
            "lab": lab,
            "applied": applied,
            "received": received,
            "window": window,
            "nft_dropped": nft_dropped,
            "counters": counters,
            "status_mid": status.get("mid"),
            "lossy_s": lossy_s,
            "status_end": status_end,
            "status_text": status_text,
            "points": got,
            "stamp": stamp,
            "applied2": applied2,
            "received2": received2,
            "window2": window2,
            "records2": total,
            "hops2": hops2,
        }
    finally:
        for f in flows + list(PHASE2.values()):
            f.kill()
        pipe.stop()
        lab.down()
        print(f"\n[inline ring6] module {time.monotonic() - t_start:.0f} s")


def test_the_controller_set_up_ioam_and_the_monitors_only(run):
    calls = run["applied"].mutating_calls
    for node in ("I", "E"):  # the STAMP sender and reflector too; the SRv6 routes were there already
        inline = {k: v for k, v in calls[node].items() if k in ("EnableIoam", "StartInlineMonitor")}
        assert inline == {"EnableIoam": 1, "StartInlineMonitor": 4}, calls[node]
        assert not any("LocalSid" in k or "Policy" in k for k in calls[node]), calls[node]
    for node in ("P1", "P2", "P3", "Q1"):
        assert calls[node] == {"EnableIoam": 1}, (node, calls[node])


def test_every_packet_sampled_instrumented_and_recorded(run):
    rec = run["received"]
    for fid, (flow, *_) in FLOWS.items():
        r = rec[fid]
        ing, eg = run["counters"][fid]
        print(f"\n[inline ring6] flow {fid} {flow.name}: sent {r['sent']} (from {r['late_s']:.2f} s after the common "
              f"start), ingress {ing.packets} packets "
              f"{ing.sampled} sampled {ing.instrumented} instrumented {ing.skipped_mtu} skipped (MTU), egress "
              f"{eg.records} records, H received {r['distinct']}")  # fmt: skip
        assert r["sent"] == COUNT and r["errors"] == 0 and r["socket_drops"] == 0 and r["bad"] == 0, r
        assert r["pad_errors"] == 0 and r["sizes"] == {str(flow.size): r["received"]}, r
        extra = rec["big"]["sent"] if fid == R3 else 0  # the alternative forward flow's big packets
        assert (ing.packets, ing.sampled) == (COUNT + extra,) * 2, ing
        assert (ing.instrumented, ing.next_sequence) == (COUNT, COUNT), ing
        assert (ing.skipped_mtu, ing.skipped_gso, ing.skipped_other) == (extra, 0, 0), ing
        assert eg.records == r["distinct"] and eg.ringbuf_full == 0, (eg, r)


def test_mtu_sized_packets_pass_uninstrumented_and_intact(run):
    big, ing = run["received"]["big"], run["counters"][R3][0]
    on_link = relay_flow(run["window"]["iq1"], "a_to_b", dst="fc00:31::e", flow_label=BIG.label)
    print(f"\n[inline ring6] 1300-byte packets: sent {big['sent']}, skipped_mtu {ing.skipped_mtu}, "
          f"relay I->Q1 released {on_link['released']}, H2 received {big['distinct']} {big['sizes']}")  # fmt: skip
    assert big["sent"] == ing.skipped_mtu > 0 and big["errors"] == 0
    assert on_link["received"] == on_link["released"] == big["sent"], on_link  # crossed the 1400-byte link
    assert big["distinct"] == big["received"] == big["sent"], big
    assert big["sizes"] == {str(BIG_SIZE): big["sent"]} and big["pad_errors"] == 0, big
    row = next(m for m in run["status_end"]["inline_monitors"] if m["flow_id"] == R3)
    assert row["skipped_by_reason"] == {"mtu": big["sent"], "gso": 0, "other": 0}, row
    # no sequence number went to a skipped packet: nothing lost, nothing reordered on this flow
    rows = run["points"][R3]["inline_loss"]
    assert sum(int(r["lost"]) for r in rows) == 0 and sum(int(r["received"]) for r in rows) == COUNT


def test_hop_delays_are_the_links_delays_and_named_right(run):
    for fid, (flow, _, _, _, hops) in FLOWS.items():
        truth = hop_ground_truth(run["window"], flow, [(link, d, outer) for link, d, outer, _ in hops])
        rows = run["points"][fid]["inline_hop_delay"]
        assert rows, f"no inline_hop_delay of flow {fid}"
        assert all(r["measured"] is True and r["unmeasured"] == 0 for r in rows), fid  # every node filled
        by_hop: dict[str, list[dict]] = {}
        for r in rows:
            by_hop.setdefault(r["hop"], []).append(r)
        assert sorted(by_hop) == [str(i) for i in range(len(hops))], (fid, sorted(by_hop))
        for i, ((link, d, _, tag), gt) in enumerate(zip(hops, truth)):
            hop = by_hop[str(i)]
            frm, to = tag.split("->")
            assert {(r["link"], r["from_node"], r["from_if"], r["to_node"], r["to_if"]) for r in hop} == {
                (tag, *frm.split(":"), *to.split(":"))
            }, (fid, i, {r["link"] for r in hop})
            mean, n = weighted(hop)
            error = mean - gt["relay_mean_us"]
            injected, late = (gt[k] / gt["released"] / 1000 for k in ("delay_ns_sum", "late_ns_sum"))
            print(f"\n[inline ring6] flow {fid} hop {i} {tag} ({link} {d}): {mean:.1f} us over {n} packets, relay "
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
        print(f"\n[inline ring6] flow {fid} {flow.name}: inline_delay {mean_i:.1f} us ({n_i} packets), STAMP "
              f"{ssid} {direction} {mean_s:.1f} us ({n_s}) over {len(seconds)} s: means {mean_i - mean_s:+.1f}, "
              f"medians {error:+.1f}")  # fmt: skip
        errors[fid] = (direction, error)
    assert all(agrees_with_stamp(d, e) for d, e in errors.values()), errors


def test_loss_reordering_and_duplicates_exact(run):
    assert run["lossy_s"] >= DURATION_S / 2, run["lossy_s"]  # the senders started in step
    for fid, (flow, _, _, _, hops) in FLOWS.items():
        truth = hop_ground_truth(run["window"], flow, [(link, d, outer) for link, d, outer, _ in hops])
        relay_drops = sum(
            t["dropped_loss"] + t["dropped_queue_full"] + t["dropped_oversize"] + t["send_errors"] for t in truth
        )
        dropped = relay_drops + (run["nft_dropped"] if fid == R1 else 0)
        reordered = sum(t["reordered"] for t in truth)
        rows = run["points"][fid]["inline_loss"]
        got = {k: sum(int(r[k]) for r in rows) for k in ("received", "lost", "duplicated", "reordered")}
        r = run["received"][fid]
        print(f"\n[inline ring6] flow {fid} {flow.name}: inline_loss {got}; dropped {dropped} (nftables on P2 "
              f"{run['nft_dropped'] if fid == R1 else 0}), relay reordered {reordered}; receiver lost "
              f"{r['sent'] - r['distinct']}, reordered {r['reordered']}")  # fmt: skip
        assert relay_drops == 0, (fid, truth)
        assert got["lost"] == dropped == r["sent"] - r["distinct"], (fid, got, dropped, r)
        assert got["reordered"] == reordered == r["reordered"], (fid, got, reordered, r)
        assert got["duplicated"] == 0 == r["duplicates"], (fid, got, r)
        assert got["received"] == r["distinct"], (fid, got, r)
    assert run["nft_dropped"] > 0
    assert sum(int(x["reordered"]) for x in run["points"][R2]["inline_loss"]) >= COUNT // 20 // 2
    for fid in (R3, R4):
        assert sum(int(x["lost"]) + int(x["reordered"]) for x in run["points"][fid]["inline_loss"]) == 0, fid


def test_controller_status_counters_and_worst_hop(run):
    lab = run["lab"]

    def injected(hop):
        t = lab.topo.link(hop[0])
        return t.delay_a_to_b_us if hop[1] == "a_to_b" else t.delay_b_to_a_us

    mid = {m["flow_id"]: m for m in run["status_mid"]["inline_monitors"]}
    end = {m["flow_id"]: m for m in run["status_end"]["inline_monitors"]}
    for fid, (_, _, _, _, hops) in FLOWS.items():
        ing, eg = run["counters"][fid]
        row = end[fid]
        assert (row["ingress_state"], row["egress_state"]) == ("installed", "installed"), row
        assert (row["sampled"], row["instrumented"], row["skipped"], row["records"]) == (
            ing.sampled, ing.instrumented, ing.skipped_mtu, eg.records
        ), row  # fmt: skip
        # the operator's table: flow, ingress, egress, states, sampled, instr., skipped, records | ...
        line = next(t.split() for t in run["status_text"].splitlines() if t.split()[:1] == [str(fid)])
        assert line[1:8] == ["I" if fid in (R1, R3) else "E", "E" if fid in (R1, R3) else "I",
                             "installed/installed", *(str(v) for v in (ing.sampled, ing.instrumented,
                                                                       ing.skipped_mtu, eg.records))], line  # fmt: skip
        worst = max(hops, key=injected)[3]
        hop = mid[fid]["worst_hop"]
        print(f"\n[inline ring6] flow {fid}: worst hop in the middle of the run {hop} (largest injected: {worst})")
        assert hop is not None and hop["link"] == worst, (fid, hop, worst)


def test_a_transit_node_without_ioam_is_a_hop_not_measured(run):
    calls = run["applied2"].mutating_calls
    assert calls == {"P2": {"DisableIoam": 1}}, calls  # nothing else changes
    window = run["window2"]
    for fid, flow in PHASE2.items():
        _, _, _, _, hops = FLOWS[fid]
        truth = hop_ground_truth(window, flow, [(link, d, outer) for link, d, outer, _ in hops])
        r = run["received2"][fid]
        assert r["distinct"] == r["sent"] == flow.count, r
        rows = run["hops2"][fid]
        by_hop: dict[str, list[dict]] = {}
        for x in rows:
            by_hop.setdefault(x["hop"], []).append(x)
        assert sorted(by_hop) == ["0", "1", "1-2", "2", "3"], (fid, sorted(by_hop))
        n = run["records2"][fid]
        before, after = PHASE2_ENDS[fid]
        # the two hops at P2: not measured, every packet counted as crossing them unmeasured
        for h, ends in (("1", (before, "P2")), ("2", ("P2", after))):
            x = by_hop[h]
            assert all(p["measured"] is False and p.get("count") is None for p in x), (fid, h, x)
            assert sum(int(p["unmeasured"]) for p in x) == n, (fid, h, x)
            assert {(p["from_node"], p["to_node"]) for p in x} == {ends}, (fid, h, x)
            print(f"\n[inline ring6] P2 without IOAM, flow {fid} hop {h} {x[0]['link']}: not measured, {n} packets")
        # measured: the first and last hop (one link each) and the span over P2 (two links)
        assert {(p["from_node"], p["to_node"]) for p in by_hop["1-2"]} == {(before, after)}, by_hop["1-2"]
        for h, gts in {"0": [truth[0]], "1-2": truth[1:3], "3": [truth[3]]}.items():
            x = by_hop[h]
            assert all(p["measured"] is True for p in x), (fid, h, x)
            mean, count = weighted(x)
            want = sum(g["relay_mean_us"] for g in gts)
            print(f"\n[inline ring6] P2 without IOAM, flow {fid} hop {h} {x[0]['link']}: {mean:.1f} us over {count} "
                  f"packets, relays {want:.1f} us {mean - want:+.1f}")  # fmt: skip
            assert count == n, (fid, h, count, n)
            assert abs(mean - want) <= HOP_TOLERANCE_US, (fid, h, mean, want)
