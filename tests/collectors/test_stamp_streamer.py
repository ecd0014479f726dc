"""stamp_streamer: synthetic records from a real BPF ring buffer (ringbuf_gen, BPF_PROG_TEST_RUN)
into a real Kafka (services/stack.py, our own port base), read back and checked record by record."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from segscope_schemas import stamp_record as sr

pytestmark = pytest.mark.datapath  # loads a BPF program (ringbuf_gen) into the kernel

REPO = Path(__file__).resolve().parents[2]
NODE = "co-node"


def gen(build: Path, pin: Path, count: int, *extra: str) -> dict:
    res = subprocess.run(
        [str(build / "ringbuf_gen"), "--pin", str(pin), "--count", str(count), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = json.loads(res.stdout)
    assert res.returncode == 0 or out.get("malformed"), res.stderr
    return out


def make_topics(bootstrap: str, partitions: int = 2) -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    records, metrics = f"co.test.{run}.records", f"co.test.{run}.metrics"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(records, partitions, 1), NewTopic(metrics, 1, 1)]).values():
        f.result(timeout=30)
    return records, metrics


def consume_all(bootstrap: str, topic: str, until, timeout: float = 60.0) -> list:
    """Every message of `topic` from the beginning, until `until(messages)` holds or timeout."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"co-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    msgs, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(msgs):
            for m in c.consume(num_messages=10000, timeout=0.5):
                assert m.error() is None, m.error()
                msgs.append(m)
    finally:
        c.close()
    return msgs


class Streamer:
    def __init__(
        self, build: Path, pin: Path, bootstrap: str, topic: str, metrics_topic: str, work_dir: Path, *extra: str
    ):
        self.stats_path = work_dir / "stats.json"
        self.proc = subprocess.Popen(
            [
                str(build / "stamp_streamer"),
                "--ringbuf",
                str(pin),
                "--node",
                NODE,
                "--brokers",
                bootstrap,
                "--topic",
                topic,
                "--metrics-topic",
                metrics_topic,
                "--stats-interval",
                "0.5",
                "--stats-json",
                str(self.stats_path),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_delivered(self, n: int, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats()
            if s.get("records_delivered", 0) + s.get("records_failed", 0) >= n:
                return s
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.1)
        raise AssertionError(f"streamer did not deliver {n} records in {timeout}s: {self.stats()}")

    def stop(self) -> tuple[int, dict, str]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, json.loads(out.strip().splitlines()[-1]), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def ring(collectors_build, co_pins, request) -> Path:
    """A fresh pinned `stamp_records` ring buffer, owned by this test."""
    pin = co_pins / request.node.name / "stamp_records"
    subprocess.run(["rm", "-rf", str(pin.parent)], check=True)
    gen(collectors_build, pin, 0, "--ring-size", str(16 << 20))
    yield pin
    subprocess.run(["rm", "-rf", str(pin.parent)], check=True)


def check_batches(msgs, node: str, key: str = "node") -> dict[int, list[int]]:
    """Decode every message; return ssid -> sender_seq in consumption order (per partition).
    key "node" (the default): key = node, a batch may hold several sessions; "session": one
    session per batch, key "<node>/<ssid>"."""
    seqs: dict[int, list[int]] = defaultdict(list)
    for m in msgs:
        hdr, recs = sr.decode_batch(m.value())
        assert hdr.node == node and hdr.record_count == len(recs) > 0
        if key == "session":
            ssids = set(recs["ssid"].tolist())
            assert len(ssids) == 1, "a batch holds one session"
            assert m.key() == f"{node}/{ssids.pop()}".encode()
        else:
            assert m.key() == node.encode()
        for ssid, seq in zip(recs["ssid"].tolist(), recs["sender_seq"].tolist()):
            seqs[ssid].append(seq)
    return seqs


def test_every_record_once_in_order_per_session(collectors_build, ring, kafka_bootstrap, work_dir):
    n, k = 200_000, 5
    topic, mtopic = make_topics(kafka_bootstrap)
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir)
    try:
        time.sleep(0.5)
        g = gen(collectors_build, ring, n, "--ssids", str(k), "--first-ssid", "100")
        assert (g["generated"], g["rb_full"]) == (n, 0)
        st.wait_delivered(n)
        time.sleep(1.2)  # at least two more stats intervals
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    assert final["records_in"] == final["records_delivered"] == n
    assert final["records_failed"] == final["malformed_records"] == final["produce_errors"] == 0
    assert final["batches_produced"] == final["batches_delivered"] == final["batch_seq"]
    assert final["final"] is True
    # --stats-json also counts per SSID (the agent carries a session's count across an agent restart)
    assert st.stats()["records_by_ssid"] == {str(100 + i): n // k for i in range(k)}
    assert st.stats()["records_in"] == n and st.stats()["final"] is True

    msgs = consume_all(kafka_bootstrap, topic, lambda ms: len(ms) >= final["batches_produced"])
    assert len(msgs) == final["batches_produced"]
    seqs = check_batches(msgs, NODE)
    assert sorted(seqs) == list(range(100, 100 + k))
    for ssid, got in seqs.items():
        assert got == list(range(n // k)), f"ssid {ssid}: records missing, duplicated or out of order"
    batch_seqs = sorted(sr.decode_header(m.value()).batch_seq for m in msgs)
    assert batch_seqs == list(range(len(msgs)))  # each batch exactly once
    assert max(sr.decode_header(m.value()).record_count for m in msgs) <= 4096

    lines = [
        line
        for m in consume_all(kafka_bootstrap, mtopic, lambda ms: len(ms) >= 3)
        for line in m.value().decode().splitlines()
    ]
    streamer_lines = [line for line in lines if line.startswith(f"segscope_streamer,node={NODE},records=stamp ")]
    assert len(streamer_lines) >= 3
    fields = dict(kv.split("=") for kv in streamer_lines[-1].split(" ")[1].split(","))
    assert fields["records_in"] == f"{n}i"
    assert re.fullmatch(r"\d{19}", streamer_lines[-1].split(" ")[2])  # ns timestamp


def test_a_fatal_producer_error_replaces_the_producer_and_loses_no_record(
    collectors_build, ring, kafka_bootstrap, work_dir, monkeypatch
):
    """librdkafka's idempotent producer gives up for good on some broker answers (Debian's 2.0.2
    raised OUT_OF_ORDER_SEQUENCE_NUMBER once after a broker was killed mid-batch); every message
    after that failed. Raised here with librdkafka's own test hook after the 40th message: the
    streamer replaces the producer and sends again what the old one had not delivered. Every
    record arrives; a record the broker had already written may arrive twice, at most
    `records_resent` of them (the delay processor drops such duplicates)."""
    n, k = 40_000, 4
    topic, mtopic = make_topics(kafka_bootstrap)
    monkeypatch.setenv("SEGSCOPE_KAFKA_TEST_FATAL_AFTER", "40")
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir, "--max-batch", "200")
    try:
        time.sleep(0.5)
        g = gen(collectors_build, ring, n, "--ssids", str(k), "--first-ssid", "20")
        assert (g["generated"], g["rb_full"]) == (n, 0)
        st.wait_delivered(n)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    assert "kafka producer failed for good" in err and "SEGSCOPE_KAFKA_TEST_FATAL_AFTER" in err, err
    assert final["producer_restarts"] == 1, final
    assert final["records_in"] == final["records_delivered"] == n, final
    assert final["records_failed"] == final["produce_errors"] == 0, final
    # some, or all when the broker had acknowledged nothing yet at the error (a loaded runner)
    assert 0 < final["records_resent"] <= n, final
    msgs = consume_all(
        kafka_bootstrap, topic, lambda ms: sum(sr.decode_header(m.value()).record_count for m in ms) >= n
    )
    seqs = check_batches(msgs, NODE)
    assert sorted(seqs) == list(range(20, 20 + k))
    duplicates = 0
    for ssid, got in seqs.items():
        assert sorted(set(got)) == list(range(n // k)), f"ssid {ssid}: records missing"
        duplicates += len(got) - len(set(got))
    assert duplicates <= final["records_resent"], (duplicates, final["records_resent"])


@pytest.mark.parametrize("key", ["node", "session"])
def test_max_batch_cuts_messages(collectors_build, ring, kafka_bootstrap, work_dir, key):
    n = 5000
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir, "--max-batch", "100", "--key", key)
    try:
        time.sleep(0.3)
        gen(collectors_build, ring, n)
        st.wait_delivered(n)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    msgs = consume_all(kafka_bootstrap, topic, lambda ms: len(ms) >= final["batches_produced"])
    counts = [sr.decode_header(m.value()).record_count for m in msgs]
    assert sum(counts) == n and max(counts) == 100 and len(msgs) >= n // 100
    assert check_batches(msgs, NODE, key) == {1: list(range(n))}


@pytest.mark.parametrize("linger_ms", [0, 3000])
def test_linger_batches_a_quiet_node_into_few_messages(collectors_build, ring, kafka_bootstrap, work_dir, linger_ms):
    """Records trickling in (bursts of 3 sessions x 2 records, one ring wake-up each, like sessions
    at a few packets per second) are held up to --linger-ms and leave as one message per node:
    a delay worker pays per message (docs/capacity.md). --linger-ms 0 sends each wake-up's records."""
    bursts, per_burst, k = 6, 6, 3
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir, "--linger-ms", str(linger_ms))
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        for b in range(bursts):
            gen(collectors_build, ring, per_burst, "--ssids", str(k), "--start-seq", str(b * per_burst // k))
            time.sleep(0.05)
        spread = time.monotonic() - t0
        st.wait_delivered(bursts * per_burst)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    msgs = consume_all(kafka_bootstrap, topic, lambda ms: len(ms) >= final["batches_produced"])
    assert len(msgs) == final["batches_produced"]
    seqs = check_batches(msgs, NODE)
    assert seqs == {ssid: list(range(bursts * per_burst // k)) for ssid in range(1, k + 1)}  # all, in order
    if linger_ms:
        assert spread < linger_ms / 1000, f"the bursts took {spread:.1f} s, the test needs them in one linger period"
        assert len(msgs) <= 2, [sr.decode_header(m.value()).record_count for m in msgs]
    else:
        assert len(msgs) >= bursts  # one message (at least) per wake-up


def test_malformed_samples_are_counted_and_fail_the_exit_code(collectors_build, ring, kafka_bootstrap, work_dir):
    n = 1000
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir)
    try:
        time.sleep(0.3)
        g = gen(collectors_build, ring, n, "--malformed-every", "10")
        assert g["malformed"] == 100
        st.wait_delivered(n - 100)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert final["malformed_records"] == 100
    assert final["records_in"] == final["records_delivered"] == 900
    assert rc == 1 and "100 records lost" in err and "malformed 100" in err
    msgs = consume_all(
        kafka_bootstrap, topic, lambda ms: sum(sr.decode_header(m.value()).record_count for m in ms) >= 900
    )
    got = check_batches(msgs, NODE)[1]
    assert got == [k for k in range(n) if k % 10 != 9]  # the good ones, in order


def test_datapath_counters_published(collectors_build, ring, kafka_bootstrap, work_dir):
    """--datapath-stats: per-CPU array summed over CPUs, names from datapath/stamp_collector.h."""
    header = (REPO / "datapath" / "stamp_collector.h").read_text()
    names = re.findall(r'\[COLL_\w+\]\s*=\s*"(\w+)"', header)
    assert len(names) >= 5
    stats_pin = ring.parent / "stats"
    subprocess.run(
        [
            "bpftool",
            "map",
            "create",
            str(stats_pin),
            "type",
            "percpu_array",
            "key",
            "4",
            "value",
            "8",
            "entries",
            str(len(names)),
            "name",
            "co_dpstats",
        ],
        check=True,
    )
    ncpus = int(Path("/sys/devices/system/cpu/possible").read_text().strip().split("-")[-1]) + 1
    for key in range(len(names)):
        val = (key * 10 + 3).to_bytes(8, "little")
        subprocess.run(
            [
                "bpftool",
                "map",
                "update",
                "pinned",
                str(stats_pin),
                "key",
                *map(str, key.to_bytes(4, "little")),
                "value",
                *map(str, val),
            ],
            check=True,
        )
    topic, mtopic = make_topics(kafka_bootstrap, partitions=1)
    st = Streamer(collectors_build, ring, kafka_bootstrap, topic, mtopic, work_dir, "--datapath-stats", str(stats_pin))
    try:
        msgs = consume_all(kafka_bootstrap, mtopic, lambda ms: len(ms) >= 2, timeout=30)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 0, err
    lines = [line for m in msgs for line in m.value().decode().splitlines()]
    dp = [line for line in lines if line.startswith(f"segscope_datapath,node={NODE},program=stamp_collector ")]
    assert dp, lines
    fields = dict(kv.split("=") for kv in dp[0].split(" ")[1].split(","))
    assert list(fields) == names
    assert fields == {name: f"{(i * 10 + 3) * ncpus}i" for i, name in enumerate(names)}

    # explicit names override the header's
    st = Streamer(
        collectors_build,
        ring,
        kafka_bootstrap,
        topic,
        mtopic,
        work_dir,
        "--datapath-stats",
        str(stats_pin),
        "--datapath-counter-names",
        "a_one,b_two",
    )
    try:
        time.sleep(1.2)
        rc, final, err = st.stop()
    finally:
        st.kill()
    msgs = consume_all(kafka_bootstrap, mtopic, lambda ms: any(b"a_one=" in m.value() for m in ms), timeout=20)
    line = next(ln for m in msgs for ln in m.value().decode().splitlines() if "a_one=" in ln)
    assert line.split(" ")[1].startswith(f"a_one={3 * ncpus}i,b_two={13 * ncpus}i,counter_2={23 * ncpus}i")


def test_unreachable_kafka_reports_loss(collectors_build, ring, work_dir):
    """Nothing listens on the broker port: records stay unacknowledged and the exit code says so."""
    from tests.isolation import closed_port

    broker = f"127.0.0.1:{closed_port(29099)}"
    st = Streamer(collectors_build, ring, broker, "co.none", "co.none.metrics", work_dir, "--flush-timeout-ms", "1000")
    try:
        time.sleep(0.3)
        gen(collectors_build, ring, 500)
        deadline = time.monotonic() + 10
        while st.stats().get("records_in", 0) < 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        rc, final, err = st.stop()
    finally:
        st.kill()
    assert rc == 1
    assert final["records_in"] == 500 and final["records_delivered"] == 0
    assert "500 records lost" in err


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--node", "x"], "--ringbuf"),
        (["--ringbuf", "/sys/fs/bpf/co-none"], "--node"),
        (["--ringbuf", "/sys/fs/bpf/co-none", "--node", "a/b"], "--node"),
        (["--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", "--max-batch", "0"], "--max-batch"),
        (["--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", "--key", "flow"], "--key"),
        (["--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", "--linger-ms", "-1"], "--linger-ms"),
        (["--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", "--stats-interval", "abc"], "--stats-interval"),
        (
            ["--ringbuf", "/sys/fs/bpf/co-none", "--node", "x", "--datapath-counter-names", "Bad-Name"],
            "--datapath-counter-names",
        ),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(collectors_build, args, flag):
    res = subprocess.run([str(collectors_build / "stamp_streamer"), *args], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.startswith(f"stamp_streamer: {flag}:"), res.stderr


def test_missing_ring_buffer_is_a_clear_error(collectors_build):
    res = subprocess.run(
        [str(collectors_build / "stamp_streamer"), "--ringbuf", "/sys/fs/bpf/co-none/x", "--node", "x"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "--ringbuf: bpf_obj_get /sys/fs/bpf/co-none/x" in res.stderr


OUTAGE_S = 35  # longer than librdkafka's request.timeout.ms (30 s): in-flight produces time out and are retried


def test_kafka_killed_and_down_35s_loses_no_record(collectors_build, ring, work_dir):
    """The broker is SIGKILLed while records flow and stays down 35 s; then `stack up` brings it
    back with its data. The streamer buffers (librdkafka: 10-minute message timeout, 1 GiB queue)
    and delivers: every record exactly once (idempotent producer), nothing failed."""
    from services.stack import Stack
    from tests.isolation import extra_stack

    run_dir, base = extra_stack("co-outage", slot=2, default_port_base=29700)
    stack = Stack(run_dir=run_dir, port_base=base, fresh=True, quiet=True)
    stack.up(only=["kafka"])
    st = None
    try:
        topic, mtopic = make_topics(stack.kafka_bootstrap)
        st = Streamer(collectors_build, ring, stack.kafka_bootstrap, topic, mtopic, work_dir)
        time.sleep(0.5)
        n, k = 30_000, 3  # per phase: before, during and after the outage
        gen(collectors_build, ring, n, "--ssids", str(k), "--first-ssid", "7")
        st.wait_delivered(n)
        os.kill(stack.read_pid("kafka"), signal.SIGKILL)
        t_down = time.monotonic()
        g = gen(collectors_build, ring, n, "--ssids", str(k), "--first-ssid", "7", "--start-seq", str(n // k))
        assert g["rb_full"] == 0  # the streamer kept reading the ring while Kafka was gone
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t_down)))
        mid = st.stats()
        assert mid["records_in"] == 2 * n and mid["records_delivered"] == n and mid["records_failed"] == 0, mid
        Stack(run_dir=run_dir, port_base=base, quiet=True).up(only=["kafka"])  # keeps its data
        gen(collectors_build, ring, n, "--ssids", str(k), "--first-ssid", "7", "--start-seq", str(2 * n // k))
        st.wait_delivered(3 * n, timeout=120)
        rc, final, err = st.stop()
        assert rc == 0, err
        assert final["records_in"] == final["records_delivered"] == 3 * n and final["records_failed"] == 0, final
        msgs = consume_all(
            stack.kafka_bootstrap, topic, lambda ms: sum(sr.decode_header(m.value()).record_count for m in ms) >= 3 * n
        )
        seqs = check_batches(msgs, NODE)
        for ssid, got in seqs.items():  # per session: every record, once, in order
            assert got == list(range(3 * n // k)), f"ssid {ssid}: {len(got)} records, {len(set(got))} distinct"
        assert sorted(seqs) == [7, 8, 9]
    finally:
        if st is not None:
            st.kill()
        Stack(run_dir=run_dir, port_base=base, quiet=True).down()
