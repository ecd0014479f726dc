"""The pieces of hitless restarts without a lab: process identity (pid + start time), the handle of
an adopted process, the state directory's lock, datapath.json's checks, the orphan reports, and
the tether of the C programs (collectors/tether.h) against a real lock."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.keeper import Adopted, AgentLockError, Keeper, ProcRef, boot_id, stop_proc
from tests.built import require

REPO = Path(__file__).resolve().parents[2]
SENDER = REPO / "build" / "collectors" / "stamp_sender"


def sleeper(seconds: float = 30) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)


def test_a_pid_is_the_process_only_with_its_start_time():
    p = sleeper()
    try:
        ref = ProcRef.of(p.pid)
        assert ref is not None and ref.alive()
        assert not ProcRef(p.pid, ref.start + 1).alive()  # the same pid, another process
        assert ProcRef.from_json(ref.to_json()) == ref and ProcRef.from_json({"pid": "x"}) is None
    finally:
        p.kill()
        p.wait()
    assert not ref.alive()


def test_an_adopted_process_is_waited_for_and_stopped_through_its_pidfd():
    p = sleeper()
    h = Adopted.open(ProcRef.of(p.pid))
    assert h is not None and h.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        h.wait(0.1)
    stop_proc(h, 5.0)  # SIGTERM through the pidfd, then waits
    assert h.returncode == Adopted.ENDED and p.wait(5) == -15
    assert Adopted.open(ProcRef(p.pid, 1)) is None  # not that process (any more)


def test_one_agent_per_state_directory(tmp_path):
    first = Keeper(tmp_path, 30, "A", "i", "1")
    first.lock()
    assert (tmp_path / "agent.lock").read_text().strip().isdigit()
    second = Keeper(tmp_path, 30, "A", "i", "1")
    t0 = time.monotonic()
    with pytest.raises(AgentLockError, match="another agent of instance i runs"):
        second.lock()
    assert time.monotonic() - t0 >= 4  # it waited (a data-path process's look holds the lock briefly)


def test_datapath_json_is_adopted_only_if_this_version_and_this_boot_wrote_it(tmp_path):
    k = Keeper(tmp_path, 30, "A", "i", "1")
    k.put("stamp", {"sessions": []})
    doc = json.loads((tmp_path / "datapath.json").read_text())
    assert doc["format"] == 1 and doc["boot_id"] == boot_id() and doc["stamp"] == {"sessions": []}
    assert Keeper(tmp_path, 30, "A", "i", "2").load()["stamp"] == {"sessions": []}
    (tmp_path / "datapath.json").write_text(json.dumps({**doc, "boot_id": "another boot"}))
    assert Keeper(tmp_path, 30, "A", "i", "2").load() is None
    (tmp_path / "datapath.json").write_text(json.dumps({**doc, "format": 99}))
    newer = Keeper(tmp_path, 30, "A", "i", "2")
    assert newer.load() is None and newer.previous["format"] == 99  # its processes get stopped
    off = Keeper(tmp_path / "off", 0, "A", "i", "1")
    off.put("stamp", {"x": 1})
    assert not (tmp_path / "off" / "datapath.json").exists()  # --adopt-timeout 0 writes nothing


def test_orphan_reports_are_counted_once_and_kept_across_agents(tmp_path):
    (tmp_path / "orphans.jsonl").write_text('{"program":"stamp_sender","pid":1}\n{"program":"x"}\nnot json\n')
    k = Keeper(tmp_path, 30, "A", "i", "1")
    assert [r["program"] for r in k.take_orphan_reports()] == ["stamp_sender", "x", "?"]
    assert k.take_orphan_reports() == [] and k.orphans_stopped == 3
    k.put("stamp", {})
    nxt = Keeper(tmp_path, 30, "A", "i", "1")
    (tmp_path / "orphans.jsonl").write_text('{"program":"altmark_collector"}\n')
    nxt.take_orphan_reports()
    nxt.load()
    assert nxt.orphans_stopped == 4


def test_the_tether_of_a_data_path_process(tmp_path):
    """stamp_sender (the same tether.h in the streamer and the collector) keeps sending while an agent
    holds the lock, for the timeout after it lets go, then stops saying so."""
    require("collectors/stamp_sender")
    base = [str(SENDER), "--src", "::1", "--dst", "::1", "--rate", "1", "--count", "1"]
    bad = subprocess.run([*base, "--ssid", "1", "--adopt-timeout", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--adopt-timeout: needs --agent-dir" in bad.stderr
    none = str(tmp_path / "none")
    bad = subprocess.run(
        [*base, "--ssid", "1", "--agent-dir", none, "--adopt-timeout", "3"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "cannot open" in bad.stderr
    lock = open(tmp_path / "agent.lock", "a")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    cmd = [str(SENDER), "--src", "::1", "--dst", "::1", "--ssid", "9", "--sport", "41009", "--rate", "20"]
    cmd += ["--duration", "60", "--agent-dir", str(tmp_path), "--adopt-timeout", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)  # > the timeout: an agent holds the lock
        assert p.poll() is None
        lock.close()  # the agent goes
        t0 = time.monotonic()
        out, err = p.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert 1.0 <= took <= 2.6, took  # the timeout, + up to a look's interval (0.25 s here) and the exit
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["orphaned"] is True and summary["sent"] >= 40
    assert "ssid 9: no agent adopted this process within 1 s" in err
    report = json.loads((tmp_path / "orphans.jsonl").read_text())
    assert report["program"] == "stamp_sender" and report["pid"] == p.pid and report["what"] == "ssid 9"


def test_an_adopted_process_waited_for_by_two_threads_at_once(tmp_path):
    """A reader thread blocks in wait() while a stop waits too: the pidfd is closed once (a second
    close would be EBADF, or close a descriptor another part of the agent opened since)."""
    import threading

    for _ in range(20):
        p = sleeper()
        h = Adopted.open(ProcRef.of(p.pid))
        errors: list[BaseException] = []

        def waiter(handle=h, errs=errors):
            try:
                handle.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the assertion below
                errs.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        stop_proc(h, 5.0)
        t.join(5)
        p.wait(5)
        assert not t.is_alive() and errors == [] and h.returncode == Adopted.ENDED


def test_the_tether_of_the_userspace_reflector(tmp_path):
    """collectors/ustamp/tether.py: the user-space reflector answers while an agent holds the lock,
    for the timeout after it lets go, then stops as on SIGTERM saying so (stderr, orphans.jsonl,
    its final counters marked orphaned)."""
    env = {"PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
    base = [sys.executable, "-m", "collectors.ustamp", "reflector", "--address", "::1", "--engine", "python"]
    bad = subprocess.run([*base, "--adopt-timeout", "3"], capture_output=True, text=True, cwd=REPO, env=env)
    assert bad.returncode == 2 and "--adopt-timeout: needs --agent-dir" in bad.stderr
    bad = subprocess.run(
        [*base, "--agent-dir", str(tmp_path / "none"), "--adopt-timeout", "3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert bad.returncode == 2 and "--agent-dir: cannot open" in bad.stderr
    lock = open(tmp_path / "agent.lock", "a")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    cmd = [*base, "--port", "41862", "--agent-dir", str(tmp_path), "--adopt-timeout", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        assert json.loads(p.stdout.readline())["event"] == "ready"
        time.sleep(2.5)  # > the timeout: an agent holds the lock
        assert p.poll() is None
        lock.close()  # the agent goes
        t0 = time.monotonic()
        out, err = p.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and 1.0 <= took <= 2.6, (p.returncode, took, err)
    final = json.loads(out.strip().splitlines()[-1])
    assert final["final"] is True and final["orphaned"] is True
    assert "ustamp_reflector: port 41862: no agent adopted this process within 1 s" in err
    report = json.loads((tmp_path / "orphans.jsonl").read_text())
    assert report["program"] == "ustamp_reflector" and report["pid"] == p.pid and report["what"] == "port 41862"


def test_an_adopted_process_waited_for_by_several_threads_ends_once_for_all():
    """The agent's reaper thread waits on an adopted sender while Reset stops it: every waiter sees
    the end, none fails (a pidfd closed by the first to wake was EBADF for the others)."""
    import threading

    p = sleeper()
    h = Adopted.open(ProcRef.of(p.pid))
    errors, ended = [], []

    def waiter():
        try:
            ended.append(h.wait(10))
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errors.append(repr(e))

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    stop_proc(h, 5.0)  # SIGTERM through the pidfd, waits too
    for t in threads:
        t.join(10)
    assert errors == [] and ended == [Adopted.ENDED] * 4, (errors, ended)
    assert p.wait(5) == -15
