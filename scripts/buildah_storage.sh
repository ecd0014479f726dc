# Sourced by scripts/images.sh and scripts/cluster.sh: the buildah command both use, so that the
# images are looked up on the storage they were built on (BUILDAH, an array).
#
# overlay where its driver starts on this machine's /var/lib/containers (kernel overlayfs on ext4
# here): a layer is stored once, as its changes. vfs otherwise: it copies the whole tree for every
# layer and every container. Measured here, a cold build of the seven images (scripts/images.sh,
# Debian's bootstrap included): overlay 118 CPU-s and 1.8 min, vfs 169 CPU-s and 2.6 min; the store
# 1.0 GB against 3.2 GB. SEGSCOPE_BUILDAH_DRIVER=vfs|overlay chooses.
buildah_driver() {
    if [ -n "${SEGSCOPE_BUILDAH_DRIVER:-}" ]; then
        echo "$SEGSCOPE_BUILDAH_DRIVER"
    # the driver's start mounts an overlay in its store: it fails where the kernel or the filesystem
    # below cannot
    elif buildah --storage-driver overlay images -q >/dev/null 2>&1; then
        echo overlay
    else
        echo vfs
    fi
}
BUILDAH=(buildah --storage-driver "$(buildah_driver)")
