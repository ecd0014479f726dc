#!/usr/bin/env bash
# Container images of segscope, built without a daemon and without a registry (`make images`, root):
#   1. a Debian bookworm base from Debian's packages (mmdebstrap, minbase + the runtime libraries)
#   2. buildah (chroot isolation; overlay storage where it works, else vfs: scripts/buildah_storage.sh)
#      builds scripts/python.Containerfile (the base + a venv with segscope) and each service's
#      Containerfile FROM that layer:
#        agent/Containerfile       localhost/segscope-agent:VERSION       (eBPF objects + C tools + agent)
#        processors/Containerfile  localhost/segscope-processors:VERSION  (delay, loss, topology; non-root)
#        controller/Containerfile  localhost/segscope-controller:VERSION  (non-root)
#        services/telegraf/Containerfile  localhost/segscope-telegraf:VERSION  (on the base; non-root)
#   3. the chart's bundled services and the pod sandbox, for a cluster with no registry
#      (scripts/cluster.sh imports them): a second Debian base with OpenJDK 17 and influxdb 1.6, then
#        services/kafka/Containerfile     localhost/segscope-kafka:VERSION     (Maven Central's jars)
#        services/influxdb/Containerfile  localhost/segscope-influxdb:VERSION  (Debian's influxd)
#        cluster/pause.Containerfile      localhost/segscope-pause:VERSION     (cluster/pause.c, static)
# segscope's wheel and every dependency's are made on this host (`pip wheel .`, after `make build`:
# generated protobuf code, C tools) and installed offline in the image: no network in the build.
# The test command builds them in the background (`images.sh --if-stale`: only when an image is
# missing or the sources changed; about 3-4 min, more from cold) for the cluster test, which runs last.
# tests/packaging checks the wheel the images install.
# `images.sh sources-hash` prints the hash of the sources the images are built from; each image
# carries it as its label segscope.sources (and a build writes it to .run/images/sources.sha256), so
# that `--if-stale` rebuilds only when they changed, also from a fresh clone of the same sources.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
sources_hash() {  # every tracked file but the tests and the docs, as it is in the work tree
    # (a scratch index: the same hash before and after a commit of the same content)
    local index
    index=$(mktemp)
    GIT_INDEX_FILE=$index git read-tree HEAD
    GIT_INDEX_FILE=$index git add -u
    GIT_INDEX_FILE=$index git ls-files -s -- . ':!tests' ':!docs' ':!*.md' | sha256sum | cut -d' ' -f1
    rm -f "$index"
}
if [ "${1:-}" = sources-hash ]; then
    sources_hash
    exit 0
fi
VERSION=$(.local/venv/bin/python -c 'import sys; sys.path.insert(0, "schemas/python"); from segscope_schemas.version import __version__; print(__version__)')
WORK=$REPO/.run/images
IMAGES=(agent processors controller telegraf kafka influxdb pause)
say() { echo "[images] $*"; }
mkdir -p "$WORK"
# The last line of $WORK/build.status: "building", "ok" or "failed: <what>" (scripts/test_builds.sh
# runs this in the background of the test command; tests/deploy/cluster_install.py waits for it).
STATUS=$WORK/build.status
echo building > "$STATUS"
trap 'rc=$?; [ "$rc" = 0 ] || echo "failed: exit $rc (the output of scripts/images.sh says why)" >> "$STATUS"' EXIT

current() {  # every image there, built from the tree's sources as they are now (its label says so)
    local want name built
    want=$(sources_hash)
    for name in "${IMAGES[@]}"; do
        built=$("${BUILDAH[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "segscope.sources"}}' \
            "localhost/segscope-$name:$VERSION" 2>/dev/null) || return 1
        [ "$built" = "$want" ] || return 1
    done
    echo "$want" > "$WORK/sources.sha256"
}
apt_install() {  # beside other builds of the test command: wait for dpkg's lock, do not fail on it
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q "$@"
}
command -v mmdebstrap >/dev/null || apt_install mmdebstrap
command -v buildah >/dev/null || apt_install buildah
source scripts/buildah_storage.sh  # BUILDAH
# segscope's images that an older build left on the other storage: gigabytes nothing reads
for driver in overlay vfs; do
    [ "$driver" != "${BUILDAH[2]}" ] && [ -d "/var/lib/containers/storage/$driver-images" ] || continue
    mapfile -t old < <(buildah --storage-driver "$driver" images -q --filter 'reference=localhost/segscope-*' 2>/dev/null)
    if [ "${#old[@]}" -gt 0 ]; then
        say "removing segscope's images from the $driver storage"
        buildah --storage-driver "$driver" rmi -f "${old[@]}" >/dev/null 2>&1 || true
        buildah --storage-driver "$driver" rmi --prune >/dev/null 2>&1 || true
    fi
done
# Each image as a docker-archive named after its ID (.run/images/archives/), which scripts/cluster.sh
# imports into containerd: pushed here, in the background of the test command, not in the cluster
# test's time. Archives of images that are no longer current are removed.
write_archives() {
    local keep=() name img id tar
    mkdir -p "$WORK/archives"
    for name in "${IMAGES[@]}"; do
        img=localhost/segscope-$name:$VERSION
        id=$("${BUILDAH[@]}" images --noheading --no-trunc --format '{{.ID}}' "$img" | head -1)
        tar=segscope-$name-${id#sha256:}.tar
        keep+=("$tar")
        [ -s "$WORK/archives/$tar" ] && continue
        "${BUILDAH[@]}" push -q "$img" "docker-archive:$WORK/archives/.$tar:$img" >/dev/null
        mv "$WORK/archives/.$tar" "$WORK/archives/$tar"
    done
    for tar in "$WORK"/archives/*.tar; do
        [ -e "$tar" ] || continue
        [[ " ${keep[*]} " == *" ${tar##*/} "* ]] || rm -f "$tar"
    done
    rm -f "$WORK"/archives/.*.tar
}
if [ "${1:-}" = --if-stale ] && current; then
    say "current (built from these sources: $(cat "$WORK/sources.sha256"))"
    write_archives
    echo ok >> "$STATUS"
    exit 0
fi
SOURCES_HASH=$(sources_hash)  # before the build: a source changed during it makes the next run rebuild

# 1. base image: the Debian runtime packages the programs need, nothing to build with
if ! "${BUILDAH[@]}" inspect --type image "localhost/segscope-base:$VERSION" >/dev/null 2>&1; then
    say "base: mmdebstrap bookworm (minbase + runtime libraries)"
    mmdebstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,libbpf1,libelf1,zlib1g,librdkafka1,iproute2,ethtool \
        bookworm "$WORK/rootfs.tar"
    ctr=$("${BUILDAH[@]}" from scratch)
    tar -C "$("${BUILDAH[@]}" mount "$ctr")" -xf "$WORK/rootfs.tar"
    "${BUILDAH[@]}" umount "$ctr" >/dev/null
    "${BUILDAH[@]}" commit -q "$ctr" "localhost/segscope-base:$VERSION" >/dev/null
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
    rm -f "$WORK/rootfs.tar"
fi

# 2. the wheel and the C tools the images copy (build context: $WORK/context)
rm -rf "$WORK/context" && mkdir -p "$WORK/context"
# from a copy of the tree: setuptools writes build/lib and build/bdist.* into the folder it builds,
# and the packaging tests build from the tree at the same time (the test command runs both)
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
tar -C "$REPO" --exclude=./.git --exclude=./.local --exclude=./.run --exclude=./build/lib \
    --exclude='./build/bdist.*' --exclude='./*.egg-info' -cf - . | tar -C "$WORK/src" -xf -
.local/venv/bin/pip wheel -q -w "$WORK/context/wheels" "$WORK/src"
rm -rf "$WORK/src"
mkdir -p "$WORK/context/build" && cp -r build/datapath build/collectors "$WORK/context/build/"
cp .local/bin/telegraf services/telegraf/telegraf.conf "$WORK/context/"
say "python layer: buildah bud scripts/python.Containerfile (venv, wheels installed offline)"
"${BUILDAH[@]}" bud -q --isolation chroot --build-arg "VERSION=$VERSION" --label "segscope.sources=$SOURCES_HASH" \
    -f "$REPO/scripts/python.Containerfile" -t "localhost/segscope-python:$VERSION" "$WORK/context"
say "telegraf: buildah bud services/telegraf/Containerfile"
"${BUILDAH[@]}" bud -q --isolation chroot --build-arg "VERSION=$VERSION" --label "segscope.sources=$SOURCES_HASH" \
    -f "$REPO/services/telegraf/Containerfile" -t "localhost/segscope-telegraf:$VERSION" "$WORK/context"
for name in agent processors controller; do
    say "$name: buildah bud $name/Containerfile"
    "${BUILDAH[@]}" bud -q --isolation chroot --build-arg "VERSION=$VERSION" --label "segscope.sources=$SOURCES_HASH" \
        -f "$REPO/$name/Containerfile" -t "localhost/segscope-$name:$VERSION" "$WORK/context"
done

# 3. the bundled services' images and the pause image
if ! "${BUILDAH[@]}" inspect --type image "localhost/segscope-bundled-base:$VERSION" >/dev/null 2>&1; then
    say "bundled base: mmdebstrap bookworm (minbase + openjdk-17-jre-headless + influxdb)"
    mmdebstrap --variant=minbase --include=openjdk-17-jre-headless,influxdb \
        bookworm "$WORK/rootfs-bundled.tar"
    ctr=$("${BUILDAH[@]}" from scratch)
    tar -C "$("${BUILDAH[@]}" mount "$ctr")" -xf "$WORK/rootfs-bundled.tar"
    "${BUILDAH[@]}" umount "$ctr" >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${BUILDAH[@]}" commit -q "$ctr" "localhost/segscope-bundled-base:$VERSION" >/dev/null
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
    rm -f "$WORK/rootfs-bundled.tar"
fi
[ -d .local/kafka/lib ] || { echo "[images] .local/kafka/lib missing: run make setup" >&2; exit 1; }
cp -r .local/kafka/lib "$WORK/context/kafka-libs"
cp -r services/kafka/image-bin "$WORK/context/kafka-bin"
cp services/kafka/log4j2.properties "$WORK/context/"
gcc -static -O2 -Wall -o "$WORK/context/pause" cluster/pause.c
for spec in kafka:services/kafka influxdb:services/influxdb pause:cluster/pause; do
    name=${spec%%:*} file=${spec#*:}
    [ "$name" = pause ] && file=$REPO/cluster/pause.Containerfile || file=$REPO/$file/Containerfile
    say "$name: buildah bud ${file#"$REPO"/}"
    "${BUILDAH[@]}" bud -q --isolation chroot --build-arg "VERSION=$VERSION" --label "segscope.sources=$SOURCES_HASH" \
        -f "$file" -t "localhost/segscope-$name:$VERSION" "$WORK/context"
done
"${BUILDAH[@]}" images --filter reference='localhost/segscope-*'
# the images these replaced, now untagged (dangling): each rebuild would otherwise keep a set
"${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
write_archives
echo "$SOURCES_HASH" > "$WORK/sources.sha256"
echo ok >> "$STATUS"
