"""Bad configuration is refused with a message that names the field, in every tool.

Tools: the XDP loaders (build/datapath/stamp_reflector, stamp_collector; attached for real to a
veth in namespace `cmc-bad`, so a command that wrongly succeeded would really change the maps),
the user-space reflector and sender (`python -m collectors.ustamp`, in that namespace) and the C
sender (build/collectors/stamp_sender). Exit codes (the tools' shared convention): 2 = bad
argument or bad session/key file, 1 = the request failed at run time (e.g. deleting a session
that does not exist).

One row per (what is wrong, tool); the id reads `<what>-<tool>`. A row may carry a strict xfail
to pin a known defect until it is fixed (none does now); strict, so the fix turns it red and the
mark must go.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

import pytest
from conformance_env import C_SENDER, ENV, PY, REPO, XDP_COLLECTOR, XDP_REFLECTOR, build, run_tool

from tests.isolation import own_name

pytestmark = pytest.mark.datapath

NETNS = own_name("cmc") + "-bad"
PIN = f"/sys/fs/bpf/segscope/{NETNS}"
SIDS_9 = ",".join(f"fc00:9::{i}" for i in range(1, 10))  # one more than the XDP reflector holds
SIDS_8 = ",".join(f"fc00:9::{i}" for i in range(1, 9))
SIDS_17 = ",".join(f"fc00:9::{i}" for i in range(1, 18))  # one more than ustamp/stamp_sender hold
KEY = "000102030405060708090a0b0c0d0e0f"


@dataclass(frozen=True)
class Row:
    what: str  # the bad configuration
    tool: str  # xdp_reflector | xdp_collector | ustamp_reflector | ustamp_sender | c_sender
    args: tuple[str, ...]  # {keys_noid} / {keys_badcur} / {sessions_badfmt} are replaced by files
    field: str  # must appear in stderr
    rc: int = 2
    xfail: str = ""

    @property
    def id(self) -> str:
        return f"{self.what}-{self.tool}"


SENDER = ("--src", "fc00:1::1", "--dst", "fc00:3::1", "--rate", "10", "--count", "1")

ROWS = [
    # unknown SSID: deleting/deactivating a session that does not exist
    Row("unknown_ssid", "xdp_reflector", ("del-session", "--ssid", "4242"), "--ssid", rc=1),
    Row("unknown_ssid", "xdp_collector", ("deactivate", "--ssid", "4242"), "--ssid", rc=1),
    # key id missing (authenticated sessions run in user space)
    Row(
        "auth_without_key_file",
        "ustamp_reflector",
        ("--add-session", "--ssid 5 --mode authenticated"),
        "key_file: required",
    ),
    Row(
        "key_without_id",
        "ustamp_reflector",
        ("--add-session", "--ssid 5 --mode authenticated --key-file {keys_noid}"),
        "keys[0]: id",
    ),
    Row(
        "current_key_id_missing",
        "ustamp_reflector",
        ("--add-session", "--ssid 5 --mode authenticated --key-file {keys_badcur}"),
        "current: key id 3",
    ),
    Row("key_without_id", "ustamp_sender", ("--ssid", "5", "--auth-key-file", "{keys_noid}"), "keys[0]: id"),
    Row(
        "current_key_id_missing",
        "ustamp_sender",
        ("--ssid", "5", "--auth-key-file", "{keys_badcur}"),
        "current: key id 3",
    ),
    # SID list too long for the program
    Row("return_sids_9", "xdp_reflector", ("add-session", "--ssid", "5", "--return-sids", SIDS_9), "--return-sids"),
    Row("return_sids_17", "ustamp_reflector", ("--add-session", f"--ssid 5 --return-sids {SIDS_17}"), "return_sids"),
    Row("segs_17", "ustamp_sender", ("--ssid", "5", "--segs", SIDS_17), "--segs"),
    Row("segs_17", "c_sender", ("--ssid", "5", "--segs", SIDS_17), "--segs"),
    # invalid timestamp format
    Row("format_tai", "xdp_reflector", ("add-session", "--ssid", "5", "--format", "tai"), "--format"),
    Row("format_tai", "xdp_collector", ("activate", "--ssid", "5", "--port", "50005", "--format", "tai"), "--format"),
    Row("format_tai", "ustamp_reflector", ("--sessions", "{sessions_badfmt}"), "sessions[0]: format"),
    Row("format_tai", "ustamp_sender", ("--ssid", "5", "--format", "tai"), "--format"),
    Row("format_tai", "c_sender", ("--ssid", "5", "--format", "tai"), "--format"),
    # SSID out of range (0 is valid: a plain RFC 8762 sender without an SSID)
    Row("ssid_negative", "xdp_reflector", ("add-session", "--ssid", "-1"), "--ssid"),
    Row("ssid_negative", "xdp_collector", ("activate", "--ssid", "-1", "--port", "50000"), "--ssid"),
    Row("ssid_negative", "ustamp_reflector", ("--add-session", "--ssid -1"), "ssid"),
    Row("ssid_negative", "ustamp_sender", ("--ssid", "-1"), "--ssid"),
    Row("ssid_negative", "c_sender", ("--ssid", "-1"), "--ssid"),
    Row("ssid_65536", "xdp_reflector", ("add-session", "--ssid", "65536"), "--ssid"),
    Row("ssid_65536", "xdp_collector", ("activate", "--ssid", "65536", "--port", "50000"), "--ssid"),
    Row("ssid_65536", "ustamp_reflector", ("--add-session", "--ssid 65536"), "ssid"),
    Row("ssid_65536", "ustamp_sender", ("--ssid", "65536"), "--ssid"),
    Row("ssid_65536", "c_sender", ("--ssid", "65536"), "--ssid"),
    # the user-space reflector's engine options (a good session, so the flag is what is wrong)
    Row("workers_65", "ustamp_reflector", ("--add-session", "--ssid 5", "--workers", "65"), "--workers"),
    Row("batch_0", "ustamp_reflector", ("--add-session", "--ssid 5", "--batch", "0"), "--batch"),
    Row("send_batch_257", "ustamp_reflector", ("--add-session", "--ssid 5", "--send-batch", "257"), "--send-batch"),
    Row("rcvbuf_negative", "ustamp_reflector", ("--add-session", "--ssid 5", "--rcvbuf", "-1"), "--rcvbuf"),
    Row("steering_unknown", "ustamp_reflector", ("--add-session", "--ssid 5", "--steering", "flow"), "--steering"),
    Row("engine_unknown", "ustamp_reflector", ("--add-session", "--ssid 5", "--engine", "rust"), "--engine"),
]


@pytest.fixture(scope="module")
def env(bpffs, tmp_path_factory):
    """Namespace with a veth pair: the XDP reflector on c0, the XDP collector on c1; bad files."""
    build()
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    d = tmp_path_factory.mktemp("cmc")
    files = {
        "keys_noid": d / "keys_noid.json",
        "keys_badcur": d / "keys_badcur.json",
        "sessions_badfmt": d / "sessions.json",
    }
    files["keys_noid"].write_text(json.dumps({"keys": [{"key_hex": KEY}]}))
    files["keys_badcur"].write_text(json.dumps({"keys": [{"id": 1, "key_hex": KEY}], "current": 3}))
    files["sessions_badfmt"].write_text(json.dumps([{"ssid": 5, "format": "tai"}]))
    try:
        for cmd in (
            ["link", "set", "lo", "up"],
            ["link", "add", "c0", "type", "veth", "peer", "name", "c1"],
            ["link", "set", "c0", "up"],
            ["link", "set", "c1", "up"],
        ):
            subprocess.run(["ip", "-n", NETNS, *cmd], check=True)
        run_tool(XDP_REFLECTOR, "attach", "--netns", NETNS, "--dev", "c0", "--pin-dir", f"{PIN}/stamp_reflector")
        run_tool(XDP_COLLECTOR, "attach", "--netns", NETNS, "--dev", "c1", "--pin-dir", f"{PIN}/stamp_collector")
        yield {k: str(v) for k, v in files.items()}
    finally:
        run_tool(
            XDP_REFLECTOR, "detach", "--netns", NETNS, "--dev", "c0", "--pin-dir", f"{PIN}/stamp_reflector", check=False
        )
        run_tool(
            XDP_COLLECTOR, "detach", "--netns", NETNS, "--dev", "c1", "--pin-dir", f"{PIN}/stamp_collector", check=False
        )
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        subprocess.run(["rmdir", PIN], capture_output=True)


def command(row: Row, files: dict[str, str]) -> list[str]:
    args = [a.format(**files) for a in row.args]
    if row.tool == "xdp_reflector":
        return [str(XDP_REFLECTOR), *args, "--pin-dir", f"{PIN}/stamp_reflector"]
    if row.tool == "xdp_collector":
        return [str(XDP_COLLECTOR), *args, "--pin-dir", f"{PIN}/stamp_collector"]
    if row.tool == "ustamp_reflector":
        return [PY, "-m", "collectors.ustamp", "reflector", "--netns", NETNS, *args]
    if row.tool == "ustamp_sender":
        return [PY, "-m", "collectors.ustamp", "sender", "--netns", NETNS, *SENDER, *args]
    return [str(C_SENDER), "--netns", NETNS, *SENDER, *args]


@pytest.mark.parametrize(
    "row",
    [pytest.param(r, id=r.id, marks=[pytest.mark.xfail(reason=r.xfail, strict=True)] if r.xfail else []) for r in ROWS],
)
def test_refused_naming_the_field(env, row):
    try:
        res = subprocess.run(command(row, env), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{row.tool} accepted the configuration and kept running")
    assert res.returncode == row.rc, (res.returncode, res.stdout, res.stderr)
    # the error message (not the usage text the tools print with it) names the field
    message = [l for l in res.stderr.splitlines() if l.strip() and not l.startswith((" ", "\t", "usage"))]
    assert any(row.field in l for l in message), res.stderr


def test_limits_themselves_are_accepted(env):
    """The boundaries are not refused: 8 return SIDs in XDP, SSID 65535 in every loader."""
    run_tool(
        XDP_REFLECTOR, "add-session", "--pin-dir", f"{PIN}/stamp_reflector", "--ssid", "65535", "--return-sids", SIDS_8
    )
    run_tool(XDP_REFLECTOR, "del-session", "--pin-dir", f"{PIN}/stamp_reflector", "--ssid", "65535")
    run_tool(XDP_COLLECTOR, "activate", "--pin-dir", f"{PIN}/stamp_collector", "--ssid", "65535", "--port", "50000")
    run_tool(XDP_COLLECTOR, "deactivate", "--pin-dir", f"{PIN}/stamp_collector", "--ssid", "65535")
    # the reflector's session is gone: deleting it again fails (exit 1)
    res = run_tool(XDP_REFLECTOR, "del-session", "--pin-dir", f"{PIN}/stamp_reflector", "--ssid", "65535", check=False)
    assert res.returncode == 1 and "65535" in res.stderr
