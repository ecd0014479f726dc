"""IPv6 Hop-by-Hop / Destination Options headers: mirror of schemas/c/ipv6_options.h.

The walk that finds an IOAM option (RFC 8200 §4.2 TLVs, the Linux kernel's ip6_parse_tlv rules:
options inside the header, padding runs of at most 7 bytes, PadN content zero; segscope's bound of
16 options per header), the IOAM option header constants (RFC 9486 §2) and the error classes both
IOAM codecs share (the same names as the egress program's counters).
"""

from __future__ import annotations

NH_HOPOPTS, NH_ROUTING, NH_DSTOPTS, NH_IPV6 = 0, 43, 60, 41
OPT_PAD1, OPT_PADN = 0x00, 0x01
MAX_PAD = 7
MAX_TLVS = 16
IOAM_OPTION_PREALLOC_TRACE = 0
IOAM_OPTION_E2E = 3
IOAM_ALIGN = 4

# error classes, in the order the checks run (C: enum ioam_decode_err)
TRUNCATED = "truncated"  # the header runs past the buffer
BAD_LENGTH = "bad_length"  # option past its header, padding, alignment, Opt Data Len, RemainingLen, NodeLen
NO_OPTION = "no_option"  # well formed, without the option looked for
UNKNOWN_TYPE = "unknown_type"  # another IOAM Option-Type, Trace-Type or E2E-Type than segscope's
BAD_TIMESTAMP = "bad_timestamp"  # E2E subseconds >= 10^9
SPACE = "space"  # encoder: a value out of range


class MalformedIoam(ValueError):
    """A header the IOAM codecs refuse; `reason` is one of the error classes above."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def find_option(buf: bytes | memoryview, opt_type: int, hdr_align: int = 0) -> int:
    """Offset (from the header start) of the first option of opt_type in the options header at
    buf[0:]; the whole header is walked. Raises MalformedIoam (truncated, bad_length, no_option).
    hdr_align: the header's offset from the IPv6 header mod 4 (0 for segscope's headers)."""
    if len(buf) < 2:
        raise MalformedIoam(TRUNCATED, f"{len(buf)} bytes, an options header needs 2")
    hdr_len = (buf[1] + 1) * 8
    if hdr_len > len(buf):
        raise MalformedIoam(TRUNCATED, f"header of {hdr_len} bytes in a buffer of {len(buf)}")
    off, pad, tlvs, found = 2, 0, 0, None
    while off < hdr_len:
        tlvs += 1
        if tlvs > MAX_TLVS:
            raise MalformedIoam(BAD_LENGTH, f"more than {MAX_TLVS} options")
        if buf[off] == OPT_PAD1:
            pad += 1
            if pad > MAX_PAD:
                raise MalformedIoam(BAD_LENGTH, f"padding of more than {MAX_PAD} bytes at {off}")
            off += 1
            continue
        if off + 2 > hdr_len:
            raise MalformedIoam(BAD_LENGTH, f"option at {off} has no length inside the header")
        opt_len = 2 + buf[off + 1]
        if off + opt_len > hdr_len:
            raise MalformedIoam(BAD_LENGTH, f"option at {off} of {opt_len} bytes runs past the header ({hdr_len})")
        if buf[off] == OPT_PADN:
            pad += opt_len
            if pad > MAX_PAD:
                raise MalformedIoam(BAD_LENGTH, f"padding of more than {MAX_PAD} bytes at {off}")
            if any(buf[off + 2 : off + opt_len]):
                raise MalformedIoam(BAD_LENGTH, f"PadN at {off} is not zero")
        else:
            pad = 0
            if buf[off] == opt_type and found is None:
                if (off + hdr_align) % IOAM_ALIGN:
                    raise MalformedIoam(BAD_LENGTH, f"option at {off} is not 4n-aligned")
                found = off
        off += opt_len
    if found is None:
        raise MalformedIoam(NO_OPTION, f"no option 0x{opt_type:02x}")
    return found
