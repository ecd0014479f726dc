"""IOAM packets in a capture, read from the bytes: independent of the datapath's own code."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

IPV6_ETHERTYPE = b"\x86\xdd"
NH_HOPOPTS, NH_ROUTING, NH_DSTOPTS = 0, 43, 60
SRH_TYPE = 4
IOAM_DOH_OPT_TYPE, IOAM_OPTION_E2E = 0x11, 3  # schemas/IOAM.md


@dataclass
class IoamPacket:
    ts: float  # capture time, seconds since the epoch (tcpdump: CLOCK_REALTIME)
    sids: list[str]  # the SRH's SID list in travel order
    hbh_len: int  # the Hop-by-Hop header's bytes: 16 + 16 per trace slot
    seq: int  # the E2E option's sequence number


def e2e_packets(pcap: Path) -> list[IoamPacket]:
    """Every frame of a nanosecond pcap (Ethernet) that is IPv6 | HBH | SRH | DOH with the IOAM E2E
    option (what ioam_tx / ioam_lwt send), in capture order."""
    data, out, off = pcap.read_bytes(), [], 24
    while off + 16 <= len(data):
        sec, nsec = int.from_bytes(data[off : off + 4], "little"), int.from_bytes(data[off + 4 : off + 8], "little")
        caplen = int.from_bytes(data[off + 8 : off + 12], "little")
        frame, off = data[off + 16 : off + 16 + caplen], off + 16 + caplen
        p = _parse(frame)
        if p is not None:
            out.append(IoamPacket(sec + nsec / 1e9, *p))
    return out


def srv6_frames(pcap: Path) -> list[tuple[float, IoamPacket | None]]:
    """Every SRv6 frame of a nanosecond pcap (Ethernet) in capture order: (capture time, the packet)
    for an instrumented one, (capture time, None) for IPv6 | SRH without IOAM."""
    data, out, off = pcap.read_bytes(), [], 24
    while off + 16 <= len(data):
        sec, nsec = int.from_bytes(data[off : off + 4], "little"), int.from_bytes(data[off + 4 : off + 8], "little")
        caplen = int.from_bytes(data[off + 8 : off + 12], "little")
        frame, off = data[off + 16 : off + 16 + caplen], off + 16 + caplen
        ts, p = sec + nsec / 1e9, _parse(frame)
        if p is not None:
            out.append((ts, IoamPacket(ts, *p)))
        elif frame[12:14] == IPV6_ETHERTYPE and len(frame) > 14 + 40 and frame[14 + 6] == NH_ROUTING:
            out.append((ts, None))
    return out


def _parse(frame: bytes) -> tuple[list[str], int, int] | None:
    ip = frame[14:]
    if frame[12:14] != IPV6_ETHERTYPE or len(ip) < 48 or ip[6] != NH_HOPOPTS:
        return None
    hbh_len = (ip[41] + 1) * 8
    srh = ip[40 + hbh_len :]
    if ip[40] != NH_ROUTING or len(srh) < 8 or srh[2] != SRH_TYPE:
        return None
    srh_len = (srh[1] + 1) * 8
    sids = [str(ipaddress.IPv6Address(srh[8 + 16 * i : 24 + 16 * i])) for i in range(srh[4], -1, -1)]
    doh = srh[srh_len:]
    if srh[0] != NH_DSTOPTS or len(doh) < 20 or doh[4] != IOAM_DOH_OPT_TYPE or doh[7] != IOAM_OPTION_E2E:
        return None
    return sids, hbh_len, int.from_bytes(doh[12:20], "big")
