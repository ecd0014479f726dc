"""Sockets for ustamp: netns entry, the type-4 SRH option, ancillary data of received packets."""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SRH_TYPE = 4
MAX_SIDS = 16

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def enter_netns(name: str) -> None:
    """setns(2) into /run/netns/NAME: every socket opened afterwards lives there."""
    path = f"/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # FileNotFoundError names the path
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def parse_sids(text: str, flag: str) -> list[str]:
    """Comma-separated IPv6 SIDs in visiting order; errors name the flag."""
    sids = [s.strip() for s in text.split(",") if s.strip()]
    if not sids:
        raise ValueError(f"{flag}: empty SID list")
    if len(sids) > MAX_SIDS:
        raise ValueError(f"{flag}: {len(sids)} SIDs, at most {MAX_SIDS}")
    for s in sids:
        try:
            ipaddress.IPv6Address(s)
        except ValueError:
            raise ValueError(f"{flag}: not an IPv6 address: {s!r}") from None
    return [str(ipaddress.IPv6Address(s)) for s in sids]


def srh_option(final_dst: str, sids: list[str]) -> bytes:
    """Type-4 SRH for IPV6_RTHDR (setsockopt or cmsg).

    Same convention as collectors/stamp_sender.c: Linux's ipv6_push_rthdr4() keeps
    segments[1..last_entry], writes the socket destination into segments[0] and sends to
    segments[segments_left]; so the SIDs go in reverse visiting order into segments[n..1]."""
    n = len(sids)
    segments = [socket.inet_pton(socket.AF_INET6, final_dst)]
    segments += [socket.inet_pton(socket.AF_INET6, s) for s in reversed(sids)]
    hdr = struct.pack("!BBBBBBH", 0, (n + 1) * 2, SRH_TYPE, n, n, 0, 0)
    return hdr + b"".join(segments)


def enable_rx_ancillary(sock: socket.socket, rthdr: bool = False) -> None:
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
    if rthdr:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVRTHDR, 1)


@dataclass
class RxMeta:
    """Ancillary data of one received datagram."""

    rx_realtime_ns: int | None = None  # SO_TIMESTAMPNS (CLOCK_REALTIME)
    hop_limit: int | None = None  # IPV6_HOPLIMIT
    local_addr: str | None = None  # IPV6_PKTINFO: the address it was sent to
    ifindex: int = 0  # IPV6_PKTINFO: the interface it arrived on
    rthdr: bytes | None = None  # IPV6_RTHDR (SRH), if any
    tclass: int = 0  # IPV6_TCLASS: Traffic Class (DSCP << 2 | ECN)


ANC_BUFSIZE = socket.CMSG_SPACE(16) + 2 * socket.CMSG_SPACE(4) + socket.CMSG_SPACE(20) + socket.CMSG_SPACE(8 + 17 * 16)


def parse_ancillary(ancdata) -> RxMeta:
    meta = RxMeta()
    for level, ctype, data in ancdata:
        if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack_from("=qq", data)
            meta.rx_realtime_ns = sec * 1_000_000_000 + nsec
        elif level == socket.IPPROTO_IPV6 and ctype == socket.IPV6_HOPLIMIT and len(data) >= 4:
            meta.hop_limit = struct.unpack_from("=i", data)[0]
        elif level == socket.IPPROTO_IPV6 and ctype == socket.IPV6_PKTINFO and len(data) >= 20:
            meta.local_addr = socket.inet_ntop(socket.AF_INET6, data[:16])
            meta.ifindex = struct.unpack_from("=I", data, 16)[0]
        elif level == socket.IPPROTO_IPV6 and ctype == socket.IPV6_TCLASS and len(data) >= 4:
            meta.tclass = struct.unpack_from("=i", data)[0]
        elif level == socket.IPPROTO_IPV6 and ctype == socket.IPV6_RTHDR:
            meta.rthdr = bytes(data)
    return meta


SO_MEMINFO = getattr(socket, "SO_MEMINFO", 55)
SK_MEMINFO_DROPS = 8  # index in the u32 array SO_MEMINFO returns (include/uapi/linux/sock_diag.h)


def socket_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped at this socket (sk_drops: receive buffer full, bad checksum)."""
    mem = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (SK_MEMINFO_DROPS + 1))
    return struct.unpack_from("=I", mem, 4 * SK_MEMINFO_DROPS)[0] if len(mem) > 4 * SK_MEMINFO_DROPS else 0


def pktinfo_cmsg(src: str, ifindex: int = 0) -> tuple[int, int, bytes]:
    """Source address (and, if ifindex != 0, the outgoing interface) of one datagram."""
    return (
        socket.IPPROTO_IPV6,
        socket.IPV6_PKTINFO,
        socket.inet_pton(socket.AF_INET6, src) + struct.pack("=I", ifindex),
    )


def tclass_cmsg(tclass: int) -> tuple[int, int, bytes]:
    return socket.IPPROTO_IPV6, socket.IPV6_TCLASS, struct.pack("=i", tclass)


def hoplimit_cmsg(hop_limit: int) -> tuple[int, int, bytes]:
    return socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, struct.pack("=i", hop_limit)
