"""Field validation for the agent's RPCs. Every failure is an ApiError whose message starts with
the field path, e.g. "policy.segments[1]: 'fc00::zz' is not an IPv6 address".

Cheap on purpose (inet_pton / inet_ntop, no ipaddress objects): validation runs on every
configuration operation and the benchmark counts operations per second.
"""

from __future__ import annotations

import re
import socket

import grpc

MAX_SEGMENTS = 16
MAX_TABLE = 0xFFFFFFFE
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


class ApiError(Exception):
    """An RPC failure with a gRPC status code and a message naming the field."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(path: str, what: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"{path}: {what}")


def ipv6(path: str, value: str, *, required: bool = True, unicast: bool = True) -> str:
    """Canonical text of an IPv6 address ("" if optional and empty)."""
    if not value:
        if required:
            raise invalid(path, "required (an IPv6 address)")
        return ""
    try:
        raw = socket.inet_pton(socket.AF_INET6, value)
    except (OSError, ValueError):
        raise invalid(path, f"{value!r} is not an IPv6 address") from None
    if unicast:
        if raw == bytes(16):
            raise invalid(path, f"{value!r} is the unspecified address")
        if raw[0] == 0xFF:
            raise invalid(path, f"{value!r} is a multicast address")
    return socket.inet_ntop(socket.AF_INET6, raw)


def ipv4(path: str, value: str, *, required: bool = True) -> str:
    if not value:
        if required:
            raise invalid(path, "required (an IPv4 address)")
        return ""
    try:
        raw = socket.inet_pton(socket.AF_INET, value)
    except (OSError, ValueError):
        raise invalid(path, f"{value!r} is not an IPv4 address") from None
    return socket.inet_ntop(socket.AF_INET, raw)


def prefix(path: str, value: str) -> tuple[str, int]:
    """Canonical "addr/len" (host bits must be zero) and the address family."""
    if not value:
        raise invalid(path, "required (a prefix such as fd00:b::/64)")
    addr, sep, plen_s = value.partition("/")
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    bits = 128 if fam == socket.AF_INET6 else 32
    try:
        raw = socket.inet_pton(fam, addr)
    except (OSError, ValueError):
        raise invalid(path, f"{value!r} is not an IPv6 or IPv4 prefix") from None
    if sep:
        if not plen_s.isdigit() or int(plen_s) > bits:
            raise invalid(path, f"{value!r}: prefix length must be 0..{bits}")
        plen = int(plen_s)
    else:
        plen = bits
    as_int = int.from_bytes(raw, "big")
    if plen < bits and as_int & ((1 << (bits - plen)) - 1):
        raise invalid(
            path,
            f"{value!r} has host bits set (did you mean "
            f"{socket.inet_ntop(fam, (as_int >> (bits - plen) << (bits - plen)).to_bytes(bits // 8, 'big'))}/{plen}?)",
        )
    return f"{socket.inet_ntop(fam, raw)}/{plen}", fam


def segments(path: str, values, *, min_len: int = 1, max_len: int = MAX_SEGMENTS) -> tuple[str, ...]:
    n = len(values)
    if n < min_len or n > max_len:
        if n == 0:
            raise invalid(path, f"required (1..{max_len} IPv6 SIDs in travel order)")
        raise invalid(path, f"{n} SIDs, at most {max_len}")
    return tuple(ipv6(f"{path}[{i}]", v) for i, v in enumerate(values))


def table(path: str, value: int) -> int:
    """0 = main (254)."""
    if value > MAX_TABLE:
        raise invalid(path, f"{value} is not a routing table id (0..{MAX_TABLE})")
    return value or 254


def required_table(path: str, value: int) -> int:
    if value == 0 or value > MAX_TABLE:
        raise invalid(
            path,
            f"required (a routing table id 1..{MAX_TABLE})"
            if value == 0
            else f"{value} is not a routing table id (1..{MAX_TABLE})",
        )
    return value


def ifname(path: str, value: str) -> str:
    if not value:
        raise invalid(path, "required (a device name)")
    if not _IFNAME.match(value):
        raise invalid(path, f"{value!r} is not a device name (1..15 characters [A-Za-z0-9_.:@-])")
    return value


def enum_value(path: str, value: int, enum_type, *, required: bool = True) -> int:
    """An enum value known to the proto (not UNSPECIFIED when required)."""
    names = enum_type.DESCRIPTOR.values_by_number
    if value not in names:
        raise invalid(path, f"{value} is not a {enum_type.DESCRIPTOR.name} value")
    if required and value == 0:
        raise invalid(path, f"required (one of {', '.join(v.name for v in enum_type.DESCRIPTOR.values[1:])})")
    return value


def in_range(path: str, value, lo, hi, what: str = "") -> None:
    if value < lo or value > hi:
        raise invalid(path, f"{value} out of range {lo}..{hi}{(' ' + what) if what else ''}")


def refuse(path: str, present: bool, why: str) -> None:
    if present:
        raise invalid(path, f"not allowed {why}")
