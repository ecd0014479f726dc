"""Offline Kubernetes JSON schemas for kubeconform, from the PyPI package kubernetes-validate.

    .local/venv/bin/python scripts/k8s_schemas.py v1.33.0 .local/k8s-schemas

kubernetes-validate bundles the schemas of Kubernetes v1.25-v1.37 as `$id` documents whose refs
point into one shared `/api/_definitions.json`; kubeconform resolves neither. This writes one
standalone file per kind (the definitions it needs copied into its own `$defs`), in the layout
kubeconform expects under `-schema-location DIR`: DIR/<version>-standalone[-strict]/<kind>.json.
Idempotent: a finished version directory (marker file) is not written again.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REF = re.compile(r'"/api/_definitions\.json#/\$defs/([^"]+)"')
LOCAL_REF = re.compile(r'"#/\$defs/([^"]+)"')


def convert(version: str, out_root: Path) -> int:
    import kubernetes_validate

    src_root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    written = 0
    for strict in ("", "-strict"):
        src = src_root / f"{version}-local{strict}"
        if not src.is_dir():
            have = sorted(p.name.removesuffix("-local") for p in src_root.glob("*-local"))
            raise SystemExit(f"kubernetes-validate has no schemas for {version}; it has {', '.join(have)}")
        dst = out_root / f"{version}-standalone{strict}"
        if (dst / ".complete").exists():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        defs = json.loads((src / "_definitions.json").read_text())["$defs"]
        for path in sorted(src.glob("*.json")):
            if path.name.startswith("_") or path.name == "all.json":
                continue
            text = path.read_text()
            need: set[str] = set()
            todo = REF.findall(text)
            while todo:  # the transitive closure of the definitions this kind refers to
                name = todo.pop()
                if name in need or name not in defs:
                    continue
                need.add(name)
                todo += LOCAL_REF.findall(json.dumps(defs[name]))
            doc = json.loads(REF.sub(lambda m: f'"#/$defs/{m.group(1)}"', text))
            doc.pop("$id", None)
            doc["$defs"] = {name: defs[name] for name in sorted(need)}
            (dst / path.name).write_text(json.dumps(doc))
            written += 1
        (dst / ".complete").write_text("")
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    n = convert(sys.argv[1], Path(sys.argv[2]))
    print(f"k8s schemas {sys.argv[1]}: {n} files written under {sys.argv[2]}")
