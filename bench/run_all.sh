#!/usr/bin/env bash
# Every benchmark of segscope, one after the other (`make bench`). Each prints its table and
# rewrites its own section of docs/benchmarks.md (between <!-- name:begin/end --> markers),
# with the machine it ran on. Run on an otherwise idle machine: these are 2-core VMs, and
# every benchmark compares ratios measured within one run rather than absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.local/venv/bin/python
[ "$(id -u)" = 0 ] || { echo "benchmarks need root (namespaces, eBPF)" >&2; exit 2; }
for b in reflector_vs_bounce reflector_userspace_vs_xdp collector_userspace_vs_xdp streamer_records kafka_partition processor_records delay_flush loss_records inline_records topology_points topology_summary freshness stamp_forwarding_capacity altmark_overhead ioam_overhead config_ops steer_evaluate steer_latency; do
  echo "=== bench/$b.py"
  $PY "bench/$b.py" "$@"
done
