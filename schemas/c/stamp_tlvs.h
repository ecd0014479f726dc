/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Every STAMP TLV this tree knows and the value check the reflector uses
 * (pass stamp_tlvs_value_check to stamp_tlv_reflect). Python mirror:
 * segscope_schemas/stamp_tlvs.py. Map: schemas/STAMP.md.
 */
#ifndef SEGSCOPE_STAMP_TLVS_H
#define SEGSCOPE_STAMP_TLVS_H
#include "stamp_tlv.h"
#include "stamp_tlv_extra_padding.h"
#include "stamp_tlv_location.h"
#include "stamp_tlv_timestamp_info.h"
#include "stamp_tlv_class_of_service.h"
#include "stamp_tlv_direct_measurement.h"
#include "stamp_tlv_access_report.h"
#include "stamp_tlv_follow_up_telemetry.h"
#include "stamp_tlv_hmac.h"
#include "stamp_tlv_dest_node_addr.h"
#include "stamp_tlv_return_path.h"

/* 1 understood and valid, 0 malformed, -1 Type not understood. */
static inline int stamp_tlvs_value_check(__u8 type, const __u8 *v, __u16 len)
{
	switch (type) {
	case STAMP_TLV_EXTRA_PADDING:       return stamp_tlv_extra_padding_value_ok(v, len);
	case STAMP_TLV_LOCATION:            return stamp_tlv_location_value_ok(v, len);
	case STAMP_TLV_TIMESTAMP_INFO:      return stamp_tlv_timestamp_info_value_ok(v, len);
	case STAMP_TLV_CLASS_OF_SERVICE:    return stamp_tlv_class_of_service_value_ok(v, len);
	case STAMP_TLV_DIRECT_MEASUREMENT:  return stamp_tlv_direct_measurement_value_ok(v, len);
	case STAMP_TLV_ACCESS_REPORT:       return stamp_tlv_access_report_value_ok(v, len);
	case STAMP_TLV_FOLLOW_UP_TELEMETRY: return stamp_tlv_follow_up_telemetry_value_ok(v, len);
	case STAMP_TLV_HMAC:                return stamp_tlv_hmac_value_ok(v, len);
	case STAMP_TLV_DEST_NODE_ADDR:      return stamp_tlv_dest_node_addr_value_ok(v, len);
	case STAMP_TLV_RETURN_PATH:         return stamp_tlv_return_path_value_ok(v, len);
	default:                            return -1;
	}
}
#endif
