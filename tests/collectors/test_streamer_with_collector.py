"""stamp_streamer on the REAL XDP collector's pins (datapath/stamp_collector): records the collector
writes for a STAMP reply (run with BPF_PROG_TEST_RUN on a crafted frame) reach Kafka, and the
collector's per-CPU counters appear on the metrics topic under the names of stamp_collector.h."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from scapy.all import UDP, Ether, IPv6, Raw  # type: ignore
from test_stamp_streamer import NODE, Streamer, consume_all, make_topics

from segscope_schemas import stamp_record as sr
from segscope_schemas import stamp_test_packet as tp

pytestmark = pytest.mark.datapath

REPO = Path(__file__).resolve().parents[2]
COLLECTOR = REPO / "build" / "datapath" / "stamp_collector"
T1_SEC, T2_SEC = 1_732_000_037, 1_732_000_037


@pytest.fixture
def collector(veth_pair, co_pins, request):
    subprocess.run(["make", "-C", str(REPO / "datapath"), "-s"], check=True)
    pin_dir = co_pins / request.node.name / "stamp_collector"
    subprocess.run(["rm", "-rf", str(pin_dir)], check=True)
    subprocess.run(
        [str(COLLECTOR), "attach", "--netns", veth_pair.snd_ns, "--dev", veth_pair.snd_if, "--pin-dir", str(pin_dir)],
        check=True,
        capture_output=True,
    )
    try:
        yield pin_dir
    finally:
        subprocess.run(
            [
                str(COLLECTOR),
                "detach",
                "--netns",
                veth_pair.snd_ns,
                "--dev",
                veth_pair.snd_if,
                "--pin-dir",
                str(pin_dir),
            ],
            capture_output=True,
        )
        subprocess.run(["rm", "-rf", str(pin_dir.parent)])


def reply_frame(seq: int, ssid: int, sender_port: int) -> str:
    refl = tp.ReflectorPacket(
        seq=seq,
        ts_sec=T2_SEC,
        ts_frac=500,
        err_est=0x4001,
        ssid=ssid,
        rx_sec=T2_SEC,
        rx_frac=400,
        sender_seq=seq,
        sender_ts_sec=T1_SEC,
        sender_ts_frac=100,
        sender_err_est=0x4002,
        sender_ttl=61,
    )
    f = (
        Ether(src="02:c0:00:00:00:02", dst="02:c0:00:00:00:01")
        / IPv6(src="fc00:3::1", dst="fc00:1::1", hlim=60)
        / UDP(sport=tp.STAMP_PORT, dport=sender_port)
        / Raw(refl.encode())
    )
    return bytes(f).hex()


def test_collector_records_and_counters_reach_kafka(collectors_build, collector, kafka_bootstrap, work_dir):
    subprocess.run(
        [str(COLLECTOR), "activate", "--pin-dir", str(collector), "--ssid", "21", "--port", "50021"],
        check=True,
        capture_output=True,
    )
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(
        collectors_build,
        collector / "stamp_records",
        kafka_bootstrap,
        topic,
        mtopic,
        work_dir,
        "--datapath-stats",
        str(collector / "stamp_collector_stats"),
    )
    try:
        time.sleep(0.3)
        for seq in range(3):  # three collected replies
            out = subprocess.run(
                [str(COLLECTOR), "test-run", "--pin-dir", str(collector), "--hex", reply_frame(seq, 21, 50021)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            assert json.loads(out)["action"] == "XDP_DROP"
        # and one for an unknown session: passed to the stack, counted, no record
        subprocess.run(
            [str(COLLECTOR), "test-run", "--pin-dir", str(collector), "--hex", reply_frame(0, 22, 50022)],
            check=True,
            capture_output=True,
        )
        st.wait_delivered(3, timeout=30)
        time.sleep(1.2)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    assert final["records_in"] == final["records_delivered"] == 3

    msgs = consume_all(
        kafka_bootstrap, topic, lambda ms: sum(sr.decode_header(m.value()).record_count for m in ms) >= 3
    )
    recs = [r for m in msgs for r in sr.decode_batch(m.value())[1]]
    assert [int(r["sender_seq"]) for r in recs] == [0, 1, 2]
    for r in recs:
        assert int(r["ssid"]) == 21 and int(r["sender_ttl"]) == 61
        assert int(r["t1_ns"]) % 1_000_000_000 == 100 and int(r["t2_ns"]) % 1_000_000_000 == 400
        assert int(r["t3_ns"]) % 1_000_000_000 == 500
        assert (int(r["sender_err_est"]), int(r["reflector_err_est"])) == (0x4002, 0x4001)

    lines = [
        ln
        for m in consume_all(kafka_bootstrap, mtopic, lambda ms: len(ms) >= 2)
        for ln in m.value().decode().splitlines()
    ]
    dp = [ln for ln in lines if ln.startswith(f"segscope_datapath,node={NODE},program=stamp_collector ")]
    assert dp
    fields = dict(kv.split("=") for kv in dp[-1].split(" ")[1].split(","))
    assert fields["collected"] == "3i"
    assert fields["pass_unknown_session"] == "1i"
    assert fields["drop_ringbuf_full"] == "0i"
