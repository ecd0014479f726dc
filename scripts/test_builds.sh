#!/usr/bin/env bash
# What the slowest tests need, built in the background while the rest of the suite runs.
# scripts/test.sh starts this in a session and process group of its own (.local/bin/.k8s-tools.pid;
# the session weighs like one test group: scripts/test.sh says why)
# before it runs `make setup build`, so that the Go builds use the CPU the setup leaves idle (pip and
# the module proxy's downloads, a one-core make), and stops it when the test command ends. Each part
# has its status file, whose last line is "queued", "building", "ok" or "failed: <what>":
#
#   1. scripts/k8s_tools.sh --binaries   helm, kustomize, kubeconform, kube-score (Go only)
#   2. scripts/cluster_build.sh          the local cluster's binaries    .local/k8s/.build.status
#      after 1: Helm's module holds the Kubernetes binaries too, and one build at a time compiles
#      each package they share once (scripts/kube_module.sh)
#   beside 2, once `make setup build` is done (the venv, the eBPF objects and tools):
#   3. scripts/k8s_tools.sh              the kubeconform schemas, then "ok"  .local/bin/.k8s-tools.status
#   4. scripts/images.sh --if-stale      the images, when missing or built from other sources
#                                                                           .run/images/build.status
#
#   bash scripts/test_builds.sh [--after FILE]   3 and 4 wait until FILE exists (scripts/test.sh
#                                                writes it when `make setup build` is done)
#
# The tests wait for the part they need while this runs (tests/deploy/k8s.py: the tools;
# tests/deploy/cluster_install.py: the binaries and the images, in the last phase) and build it
# themselves when it does not run (a plain pytest run). Each part is idempotent: on a machine that
# built them once, this takes seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
after=
[ "${1:-}" = --after ] && after=${2:?--after FILE}
mkdir -p .local/bin .local/k8s .run/images
# "queued": a status left "ok" by an earlier run must not be read as this run's
echo queued > .local/k8s/.build.status
echo queued > .run/images/build.status
wait_setup() {
    [ -z "$after" ] && return 0
    while [ ! -e "$after" ]; do sleep 1; done
}
bash scripts/k8s_tools.sh --binaries > .local/bin/.k8s-tools.log 2>&1
bash scripts/cluster_build.sh > .local/k8s/build.log 2>&1 &
(wait_setup && bash scripts/k8s_tools.sh >> .local/bin/.k8s-tools.log 2>&1) &
(wait_setup && bash scripts/images.sh --if-stale > .run/images/build.log 2>&1) &
wait
exit 0
