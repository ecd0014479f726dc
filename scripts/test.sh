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
  # the background build of the Kubernetes tools, if it still runs (its own process group)
  [ -n "${K8S_PID:-}" ] && kill -- "-$K8S_PID" 2>/dev/null
  $PY -m services.stack down --if-unused >/dev/null 2>&1 || true
  for p in te2e ctla ctlbt amlab_gt amlab_e2e agt dpl tsec; do $PY -m netlab down --prefix "$p" >/dev/null 2>&1 || true; done
}
trap sweep EXIT INT TERM

# The Kubernetes tools of tests/deploy/ (helm, kustomize, kubeconform, kube-score: 3-5 min of
# `go install` from cold) build in the background at the lowest priority while the other tests
# run; the deploy tests run last (tests/conftest.py) and wait for it (tests/deploy/k8s.py).
mkdir -p .local/bin
nice -n 19 setsid bash scripts/k8s_tools.sh > .local/bin/.k8s-tools.log 2>&1 &
K8S_PID=$!
echo "$K8S_PID" > .local/bin/.k8s-tools.pid

# Lint and format first (ruff.toml): a minute of pytest is not spent on code that fails them.
.local/venv/bin/ruff check . || exit 1
.local/venv/bin/ruff format --check . || { echo "run: .local/venv/bin/ruff format ." >&2; exit 1; }

$PY -m pytest "$@"
