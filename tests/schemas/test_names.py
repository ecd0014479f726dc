"""The names registry (schemas/names.toml): the generated C header is current, and the names the
C programs and Python modules use come from it (a name written by hand elsewhere drifts)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from segscope_schemas import names

REPO = Path(__file__).resolve().parents[2]


def test_c_header_is_generated_from_the_registry():
    on_disk = (REPO / "schemas" / "c" / "segscope_names.h").read_text()
    assert on_disk == names.c_header(), "stale: run `make -C schemas names`"


def test_registry_values_are_sane():
    assert len(set(names.TOPIC_PARTITIONS)) == len(names.REGISTRY["topics"])  # no two keys share a topic
    for topic, parts in names.TOPIC_PARTITIONS.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic), topic  # Kafka's legal topic names
        assert parts >= 1
    assert names.BPFFS_PIN_ROOT.startswith("/sys/fs/bpf/")


def test_c_sees_the_same_names(tmp_path):
    """Compile a tiny C program against the header and compare what it prints with Python's view."""
    src = tmp_path / "names.c"
    src.write_text(
        '#include <stdio.h>\n#include "segscope_names.h"\nint main(void){'
        'printf("%s %s %s %s %s %s\\n", SEGSCOPE_TOPIC_STAMP_RECORDS, SEGSCOPE_TOPIC_ALTMARK_BLOCKS,'
        'SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER, SEGSCOPE_TOPIC_TOPOLOGY,'
        'SEGSCOPE_BPFFS_PIN_ROOT); return 0; }\n'
    )
    exe = tmp_path / "names"
    subprocess.run(["cc", "-Werror", "-Wall", f"-I{REPO / 'schemas' / 'c'}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out == [
        names.TOPIC_STAMP_RECORDS,
        names.TOPIC_ALTMARK_BLOCKS,
        names.TOPIC_METRICS,
        names.TOPIC_DEADLETTER,
        names.TOPIC_TOPOLOGY,
        names.BPFFS_PIN_ROOT,
    ]


# Folders of the product (and its benchmarks): a topic, group or bpffs name written there as a
# literal instead of read from the registry would drift when the registry changes.
PRODUCT_DIRS = ("agent", "bench", "collectors", "controller", "datapath", "netlab", "processors", "scripts", "services")
SOURCE_SUFFIXES = {".py", ".c", ".h", ".conf", ".yaml", ".toml", ".properties"}


def _registered_literals() -> list[str]:
    values = [t["name"] for t in names.REGISTRY["topics"].values()]
    values += list(names.GROUPS.values()) + [names.BPFFS_PIN_ROOT]
    return [f'"{v}"' for v in values] + [f"'{v}'" for v in values]


def test_no_registered_name_is_written_as_a_literal_in_product_code():
    literals = _registered_literals()
    found = []
    for top in PRODUCT_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if "getLogger(" in line:  # logger names may share a topic's spelling
                    continue
                found += [f"{path.relative_to(REPO)}:{n}: {lit}" for lit in literals if lit in line]
    assert not found, "read these from segscope_schemas.names / segscope_names.h instead:\n" + "\n".join(found)


def test_the_drift_check_would_see_a_literal(tmp_path):
    """The check above is not vacuous: the literals it looks for are what a hand-written name looks like."""
    line = f'producer.produce("{names.TOPIC_METRICS}", value)'
    assert any(lit in line for lit in _registered_literals())
