"""The processors' runtime: what the delay, loss, in-line and topology workers share, one concern
per module.

- config.py      settings from the environment, the `python -m processors.<name>` command line,
                 the Faust settings every processor uses
- health.py      the health endpoint and the counters lines on the metrics topic
- deadletters.py malformed input to the dead-letter topic, with the reason and the original bytes
- topics.py      reading a topic outside the group (offsets, a progress topic at assignment)
- intake.py      the input path: Faust's consumer without its per-event work, batches per fetch
- acks.py        input held until its results are final, acked per partition in offset order
- commits.py     what is committed: never past a message that was not acked (ExactCommits)
- lease.py       publish only while surely still a member of the group (HeartbeatLease)
- clock.py       the time the worker could read its input, for timeouts (ActiveClock)
- input_watch.py whether the worker can read its input now (InputWatch); idle clocks held while not
- moves.py       what a rebalance does to held input and open results (PartitionMoves)
- stopping.py    the worker class: a stop on a signal ends within SEGSCOPE_STOP_TIMEOUT_S
- kafka_pacing.py  aiokafka's failed metadata updates paced (no busy loop without a broker)
"""
