"""segscope-freshness: how old the results are when they become visible in InfluxDB.

    segscope-freshness [--influx-url URL] [--db segscope] [--bootstrap HOST:PORT] [--poll-s 0.5] [--report-s 10]

Every --poll-s it asks InfluxDB for the newest point of every `stamp_delay` and `altmark_loss`
series. A point newer than the series' last one was not there at the previous poll: it became
visible between the two polls, so its packet-to-InfluxDB delay is (poll time - its newest packet
time), an upper bound too large by at most --poll-s (what this measures is the whole pipeline:
agent, Kafka, processor, Telegraf, InfluxDB). The newest packet time is the point's `newest_ns`
field (schemas/metrics.md): the largest T1 of a stamp_delay second's records, the end of an
altmark_loss block. Points written before that field existed are estimated from the end of what
they measured (a stamp_delay second ends 1 s after its timestamp, an altmark_loss block period_ms
after it) and counted apart (`estimated`; so is, rarely, a point a poll saw before InfluxDB had
written all its fields, each field being stored apart). Every --report-s it publishes, per measurement, the
delays of the points seen in that interval on `segscope.metrics` (schemas/metrics.md,
segscope_freshness):

    segscope_freshness,measurement=stamp_delay samples=42i,estimated=0i,p50_ms=1830.2,p99_ms=2410.0,max_ms=2512.4 <ns>

Credentials: SEGSCOPE_INFLUX_USER / SEGSCOPE_INFLUX_PASSWORD (a reader is enough).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

import numpy as np

from segscope_schemas import influxql
from segscope_schemas.names import INFLUXDB_DATABASE, TOPIC_METRICS
from segscope_schemas.version import VERSION_LINE

log = logging.getLogger("segscope.freshness")

# measurement -> (query of the newest point per series and its newest_ns, end of what a point
# measured after its time: the estimate for points without newest_ns)
SOURCES = {
    "stamp_delay": (
        'SELECT last("count"), "newest_ns" FROM "stamp_delay" WHERE time > now() - 5m GROUP BY "node", "ssid", '
        '"direction"',
        lambda tags: 10**9,
    ),
    "altmark_loss": (
        'SELECT last("reason"), "newest_ns" FROM "altmark_loss" WHERE time > now() - 15m GROUP BY "flow", "period_ms"',
        lambda tags: int(tags.get("period_ms", "1000")) * 10**6,
    ),
}


class Tracker:
    """The newest point time per series; a newer one yields a packet-to-InfluxDB sample."""

    def __init__(self) -> None:
        self.newest: dict[tuple, int] = {}
        self.samples: dict[str, list[float]] = {m: [] for m in SOURCES}
        self.estimated: dict[str, int] = dict.fromkeys(SOURCES, 0)

    def observe(self, measurement: str, series: list[dict], now_ns: int, first_poll: bool = False) -> int:
        """Record the series' newest points seen at now_ns (UTC); return the number of new samples.
        A row is [time, last(..), newest_ns or None]. On the first poll nothing is a sample (when
        those points arrived is not known)."""
        end_of = SOURCES[measurement][1]
        n = 0
        for s in series:
            key = (measurement, tuple(sorted(s["tags"].items())))
            row = s["values"][-1]
            t = int(row[0])
            old = self.newest.get(key)
            if old is not None and t <= old:
                continue
            self.newest[key] = t
            if old is None and first_poll:
                continue
            newest_ns = row[2] if len(row) > 2 else None
            if newest_ns is None:  # written before the field existed: the end of what it measured
                newest_ns = t + end_of(s["tags"])
                self.estimated[measurement] += 1
            self.samples[measurement].append((now_ns - int(newest_ns)) / 1e6)
            n += 1
        return n

    def report_lines(self, ts_ns: int) -> list[str]:
        out = []
        for m, values in self.samples.items():
            if values:
                a = np.asarray(values)
                p50, p99 = np.percentile(a, [50, 99])
                out.append(
                    f"segscope_freshness,measurement={m} samples={len(a)}i,estimated={self.estimated[m]}i,"
                    f"p50_ms={p50:.1f},p99_ms={p99:.1f},max_ms={a.max():.1f} {ts_ns}"
                )
            self.samples[m] = []
            self.estimated[m] = 0
        return out


def query(url: str, db: str, auth, q: str) -> list[dict]:
    return influxql.series(url, q, db, auth, timeout=5)


def run(args, stop: threading.Event) -> int:
    from confluent_kafka import Producer

    user = os.environ.get("SEGSCOPE_INFLUX_USER")
    auth = (user, os.environ.get("SEGSCOPE_INFLUX_PASSWORD", "")) if user else None
    from segscope_kafka import kafka_config

    producer = Producer(kafka_config({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "acks": "all"}))
    tracker, first, errors = Tracker(), True, 0
    next_report = time.monotonic() + args.report_s
    while not stop.is_set():
        now = time.time_ns()
        for m, (q, _) in SOURCES.items():
            try:
                tracker.observe(m, query(args.influx_url, args.db, auth, q), now, first_poll=first)
            except influxql.InfluxQLError as exc:
                errors += 1
                log.warning("InfluxDB %s: %s", args.influx_url, exc)
        first = False
        if time.monotonic() >= next_report:
            next_report += args.report_s
            lines = tracker.report_lines(time.time_ns())
            lines.append(f"segscope_freshness_monitor query_errors={errors}i {time.time_ns()}")
            producer.produce(args.topic, "\n".join(lines).encode(), key=b"freshness")
            producer.poll(0)
        stop.wait(args.poll_s)
    producer.flush(5)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="segscope-freshness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--influx-url", default=os.environ.get("SEGSCOPE_INFLUX_URL", "http://127.0.0.1:18086"))
    ap.add_argument("--db", default=os.environ.get("SEGSCOPE_INFLUX_DB", INFLUXDB_DATABASE))
    ap.add_argument("--bootstrap", default=os.environ.get("SEGSCOPE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--topic", default=os.environ.get("SEGSCOPE_TOPIC_METRICS", TOPIC_METRICS))
    ap.add_argument("--poll-s", type=float, default=0.5, help="InfluxDB poll period = the samples' error bound")
    ap.add_argument("--report-s", type=float, default=10.0, help="seconds between segscope_freshness lines")
    args = ap.parse_args(argv)
    if not 0.05 <= args.poll_s <= 10 or args.report_s < args.poll_s:
        ap.error("--poll-s must be in 0.05..10 and --report-s >= --poll-s")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s freshness %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "polling %s every %g s, reporting every %g s on %s", args.influx_url, args.poll_s, args.report_s, args.topic
    )
    return run(args, stop)


if __name__ == "__main__":
    sys.exit(main())
