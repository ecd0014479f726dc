#!/usr/bin/env bash
# The Kubernetes tools of the deploy tests (tests/deploy/), pinned, from the Go module proxy:
#   .local/bin/helm                       in the module it shares with the cluster's Kubernetes
#                                         binaries (scripts/kube_module.sh): what they share compiles once
#   .local/bin/{kustomize,kubeconform,kube-score}   go install, each with its own go.mod (kube-score
#                                         does not compile against k8s.io/apimachinery v0.34)
#   .local/k8s-schemas/   offline JSON schemas for kubeconform (from PyPI's kubernetes-validate,
#                         converted by scripts/k8s_schemas.py; needs .local/venv, `make setup`)
# Idempotent (a stamp file records what was built). About 2-4 min from a cold Go cache: the test
# command (scripts/test.sh) starts this in the background (scripts/test_builds.sh) and the deploy tests,
# which run last, wait for it; run it yourself to use the tools (`bash scripts/k8s_tools.sh`).
# `--binaries`: the Go builds only (no venv needed); the status stays "building".
# The last line of .local/bin/.k8s-tools.status is "ok" or "failed: <what>".
set -uo pipefail
cd "$(dirname "$0")/.."
LOCAL=$PWD/.local
export PATH=$PATH:/usr/local/go/bin
STATUS=$LOCAL/bin/.k8s-tools.status
mkdir -p "$LOCAL/bin"
source scripts/kube_module.sh  # HELM_VERSION, kube_module, kube_go_build

TOOLS=(
    "kustomize sigs.k8s.io/kustomize/kustomize/v5@v5.8.2"
    "kubeconform github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0"
    "kube-score github.com/zegl/kube-score/cmd/kube-score@v1.20.0"
)
SCHEMA_VERSION=v1.33.0

say() { echo "[k8s-tools] $*"; }
fail() { say "ERROR: $*" >&2; echo "failed: $*" >> "$STATUS"; exit 1; }

echo "building" > "$STATUS"
stamp=$LOCAL/bin/.k8s-tools.build
want="helm@$HELM_VERSION (with kubernetes $KUBE_VERSION) ${TOOLS[*]}"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -x "$LOCAL/bin/helm" ]; then
    say "cached (helm, kustomize, kubeconform, kube-score)"
else
    command -v go >/dev/null || fail "go not found (needed to build helm, kustomize, kubeconform, kube-score)"
    t0=$(date +%s)
    say "building helm, kustomize, kubeconform, kube-score in parallel"
    pids=() names=()
    build_helm() {
        kube_module "$LOCAL/bin/.helm.log" || return 1
        # -s -w: no symbol tables, a faster link and half the size; nobody debugs these here
        kube_go_build "$LOCAL/bin/.helm.log" "$LOCAL/bin/.helm.tmp/helm" \
            "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
    }
    rm -rf "$LOCAL/bin/.helm.tmp"; mkdir -p "$LOCAL/bin/.helm.tmp"
    build_helm &
    pids+=($!); names+=(helm)
    for tool in "${TOOLS[@]}"; do
        read -r name pkg <<< "$tool"
        rm -rf "$LOCAL/bin/.$name.tmp"; mkdir -p "$LOCAL/bin/.$name.tmp"
        GOTOOLCHAIN=local GOFLAGS=-buildvcs=false GOBIN=$LOCAL/bin/.$name.tmp \
            go install -gcflags "$NO_DWARF_GCFLAGS" -ldflags "-s -w" "$pkg" > "$LOCAL/bin/.$name.log" 2>&1 &
        pids+=($!); names+=("$name")
    done
    failed=()
    for i in "${!pids[@]}"; do
        name=${names[$i]}
        if wait "${pids[$i]}"; then
            mv "$LOCAL/bin/.$name.tmp/$name" "$LOCAL/bin/$name"; rm -rf "$LOCAL/bin/.$name.tmp"
        else
            failed+=("$name"); tail -20 "$LOCAL/bin/.$name.log" >&2
        fi
    done
    [ "${#failed[@]}" -eq 0 ] || fail "the build of ${failed[*]} (logs: $LOCAL/bin/.<tool>.log)"
    echo "$want" > "$stamp"
    say "built in $(( $(date +%s) - t0 )) s"
fi
[ "${1:-}" = --binaries ] && exit 0
if [ ! -f "$LOCAL/k8s-schemas/$SCHEMA_VERSION-standalone-strict/.complete" ]; then
    "$LOCAL/venv/bin/python" scripts/k8s_schemas.py "$SCHEMA_VERSION" "$LOCAL/k8s-schemas" \
        || fail "schema conversion (pip package kubernetes-validate in .local/venv?)"
fi
echo "ok" >> "$STATUS"
say "ok"
