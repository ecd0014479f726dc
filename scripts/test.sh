#!/usr/bin/env bash
# The test command (README, .ci/run via `make test`). Runs every test as root:
# codec tests in C and Python, datapath tests with real XDP programs in network
# namespaces, and the end-to-end pipeline through real Kafka, InfluxDB and
# Telegraf. Services and namespaces the tests start are stopped by the tests;
# the trap below only sweeps up after a crash.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.local/venv/bin/python

if [ "$(id -u)" != 0 ]; then
  echo "segscope tests need root (network namespaces, eBPF): run as root" >&2
  exit 2
fi

sweep() {
  $PY -m services.stack down --if-unused >/dev/null 2>&1 || true
  for p in te2e ctla ctlbt amlab_gt amlab_e2e agt; do $PY -m netlab down --prefix "$p" >/dev/null 2>&1 || true; done
}
trap sweep EXIT INT TERM

# Lint and format first (ruff.toml): a minute of pytest is not spent on code that fails them.
.local/venv/bin/ruff check . || exit 1
.local/venv/bin/ruff format --check . || { echo "run: .local/venv/bin/ruff format ." >&2; exit 1; }

$PY -m pytest "$@"
