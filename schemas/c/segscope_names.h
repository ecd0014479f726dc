/* GENERATED from schemas/names.toml by `python -m segscope_schemas.names --c-header`:
 * edit the TOML, then `make -C schemas names`. Shared names of segscope (Kafka topics,
 * consumer groups, InfluxDB database, bpffs pin root). */
#ifndef SEGSCOPE_NAMES_H
#define SEGSCOPE_NAMES_H

/* STAMP T1-T4 records, stamp_batch (schemas/c/stamp_batch.h); key <node> (stamp_streamer --key node) or <node>/<ssid> (--key session, ustamp) */
#define SEGSCOPE_TOPIC_STAMP_RECORDS "segscope.stamp.records"
/* alternate-marking block counters, altmark_batch (schemas/ALTMARK.md); key <node>/<flow_id> */
#define SEGSCOPE_TOPIC_ALTMARK_BLOCKS "segscope.altmark.blocks"
/* in-line IOAM records of sampled data packets, ioam_batch (schemas/IOAM.md, schemas/c/ioam_record.h); key <node>/<flow_id> (egress node) */
#define SEGSCOPE_TOPIC_IOAM_RECORDS "segscope.ioam.records"
/* the same altmark_batch records re-keyed by flow by the loss processor (processors/loss/keying.py: partition = flow_partition(flow_id)); partitions >= the most loss workers */
#define SEGSCOPE_TOPIC_ALTMARK_BLOCKS_BY_FLOW "segscope.altmark.blocks.by_flow"
/* InfluxDB line protocol (schemas/metrics.md): results and every process's counters */
#define SEGSCOPE_TOPIC_METRICS "segscope.metrics"
/* the summary of segscope.metrics for the topology processor: the newest stamp_delay and complete altmark_loss line of each series, every SEGSCOPE_SUMMARY_INTERVAL_S, from the delay and loss processors when SEGSCOPE_TOPIC_METRICS_NEWEST names it (processors/newest.py) */
#define SEGSCOPE_TOPIC_METRICS_NEWEST "segscope.metrics.newest"
/* records a processor could not decode, with the reason (JSON) */
#define SEGSCOPE_TOPIC_DEADLETTER "segscope.deadletter"
/* node views from the agents (schemas/topology.md); key <node> */
#define SEGSCOPE_TOPIC_TOPOLOGY "segscope.topology"
/* SID list of every STAMP session and flow monitor (schemas/paths.md), compacted; key stamp/<node>/<ssid>/<role> or flow/<node>/<flow_id>/<side> */
#define SEGSCOPE_TOPIC_PATHS "segscope.paths"
/* no records: the replicas of `segscope-controller run` join the consumer group segscope-controller on it; the one Kafka assigns its one partition leads (controller/leader.py). Named after its group; the controller role's ACLs (segscope_kafka/acls.py) allow reading it and that group, nothing else */
#define SEGSCOPE_TOPIC_CONTROLLER_LEADER "segscope-controller.leader"

#define SEGSCOPE_GROUP_TELEGRAF "segscope-telegraf"
#define SEGSCOPE_GROUP_DELAY "segscope-delay"
#define SEGSCOPE_GROUP_LOSS "segscope-loss"
#define SEGSCOPE_GROUP_TOPOLOGY "segscope-topology"
#define SEGSCOPE_GROUP_INLINE "segscope-inline"
#define SEGSCOPE_GROUP_CONTROLLER "segscope-controller"

#define SEGSCOPE_INFLUXDB_DATABASE "segscope"
#define SEGSCOPE_BPFFS_PIN_ROOT "/sys/fs/bpf/segscope"

#endif /* SEGSCOPE_NAMES_H */
