#!/usr/bin/env bash
# The test command (README, .ci/run via `make test`). Runs every test as root:
# codec tests in C and Python, datapath tests with real XDP programs in network
# namespaces, and the end-to-end pipeline through real Kafka, InfluxDB and
# Telegraf. Lint first, then scripts/test_groups.py: the suite in parallel groups,
# each with its own service stack (tests/README.md). Services and namespaces the
# tests start are stopped by the tests; the runner sweeps up after a crash or an
# interrupt, and the trap below after the runner.
#
#   bash scripts/test.sh                    setup, build, then everything (make test)
#   bash scripts/test.sh --quick            units, codecs, BPF_PROG_TEST_RUN; no services (make test-quick,
#                                           after its setup and build)
#   bash scripts/test.sh tests/agent -x     setup, build, then these pytest arguments, as one group with
#                                           its own stack
#   bash scripts/test.sh --plan             how the suite is split, without running it
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.local/venv/bin/python

if [ "$(id -u)" != 0 ]; then
  echo "segscope tests need root (network namespaces, eBPF): run as root" >&2
  exit 2
fi

quick=0
for arg in "$@"; do [ "$arg" = --quick ] && quick=1; done

sweep() {
  # the background builds (scripts/test_builds.sh), if they still run (their own process group);
  # CONT after TERM: a runner that died while an [alone] module had them stopped left them so
  [ -n "${K8S_PID:-}" ] && kill -- "-$K8S_PID" 2>/dev/null && kill -CONT -- "-$K8S_PID" 2>/dev/null
  # the runner, if a signal ended this script first: it interrupts its groups and sweeps them
  if [ -n "${RUNNER_PID:-}" ] && kill -0 "$RUNNER_PID" 2>/dev/null; then
    kill -TERM "$RUNNER_PID" 2>/dev/null
    wait "$RUNNER_PID" 2>/dev/null
  fi
  # the default stack and labs of this checkout, should a plain pytest run have left them
  $PY -m services.stack down --if-unused >/dev/null 2>&1 || true
  for state in .run/netlab/*/state.json; do
    [ -e "$state" ] && $PY -m netlab down --prefix "$(basename "$(dirname "$state")")" >/dev/null 2>&1
  done
  return 0
}
trap sweep EXIT
# a signal: the EXIT trap does the sweeping (the runner gets the signal and tears its groups down)
trap 'exit 130' INT
trap 'exit 143' TERM

# What the slowest tests need builds in the background while the other tests run
# (scripts/test_builds.sh): the Kubernetes tools of tests/deploy/, then the local cluster's binaries
# (about 10 min of both cores from cold) and the images (several minutes) of the cluster test, which
# runs last. The Go builds start first, before `make setup build`, whose pip and download waits and
# one-core make leave a fresh machine's CPU half idle; the parts that need the venv and the build
# wait for it (the file $ready). The tests wait for their part.
#
# The builds run in a session of their own, and each test group in its own (scripts/test_groups.py).
# With the kernel's autogroup scheduling (kernel.sched_autogroup_enabled, on here and by default) a
# session is one scheduling group, whose weight is its autogroup's nice (0), not its processes': the
# builds together get the share of one more test group. Measured here, CPU-bound loops on one CPU:
# a nice-19 loop in a session of its own took 50 % beside a nice-0 loop of another session, 1.4 % in
# the same session. That share lets a fresh machine's builds end about a minute after the [alone]
# phase, and the groups' tests pass beside it; the [alone] groups' did not, so while those measure
# the runner moves the builds into an idle cpu cgroup, where they use only CPU time nothing else
# wants (scripts/test_groups.py BackgroundBuilds). nice 19 keeps them at the bottom where autogroups
# are off.
if [ "$quick" = 0 ]; then
  mkdir -p .local/bin
  ready=.local/bin/.test-builds.ready
  rm -f "$ready"
  nice -n 19 setsid bash scripts/test_builds.sh --after "$ready" > .local/bin/.test-builds.log 2>&1 &
  K8S_PID=$!
  echo "$K8S_PID" > .local/bin/.k8s-tools.pid
  make --no-print-directory setup build || exit 1
  touch "$ready"
fi

# Lint and format first (ruff.toml): a minute of pytest is not spent on code that fails them.
.local/venv/bin/ruff check . || exit 1
.local/venv/bin/ruff format --check . || { echo "run: .local/venv/bin/ruff format ." >&2; exit 1; }

# In the background and waited for, so that a signal to this script runs its trap at once.
$PY scripts/test_groups.py "$@" &
RUNNER_PID=$!
wait "$RUNNER_PID"
rc=$?
RUNNER_PID=
exit "$rc"
