"""The Secrets' files a kustomize overlay generates its Secrets from (never committed):

    .local/venv/bin/python scripts/kustomize_secrets.py kustomize/overlays/dev/secrets [--force]

    credentials.env     every user and a random 32-character password (keys as the Helm chart's)
    ca.crt              a private CA (controller/pki.py), 30 days: a lab's
    agent.crt/.key      the agents' server certificate, name "segscope-agent" (tls.agentServerName)
    controller.crt/.key the controller's client certificate

Existing files are kept unless --force, so re-running never rotates a running lab's secrets.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import string
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controller.pki import make_pki  # noqa: E402

USERS = {
    "influxdb-admin-user": "admin",
    "influxdb-writer-user": "segscope_writer",
    "influxdb-reader-user": "segscope_reader",
    "arangodb-user": "root",
    "grafana-admin-user": "admin",
}
AGENT_SERVER_NAME = "segscope-agent"


def password() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(32))


def write(directory: Path, force: bool = False) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    env = directory / "credentials.env"
    if force or not env.exists():
        lines = [f"{k}={v}" for k, v in USERS.items()]
        lines += [f"{k.removesuffix('-user')}-password={password()}" for k in USERS]
        env.write_text("\n".join(sorted(lines)) + "\n")
        env.chmod(0o600)
        made.append(env)
    if force or not (directory / "ca.crt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            p = make_pki(tmp, [AGENT_SERVER_NAME])
            for src, dst in (
                (p["ca"], "ca.crt"),
                (p[f"agent-{AGENT_SERVER_NAME}.pem"], "agent.crt"),
                (p[f"agent-{AGENT_SERVER_NAME}.key"], "agent.key"),
                (p["controller.pem"], "controller.crt"),
                (p["controller.key"], "controller.key"),
            ):
                shutil.copyfile(src, directory / dst)
                (directory / dst).chmod(0o600)
                made.append(directory / dst)
    return made


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--force", action="store_true", help="replace existing files")
    a = ap.parse_args()
    for path in write(Path(a.dir), a.force):
        print(f"wrote {path}")
