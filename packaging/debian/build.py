"""Build segscope's Debian packages with dpkg-deb (`make debs`, root, after `make build`):

    segscope-agent_VERSION_ARCH.deb       the node agent: eBPF loaders (the objects are compiled
                                          into them) and C tools in /usr/lib/segscope, the agent's
                                          Python venv in /opt/segscope/agent, segscope-agent.service,
                                          /etc/segscope/agent.conf
    segscope-processors_VERSION_ARCH.deb  the delay, loss, in-line and topology processors: a venv in
                                          /opt/segscope/processors, segscope-processor@.service,
                                          /etc/segscope/processors.conf

Python dependencies: each package carries a finished venv, built here at its final path
(/opt/segscope/<name>, in a private mount namespace so this machine's /opt is untouched) on
Debian's own /usr/bin/python3, from wheels of the package registry pinned by requirements.txt. The
wheels are kept in .local/debs/wheels, so a rebuild needs no network. The packages therefore depend
on the python3.X of the Debian release they were built on (build on the release you install on).
System libraries: dpkg-shlibdeps on the C tools. Output: build/debs/ (or --out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "schemas" / "python"))
from segscope_schemas.version import __version__  # noqa: E402

WHEELS = REPO / ".local" / "debs" / "wheels"
SYSTEM_PYTHON = "/usr/bin/python3"  # the build host's Debian interpreter; the venv links its python3.X
MAINTAINER = "segscope developers <segscope@localhost>"
HOMEPAGE_DOC = "docs/install-debian.md"

# what each venv needs beyond segscope itself (installed --no-deps): the imports of its programs
# (tests/packaging/test_debian.py imports every module of them in the installed venv)
AGENT_PY = [
    "grpcio",
    "grpcio-health-checking",
    "grpcio-reflection",
    "protobuf",
    "confluent-kafka",
    "numpy",
    "pyroute2",
    "pyyaml",
    "requests",
]
PROCESSORS_PY = [
    "faust-streaming",
    "aiokafka",
    "cramjam",
    "confluent-kafka",
    "numpy",
    "pyyaml",
    "requests",
    "python-arango",
]
# the segscope programs each venv keeps in bin/ (the wheel declares them all)
KEEP_SCRIPTS = {
    "agent": ["segscope-agent", "segscope-ustamp", "segscope-topology-publisher"],
    "processors": [f"segscope-{n}-processor" for n in ("delay", "loss", "inline", "topology")]
    + ["segscope-freshness", "segscope-topics", "segscope-influx-setup"],
}
DATAPATH_TOOLS = ["stamp_collector", "stamp_reflector", "altmark_tx", "altmark_rx", "ioam_tx", "ioam_rx", "ioam_lwt"]
COLLECTOR_TOOLS = ["stamp_sender", "stamp_streamer", "altmark_collector", "libustamp_fast.so"]
PROCESSOR_NAMES = ("delay", "loss", "inline", "topology")


def say(msg: str) -> None:
    print(f"[debs] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"[debs] {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def arch() -> str:
    return run(["dpkg", "--print-architecture"]).stdout.strip()


def python_version() -> str:
    return run(
        [SYSTEM_PYTHON, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"]
    ).stdout.strip()


def build_wheel(work: Path) -> Path:
    """segscope's own wheel (pure Python; needs `make build`: the generated segscope_proto)."""
    if not (REPO / "schemas" / "python" / "segscope_proto").is_dir():
        raise SystemExit("[debs] schemas/python/segscope_proto is missing: run `make build` first")
    out = work / "wheel"
    run([str(REPO / ".local" / "venv" / "bin" / "pip"), "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)])
    (wheel,) = out.glob("segscope-*.whl")
    return wheel


def build_venv(stage: Path, name: str, wheel: Path, deps: list[str]) -> None:
    """A venv at /opt/segscope/<name> whose files land in stage/opt/segscope/<name>: built in a
    private mount namespace where that path is a bind mount of the stage (nothing shows outside)."""
    target = Path("/opt/segscope") / name
    dest = stage / target.relative_to("/")
    dest.mkdir(parents=True)
    WHEELS.mkdir(parents=True, exist_ok=True)
    constraints = REPO / "requirements.txt"
    pip = f"{target}/bin/python -m pip"
    common = f"-c {constraints} {' '.join(deps)}"
    python = f"/usr/bin/python{python_version()}"  # what the venv links: python3.X, the Depends
    keep = " ".join(KEEP_SCRIPTS[name])
    script = f"""
set -e
mount -t tmpfs -o mode=0755 tmpfs /opt
mkdir -p {target}
mount --bind {dest} {target}
{python} -m venv {target}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# a PYTHONPATH with a checkout on it shows pip segscope as installed (its egg-info): nothing would be
unset PYTHONPATH
if ! {pip} install -q --no-index --find-links {WHEELS} {common} 2>/dev/null; then
    {pip} download -q --only-binary=:all: -d {WHEELS} {common}
    {pip} install -q --no-index --find-links {WHEELS} {common}
fi
{pip} install -q --no-index --no-deps {wheel}
{pip} uninstall -q -y pip setuptools
cd {target}/bin && for f in segscope-*; do case " {keep} " in *" $f "*) ;; *) rm "$f";; esac; done
rm -f {target}/bin/Activate.ps1 {target}/bin/activate.csh {target}/bin/activate.fish
"""
    run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script])


def shlibdeps(binaries: list[Path]) -> str:
    """Depends of the C tools' shared libraries, as dpkg-shlibdeps computes them."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "debian").mkdir()
        (Path(tmp) / "debian" / "control").write_text(
            "Source: segscope\n\nPackage: segscope-agent\nArchitecture: any\n"
        )
        r = run(["dpkg-shlibdeps", "-O", *[str(b) for b in binaries]], cwd=tmp)
    for line in r.stdout.splitlines():
        if line.startswith("shlibs:Depends="):
            return line.split("=", 1)[1]
    raise SystemExit(f"[debs] dpkg-shlibdeps gave no Depends: {r.stdout}")


def installed_size_kib(root: Path) -> int:
    return sum((p.lstat().st_size + 1023) // 1024 for p in root.rglob("*") if p.is_file() or p.is_symlink())


def write_control(stage: Path, fields: dict[str, str], scripts: dict[str, str], conffiles: list[str]) -> None:
    debian = stage / "DEBIAN"
    debian.mkdir()
    fields = {**fields, "Installed-Size": str(installed_size_kib(stage))}
    text = ""
    for key, value in fields.items():
        text += f"{key}: {value}\n"
    (debian / "control").write_text(text)
    (debian / "conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    for name, body in scripts.items():
        (debian / name).write_text(body)
        (debian / name).chmod(0o755)


def install(src: Path, dest: Path, mode: int = 0o644) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(mode)


def launcher(stage: Path, name: str, venv: str) -> None:
    text = (HERE / "segscope_conf.py").read_text()
    dest = stage / "usr" / "lib" / "segscope" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(f"#!/opt/segscope/{venv}/bin/python\n{text}")
    dest.chmod(0o755)


def common_files(stage: Path, package: str) -> None:
    doc = stage / "usr" / "share" / "doc" / package
    install(REPO / "LICENSE", doc / "copyright")
    install(REPO / "docs" / "install-debian.md", doc / "install-debian.md")


SYSTEMD_RELOAD = 'if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null || true; fi\n'
# an upgrade (configure with the old version in $2) restarts a running agent into the new version:
# the unit's KillMode=process and the agent's on_stop = handover make that restart hitless (the new
# agent adopts the data path the old one left); prerm does not stop the agent on upgrade
AGENT_UPGRADE_RESTART = (
    'if [ "$1" = configure ] && [ -n "$2" ] && [ -d /run/systemd/system ]; then\n'
    "    systemctl try-restart segscope-agent.service >/dev/null || true\nfi\n"
)


def agent_package(out: Path, work: Path, wheel: Path, py: str, version: str) -> Path:
    stage = work / "segscope-agent"
    build_venv(stage, "agent", wheel, AGENT_PY)
    lib = stage / "usr" / "lib" / "segscope"
    tools = []
    for sub, names in (("datapath", DATAPATH_TOOLS), ("collectors", COLLECTOR_TOOLS)):
        for n in names:
            src = REPO / "build" / sub / n
            if not src.exists():
                raise SystemExit(f"[debs] {src} is missing: run `make build` first")
            install(src, lib / sub / n, 0o755)
            run(["strip", "--strip-unneeded", str(lib / sub / n)])
            tools.append(lib / sub / n)
    launcher(stage, "agent-launch", "agent")
    install(HERE / "agent" / "segscope-agent.service", stage / "lib" / "systemd" / "system" / "segscope-agent.service")
    install(HERE / "agent" / "agent.conf", stage / "etc" / "segscope" / "agent.conf")
    (stage / "etc" / "segscope" / "tls").mkdir(mode=0o700)
    common_files(stage, "segscope-agent")
    depends = ", ".join([f"python{py}", shlibdeps(tools), "util-linux", "iproute2"])
    write_control(
        stage,
        {
            "Package": "segscope-agent",
            "Version": version,
            "Architecture": arch(),
            "Maintainer": MAINTAINER,
            "Depends": depends,
            "Recommends": "systemd",
            "Section": "net",
            "Priority": "optional",
            "Description": "segscope SRv6 performance-monitoring node agent\n"
            " The gRPC agent of one router: SRv6 policies and SIDs over netlink, STAMP delay\n"
            " measurement, alternate-marking loss and IOAM in-line measurement with eBPF\n"
            " (XDP/TC), results to Kafka. Runs as segscope-agent.service with CAP_BPF,\n"
            " CAP_NET_ADMIN and CAP_PERFMON only; configure /etc/segscope/agent.conf.",
        },
        {
            "postinst": "#!/bin/sh\nset -e\nchmod 0700 /etc/segscope/tls\n" + SYSTEMD_RELOAD + AGENT_UPGRADE_RESTART,
            "prerm": "#!/bin/sh\nset -e\nif [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then\n"
            "    systemctl stop segscope-agent.service >/dev/null 2>&1 || true\nfi\n",
            "postrm": "#!/bin/sh\nset -e\n" + SYSTEMD_RELOAD,
        },
        ["/etc/segscope/agent.conf"],
    )
    return build_deb(stage, out, "segscope-agent", version)


def processors_package(out: Path, work: Path, wheel: Path, py: str, version: str) -> Path:
    stage = work / "segscope-processors"
    build_venv(stage, "processors", wheel, PROCESSORS_PY)
    launcher(stage, "processor-launch", "processors")
    install(
        HERE / "processors" / "segscope-processor@.service",
        stage / "lib" / "systemd" / "system" / "segscope-processor@.service",
    )
    install(HERE / "processors" / "processors.conf", stage / "etc" / "segscope" / "processors.conf")
    common_files(stage, "segscope-processors")
    write_control(
        stage,
        {
            "Package": "segscope-processors",
            "Version": version,
            "Architecture": arch(),
            "Maintainer": MAINTAINER,
            "Depends": f"python{py}, libc6",
            "Recommends": "systemd",
            "Section": "net",
            "Priority": "optional",
            "Description": "segscope SRv6 performance-monitoring stream processors\n"
            " The Faust processors of segscope: STAMP delay, alternate-marking loss, in-line\n"
            " (IOAM) delay and loss, and the topology graph, from Kafka to Kafka (InfluxDB line\n"
            " protocol for Telegraf) and ArangoDB. One unit per processor:\n"
            " segscope-processor@delay, @loss, @inline, @topology.",
        },
        {
            "prerm": "#!/bin/sh\nset -e\nif [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then\n"
            + "".join(
                f"    systemctl stop segscope-processor@{n}.service >/dev/null 2>&1 || true\n" for n in PROCESSOR_NAMES
            )
            + "fi\n",
            "postinst": "#!/bin/sh\nset -e\n" + SYSTEMD_RELOAD,
            "postrm": "#!/bin/sh\nset -e\n" + SYSTEMD_RELOAD,
        },
        ["/etc/segscope/processors.conf"],
    )
    return build_deb(stage, out, "segscope-processors", version)


def build_deb(stage: Path, out: Path, package: str, version: str) -> Path:
    deb = out / f"{package}_{version}_{arch()}.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zzstd", "--build", str(stage), str(deb)])
    return deb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "build" / "debs"), help="output directory (default build/debs)")
    ap.add_argument("--only", choices=("agent", "processors"), help="build one package")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("[debs] run as root (the venvs are built in a private mount namespace)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = python_version()
    with tempfile.TemporaryDirectory(prefix="segscope-debs-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        wheel = build_wheel(work)
        built = []
        if args.only in (None, "agent"):
            built.append(agent_package(out, work, wheel, py, __version__))
        if args.only in (None, "processors"):
            built.append(processors_package(out, work, wheel, py, __version__))
    for deb in built:
        say(f"{deb} ({deb.stat().st_size / 1e6:.1f} MB)")
    say(f"done in {time.monotonic() - t0:.0f} s")
    for deb in built:
        print(deb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
