"""The node's IOAM identity (inline.proto EnableIoam / DisableIoam / GetIoamConfig): what makes the
Linux kernel of a node fill IOAM trace entries (RFC 9197, RFC 9486) of the packets it receives.

Three kinds of kernel state, all in the node's network namespace:
- sysctl net.ipv6.ioam6_id: the node id (24 bits in the 0xF00000 trace; the kernel's default
  0xFFFFFF means "no id");
- sysctl net.ipv6.conf.<dev>.ioam6_enabled / ioam6_id: per receiving device, whether the kernel
  fills its entry and with which interface id (16 bits; default 0xFFFF);
- IOAM namespaces (the kernel fills only for a Namespace-ID it knows): the generic netlink family
  "IOAM6", what `ip ioam namespace add ID` sends. Spoken here over netlink from Python on the
  agent's own socket in the namespace (agent/rtnl.py's framing): one request per namespace, no
  process and no iproute2 build dependency, and the kernel's own errors come back as errno.

What the agent changes it restores: before it first writes a sysctl it saves the value found, and
it remembers which namespaces it added (those that existed before are left alone). DisableIoam,
Reset and the agent's stop write the saved values back and delete the added namespaces. The saved
values are kept in a state file (`<state dir>/ioam.json`, written before anything changes), so an
agent that was killed leaves the file behind and the next agent of the node restores from it when
it starts (restore_leftovers). The file names the network namespace's inode: a file from another
namespace of the same name (a lab torn down and built again) is discarded, not applied.

Sysctls are read and written through /proc/sys/net (or the directory --sysctl-net names: the
agent's pod mounts the host's /proc/sys/net there, the container's own /proc/sys is read-only) on
a thread inside the namespace (rtnl.in_netns): /proc/sys/net shows the network namespace of the
thread that opens it.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.rtnl import NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR, NetlinkError, Rtnl, _attrs, _nla, in_netns

log = logging.getLogger("segscope.agent.ioam")

# generic netlink (linux/genetlink.h) and the IOAM6 family (linux/ioam6_genl.h)
NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
IOAM6_GENL_NAME, IOAM6_GENL_VERSION = b"IOAM6", 1
IOAM6_CMD_ADD_NAMESPACE, IOAM6_CMD_DEL_NAMESPACE, IOAM6_CMD_DUMP_NAMESPACES = 1, 2, 3
IOAM6_ATTR_NS_ID = 1
_GENL = struct.Struct("=BBH")  # genlmsghdr: cmd, version, reserved

KERNEL_NO_NODE_ID = 0xFFFFFF  # net.ipv6.ioam6_id default
MAX_NODE_ID = 0xFFFFFE
MAX_IF_ID = 0xFFFE  # 0xFFFF is "unavailable" in a trace entry (and the kernel's default)
NODE_ID_KEY = "net/ipv6/ioam6_id"


def dev_keys(device: str) -> tuple[str, str]:
    return f"net/ipv6/conf/{device}/ioam6_enabled", f"net/ipv6/conf/{device}/ioam6_id"


class IoamGenl(Rtnl):
    """The IOAM6 generic netlink family on a socket in the node's namespace."""

    def __init__(self, netns: str | None):
        super().__init__(netns, NETLINK_GENERIC)
        self.family = self._resolve()

    def _query(self, mtype: int, body: bytes) -> tuple[bytes, int, int]:
        """One request that the kernel answers with one message (and an ack)."""
        with self.lock:
            seq = self._next_seq()
            self.sock.send(self._frame(mtype, NLM_F_REQUEST | NLM_F_ACK, seq, body))
            reply = None
            while True:
                buf = self.sock.recv(1 << 16)
                off = 0
                while off + 16 <= len(buf):
                    n, t, fl, s, _ = struct.unpack_from("=IHHII", buf, off)
                    if s == seq:
                        if t == NLMSG_ERROR:
                            err = self._parse_error(buf, off, n, fl)
                            if err is not None:
                                raise err
                            if reply is None:
                                raise NetlinkError(0, "no answer before the ack")
                            return reply
                        reply = (buf, off + 16, off + n)
                    off += (n + 3) & ~3

    def _resolve(self) -> int:
        body = _GENL.pack(CTRL_CMD_GETFAMILY, 1, 0) + _nla(CTRL_ATTR_FAMILY_NAME, IOAM6_GENL_NAME + b"\0")
        try:
            buf, off, end = self._query(GENL_ID_CTRL, body)
        except NetlinkError as e:
            raise NetlinkError(e.errno or 2, f"the kernel has no IOAM6 generic netlink family ({e.text})") from None
        attrs = _attrs(buf, off + _GENL.size, end)
        return struct.unpack_from("=H", attrs[CTRL_ATTR_FAMILY_ID])[0]

    def _ns_msg(self, cmd: int, ns_id: int) -> bytes:
        return _GENL.pack(cmd, IOAM6_GENL_VERSION, 0) + _nla(IOAM6_ATTR_NS_ID, struct.pack("=H", ns_id))

    def namespaces(self) -> set[int]:
        out = set()
        for _t, buf, off, end in self.dump(self.family, _GENL.pack(IOAM6_CMD_DUMP_NAMESPACES, IOAM6_GENL_VERSION, 0)):
            attrs = _attrs(buf, off + _GENL.size, end)
            if IOAM6_ATTR_NS_ID in attrs:
                out.add(struct.unpack_from("=H", attrs[IOAM6_ATTR_NS_ID])[0])
        return out

    def add_namespace(self, ns_id: int) -> None:
        self.request(self.family, 0, self._ns_msg(IOAM6_CMD_ADD_NAMESPACE, ns_id))

    def del_namespace(self, ns_id: int) -> None:
        self.request(self.family, 0, self._ns_msg(IOAM6_CMD_DEL_NAMESPACE, ns_id))


PROC_SYS_NET = Path("/proc/sys/net")


def _sysctl_file(root: Path, key: str) -> Path:
    """The file of key ("net/ipv6/...") under root, a view of /proc/sys/net (a container gets a
    read-only /proc/sys: the agent's pod mounts the host's /proc/sys/net elsewhere, --sysctl-net)."""
    return root / key.removeprefix("net/")


def read_sysctls(netns: str | None, keys: list[str], root: Path = PROC_SYS_NET) -> dict[str, str | None]:
    """key ("net/ipv6/...") -> its value now, None if the file does not exist (device gone)."""

    def read() -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for k in keys:
            try:
                out[k] = _sysctl_file(root, k).read_text().strip()
            except FileNotFoundError:
                out[k] = None
        return out

    return in_netns(netns, read)


def write_sysctls(
    netns: str | None, values: dict[str, str], missing_ok: bool = False, root: Path = PROC_SYS_NET
) -> None:
    """Write each key in order; OSError (naming the key) at the first failure, unless the file is
    gone and missing_ok (restoring a device that was deleted meanwhile: nothing left to restore)."""

    def write() -> None:
        for k, v in values.items():
            try:
                with open(_sysctl_file(root, k), "w") as f:
                    f.write(str(v))
            except FileNotFoundError:
                if not missing_ok:
                    raise OSError(2, f"{k.replace('/', '.')}: no such sysctl") from None
            except OSError as e:
                raise OSError(e.errno, f"{k.replace('/', '.')} = {v}: {e.strerror}") from None

    in_netns(netns, write)


def netns_inode(netns: str | None) -> int:
    return os.stat(f"/run/netns/{netns}" if netns else "/proc/self/ns/net").st_ino


@dataclass
class IoamApplied:
    """What EnableIoam made true, and how to undo it."""

    node_id: int
    namespaces: tuple[int, ...]  # the configuration's (sorted)
    interfaces: dict[str, int]  # device -> interface id, every device with IOAM enabled
    saved: dict[str, str] = field(default_factory=dict)  # sysctl key -> value before the first write
    added: list[int] = field(default_factory=list)  # namespaces this agent added


class IoamError(Exception):
    """Enable could not be done: `field` names the request field, `message` why."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field, self.message = field_path, message


class IoamNode:
    """The node's IOAM kernel state as this agent set it; one lock."""

    def __init__(self, netns: str | None, state_dir: Path, links, sysctl_net: Path = PROC_SYS_NET):
        self.netns = netns
        self.sysctl_net = Path(sysctl_net)
        self.state_path = Path(state_dir) / "ioam.json"
        self.links = links  # callable -> {device: ifindex} (Rtnl.links)
        self.lock = threading.RLock()
        self.applied: IoamApplied | None = None
        self._genl: IoamGenl | None = None

    def genl(self) -> IoamGenl:
        if self._genl is None:
            self._genl = IoamGenl(self.netns)
        return self._genl

    def close(self) -> None:
        if self._genl is not None:
            self._genl.close()
            self._genl = None

    # -- the state file ------------------------------------------------------------------------
    def _persist(self, a: IoamApplied) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "netns": self.netns,
                    "netns_inode": netns_inode(self.netns),
                    "node_id": a.node_id,
                    "namespaces": list(a.namespaces),
                    "interfaces": a.interfaces,
                    "saved": a.saved,
                    "added": a.added,
                },
                sort_keys=True,
            )
        )
        os.replace(tmp, self.state_path)  # a reader (the next agent) never sees half a file

    def _read_leftovers(self) -> IoamApplied | None:
        """What a previous agent of this node applied (its state file), None if none (a file that is
        unreadable or of another network namespace is removed)."""
        try:
            st = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as e:
            log.warning("%s unreadable (%s): removed, nothing restored", self.state_path, e)
            self.state_path.unlink(missing_ok=True)
            return None
        if st.get("netns") != self.netns or st.get("netns_inode") != netns_inode(self.netns):
            log.warning("%s belongs to another network namespace: removed, nothing restored", self.state_path)
            self.state_path.unlink(missing_ok=True)
            return None
        return IoamApplied(
            int(st["node_id"]), tuple(st["namespaces"]), dict(st["interfaces"]), dict(st["saved"]), list(st["added"])
        )

    def adopt_leftovers(self) -> bool:
        """At start, when the previous agent's in-line monitors are adopted: its IOAM configuration
        stays as it is (the monitors' trace entries need it) and becomes this agent's, with what to
        restore at DisableIoam/Reset. True if there was one."""
        left = self._read_leftovers()
        if left is None:
            return False
        with self.lock:
            self.applied = left
        log.info(
            "IOAM configuration of the previous agent adopted (node id %d, devices %s)",
            left.node_id,
            sorted(left.interfaces),
        )
        return True

    def restore_leftovers(self) -> bool:
        """At start: a state file means an agent of this node was killed with IOAM enabled; put
        back what it saved. True if something was restored."""
        with self.lock:
            if self.applied is not None:  # adopted (adopt_leftovers): it stays
                return False
        left = self._read_leftovers()
        if left is None:
            return False
        log.warning(
            "IOAM configuration left by a previous agent (node id %d, devices %s, namespaces added %s): restoring",
            left.node_id,
            sorted(left.interfaces),
            left.added,
        )
        with self.lock:
            self._undo(left)
        return True

    # -- enable / disable ------------------------------------------------------------------------
    def resolve(self, node_id: int, interfaces: dict[str, int], all_devices: bool) -> dict[str, int]:
        """device -> interface id of every device to enable (IoamError naming the field)."""
        links = self.links()
        for i, dev in enumerate(interfaces):
            if dev not in links:
                raise IoamError(f"config.interfaces[{i}].device", f"the node has no device {dev!r}")
        out = dict(interfaces)
        if all_devices:
            taken = {v: d for d, v in interfaces.items()}
            for dev, ifindex in sorted(links.items()):
                if dev == "lo" or dev in out:
                    continue
                if ifindex > MAX_IF_ID:
                    raise IoamError(
                        "config.all_devices",
                        f"device {dev} has ifindex {ifindex}, above the largest IOAM interface id {MAX_IF_ID}: "
                        f"list it in config.interfaces with an id",
                    )
                if ifindex in taken:
                    raise IoamError(
                        "config.all_devices",
                        f"device {dev}'s ifindex {ifindex} is the interface id config.interfaces gives "
                        f"{taken[ifindex]}: give {dev} an id in config.interfaces, or {taken[ifindex]} another one",
                    )
                out[dev] = ifindex
        return dict(sorted(out.items()))

    def enable(self, node_id: int, namespaces: tuple[int, ...], interfaces: dict[str, int]) -> bool:
        """Make the node's IOAM state exactly this (interfaces already resolved); True if changed."""
        with self.lock:
            old = self.applied
            if old is not None and (old.node_id, old.namespaces, old.interfaces) == (node_id, namespaces, interfaces):
                return False
            a = IoamApplied(
                node_id,
                namespaces,
                interfaces,
                dict(old.saved) if old else {},
                list(old.added) if old else [],
            )
            want = {NODE_ID_KEY: str(node_id)}
            for dev, if_id in interfaces.items():
                enabled_key, id_key = dev_keys(dev)
                want[enabled_key] = "1"
                want[id_key] = str(if_id)
            # keys of the previous configuration that this one drops go back to their old values
            back = {k: v for k, v in a.saved.items() if k not in want}
            # save what is there before the first write (and persist it before writing)
            new_keys = [k for k in want if k not in a.saved]
            for k, v in read_sysctls(self.netns, new_keys, self.sysctl_net).items():
                if v is None:
                    raise IoamError("config.interfaces", f"no sysctl {k.replace('/', '.')} (device gone?)")
                a.saved[k] = v
            genl = self.genl()
            present = genl.namespaces()
            to_add = [n for n in namespaces if n not in present]
            to_del = [n for n in a.added if n not in namespaces]
            a.added = [n for n in a.added if n in namespaces] + to_add
            self._persist(a)
            self.applied = a
            try:
                write_sysctls(self.netns, want, root=self.sysctl_net)
                for n in to_add:
                    genl.add_namespace(n)
            except OSError as e:
                log.warning("EnableIoam failed (%s): restoring what was changed", e)
                self._undo(a)
                self.applied = None
                raise IoamError("config", f"the kernel refused it: {e}") from None
            write_sysctls(self.netns, back, missing_ok=True, root=self.sysctl_net)
            for k in back:
                del a.saved[k]
            for n in to_del:
                self._del_namespace(genl, n)
            self._persist(a)
            log.info(
                "IOAM enabled: node id %d, namespaces %s (added %s), devices %s",
                node_id,
                list(namespaces),
                a.added,
                interfaces,
            )
            return True

    def disable(self) -> bool:
        with self.lock:
            a, self.applied = self.applied, None
            if a is None:
                return False
            self._undo(a)
            log.info("IOAM disabled: restored %d sysctls, removed namespaces %s", len(a.saved), a.added)
            return True

    def _del_namespace(self, genl: IoamGenl, n: int) -> None:
        try:
            genl.del_namespace(n)
        except NetlinkError as e:
            if e.errno != 2:  # ENOENT: someone removed it already
                log.warning("IOAM namespace %d not removed: %s", n, e.text)

    def _undo(self, a: IoamApplied) -> None:
        """Every saved sysctl back, every added namespace deleted, the state file removed."""
        errors = []
        try:
            write_sysctls(self.netns, a.saved, missing_ok=True, root=self.sysctl_net)
        except OSError as e:
            errors.append(str(e))
        try:
            genl = self.genl()
            for n in a.added:
                self._del_namespace(genl, n)
        except OSError as e:
            errors.append(f"IOAM namespaces: {e}")
        if errors:
            log.warning("IOAM restore incomplete: %s", "; ".join(errors))
        self.state_path.unlink(missing_ok=True)

    def interfaces_now(self) -> dict[str, int]:
        with self.lock:
            return dict(self.applied.interfaces) if self.applied else {}
