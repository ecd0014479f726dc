#!/usr/bin/env bash
# segscope installer: `make setup` (as root, Debian 12). Idempotent and non-interactive; every step
# is skipped when its result is already in place, so a re-run takes seconds.
#   1. Debian packages (apt-get update + install, one retry; skipped when all are installed)
#   2. Python venv .local/venv from requirements.txt (re-installed when requirements.txt changes)
#   3. Kafka jars .local/kafka/lib from services/kafka/pom.xml (Maven Central)
#   4. Telegraf .local/bin/telegraf, custom build with only the plugins services/telegraf needs
# The Kubernetes tools the deploy tests use are built by scripts/k8s_tools.sh, which the test
# command starts in the background (they are only needed by the last tests).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
LOCAL=$REPO/.local
export DEBIAN_FRONTEND=noninteractive
export PATH=$PATH:/usr/local/go/bin

APT_PACKAGES=(clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev iproute2 tcpdump tshark ethtool gcc
              make pkg-config nftables iputils-ping librdkafka-dev influxdb
              chromium)   # headless, for the report's test (tests/e2e/test_noc_view.py)
# the Debian packages (`make debs`, packaging/debian/) and their tests: a venv on Debian's own
# python3, dpkg-shlibdeps, a clean root to install into (mmdebstrap), systemd-analyze for the units,
# systemd-nspawn to run the agent unit under systemd itself
APT_PACKAGES+=(python3-venv dpkg-dev mmdebstrap systemd systemd-container)
TELEGRAF_VERSION=1.37.2
# Plugins used by services/telegraf/telegraf.conf (custom build: 27 MB and ~1 min instead of
# 400 MB and ~18 min for the full one). Change this list together with the config.
TELEGRAF_TAGS=custom,inputs.kafka_consumer,inputs.internal,outputs.influxdb,outputs.health,parsers.influx,serializers.influx

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

[ "$(id -u)" -eq 0 ] || die "run as root (apt-get, and the tests load eBPF programs)"

# ---------------------------------------------------------------- 1. Debian packages
missing_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

apt_install() {
    apt-get -o DPkg::Lock::Timeout=900 install -y -q --no-install-recommends "$@"
}

install_debian_packages() {
    local wanted=("${APT_PACKAGES[@]}")
    # Java and Maven (Kafka) and the venv module may be preinstalled outside dpkg; only ask apt
    # for them when they are really absent.
    command -v java >/dev/null || wanted+=(default-jre-headless)
    command -v mvn >/dev/null || wanted+=(maven)
    command -v python3 >/dev/null || wanted+=(python3)
    python3 -c 'import venv, ensurepip' 2>/dev/null || wanted+=(python3-venv)
    local missing
    mapfile -t missing < <(missing_packages "${wanted[@]}")
    if [ "${#missing[@]}" -eq 0 ]; then
        say "debian packages: cached (${#wanted[@]} installed)"
        return
    fi
    local t0; t0=$(date +%s)
    say "debian packages: installing ${missing[*]}"
    # Package maintainer scripts must not start daemons (influxdb ships a service on :8086/:8088);
    # policy-rc.d exit 101 = "action forbidden". Put back whatever was there before.
    local policy=/usr/sbin/policy-rc.d saved=""
    if [ -e "$policy" ]; then saved=$(mktemp); cp -p "$policy" "$saved"; fi
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"
    local rc=0
    apt-get -o DPkg::Lock::Timeout=900 update -q || rc=$?
    if [ "$rc" -eq 0 ]; then
        # dpkg sometimes fails once on a fresh machine ("cannot stat pathname" of a temp .deb).
        apt_install "${missing[@]}" || { say "debian packages: install failed, retrying once"; apt_install "${missing[@]}"; } || rc=$?
    fi
    if [ -n "$saved" ]; then mv "$saved" "$policy"; else rm -f "$policy"; fi
    [ "$rc" -eq 0 ] || die "apt-get failed (rc $rc)"
    say "debian packages: installed in $(elapsed "$t0")"
}

# The Debian influxdb package must not leave a daemon behind: stop and disable it if it runs.
ensure_no_system_influxd() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        if systemctl is-active --quiet influxdb 2>/dev/null || systemctl is-enabled --quiet influxdb 2>/dev/null; then
            systemctl disable --now influxdb >/dev/null 2>&1 || true
            say "influxdb: disabled the system service (segscope runs its own on 127.0.0.1:18086)"
        fi
    elif [ -x /etc/init.d/influxdb ] && /etc/init.d/influxdb status >/dev/null 2>&1; then
        /etc/init.d/influxdb stop >/dev/null 2>&1 || true
        say "influxdb: stopped the system service (segscope runs its own on 127.0.0.1:18086)"
    fi
    if command -v ss >/dev/null && ss -Hltn 'sport = :8086 or sport = :8088' | grep -q .; then
        say "WARNING: something listens on :8086/:8088 (a system influxd?); segscope uses 18086/18088"
    fi
}

# ---------------------------------------------------------------- 2. Python venv
# The venv's python finds the repository's packages (agent, processors, services, netlab, ...)
# and the wire-format package (schemas/python) from any directory: one .pth file.
repo_pth() {
    local site; site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n%s\n' "$REPO" "$REPO/schemas/python" > "$site/segscope.pth"
}
setup_venv() {
    local venv=$LOCAL/venv stamp=$LOCAL/venv/.requirements.sha256 want
    want=$(sha256sum requirements.txt | cut -d' ' -f1)
    [ -x "$venv/bin/python" ] && repo_pth "$venv"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        say "python venv: cached ($venv)"
        return
    fi
    local t0; t0=$(date +%s)
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
    repo_pth "$venv"
    echo "$want" > "$stamp"
    say "python venv: installed requirements.txt in $(elapsed "$t0")"
}

# ---------------------------------------------------------------- 3. Kafka jars
setup_kafka_jars() {
    local pom=services/kafka/pom.xml lib=$LOCAL/kafka/lib version
    version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
    [ -n "$version" ] || die "no <kafka.version> in $pom"
    if [ -f "$lib/kafka_2.13-$version.jar" ]; then
        say "kafka jars: cached (Kafka $version, $(ls "$lib" | wc -l) jars)"
        return
    fi
    command -v mvn >/dev/null || die "mvn not found"
    local t0 tmp; t0=$(date +%s)
    tmp=$LOCAL/kafka/lib.tmp
    rm -rf "$tmp"; mkdir -p "$tmp"
    # Into a temp dir first: an interrupted download never looks like a complete one.
    # Maven's output (ANSI codes even in batch mode) goes to a log, shown only on failure.
    mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime \
        > "$LOCAL/kafka/mvn.log" 2>&1 || { tail -30 "$LOCAL/kafka/mvn.log" >&2; die "mvn failed (log: $LOCAL/kafka/mvn.log)"; }
    rm -rf "$lib"; mv "$tmp" "$lib"
    say "kafka jars: Kafka $version, $(ls "$lib" | wc -l) jars in $(elapsed "$t0")"
}

# ---------------------------------------------------------------- 4. Telegraf
setup_telegraf() {
    local bin=$LOCAL/bin/telegraf stamp=$LOCAL/bin/.telegraf.build want
    want="$TELEGRAF_VERSION $TELEGRAF_TAGS"
    if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
            && "$bin" --version 2>/dev/null | grep -q "Telegraf $TELEGRAF_VERSION"; then
        say "telegraf: cached ($("$bin" --version))"
        return
    fi
    command -v go >/dev/null || die "go not found (Go >= 1.24 needed to build Telegraf $TELEGRAF_VERSION)"
    local t0 tmp; t0=$(date +%s)
    tmp=$LOCAL/bin/.telegraf.tmp
    rm -rf "$tmp"; mkdir -p "$tmp"
    say "telegraf: building v$TELEGRAF_VERSION with $TELEGRAF_TAGS (about 1-2 min)"
    # No DWARF and no symbol table, as the other Go builds (scripts/kube_module.sh): measured alone
    # from a cold build cache, 70 against 86 CPU-s and 37 against 46 s; the binary 27 against 39 MB
    GOTOOLCHAIN=local GOFLAGS=-buildvcs=false GOBIN=$tmp go install -gcflags all=-dwarf=false \
        -ldflags "-s -w -X github.com/influxdata/telegraf/internal.Version=$TELEGRAF_VERSION" \
        -tags "$TELEGRAF_TAGS" "github.com/influxdata/telegraf/cmd/telegraf@v$TELEGRAF_VERSION"
    mv "$tmp/telegraf" "$bin"; rmdir "$tmp"
    echo "$want" > "$stamp"
    say "telegraf: built $("$bin" --version) in $(elapsed "$t0")"
}

T0=$(date +%s)
mkdir -p "$LOCAL/bin" "$LOCAL/kafka"
install_debian_packages
ensure_no_system_influxd
setup_venv
setup_kafka_jars
setup_telegraf
say "done in $(elapsed "$T0")"
