"""Health and counters of one segscope process over HTTP: what a Kubernetes probe, Prometheus or
an operator with curl reads. Shared by the processors (processors/runtime/health.py) and the agent.

    GET /healthz   200 while the process's loop is alive (ticked within stale_after_s), else 503
    GET /readyz    200 while it is alive and did its job recently (e.g. a processor's last
                   publish to Kafka succeeded within stale_after_s), else 503 with the reason
    GET /metrics   the process's counters in Prometheus text format
    GET /status    the same as JSON: alive, ready, reason, the line-protocol lines

One source for the counters: the process hands the line-protocol lines it publishes on
`segscope.metrics` (schemas/metrics.md) to set_lines(); /metrics renders each integer or float
field as `<measurement>_<field>{<tags>} <value>`. So a probe, a Prometheus scrape and a Grafana
panel on InfluxDB read the same numbers.

Liveness and readiness are separate on purpose: during a Kafka outage a processor is alive (its
loop runs, it buffers) but not ready; a liveness probe that restarted it then would only replay
its input again.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from segscope_schemas.line_protocol import parse_lines


class HealthAddressError(ValueError):
    """A health address that cannot be parsed or bound; the message says which and the fix."""


def parse_address(value: str, where: str) -> tuple[str, int] | None:
    """'HOST:PORT' -> (host, port); 'off' -> None. `where` names the flag or variable for the error."""
    if value.strip().lower() in ("off", "none", ""):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise HealthAddressError(
            f"{where}={value!r} is not HOST:PORT; fix: e.g. 127.0.0.1:9641, 0.0.0.0:9641 in a pod, or 'off'"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def _prom_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(lines: list[str]) -> str:
    """Line protocol (`m,tag=v f=1i,g=2.5 ts`) -> Prometheus text exposition; string and boolean
    fields are skipped (Prometheus has only numbers), unreadable lines too. One # TYPE line per
    metric name."""
    points, _ = parse_lines("\n".join(lines))
    samples: dict[str, list[str]] = {}
    for p in points:
        labels = ",".join(f'{k}="{_prom_label(v)}"' for k, v in p.tags.items())
        labels = "{" + labels + "}" if labels else ""
        for key, value in p.fields.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            samples.setdefault(f"{p.measurement}_{key}", []).append(f"{labels} {value}")
    out = []
    for name, values in samples.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(name + v for v in values)
    return "\n".join(out) + "\n"


class Health:
    """Liveness, readiness and the latest counter lines of one process, served by serve()."""

    def __init__(self, name: str, stale_after_s: float = 15.0):
        self.name = name
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._last_tick = time.monotonic()
        self._last_ok: float | None = None
        self._not_ready = "starting"
        self._lines: dict[str, list[str]] = {}
        self._server: ThreadingHTTPServer | None = None
        self.address: tuple[str, int] | None = None

    # -- what the process reports -----------------------------------------------------------
    def tick(self) -> None:
        """The process's loop is running (call it from that loop, not from another thread)."""
        self._last_tick = time.monotonic()

    def ok(self) -> None:
        """The process did its job just now (e.g. a publish was acknowledged)."""
        with self._lock:
            self._last_ok = time.monotonic()
            self._not_ready = ""

    def not_ready(self, reason: str) -> None:
        with self._lock:
            self._not_ready = reason

    def set_lines(self, source: str, lines: list[str]) -> None:
        """The latest line-protocol lines of one source (replaces that source's previous lines)."""
        with self._lock:
            self._lines[source] = list(lines)

    # -- what a probe reads -----------------------------------------------------------------
    def state(self) -> dict:
        now = time.monotonic()
        with self._lock:
            tick_age = now - self._last_tick
            ok_age = None if self._last_ok is None else now - self._last_ok
            alive = tick_age <= self.stale_after_s
            reason = ""
            if not alive:
                reason = f"loop has not run for {tick_age:.1f} s"
            elif self._not_ready:
                reason = self._not_ready
            elif ok_age is None or ok_age > self.stale_after_s:
                reason = "no successful publish for %s" % ("ever" if ok_age is None else f"{ok_age:.1f} s")
            lines = [ln for src in self._lines.values() for ln in src]
        return {
            "name": self.name,
            "alive": alive,
            "ready": alive and not reason,
            "reason": reason,
            "loop_age_s": round(tick_age, 3),
            "last_ok_age_s": None if ok_age is None else round(ok_age, 3),
            "lines": lines,
        }

    # -- the server -------------------------------------------------------------------------
    def serve(self, address: tuple[str, int], where: str = "health address") -> tuple[str, int]:
        """Serve on address (port 0: any free port) in a daemon thread; returns the bound address."""
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                st = health.state()
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    code, body, ctype = (
                        (200 if st["alive"] else 503),
                        ("ok\n" if st["alive"] else st["reason"] + "\n"),
                        "text/plain",
                    )
                elif path == "/readyz":
                    code, body, ctype = (
                        (200 if st["ready"] else 503),
                        ("ready\n" if st["ready"] else st["reason"] + "\n"),
                        "text/plain",
                    )
                elif path == "/metrics":
                    up = f'segscope_up{{process="{_prom_label(health.name)}"}} {int(st["ready"])}\n'
                    code, body, ctype = 200, up + prometheus_text(st["lines"]), "text/plain; version=0.0.4"
                elif path == "/status":
                    code, body, ctype = 200, json.dumps(st, indent=1) + "\n", "application/json"
                else:
                    code, body, ctype = 404, "paths: /healthz /readyz /metrics /status\n", "text/plain"
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # probes every few seconds: no access log
                pass

        try:
            self._server = ThreadingHTTPServer(address, Handler)
        except OSError as e:
            raise HealthAddressError(
                f"{where}={address[0]}:{address[1]}: cannot listen ({e.strerror}); "
                "fix: choose a free port, port 0 for any free one, or 'off'"
            ) from None
        self._server.daemon_threads = True
        self.address = self._server.server_address[:2]
        threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True).start()
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
