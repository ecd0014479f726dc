"""Node topology views (netlink -> JSON) and their Kafka publisher (schemas/topology.md).

Public API (issue-6 contract, used by agent):
    build_node_view(node, netns) -> dict
    NodeViewPublisher(node, netns, bootstrap, interval_s=30.0, topic="segscope.topology")
        .start() / .stop() / .publish_now()
"""
from collectors.topology.publisher import NodeViewPublisher
from collectors.topology.view import SCHEMA, SCHEMA_VERSION, NodeViewError, build_node_view, view_fingerprint

__all__ = ["NodeViewPublisher", "build_node_view", "view_fingerprint", "NodeViewError", "SCHEMA",
           "SCHEMA_VERSION"]
