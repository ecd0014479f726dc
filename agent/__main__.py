"""python -m agent --node A --netns demo-A --listen 127.0.0.1:20100 \
       --tls-cert agent.crt --tls-key agent.key [--tls-client-ca ca.crt] [--kafka 127.0.0.1:19092]

Runs until SIGINT/SIGTERM; then (--on-stop teardown, the default) stops the STAMP senders, detaches
the datapath it attached and exits 0, or (--on-stop handover) leaves them measuring for the next
agent of the node, which adopts them. Exit 2: bad arguments, or another agent of the same instance
runs. See agent/README.md ("Restarts and adoption").
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from segscope_schemas.version import VERSION_LINE

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO / "schemas" / "python") not in sys.path:  # segscope_proto / segscope_schemas
    sys.path.insert(0, str(_REPO / "schemas" / "python"))


def node_name(value: str) -> str:
    """--node: the key of the node's records, Influx tag and topology documents; one the batch
    header holds (a longer name would stop the streamer on every record, long after the start)."""
    from segscope_schemas.batch_envelope import node_name_problem

    problem = node_name_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agent", description="segscope southbound gRPC agent for one node")
    p.add_argument("--version", action="version", version=VERSION_LINE)
    p.add_argument(
        "--node",
        required=True,
        type=node_name,
        help="node name (e.g. A, or a Kubernetes node's: worker-1.example); used in logs, Kafka keys, topology",
    )
    p.add_argument("--netns", help="network namespace of the node (/run/netns/NAME); omit on a real router")
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (e.g. 127.0.0.1:20100)")
    p.add_argument("--tls-cert", help="server certificate (PEM)")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument(
        "--tls-client-ca",
        help="CA (PEM) for client certificates: mutual TLS, a client without a certificate signed by it is refused",
    )
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (development only)")
    p.add_argument(
        "--instance",
        help="bpffs instance: pins under /sys/fs/bpf/segscope/INSTANCE (default: the netns name, else the node name)",
    )
    p.add_argument(
        "--kafka",
        help="Kafka bootstrap HOST:PORT: STAMP records to segscope.stamp.records, "
        "node views to segscope.topology, altmark blocks to segscope.altmark.blocks",
    )
    p.add_argument(
        "--topology-interval",
        type=float,
        default=30.0,
        help="seconds between periodic topology publications (default 30)",
    )
    p.add_argument(
        "--stats-interval",
        type=float,
        default=1.0,
        help="seconds between segscope_datapath / segscope_agent counter lines on "
        "segscope.metrics (with --kafka; default 1)",
    )
    p.add_argument(
        "--stamp-linger-ms",
        type=int,
        default=200,
        help="how long stamp_streamer holds STAMP records to send one Kafka message per node "
        "(default 200; more: fewer messages for the delay workers, results later; 0: each ring wake-up)",
    )
    p.add_argument(
        "--health",
        help="HOST:PORT for HTTP /healthz /readyz /metrics /status (Kubernetes probes, Prometheus); default off",
    )
    p.add_argument(
        "--state-dir",
        help="where the agent keeps what must outlive it if it is killed (the IOAM values to restore); "
        "default /run/segscope/INSTANCE",
    )
    p.add_argument(
        "--sysctl-net",
        default="/proc/sys/net",
        help="the node's /proc/sys/net as the agent sees it, for the IOAM sysctls (default /proc/sys/net; "
        "in a container, where /proc/sys is read-only, a mount of the host's /proc/sys/net)",
    )
    p.add_argument(
        "--adopt-timeout",
        type=float,
        default=30.0,
        help="the data-path processes (STAMP senders, the streamer, the altmark collector) outlive the "
        "agent and the next agent of the node adopts them; one that no agent adopts within this many "
        "seconds stops itself (default 30; 0: they die with the agent and nothing is adopted)",
    )
    p.add_argument(
        "--on-stop",
        choices=("teardown", "handover"),
        default="teardown",
        help="SIGTERM/SIGINT: teardown (default) stops the senders and detaches the datapath; handover "
        "leaves them measuring for the next agent (an upgrade or a restart without a gap)",
    )
    p.add_argument(
        "--inline-egress-hook",
        choices=("auto", "xdp", "tc"),
        default="auto",
        help="where ioam_rx reads an EGRESS in-line monitor's packets, per device: auto (default) tc on a veth "
        "that runs no XDP program and xdp on any other device; xdp, native XDP in the XDP chain with the node's "
        "other programs (the cheapest on a real NIC); tc, a TC ingress filter (on veth and pod interfaces "
        "native XDP switches the device to NAPI and copies every packet, and TC ingress measured 340-590 ns "
        "per packet cheaper; docs/benchmarks.md)",
    )
    p.add_argument("--workers", type=int, default=16, help="gRPC worker threads (default 16)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    a = p.parse_args(argv)
    if not 0.05 <= a.stats_interval <= 3600:
        p.error(f"--stats-interval: {a.stats_interval} out of range 0.05..3600 seconds")
    if a.adopt_timeout != 0 and not 0.1 <= a.adopt_timeout <= 86400:
        p.error(f"--adopt-timeout: {a.adopt_timeout:g} out of range 0 (off) or 0.1..86400 seconds")
    if a.on_stop == "handover" and a.adopt_timeout == 0:
        p.error("--on-stop handover: needs --adopt-timeout > 0 (the processes left running must wait for an agent)")
    if not 0 <= a.stamp_linger_ms <= 10000:
        p.error(f"--stamp-linger-ms: {a.stamp_linger_ms} out of range 0..10000 ms")
    if a.health:
        from segscope_schemas.health import HealthAddressError, parse_address

        try:
            parse_address(a.health, "--health")
        except HealthAddressError as e:
            p.error(str(e))
    if not a.insecure and not (a.tls_cert and a.tls_key):
        p.error("--tls-cert and --tls-key are required (or --insecure for plaintext)")
    if a.insecure and (a.tls_cert or a.tls_key or a.tls_client_ca):
        p.error("--insecure and --tls-* are exclusive")
    if a.kafka:
        from segscope_kafka import KafkaConfigError, from_env

        try:
            from_env()  # SEGSCOPE_KAFKA_*: the agent's and its C tools' Kafka security (docs/security.md)
        except KafkaConfigError as e:
            p.error(str(e))
    if a.netns and not os.path.exists(f"/run/netns/{a.netns}"):
        p.error(f"--netns: no network namespace {a.netns!r} (/run/netns/{a.netns})")
    for flag in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(a, flag)
        if path and not os.path.isfile(path):
            p.error(f"--{flag.replace('_', '-')}: no such file {path!r}")
    return a


def kafka_refused(bootstrap: str) -> bool:
    """With Kafka security set, log in once before serving: a refusal (wrong password, CA, ACL) is a
    configuration error, said once and the agent exits 1, instead of every STAMP and flow tool it
    starts failing later. An unreachable Kafka is only said: the agent starts, its producers wait."""
    from segscope_kafka import KafkaRefused, from_env, login_check

    sec = from_env()
    if sec.protocol == "PLAINTEXT":
        return False
    log = logging.getLogger("agent")
    try:
        if login_check(bootstrap, sec, timeout_s=10.0):
            log.info("Kafka %s: logged in (%s)", bootstrap, sec.describe())
        else:
            log.warning("Kafka %s did not answer within 10 s (%s); starting anyway", bootstrap, sec.describe())
    except KafkaRefused as e:
        log.error("Kafka %s: %s", bootstrap, e)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=a.log_level, stream=sys.stderr, format=f"%(asctime)s agent[{a.node}] %(levelname)s %(name)s: %(message)s"
    )
    from agent.keeper import AgentLockError
    from agent.server import Agent, AgentConfig

    if a.kafka and kafka_refused(a.kafka):
        return 1

    try:
        agent = Agent(
            AgentConfig(
                node=a.node,
                listen=a.listen,
                netns=a.netns,
                instance=a.instance,
                tls_cert=a.tls_cert,
                tls_key=a.tls_key,
                tls_client_ca=a.tls_client_ca,
                insecure=a.insecure,
                kafka=a.kafka,
                workers=a.workers,
                topology_interval_s=a.topology_interval,
                stats_interval_s=a.stats_interval,
                stamp_linger_ms=a.stamp_linger_ms,
                inline_egress_hook=a.inline_egress_hook,
                health=a.health,
                state_dir=a.state_dir,
                sysctl_net=a.sysctl_net,
                adopt_timeout_s=a.adopt_timeout,
                on_stop=a.on_stop,
            )
        )
    except AgentLockError as e:
        print(f"python -m agent: {e}", file=sys.stderr)
        return 2
    # `kill -USR1 <agent>` writes every thread's Python stack to stderr (the log): for an agent that
    # does not answer, or does not stop on SIGTERM. faulthandler's handler runs in C, without the GIL.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    port = agent.start()
    print(f"agent {a.node} listening on port {port}", flush=True)  # readiness line for scripts
    done.wait()
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
