"""Every STAMP TLV this tree knows, by Type, and the value check the reflector uses.

Mirror of schemas/c/stamp_tlvs.h. reflect(packet, offset, hmac_verify) applies RFC 8972 §4 with
this table (stamp_tlv.reflect_tlvs does the work).
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

from . import (
    stamp_tlv,
    stamp_tlv_access_report,
    stamp_tlv_class_of_service,
    stamp_tlv_dest_node_addr,
    stamp_tlv_direct_measurement,
    stamp_tlv_extra_padding,
    stamp_tlv_follow_up_telemetry,
    stamp_tlv_hmac,
    stamp_tlv_location,
    stamp_tlv_return_path,
    stamp_tlv_timestamp_info,
)

MODULES: dict[int, ModuleType] = {
    stamp_tlv.TYPE_EXTRA_PADDING: stamp_tlv_extra_padding,
    stamp_tlv.TYPE_LOCATION: stamp_tlv_location,
    stamp_tlv.TYPE_TIMESTAMP_INFO: stamp_tlv_timestamp_info,
    stamp_tlv.TYPE_CLASS_OF_SERVICE: stamp_tlv_class_of_service,
    stamp_tlv.TYPE_DIRECT_MEASUREMENT: stamp_tlv_direct_measurement,
    stamp_tlv.TYPE_ACCESS_REPORT: stamp_tlv_access_report,
    stamp_tlv.TYPE_FOLLOW_UP_TELEMETRY: stamp_tlv_follow_up_telemetry,
    stamp_tlv.TYPE_HMAC: stamp_tlv_hmac,
    stamp_tlv.TYPE_DEST_NODE_ADDR: stamp_tlv_dest_node_addr,
    stamp_tlv.TYPE_RETURN_PATH: stamp_tlv_return_path,
}


def value_check(tlv_type: int, value: bytes) -> Optional[bool]:
    mod = MODULES.get(tlv_type)
    return None if mod is None else mod.value_ok(value)


def reflect(packet: bytes, offset: int = stamp_tlv.BASE_LEN_UNAUTH, hmac_verify: Optional[stamp_tlv.HmacVerify] = None):
    return stamp_tlv.reflect_tlvs(packet, offset, value_check, hmac_verify)
