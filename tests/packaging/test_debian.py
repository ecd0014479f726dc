"""The Debian packages (`make debs`, packaging/debian/build.py) in a clean Debian root:

build        both packages, once per module (the venvs' wheels cached in .local/debs/wheels); in
             `make test` built with the root by tests/packaging/prepare.py while other tests run
install      a minbase bookworm root (mmdebstrap, cached); `dpkg -i` alone must fail naming
             the missing dependencies (they are declared), apt-get then installs them and
             dpkg reports both packages installed
units        `systemd-analyze verify` and `security --offline=yes` on the installed units:
             the agent's exposure <= 2.5
config       the launchers refuse a bad /etc/segscope file naming FILE:LINE and the fix
run          the installed agent, started as its unit starts it (ExecStart, with the unit's
             capability set through setpriv; chroot into the installed root, in a netlab
             node's namespace as on a router) on A and B of line5: a STAMP session A -> B
             through the controller, the installed delay processor (as its unit runs it,
             an unprivileged user), Telegraf -> InfluxDB: the session's delay rows arrive
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from netlab import Lab
from segscope_schemas.version import __version__
from tests.isolation import own_name
from tests.packaging import debroot
from tests.packaging.netns_forward import Forward
from tests.packaging.prepare import prep_dir, wait_for_step

pytestmark = [pytest.mark.datapath, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("SEGSCOPE_DEB_TEST_PREFIX") or own_name("dpk")
CAP_BITS = {"CAP_NET_ADMIN": 12, "CAP_PERFMON": 38, "CAP_BPF": 39}
AGENT_PORT = 50051


# ------------------------------------------------------------------ fixtures (one build, one root)
@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> dict[str, Path]:
    """Built by packaging/debian/build.py here; SEGSCOPE_DEBS_DIR=DIR tests the packages already in
    DIR instead (e.g. build/debs after `make debs`)."""
    given = os.environ.get("SEGSCOPE_DEBS_DIR")
    prepared = None if given else wait_for_step("debs")  # built by the runner while other tests ran
    if given:
        out = Path(given)
    elif prepared is not None:
        assert prepared[0], prepared[1]
        out = prep_dir() / "debs"
    else:
        out = tmp_path_factory.mktemp("debs")
        r = subprocess.run(
            [str(REPO / ".local" / "venv" / "bin" / "python"), str(REPO / "packaging" / "debian" / "build.py"),
             "--out", str(out)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-4000:]
    found = {p.name.split("_")[0]: p for p in out.glob("*.deb")}
    assert set(found) == {"segscope-agent", "segscope-processors"}, found
    for deb in found.values():
        print(f"\n[debs] {deb.name}: {deb.stat().st_size / 1e6:.1f} MB")
    return found


@pytest.fixture(scope="module")
def installed(debs, tmp_path_factory):
    """A clean root with both packages installed; the dpkg -i attempt before their dependencies."""
    root = debroot.fresh_root(tmp_path_factory.mktemp("debroot") / "root")
    try:
        for deb in debs.values():
            shutil.copyfile(deb, root / "tmp" / deb.name)
        names = [f"/tmp/{d.name}" for d in debs.values()]
        alone = debroot.in_root(root, ["dpkg", "-i", *names])
        fix = debroot.in_root(root, ["apt-get", "-q", "-y", "--no-install-recommends", "-f", "install"])
        if fix.returncode != 0:  # the cached package lists are older than the mirror: refresh once
            debroot.in_root(root, ["apt-get", "-q", "update"])
            fix = debroot.in_root(root, ["apt-get", "-q", "-y", "--no-install-recommends", "-f", "install"])
        assert fix.returncode == 0, fix.stdout[-3000:] + fix.stderr[-3000:]
        # what a router has, and what `systemd-analyze verify --root` checks the units against
        sd = debroot.in_root(root, ["apt-get", "-q", "-y", "--no-install-recommends", "install", "systemd"])
        assert sd.returncode == 0, sd.stdout[-3000:] + sd.stderr[-3000:]
        debroot.keep_downloads(root)
        # with the dependencies there, dpkg -i alone installs both (again)
        again = debroot.in_root(root, ["dpkg", "-i", *names])
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        yield root, alone
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


# ------------------------------------------------------------------ install
def test_dpkg_names_the_missing_dependencies_then_installs(installed):
    root, alone = installed
    assert alone.returncode != 0, "dpkg -i into a bare root should have lacked the dependencies"
    for dep in ("python3.11", "libbpf1", "librdkafka1", "iproute2"):
        assert re.search(rf"segscope-agent depends on {re.escape(dep)}\b", alone.stderr), (dep, alone.stderr)
    assert (root / "etc" / "segscope" / "tls").stat().st_mode & 0o777 == 0o700  # the key directory
    status = debroot.in_root(root, ["dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\\n", "segscope-*"])
    rows = sorted(status.stdout.splitlines())
    assert rows == [
        f"segscope-agent {__version__} install ok installed",
        f"segscope-processors {__version__} install ok installed",
    ], status


def test_installed_venvs_import_every_module(installed):
    """Each venv has what its programs import (their dependency lists are hand-written)."""
    root, _ = installed
    code = (
        "import importlib, pkgutil, sys\n"
        "bad = []\n"
        "for pkg in sys.argv[1:]:\n"
        "    mod = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):\n"
        "        if info.name.rsplit('.', 1)[-1] == '__main__': continue\n"
        "        try: importlib.import_module(info.name)\n"
        "        except Exception as exc: bad.append(f'{info.name}: {exc!r}')\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    agent = debroot.in_root(
        root,
        ["/opt/segscope/agent/bin/python", "-c", code, "agent", "collectors", "segscope_schemas", "segscope_proto"],
    )
    assert agent.returncode == 0, agent.stdout + agent.stderr[-2000:]
    procs = debroot.in_root(root, ["/opt/segscope/processors/bin/python", "-c", code, "processors", "segscope_schemas"])
    assert procs.returncode == 0, procs.stdout + procs.stderr[-2000:]
    for prog in ("/opt/segscope/agent/bin/segscope-agent", "/opt/segscope/processors/bin/segscope-delay-processor"):
        v = debroot.in_root(root, [prog, "--version"])
        assert v.stdout.strip() == f"segscope {__version__}", v


def test_package_contents(debs):
    listing = subprocess.run(["dpkg-deb", "-c", str(debs["segscope-agent"])], capture_output=True, text=True).stdout
    paths = {line.split()[-1] for line in listing.splitlines() if "->" not in line}
    for path in (
        "./lib/systemd/system/segscope-agent.service",
        "./etc/segscope/agent.conf",
        "./usr/lib/segscope/agent-launch",
        "./opt/segscope/agent/bin/segscope-agent",
        *(f"./usr/lib/segscope/datapath/{t}" for t in ("stamp_collector", "stamp_reflector", "altmark_tx", "ioam_rx")),
        *(f"./usr/lib/segscope/collectors/{t}" for t in ("stamp_sender", "stamp_streamer", "libustamp_fast.so")),
    ):
        assert path in paths, path
    # the venv's interpreter is Debian's python3.X, which the package depends on
    assert re.search(r"opt/segscope/agent/bin/python3\.\d+ -> /usr/bin/python3\.\d+\n", listing), listing[-3000:]
    conffiles = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", str(debs["segscope-agent"])], capture_output=True
    ).stdout  # a tar; the conffiles list is in it
    assert b"/etc/segscope/agent.conf" in conffiles


# ------------------------------------------------------------------ units
def _unit(root: Path, name: str) -> Path:
    return root / "lib" / "systemd" / "system" / name


def test_units_verify(installed, tmp_path):
    root, _ = installed
    for unit in ("segscope-agent.service", "segscope-processor@delay.service"):
        r = subprocess.run(
            ["systemd-analyze", "verify", f"--root={root}", unit], capture_output=True, text=True, timeout=60
        )
        # verify's complaints about the host's own units are no business of this test
        ours = [ln for ln in (r.stdout + r.stderr).splitlines() if "segscope" in ln]
        assert r.returncode == 0 and not ours, r.stdout + r.stderr


def exposure(root: Path, unit: str) -> float:
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--root={root}", "--no-pager", unit],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr
    return float(m.group(1))


def test_agent_unit_exposure(installed):
    root, _ = installed
    score = exposure(root, "segscope-agent.service")
    print(f"\n[units] segscope-agent.service exposure {score}")
    assert score <= 2.5
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(_unit(root, "segscope-agent.service"))
    service = unit["Service"]
    assert set(service["CapabilityBoundingSet"].split()) == set(CAP_BITS)
    assert set(service["AmbientCapabilities"].split()) == set(CAP_BITS)
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"].split()[0] == "/sys/fs/bpf"


def test_processor_units_exposure(installed):
    root, _ = installed
    for name in ("delay", "loss", "inline", "topology"):
        score = exposure(root, f"segscope-processor@{name}.service")
        print(f"\n[units] segscope-processor@{name}.service exposure {score}")
        assert score <= 1.5


# ------------------------------------------------------------------ configuration errors
def test_agent_config_errors_name_file_line_and_fix(installed):
    root, _ = installed
    conf = root / "etc" / "segscope" / "bad.conf"
    conf.write_text(
        "# a router\nnode = R1\nlisten = 192.0.2.1:862\nnodee = R2\ntls_cert = /etc/segscope/tls/missing.pem\n"
        "stats_interval = soon\n"
    )
    r = debroot.in_root(root, ["/usr/lib/segscope/agent-launch", "--check", "/etc/segscope/bad.conf"])
    assert r.returncode == 2, r
    err = r.stderr
    assert "/etc/segscope/bad.conf:3: listen: port 862 needs CAP_NET_BIND_SERVICE" in err, err
    assert "/etc/segscope/bad.conf:4: nodee: unknown key. Fix: did you mean `node`?" in err, err
    assert "/etc/segscope/bad.conf:5: tls_cert: no such file '/etc/segscope/tls/missing.pem'. Fix:" in err, err
    assert "/etc/segscope/bad.conf:6: stats_interval: 'soon' is not a number" in err, err
    assert "/etc/segscope/bad.conf:0: tls_key: missing. Fix: add a line `tls_key = ...`" in err, err
    # the shipped file: the agent does not start before the router's name and address are set
    shipped = debroot.in_root(root, ["/usr/lib/segscope/agent-launch", "--check", "/etc/segscope/agent.conf"])
    assert shipped.returncode == 2
    assert re.search(r"/etc/segscope/agent.conf:\d+: node: not set. Fix: write this router's name", shipped.stderr)


def test_processor_config_errors_name_file_line_and_fix(installed):
    root, _ = installed
    conf = root / "etc" / "segscope" / "bad-processors.conf"
    conf.write_text("SEGSCOPE_KAFKA=127.0.0.1:9092\nSEGSCOPE_DELAY_GRACE=1\nSEGSCOPE_DELAY_GRACE_S=half\n")
    r = debroot.in_root(
        root, ["/usr/lib/segscope/processor-launch", "--check", "delay", "/etc/segscope/bad-processors.conf"]
    )
    assert r.returncode == 2, r
    unknown = "bad-processors.conf:2: SEGSCOPE_DELAY_GRACE: not a setting of any processor. Fix: did you mean "
    assert unknown + "`SEGSCOPE_DELAY_GRACE_S`?" in r.stderr, r.stderr
    assert (
        "bad-processors.conf:3: SEGSCOPE_DELAY_GRACE_S: environment variable SEGSCOPE_DELAY_GRACE_S='half'" in r.stderr
    )
    good = debroot.in_root(
        root, ["/usr/lib/segscope/processor-launch", "--check", "delay", "/etc/segscope/processors.conf"]
    )
    assert good.returncode == 0 and good.stdout.strip() == "/opt/segscope/processors/bin/segscope-delay-processor", good


# ------------------------------------------------------------------ the installed agent measures
def unit_exec(root: Path, unit_name: str) -> tuple[list[str], list[str]]:
    """(setpriv arguments for the unit's identity and capabilities, its ExecStart argv)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(_unit(root, unit_name))
    s = unit["Service"]
    bounding = [c.lower().removeprefix("cap_") for c in s.get("CapabilityBoundingSet", "").split()]
    ambient = [c.lower().removeprefix("cap_") for c in s.get("AmbientCapabilities", "").split()]
    caps = ",".join(["-all"] + [f"+{c}" for c in bounding])
    amb = ",".join(["-all"] + [f"+{c}" for c in ambient])
    setpriv = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={amb}", f"--ambient-caps={amb}"]
    if s.get("DynamicUser") == "yes":
        setpriv += ["--reuid=65534", "--regid=65534", "--clear-groups"]
    if "noroot" in s.get("SecureBits", ""):
        setpriv += ["--securebits=+noroot,+noroot_locked"]
    if s.get("NoNewPrivileges") == "yes":
        setpriv += ["--no-new-privs"]
    return setpriv, shlex.split(s["ExecStart"])


def start_in_root(root: Path, unit: str, argv: list[str], log: Path, netns: str | None, prep: str = ""):
    """A unit's program in the installed root, in netns (as on a router), with the unit's capability
    set; the Popen's pid is the program itself (every step execs)."""
    setpriv, _ = unit_exec(root, unit)
    script = " && ".join(filter(None, [debroot.mounts_script(root), prep, f"exec chroot {shlex.quote(str(root))} "
                                       f"{shlex.join(setpriv + ['--', *argv])}"]))  # fmt: skip
    cmd = ["unshare", "--mount", "--propagation", "private"]
    if netns:
        cmd += ["nsenter", f"--net=/run/netns/{netns}"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/"}
    with open(log, "w") as out:
        return subprocess.Popen(
            [*cmd, "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def caps_of(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: int(v, 16) for k, v in re.findall(r"^(Cap\w+):\s+([0-9a-f]+)$", status, re.M)}


def wait_for(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {timeout:g} s" + (f"\n{log.read_text()[-3000:]}" if log else ""))


def test_installed_agent_measures_stamp_to_influxdb(installed, stack, bpffs, tmp_path):
    from controller.core import Controller
    from controller.intent import load_intent
    from controller.pki import make_pki

    root, _ = installed
    kafka_host, kafka_port = stack.kafka_bootstrap.rsplit(":", 1)
    pki = make_pki(root / "etc" / "segscope" / "tls", ["A", "B"])
    agents, forwards, procs = {}, [], {}
    lab = Lab.up(REPO / "netlab" / "topologies" / "line5.yaml", prefix=PREFIX)
    try:
        for node in ("A", "B"):
            conf = root / "etc" / "segscope" / f"agent-{node}.conf"
            conf.write_text(
                f"node = {node}\nlisten = 127.0.0.1:{AGENT_PORT}\n"
                f"tls_cert = /etc/segscope/tls/agent-{node}.pem\ntls_key = /etc/segscope/tls/agent-{node}.key\n"
                f"tls_client_ca = /etc/segscope/tls/ca.pem\nkafka = {stack.kafka_bootstrap}\n"
                f"instance = {lab.ns(node)}\n"
                # this run checks a stop for good: the agent detaches everything (the default,
                # handover, leaves the data path for the next agent: tests/agent/test_agent_restarts.py)
                "on_stop = teardown\n"
            )
            # getaddrinfo(AI_ADDRCONFIG), as librdkafka calls it, resolves an IPv4 literal only where an
            # IPv4 address other than 127.0.0.1 exists: a router has one, this IPv6-only node gets one
            subprocess.run(["ip", "-n", lab.ns(node), "addr", "add", "127.0.0.2/32", "dev", "lo"], check=True)
            # Kafka (root namespace) as the router would reach it: at its advertised address
            forwards.append(Forward(lab.ns(node), ("127.0.0.1", int(kafka_port)), None, (kafka_host, int(kafka_port))))
            _, exec_start = unit_exec(root, "segscope-agent.service")
            argv = [exec_start[0], f"/etc/segscope/agent-{node}.conf"]
            log = tmp_path / f"agent-{node}.log"
            procs[node] = start_in_root(root, "segscope-agent.service", argv, log, lab.ns(node),
                                        prep=f"mkdir -m 0700 {shlex.quote(str(root))}/run/segscope")  # fmt: skip
            # the controller's view of the agent's management address
            fwd = Forward(None, ("127.0.0.1", 0), lab.ns(node), ("127.0.0.1", AGENT_PORT))
            forwards.append(fwd)
            agents[node] = f"127.0.0.1:{fwd.port}"
        for node in ("A", "B"):
            log = tmp_path / f"agent-{node}.log"
            wait_for(lambda log=log: "listening on port" in log.read_text(), 60, f"agent {node}", log)
            # exactly the unit's three capabilities, effective and nothing else in the bounding set
            caps = caps_of(procs[node].pid)
            want = sum(1 << b for b in CAP_BITS.values())
            assert caps["CapEff"] == caps["CapBnd"] == caps["CapAmb"] == want, caps
            cmdline = Path(f"/proc/{procs[node].pid}/cmdline").read_bytes().split(b"\0")
            assert b"/opt/segscope/agent/bin/segscope-agent" in cmdline, cmdline

        # the installed delay processor, as segscope-processor@delay.service runs it
        pconf = root / "etc" / "segscope" / "processors.conf"
        pconf.write_text(
            f"SEGSCOPE_KAFKA={stack.kafka_bootstrap}\nSEGSCOPE_DELAY_HEALTH=127.0.0.1:0\n"
            "SEGSCOPE_DELAY_DATADIR=/var/lib/segscope-delay/{app_id}\nSEGSCOPE_DELAY_GRACE_S=0.5\n"
        )
        state = root / "var" / "lib" / "segscope-delay"
        state.mkdir(parents=True, exist_ok=True)
        os.chown(state, 65534, 65534)
        _, exec_start = unit_exec(root, "segscope-processor@.service")
        argv = [a.replace("%i", "delay") for a in exec_start]
        plog = tmp_path / "delay.log"
        procs["delay"] = start_in_root(root, "segscope-processor@.service", argv, plog, None)
        wait_for(
            lambda: b"segscope-delay-processor" in Path(f"/proc/{procs['delay'].pid}/cmdline").read_bytes(),
            30,
            "the delay processor's exec",
            plog,
        )
        caps = caps_of(procs["delay"].pid)
        assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == 0, caps  # a dynamic user, no capability
        assert Path(f"/proc/{procs['delay'].pid}").stat().st_uid == 65534
        os.environ.update({f"SEGSCOPE_AGENT_{n}": a for n, a in agents.items()})
        os.environ["SEGSCOPE_CERTS"] = str(pki["ca"].parent)
        intent_file = tmp_path / "intent.yaml"
        intent_file.write_text(
            "version: 1\nnodes:\n"
            + "".join(
                f"  {n}: {{agent: \"${{SEGSCOPE_AGENT_{n}}}\", tls: {{ca: \"${{SEGSCOPE_CERTS}}/ca.pem\", "
                f"cert: \"${{SEGSCOPE_CERTS}}/controller.pem\", key: \"${{SEGSCOPE_CERTS}}/controller.key\"}}}}\n"
                for n in ("A", "B")
            )
            + "stamp_sessions:\n  - {ssid: 7, sender: {node: A, address: \"fc00:1::1\", dev: a0}, "
            "reflector: {node: B, address: \"fc00:3::1\", dev: b0}, segs: [\"fc00:2::e\"], "
            "return_segs: [\"fc00:2::e\"], rate_pps: 100, duration_s: 5}\n"
        )
        ctl = Controller(load_intent(intent_file))
        try:
            result = ctl.apply()
            assert result.ok, result.failed
        finally:
            ctl.close()

        def rows():
            return stack.influx_query(
                "SELECT count(\"mean_us\") FROM stamp_delay WHERE \"ssid\" = '7' AND \"node\" = 'A' "
                "AND \"direction\" = 'round_trip' AND time > now() - 5m"
            )

        found = wait_for(lambda: rows() and rows()[0]["count"] >= 3, 90, "stamp_delay rows of ssid 7", plog)
        assert found
        # the datapath the installed agent attached is under its instance in bpffs
        assert (bpffs / "segscope" / lab.ns("A") / "stamp_collector").is_dir()
        assert (bpffs / "segscope" / lab.ns("B") / "stamp_reflector").is_dir()
    finally:
        codes = {name: stop(p) for name, p in procs.items()}
        for fwd in forwards:
            fwd.close()
        lab.down()
        for key in ("SEGSCOPE_AGENT_A", "SEGSCOPE_AGENT_B", "SEGSCOPE_CERTS"):
            os.environ.pop(key, None)
    # SIGTERM: each agent detached what it attached and exited 0 (the unit's stop)
    assert codes.get("A") == 0 and codes.get("B") == 0, codes
    assert not list((bpffs / "segscope").glob(f"{PREFIX}-*"))


# ------------------------------------------------------------------ the unit under systemd itself
def test_agent_unit_runs_under_systemd(installed, bpffs, tmp_path):
    """systemd (the installed root booted with systemd-nspawn, systemd.unit=segscope-agent.service)
    runs the agent with the unit's whole sandbox: capabilities, seccomp filter, read-only system,
    MemoryDenyWriteExecute. Through gRPC it attaches an XDP STAMP reflector and pins its maps.
    nspawn's own filter passes bpf(2) and adjtimex only when told (--system-call-filter=bpf,
    CAP_SYS_TIME in the container's set, which the unit drops again)."""
    import grpc

    from controller.pki import make_pki
    from segscope_proto.segscope.agent.v1 import stamp_pb2, stamp_pb2_grpc

    root, _ = installed
    machine, netns, instance = f"{PREFIX.replace('_', '')}sd", f"{PREFIX}-sd", f"{PREFIX}-sd"  # no _ in a machine name
    make_pki(root / "etc" / "segscope" / "tls", ["P"])
    shipped = (root / "etc" / "segscope" / "agent.conf").read_text()
    (root / "etc" / "segscope" / "agent.conf").write_text(
        "node = P\nlisten = 127.0.0.1:50051\ntls_cert = /etc/segscope/tls/agent-P.pem\n"
        "tls_key = /etc/segscope/tls/agent-P.key\ntls_client_ca = /etc/segscope/tls/ca.pem\n"
        f"instance = {instance}\n"
    )
    log = tmp_path / "nspawn.log"
    with open(log, "w") as out:
        nspawn = subprocess.Popen(
            ["systemd-nspawn", "-q", "-D", str(root), f"--machine={machine}", "--register=no", "--keep-unit",
             "--private-network", "--network-veth", "--console=pipe", "--bind=/sys/fs/bpf",
             "--capability=CAP_BPF,CAP_PERFMON,CAP_SYS_TIME", "--system-call-filter=bpf", "-b",
             "systemd.unit=segscope-agent.service", "systemd.journald.forward_to_console=1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    fwd = None
    try:

        def agent_pid() -> int | None:
            for pid in descendants(nspawn.pid):
                try:
                    if b"bin/segscope-agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return pid
                except OSError:
                    pass
            return None

        pid = wait_for(agent_pid, 90, "the agent started by systemd", log)
        status = Path(f"/proc/{pid}/status").read_text()
        want = sum(1 << b for b in CAP_BITS.values())
        caps = caps_of(pid)
        assert caps["CapEff"] == caps["CapBnd"] == caps["CapAmb"] == want, caps
        assert re.search(r"^NoNewPrivs:\s+1$", status, re.M) and re.search(r"^Seccomp:\s+2$", status, re.M), status
        mounts = {ln.split()[4]: ln.split()[5] for ln in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()}
        assert mounts["/"].startswith("ro") and mounts["/sys/fs/bpf"].startswith("rw"), mounts
        subprocess.run(["ip", "netns", "attach", netns, str(pid)], check=True)
        fwd = Forward(None, ("127.0.0.1", 0), netns, ("127.0.0.1", 50051))
        tls = root / "etc" / "segscope" / "tls"
        creds = grpc.ssl_channel_credentials(
            (tls / "ca.pem").read_bytes(), (tls / "controller.key").read_bytes(), (tls / "controller.pem").read_bytes()
        )
        with grpc.secure_channel(f"127.0.0.1:{fwd.port}", creds) as channel:
            stub = stamp_pb2_grpc.StampServiceStub(channel)
            request = stamp_pb2.InitRequest(
                reflector=stamp_pb2.StampReflectorConfig(
                    device="host0", addresses=["fc00:99::1"], udp_port=8620, mode=stamp_pb2.STAMP_REFLECTOR_MODE_XDP
                )
            )
            reply = wait_for(lambda: _try(stub.Init, request), 60, "the agent's gRPC service", log)
            assert reply.reflector_running == stamp_pb2.STAMP_REFLECTOR_MODE_XDP, reply
            assert (bpffs / "segscope" / instance / "stamp_reflector").is_dir()
            stub.Reset(stamp_pb2.ResetRequest(), timeout=30)
    finally:
        if fwd:
            fwd.close()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        inside = {p: _cmdline(p) for p in descendants(nspawn.pid)}  # before nspawn exits: orphans move to 1
        nspawn.send_signal(signal.SIGTERM)  # nspawn powers the container off: the agent gets SIGTERM
        try:
            nspawn.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(nspawn.pid, signal.SIGKILL)
            nspawn.wait()
        left = [p for p, cmd in inside.items() if cmd and _cmdline(p) == cmd]  # still that process
        for p in left:
            os.kill(p, signal.SIGKILL)
        shutil.rmtree(bpffs / "segscope" / instance, ignore_errors=True)
        (root / "etc" / "segscope" / "agent.conf").write_text(shipped)
    assert nspawn.returncode == 0 and not left, (nspawn.returncode, left, log.read_text()[-2000:])


def _try(call, request):
    """call(request), or None while the server is not there yet."""
    import grpc

    try:
        return call(request, timeout=10)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        raise


def descendants(pid: int) -> list[int]:
    """Every process below pid (the container's init and all it started)."""
    children: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(re.search(r"^PPid:\s+(\d+)", Path(f"/proc/{p}/status").read_text(), re.M).group(1))
        except (OSError, AttributeError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
