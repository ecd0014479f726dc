"""A clean Debian root for the package tests, made as scripts/images.sh makes the images' base:
mmdebstrap, minbase, from Debian's packages. Cached under .local/debs/ (the root as a tarball with
its apt lists, and every .deb apt fetched for it), so a second run downloads nothing.

    root = fresh_root(tmp_dir)                      # unpacked copy of the cached minbase root
    in_root(root, ["dpkg", "-i", "/tmp/x.deb"])     # chroot, with /dev, /proc, /sys mounted
    keep_downloads(root)                            # the root's downloaded .debs into the cache

Every chroot runs in a private mount namespace (unshare -m): its mounts vanish with it, so the
root can be deleted with a plain rmtree and nothing shows on this machine's mount table.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from tests.packaging.prepare import wait_for_step

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".local" / "debs"
ROOT_TAR = CACHE / "bookworm-minbase.tar"
APT_CACHE = CACHE / "apt-archives"


def ensure_tools() -> None:
    tools = ("mmdebstrap", "dpkg-deb", "systemd-analyze", "systemd-nspawn", "unshare", "setpriv")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not installed: run `make setup` (scripts/setup.sh installs them)")


def _make_tar() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    APT_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = ROOT_TAR.with_suffix(".tmp.tar")
    subprocess.run(
        [
            "mmdebstrap", "--quiet", "--mode=root", "--variant=minbase",
            "--skip=cleanup/apt/lists", "--skip=cleanup/apt/cache",
            "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives",
            f"--setup-hook=cp -a {APT_CACHE}/. \"$1\"/var/cache/apt/archives/",
            f"--customize-hook=cp -a \"$1\"/var/cache/apt/archives/. {APT_CACHE}/",
            "--customize-hook=rm -f \"$1\"/var/cache/apt/archives/*.deb",
            "bookworm", str(tmp),
        ],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    tmp.rename(ROOT_TAR)


def ensure_root_tar() -> None:
    """The cached minbase root tarball, made if missing (tests/packaging/prepare.py runs this
    while the other tests run)."""
    ensure_tools()
    if not ROOT_TAR.exists():
        _make_tar()


def fresh_root(dest: Path) -> Path:
    """An unpacked minbase root at dest (made once, then from the cached tarball)."""
    prepared = wait_for_step("root")
    if prepared is not None and not prepared[0]:
        raise RuntimeError(f"the minbase root was not made:\n{prepared[1]}")
    ensure_root_tar()
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-C", str(dest), "-xf", str(ROOT_TAR)], check=True)
    shutil.copyfile("/etc/resolv.conf", dest / "etc" / "resolv.conf")
    for deb in APT_CACHE.glob("*.deb"):
        shutil.copyfile(deb, dest / "var" / "cache" / "apt" / "archives" / deb.name)
    return dest


def keep_downloads(root: Path) -> None:
    APT_CACHE.mkdir(parents=True, exist_ok=True)
    for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        if not (APT_CACHE / deb.name).exists():
            shutil.copyfile(deb, APT_CACHE / deb.name)


def mounts_script(root: Path, sysfs: bool = True) -> str:
    """sh commands that mount what a program in the root needs (in the caller's private mount ns):
    /dev, /proc, a sysfs of the current network namespace with this machine's bpffs on it, /run
    and /tmp as tmpfs."""
    r = shlex.quote(str(root))
    lines = [f"mount --rbind /dev {r}/dev", f"mount -t proc proc {r}/proc", f"mount -t tmpfs tmpfs {r}/run",
             f"mount -t tmpfs tmpfs {r}/tmp"]  # fmt: skip
    if sysfs:
        lines += [f"mount -t sysfs sysfs {r}/sys", f"mount --bind /sys/fs/bpf {r}/sys/fs/bpf"]
    return " && ".join(lines)


def in_root(root: Path, argv: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """argv run in the root (chroot) with /dev and /proc mounted; output captured as text."""
    r = shlex.quote(str(root))
    script = f"mount --rbind /dev {r}/dev && mount -t proc proc {r}/proc && exec chroot {r} {shlex.join(argv)}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=timeout, env=env, **kw,
    )  # fmt: skip
