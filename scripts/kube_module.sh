# Sourced by scripts/k8s_tools.sh and scripts/cluster_build.sh: the one Go module that builds Helm and
# the local cluster's Kubernetes binaries, so that the packages they share (k8s.io/api, apimachinery,
# client-go, apiserver, kubectl, protobuf, gRPC: about 120 CPU-s of a cold 550) compile once. Go's
# build cache reuses a compiled package only when every dependency below it is the same version,
# which two modules with go.mod files of their own never give; one module does.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the k8s.io/* staging modules by
# folders of its own tree. This module requires it and replaces each staging module by the published
# v0.<minor>.<patch> of the same release instead (the list is read from kubernetes' go.mod). Helm is
# the release built on the same k8s.io/* minor (v3.20 and later need v0.35).
#
#   kube_module LOG     makes .local/k8s/src/kubebuild (once per version pair; under a lock, as the
#                       two scripts may run at once); returns non-zero with the reason in LOG
#   kube_go_build LOG OUTDIR LDFLAGS PKG...   go build in that module

KUBE_VERSION=v1.34.4
HELM_VERSION=v3.19.5
KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
KUBE_MODULE=$PWD/.local/k8s/src/kubebuild
# No DWARF from the compiler: the binaries are linked with -s -w, which drops it anyway (4 % of a
# cold build's CPU)
NO_DWARF_GCFLAGS=all=-dwarf=false

kube_module() {
    local log=$1 minor=${KUBE_VERSION#v1.} want kube_mod
    want="kubernetes=$KUBE_VERSION helm=$HELM_VERSION"
    mkdir -p "$KUBE_MODULE"
    (
        flock 9
        [ "$(cat "$KUBE_MODULE/.made" 2>/dev/null)" = "$want" ] && [ -f "$KUBE_MODULE/go.sum" ] && exit 0
        rm -f "$KUBE_MODULE"/go.* "$KUBE_MODULE/.made"
        kube_mod=$(cd "$KUBE_MODULE" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
            | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
        [ -f "$kube_mod" ] || { echo "go mod download k8s.io/kubernetes@$KUBE_VERSION failed"; exit 1; }
        {
            echo "module segscope.local/kubebuild"
            echo
            echo "go 1.24"
            echo
            echo "require ("
            echo "	k8s.io/kubernetes $KUBE_VERSION"
            echo "	helm.sh/helm/v3 $HELM_VERSION"
            echo ")"
            echo
            # every `k8s.io/x => ./staging/src/k8s.io/x` of kubernetes' go.mod, pinned to v0.<minor>
            sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 v0.'"$minor"'#p' "$kube_mod"
        } > "$KUBE_MODULE/go.mod"
        {
            echo "//go:build tools"
            echo
            echo "package kubebuild"
            echo
            echo "import ("
            local c
            for c in "${KUBE_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
            echo "	_ \"helm.sh/helm/v3/cmd/helm\""
            echo ")"
        } > "$KUBE_MODULE/tools.go"
        (cd "$KUBE_MODULE" && go mod tidy -e) || { echo "go mod tidy failed"; exit 1; }
        echo "$want" > "$KUBE_MODULE/.made"
    ) 9> "$KUBE_MODULE.lock" > "$log" 2>&1
}

kube_go_build() {
    local log=$1 out=$2 ldflags=$3
    shift 3
    (cd "$KUBE_MODULE" && GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
        go build -tags tools -gcflags "$NO_DWARF_GCFLAGS" -ldflags "$ldflags" -o "$out" "$@") > "$log" 2>&1
}
