"""Bring emulated SRv6 networks up and down from a topology file.

Everything goes through iproute2 / ethtool / nft / sysctl subprocesses so each
step is the same command a person would type (and `ip` errors are readable).
Namespaces are named <prefix>-<NODE>; a link with a delay gets a relay namespace
<prefix>-dly-<link> in the middle of it. State lives in .run/netlab/<prefix>/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from segscope_schemas.names import BPFFS_PIN_ROOT

from . import keep_awake
from . import topology as topo_mod
from .topology import Endpoint, Link, Reorder, Topology

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO_ROOT / "build" / "netlab"
RELAY_BIN = BUILD_DIR / "delay_relay"
XDP_PASS_OBJ = BUILD_DIR / "xdp_pass.bpf.o"
RUN_ROOT = REPO_ROOT / ".run" / "netlab"
BPFFS_SEGSCOPE = Path(BPFFS_PIN_ROOT)
PREFIX_RE = re.compile(r"^[A-Za-z0-9_]{1,16}$")
RELAY_IF_A, RELAY_IF_B = "ra", "rb"  # relay veths: ra faces link end a, rb faces end b
RELAY_OFFLOADS_OFF = ["tx", "off", "tso", "off", "gso", "off", "gro", "off"]
# Relay timing options; NETLAB_RELAY_ARGS overrides them (for measuring alternatives).
# Measured (README): SCHED_FIFO + waking 30 us early and spinning cuts p99 lateness from ms to ~0.1 ms.
RELAY_REPLY_BYTES = 1 << 20  # the relay's stats JSON is at most 512 KiB (STATS_BYTES in delay_relay.c)
RELAY_TIMING_ARGS = os.environ.get("NETLAB_RELAY_ARGS", "--rt-prio 10 --spin-ns 30000 --keep-awake").split()


class LabError(RuntimeError):
    pass


@dataclass
class LossHandle:
    node: str
    table: str
    chain: str
    handle: int
    comment: str


def sh(cmd: Sequence[str], check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command; on failure raise LabError with the command and its stderr."""
    proc = subprocess.run(list(cmd), input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        shown = " ".join(cmd)
        extra = f"\n--- input ---\n{input}" if input else ""
        raise LabError(f"command failed ({proc.returncode}): {shown}\n{proc.stderr.strip()}{extra}")
    return proc


def _mac(prefix: str, *parts: str) -> str:
    """Deterministic locally administered unicast MAC for a link end."""
    digest = hashlib.sha1("/".join((prefix,) + parts).encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02,) + tuple(digest[:5]))


def _link_local(mac: str) -> str:
    """EUI-64 link-local address the kernel derives from a MAC (addr_gen_mode eui64)."""
    b = [int(x, 16) for x in mac.split(":")]
    eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return "fe80::" + ":".join(groups)


def _tmp_tag(prefix: str) -> str:
    """Root-namespace temporary veth names start with this (so `down` can find leftovers)."""
    return "nlt" + hashlib.sha1(prefix.encode()).hexdigest()[:4]


def _netns_names() -> list[str]:
    out = sh(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _own_netns(prefix: str, names: list[str]) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-(dly-)?[A-Za-z0-9_]+$")
    return [n for n in names if pattern.match(n)]


def _pid_alive(pid: int) -> bool:
    """True if running; a zombie (exited, parent has not reaped it yet) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_relay(pid: int) -> bool:
    try:
        return b"delay_relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _terminate(pid: int, timeout: float = 3.0) -> None:
    """SIGTERM, wait, then SIGKILL one process we started."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
            if done:
                return
        except ChildProcessError:
            if not _pid_alive(pid):
                return
        time.sleep(0.02)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def relay_ends_script(devices: tuple[str, ...], mtu: int | None = None) -> str:
    """Shell lines (run in the relay's netns) that make its veth ends fit for the delay relay: no
    offloads, so the relay sees real-size frames; xdp_pass attached, because a node's XDP program
    that answers with XDP_TX (the STAMP reflector) sends into its veth peer, and veth drops XDP_TX
    frames when the peer has no XDP program (the relay's AF_PACKET sockets still see every frame)."""
    mtu_arg = f" mtu {mtu}" if mtu else ""
    return "set -e\n" + "".join(
        f"ethtool -K {dev} {' '.join(RELAY_OFFLOADS_OFF)} >/dev/null\nip link set dev {dev}{mtu_arg} up\n"
        f"ip link set dev {dev} xdpdrv obj {XDP_PASS_OBJ} sec xdp\n"
        for dev in devices
    )


def ensure_built() -> None:
    """Build the relay and xdp_pass object if they are missing (make is quick and idempotent)."""
    if RELAY_BIN.exists() and XDP_PASS_OBJ.exists():
        return
    sh(["make", "-s", "-C", str(REPO_ROOT / "netlab")])


class Lab:
    """A running lab. Use Lab.up(...) (or `with Lab.up(...) as lab:`) and lab.down()."""

    def __init__(self, topo: Topology, prefix: str):
        self.topo = topo
        self.prefix = prefix
        self.state_dir = RUN_ROOT / prefix
        self.relays: dict[str, dict[str, Any]] = {}
        self._relay_procs: dict[str, subprocess.Popen] = {}
        self._loss_seq = 0
        self.final_relay_stats: dict[str, Any] = {}
        self.ioam = True  # apply the topology's `ioam:` settings

    # ------------------------------------------------------------ names
    def ns(self, node: str) -> str:
        if node not in self.topo.nodes:
            raise KeyError(f"no node {node!r} (nodes: {', '.join(self.topo.nodes)})")
        return f"{self.prefix}-{node}"

    def relay_ns(self, link_name: str) -> str:
        return f"{self.prefix}-dly-{link_name}"

    @property
    def namespaces(self) -> list[str]:
        names = [self.ns(n) for n in self.topo.nodes]
        return names + [self.relay_ns(l) for l in self.relays]

    # ------------------------------------------------------------ bring up
    @classmethod
    def attach(cls, prefix: str) -> "Lab":
        """The Lab of a lab another process brought up (from its state file): run commands in its
        nodes, read and change its relays (delay, loss, stats). It does not own the lab: down()
        of the process that brought it up, or `python -m netlab down`, removes it."""
        state_file = RUN_ROOT / prefix / "state.json"
        if not state_file.exists():
            raise LabError(f"no state for lab {prefix!r} ({state_file}); is it up?")
        state = json.loads(state_file.read_text())
        lab = cls(topo_mod.load(state["topology"]), prefix)
        lab.relays = state["relays"]
        for name, link in state.get("links", {}).items():  # the values set at run time
            t = lab.topo.link(name)
            t.delay_a_to_b_us, t.delay_b_to_a_us = link["delay_us"]["a_to_b"], link["delay_us"]["b_to_a"]
            if "loss_pct" in link:
                t.loss_a_to_b_pct, t.loss_b_to_a_pct = link["loss_pct"]["a_to_b"], link["loss_pct"]["b_to_a"]
            if "reorder" in link:
                t.reorder_a_to_b = Reorder.parse(link["reorder"]["a_to_b"])
                t.reorder_b_to_a = Reorder.parse(link["reorder"]["b_to_a"])
        lab.ioam = state.get("ioam", True)
        return lab

    @classmethod
    def up(
        cls,
        topology_path: str | Path,
        prefix: str,
        delay_us: dict[str, tuple[float, float]] | None = None,
        relay_links: Sequence[str] = (),
        ioam: bool = True,
    ) -> "Lab":
        """Create the lab. delay_us overrides link delays: {"ar": (a_to_b_us, b_to_a_us)};
        relay_links splices a relay into these links even at zero delay, so set_delay() can
        change them later (e.g. measure a baseline first, then inject). ioam=False leaves the
        topology's `ioam:` settings unapplied (for a test where the agent configures IOAM)."""
        if not PREFIX_RE.match(prefix):
            raise LabError(f"prefix {prefix!r} is not valid: use 1-16 characters [A-Za-z0-9_] (no '-')")
        topo = topo_mod.load(topology_path)
        for link_name, (a_to_b, b_to_a) in (delay_us or {}).items():
            link = topo.link(link_name)
            if a_to_b < 0 or b_to_a < 0:
                raise LabError(f"delay for link {link_name} must be >= 0 µs")
            link.delay_a_to_b_us, link.delay_b_to_a_us = float(a_to_b), float(b_to_a)
        for link_name in relay_links:
            topo.link(link_name).relay = "always"
        existing = _own_netns(prefix, _netns_names())
        if existing:
            raise LabError(
                f"lab {prefix!r} is already up ({', '.join(existing)}); "
                f"run `python -m netlab down --prefix {prefix}` first"
            )
        ensure_built()
        lab = cls(topo, prefix)
        lab.ioam = ioam
        try:
            lab._create()
        except BaseException:
            lab.down()
            raise
        return lab

    def _create(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        relay_links = [l for l in self.topo.links if l.wants_relay]
        self.relays = {l.name: {} for l in relay_links}
        self._write_state()
        for node in self.topo.nodes.values():
            sh(["ip", "netns", "add", self.ns(node.name)])
            self._apply_ns_sysctls(node)
        for link in relay_links:
            ns = self.relay_ns(link.name)
            sh(["ip", "netns", "add", ns])
            # The relay namespace is a wire: no IPv6 on its devices (no MLD/RS noise).
            sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ]
            )
        for link in self.topo.links:
            self._create_link(link)
        for node in self.topo.nodes.values():
            self._configure_devices(node)
        for node in self.topo.nodes.values():
            self._configure_addresses(node)
        for node in self.topo.nodes.values():
            self._configure_routes(node)
        for link in relay_links:
            self._start_relay(link)
        self._write_state()

    def _apply_ns_sysctls(self, node) -> None:
        values = {**self.topo.sysctl, **node.sysctl}
        if node.ioam and self.ioam:
            values["net.ipv6.ioam6_id"] = str(node.ioam.node_id)
            if node.ioam.node_id_wide is not None:
                values["net.ipv6.ioam6_id_wide"] = str(node.ioam.node_id_wide)
            batch = []
            for ns in node.ioam.namespaces:
                extra = (f" data {ns.data}" if ns.data is not None else "") + (
                    f" wide {ns.data_wide}" if ns.data_wide is not None else ""
                )
                batch.append(f"ioam namespace add {ns.id}{extra}")
            if batch:
                sh(["ip", "-n", self.ns(node.name), "-batch", "-"], input="\n".join(batch) + "\n")
        if values:
            sh(
                ["ip", "netns", "exec", self.ns(node.name), "sysctl", "-q", "-w"]
                + [f"{k}={v}" for k, v in values.items()]
            )

    def _end_mac(self, link: Link, end: Endpoint) -> str:
        return end.mac or _mac(self.prefix, link.name, end.node, end.ifname)

    def _create_link(self, link: Link) -> None:
        """veth pair(s) with temporary names in the root ns, moved into place and renamed."""
        tag = _tmp_tag(self.prefix)
        index = self.topo.links.index(link)
        tmp = [f"{tag}{index:03d}{s}" for s in "abcd"]
        mac_a, mac_b = self._end_mac(link, link.a), self._end_mac(link, link.b)
        if not link.wants_relay:
            sh(
                [
                    "ip",
                    "link",
                    "add",
                    tmp[0],
                    "address",
                    mac_a,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    tmp[1],
                    "address",
                    mac_b,
                ]
            )
            sh(["ip", "link", "set", "dev", tmp[0], "netns", self.ns(link.a.node), "name", link.a.ifname])
            sh(["ip", "link", "set", "dev", tmp[1], "netns", self.ns(link.b.node), "name", link.b.ifname])
            return
        relay_ns = self.relay_ns(link.name)
        sh(["ip", "link", "add", tmp[0], "address", mac_a, "type", "veth", "peer", "name", tmp[1]])
        sh(["ip", "link", "add", tmp[2], "type", "veth", "peer", "name", tmp[3], "address", mac_b])
        sh(["ip", "link", "set", "dev", tmp[0], "netns", self.ns(link.a.node), "name", link.a.ifname])
        sh(["ip", "link", "set", "dev", tmp[1], "netns", relay_ns, "name", RELAY_IF_A])
        sh(["ip", "link", "set", "dev", tmp[2], "netns", relay_ns, "name", RELAY_IF_B])
        sh(["ip", "link", "set", "dev", tmp[3], "netns", self.ns(link.b.node), "name", link.b.ifname])
        sh(["ip", "netns", "exec", relay_ns, "sh", "-c", relay_ends_script((RELAY_IF_A, RELAY_IF_B), link.mtu)])

    def _configure_devices(self, node) -> None:
        """Per-device sysctls and offloads (one shell per namespace keeps this fast)."""
        lines = ["set -e"]
        devices = ["lo"] + [end.ifname for _, end, _ in self.topo.endpoints_of(node.name)]
        settings = [f"net.ipv6.conf.{dev}.{k}={v}" for dev in devices for k, v in self.topo.device_sysctl.items()]
        for _link, end, _far in self.topo.endpoints_of(node.name):
            if not self.ioam:
                break
            enabled = end.ioam_enabled if end.ioam_enabled is not None else node.ioam is not None
            conf = f"net.ipv6.conf.{end.ifname}"
            if enabled:
                settings.append(f"{conf}.ioam6_enabled=1")
            if end.ioam_id is not None:
                settings.append(f"{conf}.ioam6_id={end.ioam_id}")
            if end.ioam_id_wide is not None:
                settings.append(f"{conf}.ioam6_id_wide={end.ioam_id_wide}")
        if settings:
            lines.append("sysctl -q -w " + " ".join(settings))
        for link, end, _far in self.topo.endpoints_of(node.name):
            # tx off: kernel-socket senders whose packets XDP rewrites need full checksums.
            # Next to a relay, also no GSO/TSO so the relay sees real-size frames.
            offloads = RELAY_OFFLOADS_OFF if link.wants_relay else ["tx", "off"]
            lines.append(f"ethtool -K {end.ifname} {' '.join(offloads)} >/dev/null")
        sh(["ip", "netns", "exec", self.ns(node.name), "sh", "-c", "\n".join(lines)])

    def reapply(self, node_name: str) -> None:
        """Put addresses, static neighbours and routes of a node back (idempotent).

        Needed after `ip link set X down/up`: the kernel flushes the routes and
        neighbour entries of a device that goes down (addresses stay, because the
        topology sets keep_addr_on_down=1)."""
        node = self.topo.nodes[node_name]
        self._configure_addresses(node, reapply=True)
        self._configure_routes(node)

    def _configure_addresses(self, node, reapply: bool = False) -> None:
        batch = ["link set dev lo up"]
        for addr in node.loopback:
            batch.append(f"addr replace {addr} dev lo nodad")
        for link, end, far in self.topo.endpoints_of(node.name):
            mtu = f" mtu {link.mtu}" if link.mtu else ""
            batch.append(f"link set dev {end.ifname}{mtu} up")
            for addr in end.addrs:
                batch.append(f"addr replace {addr} dev {end.ifname} nodad")
            far_mac = self._end_mac(link, far)
            for far_addr in [a.split("/")[0] for a in far.addrs] + [_link_local(far_mac)]:
                batch.append(f"neigh replace {far_addr} lladdr {far_mac} dev {end.ifname} nud permanent")
            if end.xdp_pass and not reapply:
                batch.append(f"link set dev {end.ifname} xdpdrv obj {XDP_PASS_OBJ} sec xdp")
        sh(["ip", "-6", "-n", self.ns(node.name), "-batch", "-"], input="\n".join(batch) + "\n")

    def _configure_routes(self, node) -> None:
        if not node.routes:
            return
        batch = ["route replace " + " ".join(r.ip_args()) for r in node.routes]
        sh(["ip", "-6", "-n", self.ns(node.name), "-batch", "-"], input="\n".join(batch) + "\n")

    # ------------------------------------------------------------ delay relay
    def _relay_paths(self, link_name: str) -> dict[str, str]:
        base = self.state_dir / f"relay-{link_name}"
        return {"control": f"{base}.sock", "stats": f"{base}.json", "pidfile": f"{base}.pid", "log": f"{base}.log"}

    def _start_relay(self, link: Link) -> None:
        paths = self._relay_paths(link.name)
        for stale in (paths["control"], paths["stats"]):
            Path(stale).unlink(missing_ok=True)
        cmd = [
            "ip",
            "netns",
            "exec",
            self.relay_ns(link.name),
            str(RELAY_BIN),
            "--if-a",
            RELAY_IF_A,
            "--if-b",
            RELAY_IF_B,
            "--a-to-b-us",
            f"{link.delay_a_to_b_us}",
            "--b-to-a-us",
            f"{link.delay_b_to_a_us}",
            "--queue",
            str(link.queue_frames),
            "--a-to-b-loss",
            f"{link.loss_a_to_b_pct}",
            "--b-to-a-loss",
            f"{link.loss_b_to_a_pct}",
            "--a-to-b-reorder",
            link.reorder_a_to_b.spec(),
            "--b-to-a-reorder",
            link.reorder_b_to_a.spec(),
            "--control",
            paths["control"],
            "--stats",
            paths["stats"],
            *RELAY_TIMING_ARGS,
        ]
        log = open(paths["log"], "ab")
        # `ip netns exec` execs the relay, so the PID is the relay's own.
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        Path(paths["pidfile"]).write_text(f"{proc.pid}\n")
        self._relay_procs[link.name] = proc
        self.relays[link.name] = {"pid": proc.pid, "ns": self.relay_ns(link.name), **paths}
        deadline = time.monotonic() + 5
        while not os.path.exists(paths["control"]):
            if proc.poll() is not None:
                raise LabError(
                    f"delay relay for link {link.name} exited ({proc.returncode}); "
                    f"log: {Path(paths['log']).read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise LabError(f"delay relay for link {link.name} not ready after 5 s; see {paths['log']}")
            time.sleep(0.01)
        # The spinners exist once the control socket does (the relay starts them first).
        self.relays[link.name]["keep_awake"] = keep_awake.make_spinners_idle(proc.pid)

    def _relay_request(self, link_name: str, request: str) -> dict[str, Any]:
        if link_name not in self.relays:
            raise LabError(
                f"link {link_name!r} has no delay relay; bring the lab up with a delay on it "
                f"(Lab.up(..., delay_us={{{link_name!r}: (a_to_b, b_to_a)}}) or `relay: always`)"
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(2)
            sock.connect(self.relays[link_name]["control"])
            sock.send(request.encode())
            reply = json.loads(sock.recv(RELAY_REPLY_BYTES).decode())
        if "error" in reply:
            raise LabError(f"relay {link_name}: {reply['error']}")
        return reply

    def set_delay(self, link_name: str, a_to_b_us: float, b_to_a_us: float) -> dict[str, Any]:
        """Change a relay's delay at run time; frames already queued keep their release time."""
        reply = self._relay_request(link_name, f"delay {float(a_to_b_us)} {float(b_to_a_us)}")
        link = self.topo.link(link_name)
        link.delay_a_to_b_us, link.delay_b_to_a_us = float(a_to_b_us), float(b_to_a_us)
        self._write_state()
        return reply

    def set_loss(self, link_name: str, a_to_b_pct: float, b_to_a_pct: float) -> dict[str, Any]:
        """Change a relay's injected loss at run time (percent per direction, 0..100)."""
        reply = self._relay_request(link_name, f"loss {float(a_to_b_pct)} {float(b_to_a_pct)}")
        link = self.topo.link(link_name)
        link.loss_a_to_b_pct, link.loss_b_to_a_pct = float(a_to_b_pct), float(b_to_a_pct)
        self._write_state()
        return reply

    def set_reorder(
        self, link_name: str, a_to_b: Reorder | str | None = None, b_to_a: Reorder | str | None = None
    ) -> dict[str, Any]:
        """Make a relay reorder at run time, per direction: a Reorder(every=K | pct=P, hold_us=H),
        a spec string ("every:K:HOLD_US", "random:PCT:HOLD_US", "off") or None (off). Frames
        already held keep their release time. The relay counts, per flow, the frames it released
        after a later-arrived frame of the same flow (RFC 4737): stats[dir]["reorder"]["reordered"]
        and stats[dir]["flows"][i]["reordered"]."""
        try:
            specs = [Reorder.parse(a_to_b), Reorder.parse(b_to_a)]
        except ValueError as exc:
            raise LabError(str(exc)) from None
        reply = self._relay_request(link_name, f"reorder {specs[0].spec()} {specs[1].spec()}")
        link = self.topo.link(link_name)
        link.reorder_a_to_b, link.reorder_b_to_a = specs
        self._write_state()
        return reply

    def relay_stats(self, link_name: str) -> dict[str, Any]:
        return self._relay_request(link_name, "stats")

    # ------------------------------------------------------------ run things in nodes
    def _exec_prefix(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node)]

    def run(
        self, node: str, cmd: Sequence[str], check: bool = False, timeout: float | None = 60, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run cmd inside node's namespace; output captured as text unless told otherwise."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        proc = subprocess.run(self._exec_prefix(node) + list(cmd), timeout=timeout, **kwargs)
        if check and proc.returncode != 0:
            raise LabError(f"[{node}] {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def popen(self, node: str, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self._exec_prefix(node) + list(cmd), **kwargs)

    def ifindex(self, node: str, ifname: str) -> int:
        out = sh(["ip", "-n", self.ns(node), "-j", "link", "show", "dev", ifname]).stdout
        return int(json.loads(out)[0]["ifindex"])

    def mac(self, node: str, ifname: str) -> str:
        out = sh(["ip", "-n", self.ns(node), "-j", "link", "show", "dev", ifname]).stdout
        return json.loads(out)[0]["address"]

    # ------------------------------------------------------------ loss injection (nftables)
    def add_loss(self, node: str, percent: float, match: str = "", hook: str = "forward") -> LossHandle:
        """Drop `percent` % of matching packets at `node` (nft numgen random + counter drop).

        match is an nft expression, e.g. "ip6 daddr fc00:3::d6". The counter counts
        exactly the dropped packets: loss_counter(handle)."""
        if not 0 <= percent <= 100:
            raise LabError(f"loss percent must be in [0, 100], got {percent}")
        if hook not in ("forward", "input", "output", "prerouting", "postrouting"):
            raise LabError(f"hook {hook!r}: use forward, input, output, prerouting or postrouting")
        table, chain = "netlab", f"{hook}_loss"  # `fwd` is reserved in nft: do not use it as a name
        ns_cmd = self._exec_prefix(node) + ["nft"]
        sh(ns_cmd + ["add", "table", "inet", table])
        sh(ns_cmd + ["add", "chain", "inet", table, chain, f"{{ type filter hook {hook} priority 0; }}"])
        self._loss_seq += 1
        comment = f"netlab-loss-{self._loss_seq}"
        threshold = round(percent * 100)  # numgen over 0..9999: 0.01 % resolution
        rule = f"{match} numgen random mod 10000 < {threshold} counter drop comment \"{comment}\""
        out = sh(ns_cmd + ["--echo", "--handle", "add", "rule", "inet", table, chain] + rule.split()).stdout
        found = re.search(r"# handle (\d+)", out)
        if not found:
            raise LabError(f"nft did not report a rule handle: {out!r}")
        return LossHandle(node, table, chain, int(found.group(1)), comment)

    def loss_counter(self, handle: LossHandle) -> int:
        out = sh(
            self._exec_prefix(handle.node) + ["nft", "-j", "list", "chain", "inet", handle.table, handle.chain]
        ).stdout
        for item in json.loads(out)["nftables"]:
            rule = item.get("rule")
            if rule and rule["handle"] == handle.handle:
                for expr in rule["expr"]:
                    if "counter" in expr:
                        return int(expr["counter"]["packets"])
        raise LabError(f"loss rule {handle.comment} not found on {handle.node}")

    def remove_loss(self, handle: LossHandle) -> None:
        sh(
            self._exec_prefix(handle.node)
            + ["nft", "delete", "rule", "inet", handle.table, handle.chain, "handle", str(handle.handle)]
        )

    # ------------------------------------------------------------ state, teardown
    def _write_state(self) -> None:
        state = {
            "prefix": self.prefix,
            "topology": str(Path(self.topo.path).resolve()),
            "name": self.topo.name,
            "nodes": {n: self.ns(n) for n in self.topo.nodes},
            "relays": self.relays,
            "ioam": self.ioam,
            "links": {
                l.name: {
                    "a": f"{l.a.node}:{l.a.ifname}",
                    "b": f"{l.b.node}:{l.b.ifname}",
                    "delay_us": {"a_to_b": l.delay_a_to_b_us, "b_to_a": l.delay_b_to_a_us},
                    "loss_pct": {"a_to_b": l.loss_a_to_b_pct, "b_to_a": l.loss_b_to_a_pct},
                    "reorder": {"a_to_b": l.reorder_a_to_b.spec(), "b_to_a": l.reorder_b_to_a.spec()},
                    "mtu": l.mtu,
                    "relay": l.name in self.relays,
                }
                for l in self.topo.links
            },
        }
        (self.state_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def down(self) -> dict[str, Any]:
        """Remove everything; returns the relays' final stats {link: stats}."""
        for proc in self._relay_procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._relay_procs.clear()
        self.final_relay_stats = teardown(self.prefix)
        return self.final_relay_stats

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.down()


def relay_lateness_us(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Mean time (us) the relay released frames after their due time, per direction, between
    two relay_stats() snapshots: the delay emulator's own error, measured for every frame."""
    out = {}
    for d in ("a_to_b", "b_to_a"):
        b, a = before[d]["lateness_ns"], after[d]["lateness_ns"]
        n = a["count"] - b["count"]
        out[d] = (a["mean"] * a["count"] - b["mean"] * b["count"]) / n / 1000 if n else 0.0
    return out


FLOW_COUNTERS = (
    "received",
    "dropped_loss",
    "dropped_queue_full",
    "dropped_oversize",
    "released",
    "send_errors",
    "held",
    "reordered",
    "delay_ns_sum",
    "late_ns_sum",
)
DIRECTION_COUNTERS = (
    "received",
    "forwarded",
    "dropped_queue_full",
    "dropped_oversize",
    "dropped_socket",
    "send_errors",
    "dropped_loss",
)


def _quantiles_ns(hist: dict[int, int], qs: Sequence[float]) -> dict[float, int]:
    """Quantiles of a lateness histogram {bucket upper bound ns: count}: the upper bound of the
    bucket holding rank ceil(q * n), so at most one bucket (3.2 %) above the true value."""
    total = sum(hist.values())
    out = {}
    for q in qs:
        rank, seen = max(1, -(-int(q * total * 1_000_000) // 1_000_000)), 0
        for upper in sorted(hist):
            seen += hist[upper]
            if seen >= rank:
                out[q] = upper
                break
        else:
            out[q] = 0
    return out


def relay_ground_truth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a relay did between two relay_stats() snapshots, per direction ("a_to_b", "b_to_a"):
    the link's per-direction ground truth for a test.

    Per direction: the counters' differences (received, forwarded, dropped_*, send_errors), and
      injected_mean_us  mean injected delay of the forwarded frames (delay, plus the hold of held
                        frames), exact: from the relay's per-frame sum
      lateness_us       {count, mean, p50, p90, p99, p999}: how late the relay released frames after
                        their due time; mean exact, percentiles the upper bound of a 3.2 % bucket
      relay_mean_us     injected_mean_us + lateness mean: the mean time the relay added per frame
      held, reordered   frames held back, and frames released after a later-arrived frame of their
                        own flow (RFC 4737, summed over flows)
      flows             [{src, dst, flow_label, <FLOW_COUNTERS differences>, relay_mean_us}], the flows
                        the relay lists (the first 256 it saw per direction)
    """
    out: dict[str, dict[str, Any]] = {}
    for d in ("a_to_b", "b_to_a"):
        b, a = before[d], after[d]
        res: dict[str, Any] = {k: a[k] - b[k] for k in DIRECTION_COUNTERS}
        n_inj = a["injected_ns"]["count"] - b["injected_ns"]["count"]
        inj_sum = a["injected_ns"]["sum"] - b["injected_ns"]["sum"]
        res["injected_mean_us"] = inj_sum / n_inj / 1000 if n_inj else 0.0
        la, lb = a["lateness_ns"], b["lateness_ns"]
        n_late = la["count"] - lb["count"]
        hist = {upper: count for upper, count in la["hist_log"]}
        for upper, count in lb["hist_log"]:
            hist[upper] -= count
        q = _quantiles_ns({k: v for k, v in hist.items() if v}, (0.5, 0.9, 0.99, 0.999))
        res["lateness_us"] = {
            "count": n_late,
            "mean": (la["sum"] - lb["sum"]) / n_late / 1000 if n_late else 0.0,
            **{name: q[v] / 1000 for name, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))},
        }
        res["relay_mean_us"] = res["injected_mean_us"] + res["lateness_us"]["mean"]
        res["held"] = a["reorder"]["held"] - b["reorder"]["held"]
        res["reordered"] = a["reorder"]["reordered"] - b["reorder"]["reordered"]
        old = {(f["src"], f["dst"], f["flow_label"]): f for f in b["flows"]}
        res["flows"] = []
        for f in a["flows"]:
            key = (f["src"], f["dst"], f["flow_label"])
            prev = old.get(key, {})
            row: dict[str, Any] = {"src": key[0], "dst": key[1], "flow_label": key[2]}
            row.update({k: f[k] - prev.get(k, 0) for k in FLOW_COUNTERS})
            released = row["released"]
            row["relay_mean_us"] = (row["delay_ns_sum"] + row["late_ns_sum"]) / released / 1000 if released else 0.0
            res["flows"].append(row)
        out[d] = res
    return out


def relay_flow(window: dict[str, Any], direction: str, **match: Any) -> dict[str, Any]:
    """The one flow of relay_ground_truth(...)[direction] (or of relay_stats()[direction]) whose
    fields equal `match` (e.g. dst="fc00:21::e", flow_label=0x12345); LabError if not exactly one."""
    found = [f for f in window[direction]["flows"] if all(f.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        listed = [(f["src"], f["dst"], f["flow_label"]) for f in window[direction]["flows"]]
        raise LabError(f"{len(found)} flows {direction} match {match}; listed: {listed}")
    return found[0]


def teardown(prefix: str) -> dict[str, Any]:
    """Remove a lab by prefix; works without the state file. Returns final relay stats."""
    if not PREFIX_RE.match(prefix):
        raise LabError(f"prefix {prefix!r} is not valid: use 1-16 characters [A-Za-z0-9_]")
    state_dir = RUN_ROOT / prefix
    final: dict[str, Any] = {}
    # 1. relays, by PID file (only if the PID really is a delay_relay)
    for pidfile in sorted(state_dir.glob("relay-*.pid")) if state_dir.exists() else []:
        try:
            pid = int(pidfile.read_text().strip())
        except ValueError:
            pid = 0
        if pid and _is_relay(pid):
            _terminate(pid)
        pidfile.unlink(missing_ok=True)
        stats = pidfile.with_suffix(".json")
        link = pidfile.stem.removeprefix("relay-")
        if stats.exists():
            try:
                final[link] = json.loads(stats.read_text())
            except ValueError:
                pass
    # 2. anything still running inside our namespaces (started in them by us or our tests)
    own = _own_netns(prefix, _netns_names())
    for ns in own:
        pids = sh(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            _terminate(int(pid), timeout=1)
    # 3. namespaces (their veths, routes, nft tables and XDP attachments go with them)
    for ns in own:
        sh(["ip", "netns", "del", ns], check=False)
    keep_awake.remove_idle_cgroup()  # gone with the last lab's relays; kept while others run
    # 4. temporary veths left in the root namespace by an interrupted `up`
    tag = _tmp_tag(prefix)
    links = json.loads(sh(["ip", "-j", "link", "show"]).stdout or "[]")
    for link in links:
        if link.get("ifname", "").startswith(tag):
            sh(["ip", "link", "del", link["ifname"]], check=False)
    # 5. bpffs pins of instances named after our namespaces (segscope convention)
    if BPFFS_SEGSCOPE.is_dir():
        for pin_dir in _own_netns(prefix, [p.name for p in BPFFS_SEGSCOPE.iterdir()]):
            shutil.rmtree(BPFFS_SEGSCOPE / pin_dir, ignore_errors=True)
    # 6. state: keep logs and final stats for post-mortems, drop the rest
    if state_dir.exists():
        for path in state_dir.iterdir():
            if path.suffix in (".sock", ".pid") or path.name == "state.json":
                path.unlink(missing_ok=True)
    return final


def status(prefix: str) -> dict[str, Any]:
    state_file = RUN_ROOT / prefix / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    relays = {}
    for link, info in state.get("relays", {}).items():
        pid = info.get("pid")
        relays[link] = {
            "pid": pid,
            "alive": bool(pid) and _pid_alive(pid) and _is_relay(pid),
            "control": info.get("control"),
        }
    return {
        "prefix": prefix,
        "state_file": str(state_file) if state else None,
        "topology": state.get("topology"),
        "netns": _own_netns(prefix, _netns_names()),
        "relays": relays,
    }
