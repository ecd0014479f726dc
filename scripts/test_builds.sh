#!/usr/bin/env bash
# What the slowest tests need, built in the background while the rest of the suite runs.
# scripts/test.sh starts this at nice 19 in a process group of its own (.local/bin/.k8s-tools.pid)
# and stops it when the test command ends. The tools first (the deploy tests want them early), then
# the cluster's binaries and the images side by side (the images wait on Debian's mirror and the disk
# much of their time, the binaries on the CPU), each with its status file, whose last line is
# "queued", "building", "ok" or "failed: <what>":
#
#   1. scripts/k8s_tools.sh      helm, kustomize, kubeconform, kube-score      .local/bin/.k8s-tools.status
#   2. scripts/cluster_build.sh  the local cluster's binaries (.local/k8s/bin)  .local/k8s/.build.status
#   3. scripts/images.sh --if-stale   the images, when missing or built from other sources
#                                                                            .run/images/build.status
#
# The tests wait for the part they need while this runs (tests/deploy/k8s.py: the tools, first
# thing after the suite's start; tests/deploy/cluster_install.py: the binaries and the images, in
# the last phase) and build it themselves when it does not run (a plain pytest run). Each part is
# idempotent: on a machine that built them once, this takes seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .local/bin .local/k8s .run/images
# "queued": a status left "ok" by an earlier run must not be read as this run's
echo queued > .local/k8s/.build.status
echo queued > .run/images/build.status
bash scripts/k8s_tools.sh > .local/bin/.k8s-tools.log 2>&1
bash scripts/cluster_build.sh > .local/k8s/build.log 2>&1 &
bash scripts/images.sh --if-stale > .run/images/build.log 2>&1 &
wait
exit 0
