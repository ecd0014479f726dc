"""python -m tests.processors.skip_handover <python -m processors.loss flags>: a loss worker
whose Faust fetch loop loses the hand-over of chosen messages once.

That is what faust-streaming 0.15 does when a rebalance starts while it hands a message to the
streams (processors/worker.py `ExactCommits`): the message is marked read and never reaches
the agent, while later messages of the partition do. Here it happens on demand instead of in
1 of 13 churn runs: SEGSCOPE_TEST_SKIP_HANDOVER="topic:partition:offset[,...]" names the
messages; each skip is printed ("skipped hand-over of ...") so a test can tell it happened."""

from __future__ import annotations

import os
import sys

from faust.transport import consumer as faust_consumer


def skip_handovers(wanted: set[tuple[str, int, int]]) -> None:
    skipped: set[tuple[str, int, int]] = set()
    original_init = faust_consumer.Consumer.__init__

    def __init__(self, *args, **kwargs) -> None:
        original_init(self, *args, **kwargs)
        hand_over = self.callback

        async def callback(message) -> None:
            key = (message.topic, message.partition, message.offset)
            if key in wanted and key not in skipped:
                skipped.add(key)
                print(f"skipped hand-over of {key[0]}:{key[1]}:{key[2]}", file=sys.stderr, flush=True)
                return  # the fetch loop marks it read all the same, as after a cancelled hand-over
            await hand_over(message)

        self.callback = callback

    faust_consumer.Consumer.__init__ = __init__


def main() -> None:
    wanted = set()
    for spec in os.environ.get("SEGSCOPE_TEST_SKIP_HANDOVER", "").split(","):
        if spec:
            topic, partition, offset = spec.rsplit(":", 2)
            wanted.add((topic, int(partition), int(offset)))
    skip_handovers(wanted)
    from processors.loss.__main__ import main as loss_main

    loss_main(sys.argv[1:])


if __name__ == "__main__":
    main()
