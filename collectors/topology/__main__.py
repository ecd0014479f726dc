"""python -m collectors.topology: print a node's view, or publish it to Kafka until stopped.

python -m collectors.topology --node A --netns demo-A --print
python -m collectors.topology --node A --netns demo-A --bootstrap 127.0.0.1:19092 [--interval 30]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from collectors.topology import NodeViewError, NodeViewPublisher, build_node_view
from segscope_schemas import names
from segscope_schemas.version import VERSION_LINE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m collectors.topology", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=VERSION_LINE)
    ap.add_argument("--node", required=True, help="node name (Kafka key, router id)")
    ap.add_argument("--netns", default=None, help="network namespace to read (default: own)")
    ap.add_argument("--print", action="store_true", help="print the view as JSON and exit")
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--topic", default=names.TOPIC_TOPOLOGY)
    ap.add_argument("--interval", type=float, default=30.0, help="periodic publish, s")
    ap.add_argument("--poll", type=float, default=1.0, help="change detection period, s")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.print:
        try:
            print(json.dumps(build_node_view(args.node, args.netns), indent=2, sort_keys=True))
        except NodeViewError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    pub = NodeViewPublisher(
        args.node, args.netns, args.bootstrap, interval_s=args.interval, topic=args.topic, poll_s=args.poll
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    pub.start()
    done.wait()
    pub.stop()
    print(json.dumps(pub.counters()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
