#!/usr/bin/env bash
# A single-node Kubernetes cluster on this machine, from the binaries scripts/cluster_build.sh
# builds into .local/k8s/bin (docs/kubernetes-local.md):
#
#   bash scripts/cluster.sh up       PKI, kubeconfigs, etcd, kube-apiserver, kube-controller-manager,
#                                    kube-scheduler, containerd (runc, bridge CNI), kubelet, kube-proxy
#                                    (nftables), the cluster DNS (cluster/dns.py); waits for the node
#   bash scripts/cluster.sh import IMAGE...   buildah's images into containerd (k8s.io namespace)
#   bash scripts/cluster.sh down     stops everything, removes pods' mounts, netns, cgroups, the
#                                    bridge, the node address and kube-proxy's nftables tables
#   bash scripts/cluster.sh env      prints `export KUBECONFIG=...`
#
# Settings (environment): SEGSCOPE_CLUSTER_DIR (state, logs; default .run/cluster),
# SEGSCOPE_CLUSTER_PORT_BASE (ten ports from it; default 30650), SEGSCOPE_CLUSTER_TAG (suffix of
# the bridge and node-address interface names; default k8s). One cluster per machine: the kubelet's
# cgroups (/kubepods) are the machine's; a lock (/run/segscope-cluster.lock) names the owner.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BIN=$REPO/.local/k8s/bin
DIR=${SEGSCOPE_CLUSTER_DIR:-$REPO/.run/cluster}
PB=${SEGSCOPE_CLUSTER_PORT_BASE:-30650}
TAG=${SEGSCOPE_CLUSTER_TAG:-k8s}
LOCK=/run/segscope-cluster.lock
NODE=segscope-node        # also its name in the intent: a Kubernetes-style name, with a hyphen
NODE_IP=172.30.0.1            # on lo: the node's, the API server's, the DNS's
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
BRIDGE=cbr-$TAG
ETCD_PORT=$PB API_PORT=$((PB + 2)) KUBELET_PORT=$((PB + 3)) KUBELET_HEALTH=$((PB + 4))
KCM_PORT=$((PB + 5)) SCHED_PORT=$((PB + 6)) PROXY_METRICS=$((PB + 7)) PROXY_HEALTH=$((PB + 8))
ETCD_PEER=$((PB + 9))
UP_TIMEOUT_S=${SEGSCOPE_CLUSTER_UP_TIMEOUT:-180}
PKI=$DIR/pki LOGS=$DIR/logs PIDS=$DIR/pids
CTR_SOCK=$DIR/containerd/containerd.sock
export PATH=$BIN:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "[cluster] $*"; }
die() { say "ERROR: $*" >&2; exit 1; }
kubectl() { "$BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

# --- PKI: one CA; the API server's serving cert; client certs per identity ---
cert() {  # name CN O [SANs]
    local name=$1 cn=$2 org=$3 sans=${4:-}
    [ -f "$PKI/$name.crt" ] && return
    local ext="$PKI/$name.ext"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' > "$ext"
    [ -n "$sans" ] && echo "subjectAltName=$sans" >> "$ext"
    local subj="/CN=$cn"
    [ -n "$org" ] && subj="/O=$org$subj"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null || die "certificate $name"
}
make_pki() {
    mkdir -p "$PKI"
    if [ ! -f "$PKI/ca.crt" ]; then
        openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -days 30 \
            -subj "/CN=segscope-local-cluster-ca" -out "$PKI/ca.crt" 2>/dev/null || die "CA"
    fi
    cert apiserver kube-apiserver "" \
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$API_SERVICE_IP"
    cert admin admin system:masters
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    cert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,IP:$NODE_IP"
    cert kube-proxy system:kube-proxy ""
    [ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null && openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
}
kubeconfig() {  # file cert-name
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: user
  user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
EOF
}

# --- processes: started in their own session, pid files, logs ---
start() {  # name cmd...
    local name=$1; shift
    setsid "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
    echo $! > "$PIDS/$name.pid"
}
alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }
wait_for() {  # what seconds command...
    local what=$1 secs=$2; shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -ge $deadline ] && die "$what not up within ${secs} s (logs: $LOGS)"
        sleep 0.5
    done
}
stop_proc() {  # name [signal wait]
    local name=$1 pidf=$PIDS/$1.pid
    [ -f "$pidf" ] || return 0
    local pid; pid=$(cat "$pidf")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$pidf"
}

check_binaries() {
    local b
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl containerd containerd-shim-runc-v2 ctr runc; do
        [ -x "$BIN/$b" ] || die "$BIN/$b missing: run bash scripts/cluster_build.sh"
    done
    [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (Debian package containernetworking-plugins)"
}

take_lock() {
    if [ -f "$LOCK" ] && [ "$(cat "$LOCK")" != "$DIR" ]; then
        local other; other=$(cat "$LOCK")
        [ -d "$other/pids" ] && ls "$other"/pids/*.pid >/dev/null 2>&1 \
            && die "another local cluster runs ($other): one per machine (kubelet cgroups); stop it first"
    fi
    echo "$DIR" > "$LOCK"
}

node_network() {
    # the node's address on the root namespace's loopback (this kernel has no dummy links, and the
    # CNI bridge plugin refuses a bridge with an address it did not set)
    ip addr replace "$NODE_IP/32" dev lo
    # the bridge the CNI plugin then uses, made first so that forwarding is on for it alone (a pod's
    # packet to a ClusterIP comes in here and is forwarded back to the pod kube-proxy chose);
    # net.ipv4.ip_forward stays as it is
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" up
    sysctl -qw "net.ipv4.conf.$BRIDGE.forwarding=1"
    # the agent's bpffs volume has mountPropagation HostToContainer, which containerd refuses on
    # a private mount; systemd makes it shared, this machine's init does not
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
    mount --make-shared /sys/fs/bpf
}

write_configs() {
    mkdir -p "$DIR/cni/net.d" "$DIR/containerd" "$DIR/kubelet"
    local version
    version=$(image_version)
    PAUSE_IMAGE=localhost/segscope-pause:$version
    cat > "$DIR/cni/net.d/10-segscope.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "segscope-local",
 "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
    cat > "$DIR/containerd/config.toml" <<EOF
version = 3
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$DIR/containerd/containerd.sock.ttrpc"
[debug]
  address = "$DIR/containerd/debug.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # this machine's processes lack CAP_SYS_RESOURCE (runc init cannot lower oom_score_adj to the
  # sandbox's -998): containerd clamps every container's value to its own
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$BIN/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$DIR/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
    : > "$DIR/kubelet/resolv.conf"
    cat > "$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTH
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/kubelet.crt"
tlsPrivateKeyFile: "$PKI/kubelet.key"
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: "$DIR/kubelet/resolv.conf"
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: "unix://$CTR_SOCK"
podCIDR: $POD_CIDR
maxPods: 60
serializeImagePulls: false
# a shared machine: its disk and memory are others' too, only a near-full disk evicts
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# the machine's cgroups are not systemd's: no node-allocatable enforcement on /
enforceNodeAllocatable: []
cgroupsPerQOS: true
cgroupRoot: /
registerNode: true
protectKernelDefaults: false
EOF
    cat > "$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: "$DIR/kube-proxy.kubeconfig"}
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
metricsBindAddress: 127.0.0.1:$PROXY_METRICS
healthzBindAddress: 127.0.0.1:$PROXY_HEALTH
# pod -> ClusterIP -> a pod on the same bridge: the reply must come back through the host to be
# un-DNATed (no br_netfilter on a shared machine), so every Service connection is masqueraded
nftables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
nodePortAddresses: [$NODE_IP/32]
EOF
}

api_ready() { kubectl get --raw /readyz >/dev/null 2>&1; }

up() {
    check_binaries
    [ "$(id -u)" = 0 ] || die "root needed (containerd, kubelet, network)"
    take_lock
    mkdir -p "$LOGS" "$PIDS"
    local t0=$SECONDS
    make_pki
    kubeconfig "$DIR/admin.kubeconfig" admin
    kubeconfig "$DIR/kubelet.kubeconfig" kubelet
    kubeconfig "$DIR/kube-proxy.kubeconfig" kube-proxy
    node_network
    write_configs
    alive etcd || start etcd "$BIN/etcd" --name node --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
        --initial-cluster "node=http://127.0.0.1:$ETCD_PEER" --listen-metrics-urls "" \
        --quota-backend-bytes 1073741824 --snapshot-count 10000
    alive containerd || start containerd "$BIN/containerd" --config "$DIR/containerd/config.toml"
    alive kube-apiserver || start kube-apiserver "$BIN/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address "$NODE_IP" --secure-port "$API_PORT" --advertise-address "$NODE_IP" \
        --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
        --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC \
        --enable-admission-plugins NodeRestriction --allow-privileged=false \
        --kubelet-preferred-address-types InternalIP \
        --profiling=false --event-ttl 2h
    wait_for kube-apiserver "$UP_TIMEOUT_S" api_ready
    alive kube-controller-manager || start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$DIR/admin.kubeconfig" --authentication-kubeconfig "$DIR/admin.kubeconfig" \
        --authorization-kubeconfig "$DIR/admin.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
        --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
        --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --use-service-account-credentials \
        --profiling=false
    alive kube-scheduler || start kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig "$DIR/admin.kubeconfig" --authentication-kubeconfig "$DIR/admin.kubeconfig" \
        --authorization-kubeconfig "$DIR/admin.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
    wait_for containerd "$UP_TIMEOUT_S" "$BIN/ctr" --address "$CTR_SOCK" version
    import_images "localhost/segscope-pause:$(image_version)"
    alive kubelet || start kubelet "$BIN/kubelet" --config "$DIR/kubelet/config.yaml" \
        --kubeconfig "$DIR/kubelet.kubeconfig" --root-dir "$DIR/kubelet/root" \
        --hostname-override "$NODE" --node-ip "$NODE_IP" --cert-dir "$DIR/kubelet/pki"
    alive kube-proxy || start kube-proxy "$BIN/kube-proxy" --config "$DIR/kube-proxy.yaml"
    alive dns || start dns "$REPO/.local/venv/bin/python" -m cluster.dns --listen "$NODE_IP:53" \
        --server "https://$NODE_IP:$API_PORT" --ca "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key"
    wait_for "node $NODE Ready" "$UP_TIMEOUT_S" node_ready
    volumes
    say "up in $((SECONDS - t0)) s: export KUBECONFIG=$DIR/admin.kubeconfig"
}
# Storage: no provisioner; PersistentVolumes on host folders, without a class, which a claim without
# a class binds (there is no default StorageClass). Mode 0777: the chart's StatefulSets run as uid
# 1000 and the kubelet applies no fsGroup to hostPath volumes.
VOLUMES=4
volumes() {
    local i
    for i in $(seq 1 $VOLUMES); do
        mkdir -p "$DIR/volumes/pv$i" && chmod 0777 "$DIR/volumes/pv$i"
        cat <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: local-pv$i}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: "$DIR/volumes/pv$i", type: Directory}
---
EOF
    done | kubectl apply -f - >/dev/null || die "PersistentVolumes"
}
node_ready() {
    [ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
image_version() {
    "$REPO"/.local/venv/bin/python -c 'import sys; sys.path.insert(0, "'"$REPO"'/schemas/python"); from segscope_schemas.version import __version__; print(__version__)'
}

import_images() {  # image... (buildah's names, e.g. localhost/segscope-agent:0.1.0)
    local img id tar
    source "$REPO/scripts/buildah_storage.sh"  # BUILDAH: the storage scripts/images.sh built on
    for img in "$@"; do
        if "$BIN/ctr" --address "$CTR_SOCK" -n k8s.io images check "name==$img" 2>/dev/null | grep -q "$img"; then
            continue
        fi
        # the archive scripts/images.sh wrote of this very image (its ID in the name), else one now
        id=$("${BUILDAH[@]}" images --noheading --no-trunc --format '{{.ID}}' "$img" 2>/dev/null | head -1)
        tar=$REPO/.run/images/archives/$(archive_name "$img" "$id")
        if [ -z "$id" ] || [ ! -s "$tar" ]; then
            say "import $img (buildah push)"
            tar=$DIR/import.tar
            rm -f "$tar"
            "${BUILDAH[@]}" push -q "$img" "docker-archive:$tar:$img" >/dev/null || die "buildah push $img (make images first)"
        else
            say "import $img (from its archive)"
        fi
        "$BIN/ctr" --address "$CTR_SOCK" -n k8s.io images import "$tar" >/dev/null \
            || die "ctr import $img"
        rm -f "$DIR/import.tar"
    done
}
archive_name() {  # image id: the file name scripts/images.sh gives an image's docker-archive
    local name=${1##*/}
    echo "${name%%:*}-${2#sha256:}.tar"
}

# every mount below a folder, deepest first
unmount_below() {
    local m
    awk -v d="$1" '$2 ~ "^"d {print $2}' /proc/self/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null
    done
}
# the processes of containers this cluster started: their shims name our containerd's socket
shim_pids() {
    local p
    for p in /proc/[0-9]*; do
        { tr "\0" " " < "$p/cmdline"; } 2>/dev/null | grep -q -- "-address $CTR_SOCK" && echo "${p#/proc/}"
    done
}

down() {
    local t0=$SECONDS
    # the kubelet first, so it does not restart what is stopped below
    stop_proc kubelet
    if alive containerd; then
        local c
        for c in $("$BIN/ctr" --address "$CTR_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            "$BIN/ctr" --address "$CTR_SOCK" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1
        done
        sleep 1
        for c in $("$BIN/ctr" --address "$CTR_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            "$BIN/ctr" --address "$CTR_SOCK" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1
        done
    fi
    for name in kube-proxy dns kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
        stop_proc "$name"
    done
    # shims (and through them the containers) that outlived containerd
    local p
    for p in $(shim_pids); do kill -KILL "$p" 2>/dev/null; done
    # what the containers left: their mounts, sandbox netns, the CNI's bridge and addresses
    unmount_below "$DIR/"
    ip link del "$BRIDGE" 2>/dev/null
    ip addr del "$NODE_IP/32" dev lo 2>/dev/null
    nft delete table ip kube-proxy 2>/dev/null
    nft delete table ip6 kube-proxy 2>/dev/null
    # veths of pods whose netns went away go with them; cgroups of the kubelet, deepest first
    local cg
    for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
        [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    # state (logs are kept: $LOGS)
    rm -rf "$DIR/etcd" "$DIR/volumes" "$DIR/containerd" "$DIR/kubelet" "$DIR/cni" "$DIR/pki" "$PIDS"
    [ "$(cat "$LOCK" 2>/dev/null)" = "$DIR" ] && rm -f "$LOCK"
    say "down in $((SECONDS - t0)) s"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    import) shift; import_images "$@" ;;
    env) echo "export KUBECONFIG=$DIR/admin.kubeconfig" ;;
    *) echo "usage: $0 up|down|import IMAGE...|env" >&2; exit 2 ;;
esac
