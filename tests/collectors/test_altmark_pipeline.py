"""Collector + loss worker + Telegraf + InfluxDB: exact lost packets per block from real kernel maps.

tx and rx instances as real maps of the datapath/altmark.h layout (bpftool + libbpf writes, see
altmark_maps.py), one altmark_collector reading both (nodes amcolA<run> / amcolB<run>) into Kafka,
`python -m processors.loss` joining them into altmark_loss points in InfluxDB. For every block
the test knows tx and rx counts it wrote; InfluxDB must hold lost == tx - rx (complete=true)
for every full block, 0-packet blocks included, and complete=false (partial_block) for the
install block.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from altmark_maps import METHOD_RFC9343, AltmarkMaps
from test_altmark_collector import PERIOD_MS, SIDS_A, Blocks, Collector, T, pins  # noqa: F401 (fixture)

from processors.delay.topics import ensure_topics

pytestmark = [pytest.mark.datapath, pytest.mark.e2e]

TAI_UTC = 37
REPO = Path(__file__).resolve().parents[2]


def start_worker(bootstrap: str, run_dir: Path, blocks_topic: str, dl_topic: str, app_id: str):
    log_path = run_dir / f"{app_id}.log"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'schemas' / 'python'}")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "processors.loss",
                "--bootstrap",
                bootstrap,
                "--blocks-topic",
                blocks_topic,
                "--deadletter-topic",
                dl_topic,
                "--app-id",
                app_id,
                "--timeout-s",
                "2",
                "--flush-interval-s",
                "0.5",
                "--tai-utc-offset-s",
                str(TAI_UTC),
                "--datadir",
                str(run_dir / app_id),
                "-l",
                "info",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, log_path


def test_collector_to_influxdb_exact_loss_per_block(stack, collectors_build, pins, work_dir, tmp_path):  # noqa: F811
    run = uuid.uuid4().hex[:6]
    tx_node, rx_node = f"amcolA{run}", f"amcolB{run}"
    blocks_topic, dl_topic = f"amcol.test.{run}.blocks", f"amcol.test.{run}.dl"
    ensure_topics(stack.kafka_bootstrap, [blocks_topic, dl_topic])
    tx = AltmarkMaps.create(pins / "altmark_tx", "tx")
    rx = AltmarkMaps.create(pins / "altmark_rx", "rx")
    worker, worker_log = start_worker(stack.kafka_bootstrap, tmp_path, blocks_topic, dl_topic, f"amcol-loss-{run}")
    flows = {951: dict(slot_tx=1, slot_rx=4, sids=SIDS_A), 0x951: dict(slot_tx=2, slot_rx=5, flowmon=0x951)}
    plan = [(100, 3), (0, 0), (250, 25), (80, 0), (1, 1)]  # (tx packets, lost) per block
    blocks = Blocks()
    args = [
        "--node",
        f"amcolC{run}",
        "--tx-pin-dir",
        f"{pins / 'altmark_tx'}@{tx_node}",
        "--rx-pin-dir",
        f"{pins / 'altmark_rx'}@{rx_node}",
        "--brokers",
        stack.kafka_bootstrap,
        "--topic",
        blocks_topic,
        "--scan-interval-ms",
        "50",
    ]
    try:
        with Collector(collectors_build / "altmark_collector", work_dir, *args) as col:
            k0 = blocks.next()
            for fid, f in flows.items():
                if "flowmon" in f:
                    tx.install_flow(f["slot_tx"], fid, PERIOD_MS, sids=["fc00:3::d6"], method=METHOD_RFC9343)
                    rx.install_flow(f["slot_rx"], fid, PERIOD_MS, flowmon_id=f["flowmon"], method=METHOD_RFC9343)
                else:
                    tx.install_flow(f["slot_tx"], fid, PERIOD_MS, sids=f["sids"])
                    rx.install_flow(f["slot_rx"], fid, PERIOD_MS, sids=f["sids"])
                blocks.add(tx, ("tx", fid), f["slot_tx"], 7, 700)  # install block: partial
                blocks.add(rx, ("rx", fid), f["slot_rx"], 7, 700)
            for sent, lost in plan:
                blocks.next()
                for i, (fid, f) in enumerate(flows.items()):
                    n, l_ = sent + i, lost + i if sent else 0
                    blocks.add(tx, ("tx", fid), f["slot_tx"], n, n * 150, cpu=i % 2)
                    blocks.add(rx, ("rx", fid), f["slot_rx"], n - l_, (n - l_) * 150, cpu=1 - i % 2)
            blocks.next()
            time.sleep(T / 1e9)
            records, counters = col.stop()
        assert counters["records_delivered"] == counters["records_out"] > 0

        want = {}
        for (side_flow, k), (packets, _, _, _) in blocks.expected.items():
            side, fid = side_flow
            want.setdefault((fid, k), {})[side] = packets
        query = f"SELECT * FROM altmark_loss WHERE tx_node = '{tx_node}'"

        def by_block(rows: list[dict]) -> dict:
            return {(int(r["flow"]), (r["time"] + TAI_UTC * 10**9) // T): r for r in rows}

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            points = by_block(stack.influx_query(query))
            if all((fid, k) in points for fid, k in want):
                break
            time.sleep(0.5)
        # the loop waited for the points' times only: the newest may still be mid-write with some
        # fields null (InfluxDB 1.x, influxdata/influxdb#8546), the asserts read settled points
        points = by_block(stack.influx_query_settled(query, settle_s=0.5))
        for (fid, k), sides in sorted(want.items()):
            p = points.get((fid, k))
            assert p is not None, ((fid, k), sorted(points), worker_log.read_text()[-2000:])
            assert p["rx_node"] == rx_node and p["method"] == ("rfc9343" if fid == 0x951 else "dscp")
            if k == k0:
                assert (p["complete"], p["reason"], p["lost"]) == (False, "partial_block", None)
                continue
            assert (p["complete"], p["reason"]) == (True, "ok"), p
            assert (p["tx_packets"], p["rx_packets"], p["lost"]) == (
                sides["tx"],
                sides["rx"],
                sides["tx"] - sides["rx"],
            ), ((fid, k), p)
        # a block without traffic is a point with lost=0, not a missing point
        zero = points[(951, k0 + 2)]  # plan[1]: no traffic for flow 951
        assert (zero["tx_packets"], zero["rx_packets"], zero["lost"], zero["loss_ratio"]) == (0, 0, 0, None)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        tx.close()
        rx.close()
