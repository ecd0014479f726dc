"""Node topology views (netlink -> JSON) and their Kafka publisher (schemas/topology.md).

Public API (used by the agent):
    build_node_view(node, netns) -> dict
    NodeViewPublisher(node, netns, bootstrap, interval_s=30.0, topic=names.TOPIC_TOPOLOGY)
        .start() / .stop() / .publish_now()
"""

import os
import sys

# The names registry (segscope_schemas) lives in schemas/python (pytest adds it via pytest.ini).
# Make `python -m collectors.topology` runnable from the repository root: add it when missing.
try:
    import segscope_schemas  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "schemas", "python"))

from collectors.topology.publisher import NodeViewPublisher  # noqa: E402
from collectors.topology.view import (  # noqa: E402,E501
    SCHEMA,
    SCHEMA_VERSION,
    NodeViewError,
    build_node_view,
    view_fingerprint,
)

__all__ = ["NodeViewPublisher", "build_node_view", "view_fingerprint", "NodeViewError", "SCHEMA", "SCHEMA_VERSION"]
