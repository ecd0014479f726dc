"""`gobmp.parsed.ls_link_events`-style notifications: "this link's document changed, re-read it".

Shape (cisco-open/jalapeno gobmp-arango/kafkanotifier/kafkanotifier.go, EventMessage, and
collection.go reliableNotifier): Kafka key = the document `_key`; value = the JSON of
`EventMessage{TopicType, Key "_key", ID "_id", Action "action"}` — `TopicType` has no json tag,
so Go writes it under its field name, as gobmp's message type number (sbezverk/gobmp
pkg/bmp/consts.go: LSLinkMsg = 9); `_id` = `<collection>/<key>`; `action` "add" / "update" / "del".
Consumers (Jalapeno's linkstate-edge, external apps) decode `_key`, `_id`, `action` and set
TopicType from the topic they read.

segscope sends action "update" for each igpv6_graph edge it annotated, `_id` naming that edge
(the edge `_key` is the ls_link `_key`: igp-graph copies it). Note: Jalapeno's current igp-graph
and ip-graph (2025-26) consume the raw `gobmp.parsed.ls_link` topic, not `*_events`; these events
are for the processors and apps that still follow the gobmp-arango event topics.
"""

from __future__ import annotations

import json

DEFAULT_TOPIC = "gobmp.parsed.ls_link_events"
LS_LINK_MSG = 9  # gobmp pkg/bmp/consts.go LSLinkMsg


def link_event(collection: str, key: str, action: str = "update") -> tuple[bytes, bytes]:
    """(Kafka key, value) of one event."""
    value = {"TopicType": LS_LINK_MSG, "_key": key, "_id": f"{collection}/{key}", "action": action}
    return key.encode(), json.dumps(value, separators=(",", ":")).encode()
