#!/usr/bin/env bash
# The binaries of the local single-node Kubernetes cluster (scripts/cluster.sh), built from source
# through the Go module proxy into .local/k8s/bin/, pinned:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl  (k8s.io/kubernetes)
#   etcd                                  (go.etcd.io/etcd/server/v3's etcdmain, a three-line main)
#   containerd containerd-shim-runc-v2 ctr (github.com/containerd/containerd/v2)
#   runc                                  (github.com/opencontainers/runc, with seccomp)
# The CNI plugins come from Debian (containernetworking-plugins).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the k8s.io/* staging modules by
# folders of its own tree. A wrapper module requires it and replaces each staging module by the
# published v0.<minor>.<patch> of the same release instead (the list is read from kubernetes' go.mod).
#
# Idempotent: a stamp records what was built; nothing is rebuilt when it matches. Heavy (about
# 10 min of both cores from a cold Go cache): one go build at a time, at its caller's priority. The test
# command starts it in the background at nice 19 (scripts/test.sh); the last line of
# .local/k8s/.build.status is "ok" or "failed: <what>".
set -uo pipefail
cd "$(dirname "$0")/.."
LOCAL=$PWD/.local
K8S=$LOCAL/k8s
BIN=$K8S/bin
STATUS=$K8S/.build.status
export PATH=$PATH:/usr/local/go/bin GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

KUBE_VERSION=v1.34.4
ETCD_VERSION=v3.6.13
CONTAINERD_VERSION=v2.4.2
# Debian's runc 1.1.5 fails every sandbox here ("can't get final child's PID from pipe: EOF",
# kernel 6.18, containerd 2.4): runc is built too, with seccomp (cgo, libseccomp-dev)
RUNC_VERSION=v1.5.3
KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
DEBS=(containernetworking-plugins nftables conntrack libseccomp-dev pkg-config)

say() { echo "[cluster-build] $*"; }
fail() { say "ERROR: $*" >&2; echo "failed: $*" >> "$STATUS"; exit 1; }
mkdir -p "$BIN" "$K8S/src"
echo "building" > "$STATUS"
want="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION containerd=$CONTAINERD_VERSION runc=$RUNC_VERSION"
stamp=$K8S/.build.stamp
# one stamp per part (kubernetes, etcd, containerd): a part is rebuilt only when its version
# changed or one of its binaries is missing (linking the six Kubernetes binaries alone is minutes)
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

# --- Kubernetes: the wrapper module ---
build_kubernetes() {
kube_src=$K8S/src/kubernetes
minor=${KUBE_VERSION#v1.}   # 34.4
if [ ! -f "$kube_src/go.sum" ] || ! grep -q "k8s.io/kubernetes $KUBE_VERSION" "$kube_src/go.mod"; then
    say "wrapper module for k8s.io/kubernetes $KUBE_VERSION"
    rm -rf "$kube_src" && mkdir -p "$kube_src"
    kube_mod=$(cd "$kube_src" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
        | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    [ -f "$kube_mod" ] || fail "go mod download k8s.io/kubernetes@$KUBE_VERSION"
    {
        echo "module segscope.local/kubebuild"
        echo
        echo "go 1.24"
        echo
        echo "require k8s.io/kubernetes $KUBE_VERSION"
        echo
        # every `k8s.io/x => ./staging/src/k8s.io/x` of kubernetes' go.mod, pinned to v0.<minor>
        sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 v0.'"$minor"'#p' "$kube_mod"
    } > "$kube_src/go.mod"
    {
        echo "//go:build tools"
        echo
        echo "package kubebuild"
        echo
        echo "import ("
        for c in "${KUBE_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
        echo ")"
    } > "$kube_src/tools.go"
    (cd "$kube_src" && go mod tidy -e) > "$K8S/kube-tidy.log" 2>&1 || fail "go mod tidy (log: $K8S/kube-tidy.log)"
fi
# the version the binaries report (kubelet's node status, kubectl version): the release ldflags
ver_pkg=k8s.io/component-base/version
ldflags="-s -w -X $ver_pkg.gitVersion=$KUBE_VERSION -X $ver_pkg.gitMajor=1 -X $ver_pkg.gitMinor=${minor%%.*}"
ldflags+=" -X $ver_pkg.gitTreeState=clean -X $ver_pkg.buildDate=1970-01-01T00:00:00Z"
t0=$(date +%s)
say "go build ${KUBE_CMDS[*]} ($KUBE_VERSION)"
pkgs=()
for c in "${KUBE_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
(cd "$kube_src" && go build -tags tools -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}") \
    > "$K8S/kube-build.log" 2>&1 || fail "go build kubernetes (log: $K8S/kube-build.log)"
say "kubernetes built in $(($(date +%s) - t0)) s"
}
part_done kubernetes "$KUBE_VERSION" "${KUBE_CMDS[@]}" || { build_kubernetes && echo "$KUBE_VERSION" > "$K8S/.build.kubernetes"; }

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
(cd "$etcd_src" && go build -ldflags "-s -w" -o "$BIN/etcd" .) > "$K8S/etcd-build.log" 2>&1 \
    || fail "go build etcd (log: $K8S/etcd-build.log)"
say "etcd built in $(($(date +%s) - t0)) s"
}
part_done etcd "$ETCD_VERSION" etcd || { build_etcd && echo "$ETCD_VERSION" > "$K8S/.build.etcd"; }

# --- containerd and its runc shim ---
build_containerd() {
t0=$(date +%s)
say "go install containerd, containerd-shim-runc-v2, ctr ($CONTAINERD_VERSION)"
for c in containerd containerd-shim-runc-v2 ctr; do
    GOBIN=$BIN go install -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD_VERSION" > "$K8S/$c-build.log" 2>&1 \
        || fail "go install $c (log: $K8S/$c-build.log)"
done
say "containerd built in $(($(date +%s) - t0)) s"
}
part_done containerd "$CONTAINERD_VERSION" containerd containerd-shim-runc-v2 ctr \
    || { build_containerd && echo "$CONTAINERD_VERSION" > "$K8S/.build.containerd"; }

build_runc() {
    t0=$(date +%s)
    say "go install runc ($RUNC_VERSION, seccomp)"
    CGO_ENABLED=1 GOBIN=$BIN go install -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
        "github.com/opencontainers/runc@$RUNC_VERSION" > "$K8S/runc-build.log" 2>&1 \
        || fail "go install runc (log: $K8S/runc-build.log)"
    say "runc built in $(($(date +%s) - t0)) s"
}
part_done runc "$RUNC_VERSION" runc || { build_runc && echo "$RUNC_VERSION" > "$K8S/.build.runc"; }

all_built || fail "a binary is missing from $BIN"
echo "$want" > "$stamp"
say "all built in $(($(date +%s) - t_all)) s"
echo ok >> "$STATUS"
