#!/usr/bin/env bash
# The binaries of the local single-node Kubernetes cluster (scripts/cluster.sh), built from source
# through the Go module proxy into .local/k8s/bin/, pinned:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl  (k8s.io/kubernetes,
#                                         in the module it shares with Helm: scripts/kube_module.sh)
#   etcd                                  (go.etcd.io/etcd/server/v3's etcdmain, a three-line main)
#   containerd containerd-shim-runc-v2 ctr (github.com/containerd/containerd/v2)
#   runc                                  (github.com/opencontainers/runc, with seccomp)
# The CNI plugins come from Debian (containernetworking-plugins).
#
# Idempotent: a stamp records what was built; nothing is rebuilt when it matches. Heavy (about
# 10 min of both cores from a cold Go cache): Kubernetes first, then the other three side by side
# (below), at its caller's priority. The test command starts it in the background
# (scripts/test_builds.sh); the last line of .local/k8s/.build.status is "ok" or "failed: <what>".
set -uo pipefail
cd "$(dirname "$0")/.."
LOCAL=$PWD/.local
K8S=$LOCAL/k8s
BIN=$K8S/bin
STATUS=$K8S/.build.status
export PATH=$PATH:/usr/local/go/bin GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

source scripts/kube_module.sh  # KUBE_VERSION, KUBE_CMDS, kube_module, kube_go_build
ETCD_VERSION=v3.6.13
CONTAINERD_VERSION=v2.4.2
# Debian's runc 1.1.5 fails every sandbox here ("can't get final child's PID from pipe: EOF",
# kernel 6.18, containerd 2.4): runc is built too, with seccomp (cgo, libseccomp-dev)
RUNC_VERSION=v1.5.3
DEBS=(containernetworking-plugins nftables conntrack libseccomp-dev pkg-config)

say() { echo "[cluster-build] $*"; }
fail() { say "ERROR: $*" >&2; echo "failed: $*" >> "$STATUS"; exit 1; }
mkdir -p "$BIN" "$K8S/src"
echo "building" > "$STATUS"
want="kubernetes=$KUBE_VERSION+helm-$HELM_VERSION etcd=$ETCD_VERSION containerd=$CONTAINERD_VERSION runc=$RUNC_VERSION"
stamp=$K8S/.build.stamp
# one stamp per part (kubernetes, etcd, containerd): a part is rebuilt only when its version
# changed or one of its binaries is missing (from a warm Go cache, the six Kubernetes links alone
# take 24 CPU-s)
part_done() {  # part version binary...
    local part=$1 version=$2; shift 2
    [ "$(cat "$K8S/.build.$part" 2>/dev/null)" = "$version" ] || return 1
    local b
    for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done
}

missing_debs=()
for deb in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "ok installed" || missing_debs+=("$deb")
done
if [ "${#missing_debs[@]}" -gt 0 ]; then
    say "apt-get install ${missing_debs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q "${missing_debs[@]}" \
        > "$K8S/apt.log" 2>&1 || fail "apt-get install ${missing_debs[*]} (log: $K8S/apt.log)"
fi

all_built() {
    local b
    for b in "${KUBE_CMDS[@]}" etcd containerd containerd-shim-runc-v2 ctr runc; do
        [ -x "$BIN/$b" ] || return 1
    done
}
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && all_built; then
    say "cached ($want)"
    echo ok >> "$STATUS"
    exit 0
fi
command -v go >/dev/null || fail "go not found"
t_all=$(date +%s)

# --- Kubernetes: from the module it shares with Helm (scripts/kube_module.sh) ---
build_kubernetes() {
kube_module "$K8S/kube-tidy.log" || fail "the Kubernetes module (log: $K8S/kube-tidy.log)"
# the version the binaries report (kubelet's node status, kubectl version): the release ldflags
local minor=${KUBE_VERSION#v1.} ver_pkg=k8s.io/component-base/version ldflags
ldflags="-s -w -X $ver_pkg.gitVersion=$KUBE_VERSION -X $ver_pkg.gitMajor=1 -X $ver_pkg.gitMinor=${minor%%.*}"
ldflags+=" -X $ver_pkg.gitTreeState=clean -X $ver_pkg.buildDate=1970-01-01T00:00:00Z"
t0=$(date +%s)
say "go build ${KUBE_CMDS[*]} ($KUBE_VERSION)"
pkgs=()
for c in "${KUBE_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
kube_go_build "$K8S/kube-build.log" "$BIN/" "$ldflags" "${pkgs[@]}" || fail "go build kubernetes (log: $K8S/kube-build.log)"
say "kubernetes built in $(($(date +%s) - t0)) s"
}
# the module's Helm version is part of the stamp: it moves the versions the binaries are built against
kube_part=$KUBE_VERSION+helm-$HELM_VERSION
part_done kubernetes "$kube_part" "${KUBE_CMDS[@]}" || { build_kubernetes && echo "$kube_part" > "$K8S/.build.kubernetes"; }

# --- etcd: etcdmain behind a main of our own (the etcd root module is not served) ---
build_etcd() {
etcd_src=$K8S/src/etcd
if [ ! -f "$etcd_src/go.sum" ] || ! grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$etcd_src/go.mod"; then
    rm -rf "$etcd_src" && mkdir -p "$etcd_src"
    printf 'module segscope.local/etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$ETCD_VERSION" > "$etcd_src/go.mod"
    cat > "$etcd_src/main.go" <<'EOF'
// etcd's own main, which lives in the etcd root module (not served by the module proxy).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    (cd "$etcd_src" && go mod tidy) > "$K8S/etcd-tidy.log" 2>&1 || fail "go mod tidy etcd (log: $K8S/etcd-tidy.log)"
fi
t0=$(date +%s)
say "go build etcd ($ETCD_VERSION)"
(cd "$etcd_src" && go build -gcflags "$NO_DWARF_GCFLAGS" -ldflags "-s -w" -o "$BIN/etcd" .) > "$K8S/etcd-build.log" 2>&1 \
    || fail "go build etcd (log: $K8S/etcd-build.log)"
say "etcd built in $(($(date +%s) - t0)) s"
}

# --- containerd and its runc shim ---
build_containerd() {
t0=$(date +%s)
say "go install containerd, containerd-shim-runc-v2, ctr ($CONTAINERD_VERSION)"
# one go command for the three: their packages compile side by side and the three links run at once
# (three commands in a row ended a fresh machine's build with minutes of one-core links)
pkgs=()
for c in containerd containerd-shim-runc-v2 ctr; do pkgs+=("github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD_VERSION"); done
GOBIN=$BIN go install -gcflags "$NO_DWARF_GCFLAGS" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "${pkgs[@]}" > "$K8S/containerd-build.log" 2>&1 || fail "go install containerd (log: $K8S/containerd-build.log)"
say "containerd built in $(($(date +%s) - t0)) s"
}

build_runc() {
    t0=$(date +%s)
    say "go install runc ($RUNC_VERSION, seccomp)"
    CGO_ENABLED=1 GOBIN=$BIN go install -tags seccomp -gcflags "$NO_DWARF_GCFLAGS" -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
        "github.com/opencontainers/runc@$RUNC_VERSION" > "$K8S/runc-build.log" 2>&1 \
        || fail "go install runc (log: $K8S/runc-build.log)"
    say "runc built in $(($(date +%s) - t0)) s"
}
# etcd, containerd and runc side by side, after Kubernetes: their module downloads and links (one
# core each) overlap; one after another, they left the CPU half idle at the end of a fresh machine's
# build. (Each is a module of its own: Go's cache shares a compiled package between them only where
# they require the same version of it.) A part that fails writes its reason to the status file and
# ends its subshell only.
tail_pids=()
part_done etcd "$ETCD_VERSION" etcd || { (build_etcd && echo "$ETCD_VERSION" > "$K8S/.build.etcd") & tail_pids+=($!); }
part_done containerd "$CONTAINERD_VERSION" containerd containerd-shim-runc-v2 ctr \
    || { (build_containerd && echo "$CONTAINERD_VERSION" > "$K8S/.build.containerd") & tail_pids+=($!); }
part_done runc "$RUNC_VERSION" runc || { (build_runc && echo "$RUNC_VERSION" > "$K8S/.build.runc") & tail_pids+=($!); }
tail_failed=0
for pid in "${tail_pids[@]}"; do wait "$pid" || tail_failed=1; done
[ "$tail_failed" = 0 ] || exit 1  # the status file names the part

all_built || fail "a binary is missing from $BIN"
echo "$want" > "$stamp"
say "all built in $(($(date +%s) - t_all)) s"
echo ok >> "$STATUS"
