"""processors/newest.py NewestLines, pure: the summary keeps, per series, the line the topology model
would keep, so a model fed from the summary ends with the measures of one fed every line; and the
summary's settings are refused by name. The worker-level test is test_newest_summary.py."""

from __future__ import annotations

import random

import numpy as np
import pytest

from processors.delay.config import DelayConfig
from processors.loss.config import LossConfig
from processors.loss.join import NS_PER_S, LossJoiner
from processors.newest import NewestLines
from processors.topology.config import TopologyConfig
from processors.topology.model import TopologyModel
from processors.worker import ConfigError
from tests.processors.test_loss_join_differential import NODES, flow_path, random_records

S = 1_000_000_000


def delay_line(ssid: int, ts_s: int, mean: float, direction="forward", path="fc00:2::e\\,fc00:3::d6", node="A") -> str:
    return (
        f"stamp_delay,node={node},ssid={ssid},path={path},direction={direction} count=10i,sum_us={mean * 10},"
        f"min_us={mean - 1},mean_us={mean},max_us={mean + 1},p50_us={mean},p99_us={mean + 1},ipdv_mean_us=0.5,"
        f"unsynchronized=0i,newest_ns={ts_s * S + 999}i {ts_s * S}"
    )


def loss_line(flow: int, block_s: int, lost: int, complete=True, tx_node="A", path="fc00:2::e") -> str:
    head = f"altmark_loss,flow={flow},method=dscp,period_ms=1000,tx_node={tx_node},rx_node=B,path={path}"
    if complete:
        fields = (
            f'tx_packets=1000i,rx_packets={1000 - lost}i,lost={lost}i,loss_ratio={lost / 1000},tx_bytes=9i,'
            f'rx_bytes=9i,complete=true,reason="ok",newest_ns={block_s * S + 5}i'
        )
    else:
        fields = f'tx_packets=1000i,tx_bytes=9i,complete=false,reason="missing_rx",newest_ns={block_s * S + 5}i'
    return f"{head} {fields} {block_s * S}"


def histogram_line(ssid: int, ts_s: int) -> str:
    return f"stamp_delay_histogram,node=A,ssid={ssid},path=unknown,direction=forward b0=3i,b1=7i {ts_s * S}"


def measures(model: TopologyModel) -> dict:
    model.settle()
    return {
        "stamp": {k: (m.timestamp_ns, m.fields, m.tags) for k, m in model.stamp.items()},
        "loss": {k: (m.timestamp_ns, m.fields, m.tags) for k, m in model.loss.items()},
    }


def test_newest_by_timestamp_not_by_arrival():
    held = NewestLines()
    newer, older = delay_line(1, 102, 2000.0), delay_line(1, 100, 1500.0)
    held.take([newer, delay_line(1, 101, 1800.0)])
    held.take([older])  # a re-emitted older second, later
    assert held.drain() == [newer]
    c = held.counters
    assert (c.newest_lines_held, c.newest_lines_older) == (1, 2)
    # an equal timestamp replaces (the model keeps the last arrived of equal ones)
    again = delay_line(1, 102, 2100.0)
    held.take([newer, again])
    assert held.drain() == [again]
    assert held.drain() == [] and len(held) == 0  # drained: empty


def test_each_series_and_direction_is_its_own_and_histograms_are_not_taken():
    held = NewestLines()
    lines = [
        delay_line(1, 100, 1.0),
        delay_line(1, 100, 2.0, direction="backward"),
        histogram_line(1, 101),  # stamp_delay_histogram starts with "stamp_delay": not a stamp_delay line
        delay_line(2, 99, 3.0),
        "segscope_processor,processor=delay,instance=x records_in=5i 1",
        delay_line(1, 100, 1.0, path="unknown"),  # another path: another series (the model keeps the newest of both)
    ]
    held.take(lines)
    assert held.drain() == [lines[0], lines[1], lines[3], lines[5]]


def test_incomplete_blocks_are_not_held_and_do_not_replace_a_complete_one():
    held = NewestLines()
    complete = loss_line(7, 100, 3)
    held.take([complete, loss_line(7, 101, 0, complete=False), loss_line(8, 100, 0, complete=False)])
    assert held.drain() == [complete]
    assert held.counters.newest_lines_incomplete == 2
    # complete=t (the short form) counts as complete, as in the model; a broken field set does not
    short = loss_line(9, 100, 1).replace("complete=true", "complete=t")
    broken = loss_line(10, 100, 1).replace('reason="ok"', 'reason="ok')
    held.take([short, broken])
    assert held.drain() == [short]


@pytest.mark.parametrize(
    "fields",
    [
        'tx_packets=9i,complete=true,reason="ok"',  # the loss joiner's shape
        'complete=true,reason="ok"',  # first field: no comma before it
        "tx_packets=9i,complete=true",  # last field: no comma after it
        'tx_packets=9i,complete=true,reason="ok",complete=false',  # the last one counts
        'tx_packets=9i,complete=false,reason="ok",complete=true,x=1i',
        'tx_packets=9i,reason="a,complete=true,b",complete=false',  # inside a string
        'tx_packets=9i,reason="a,complete=true,b"',
        'tx_packets=9i,complete=true,reason="ok',  # an unterminated string
        "tx_packets=9i,complete=True,x=1i",
        "tx_packets=9i,complete=T,x=1i",
        "tx_packets=9i,complete=tru,x=1i",
        'tx_packets=9i,complete=true,reason="a\\"b"',  # an escaped quote
        'tx_packets=9i,x="a,complete=true,\\"c"',  # inside a string, an escaped quote after it
    ],
)
def test_a_loss_line_is_held_exactly_when_the_model_takes_it(fields):
    line = f"altmark_loss,flow=7,method=dscp,period_ms=1000,tx_node=A,rx_node=B {fields} {100 * S}"
    model = TopologyModel()
    model.apply_metrics_text(line)
    model.settle()
    held = NewestLines()
    held.take([line])
    assert held.drain() == ([line] if model.loss else [])


def test_lines_the_split_cannot_read_go_to_the_parser():
    held = NewestLines()
    escaped_blank = delay_line(1, 100, 1.0, node="a\\ b")  # a blank in a tag value
    blank_in_string = loss_line(7, 100, 1).replace('reason="ok"', 'reason="o k"')
    no_timestamp = delay_line(2, 100, 1.0).rsplit(" ", 1)[0]
    older = escaped_blank.rsplit(" ", 1)[0] + f" {99 * S}"
    held.take([escaped_blank, blank_in_string, no_timestamp, "stamp_delay,node=A garbage", older])
    assert held.drain() == [escaped_blank, blank_in_string]  # the older escaped_blank is not kept
    c = held.counters
    assert (c.newest_lines_malformed, c.newest_lines_older) == (2, 1)


def test_messages_batch_lines_and_take_back_keeps_a_newer_line():
    held = NewestLines(max_lines_per_message=3)
    lines = [delay_line(i, 100, 1.0) for i in range(7)]
    held.take(lines)
    out = held.drain()
    bodies = held.messages(out)
    assert [b.decode().split("\n") for b in bodies] == [lines[0:3], lines[3:6], lines[6:7]]
    # a failed send holds its lines again, unless a newer one of the series came meanwhile
    newer = delay_line(0, 101, 2.0)
    held.take([newer])
    held.take_back(out)
    assert held.drain() == [newer, *lines[1:]]
    assert held.counters.newest_lines_held == 8  # the taken-back lines are not counted twice


def test_off_holds_nothing_and_reports_nothing():
    held = NewestLines(enabled=False)
    held.take([delay_line(1, 100, 1.0)])
    assert held.drain() == [] and held.counts() == {}


def random_lines(rng: random.Random, n: int) -> list[str]:
    """A topic's worth of lines: few series, timestamps out of order, equal timestamps, path changes
    (two heads of one model key), incomplete blocks, histograms and counters in between."""
    out = []
    for _ in range(n):
        ts = rng.randrange(100, 110)
        kind = rng.random()
        if kind < 0.45:
            out.append(
                delay_line(
                    rng.randrange(1, 4),
                    ts,
                    rng.randrange(1000, 3000) / 7,
                    direction=rng.choice(["forward", "backward", "round_trip"]),
                    path=rng.choice(["unknown", "fc00:2::e\\,fc00:3::d6"]),
                )
            )
        elif kind < 0.8:
            out.append(
                loss_line(
                    rng.randrange(1, 4),
                    ts,
                    rng.randrange(0, 50),
                    complete=rng.random() < 0.7,
                    path=rng.choice(["unknown", "fc00:2::e"]),
                )
            )
        elif kind < 0.9:
            out.append(histogram_line(rng.randrange(1, 4), ts))
        else:
            out.append(f"segscope_processor,processor=loss,instance=i records_in={ts}i {ts * S}")
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_model_fed_the_summary_keeps_what_a_model_fed_every_line_keeps(seed):
    """Random lines in random publish_lines calls and random summary intervals: the model that reads
    the summaries ends with the same newest measures (timestamp, fields, tags) as the model that
    reads every message. A holder that keeps the last-arrived line, or drops a series, fails."""
    rng = random.Random(seed)
    every_line, summarised = TopologyModel(), TopologyModel()
    held = NewestLines(max_lines_per_message=rng.choice([1, 3, 2000]))
    lines = random_lines(rng, rng.randrange(20, 200))
    i = 0
    while i < len(lines):
        call = lines[i : i + rng.randrange(1, 12)]  # one publish_lines call
        i += len(call)
        every_line.apply_metrics_text("\n".join(call))
        held.take(call)
        if rng.random() < 0.3 or i >= len(lines):  # the summary timer
            for body in held.messages(held.drain()):
                summarised.apply_metrics_text(body.decode())
    assert measures(summarised) == measures(every_line)
    assert every_line.stamp or every_line.loss


ON = {"SEGSCOPE_TOPIC_METRICS_NEWEST": "segscope.metrics.newest"}


@pytest.mark.parametrize(
    "config,env,message",
    [
        (
            DelayConfig,
            {**ON, "SEGSCOPE_SUMMARY_INTERVAL_S": "30"},
            "SEGSCOPE_SUMMARY_INTERVAL_S=30.0: use 0 < interval < 30",
        ),
        (DelayConfig, {**ON, "SEGSCOPE_SUMMARY_INTERVAL_S": "0"}, "SEGSCOPE_SUMMARY_INTERVAL_S=0.0"),
        (DelayConfig, {**ON, "SEGSCOPE_DELAY_RETENTION_S": "8"}, "use 0 < interval < 8 s .* e.g. 4"),
        (LossConfig, {"SEGSCOPE_TOPIC_METRICS_NEWEST": "segscope.metrics"}, "is the metrics topic"),
        (
            TopologyConfig,
            {"SEGSCOPE_TOPIC_METRICS_NEWEST": "s.n", "SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC": "j.t"},
            "unset SEGSCOPE_TOPOLOGY_JALAPENO_TELEMETRY_TOPIC",
        ),
        (
            TopologyConfig,
            {"SEGSCOPE_TOPIC_METRICS_NEWEST": "s.n", "SEGSCOPE_TOPOLOGY_REFRESH_S": "5"},
            "SEGSCOPE_SUMMARY_INTERVAL_S=10.0 must be below SEGSCOPE_TOPOLOGY_REFRESH_S=5.0",
        ),
        (TopologyConfig, {"SEGSCOPE_TOPIC_METRICS_NEWEST": "segscope.topology"}, "is an input topic already"),
    ],
)
def test_summary_settings_are_refused_by_name(config, env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(". ", r"\. ")):
        config.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", **env})


def test_summary_off_leaves_the_interval_alone():
    """Off (the default), the interval is not used: a worker with a short retention still starts."""
    cfg = DelayConfig.from_env({"SEGSCOPE_TAI_UTC_OFFSET_S": "37", "SEGSCOPE_DELAY_RETENTION_S": "8"})
    assert (cfg.newest_topic, cfg.summary_interval_s) == ("", 10.0)


def test_topology_reads_the_summary_when_it_is_set():
    assert TopologyConfig.from_env({}).measures_topic() == "segscope.metrics"
    cfg = TopologyConfig.from_env({"SEGSCOPE_TOPIC_METRICS_NEWEST": "segscope.metrics.newest"})
    assert (cfg.measures_topic(), cfg.metrics_topic) == ("segscope.metrics.newest", "segscope.metrics")


@pytest.mark.parametrize("seed", range(4))
def test_the_loss_joiners_own_entries_hold_what_reading_its_lines_holds(seed):
    """The loss worker hands the joiner's complete_out (tags, timestamp, line of each complete line
    of a flush) to take_known instead of its lines to take(): on the joiner's random input (double
    marking, rx > tx, escaped node names, re-emissions, timeouts) both hold the same lines."""
    rng = np.random.default_rng(seed)
    joiner = LossJoiner(timeout_s=2.0, retention_s=6.0, tai_utc_offset_s=37)
    joiner.flow_path = flow_path
    joiner.keep_complete = True
    by_lines, by_entries = NewestLines(), NewestLines()
    now, summaries, complete_lines = 1_000 * S, 0, 0
    for step in range(120):
        node = str(rng.choice(NODES, p=[0.45, 0.45, 0.05, 0.05]))
        joiner.ingest(node, random_records(rng, int(rng.choice([1, 5, 33, 80])), node, 1_795_305_600 + step // 8), now)
        now += int(rng.integers(0, NS_PER_S // 4))
        if rng.random() < 0.3:
            lines = joiner.flush(now)
            assert [e[2] for e in joiner.complete_out] == [line for line in lines if ",complete=true," in line]
            complete_lines += len(joiner.complete_out)
            by_lines.take(lines)
            by_entries.take_known(joiner.complete_out, incomplete=len(lines) - len(joiner.complete_out))
        if rng.random() < 0.1:
            assert by_entries.drain() == by_lines.drain()
            summaries += 1
    assert by_entries.drain() == by_lines.drain()
    assert by_entries.counters.__dict__ == by_lines.counters.__dict__
    assert complete_lines > 50 and summaries > 3
