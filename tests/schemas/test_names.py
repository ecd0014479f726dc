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
    assert len(set(names.TOPIC_PARTITIONS)) == len(names.REGISTRY["topics"])   # no two keys share a topic
    for topic, parts in names.TOPIC_PARTITIONS.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic), topic           # Kafka's legal topic names
        assert parts >= 1
    assert names.BPFFS_PIN_ROOT.startswith("/sys/fs/bpf/")


def test_c_sees_the_same_names(tmp_path):
    """Compile a tiny C program against the header and compare what it prints with Python's view."""
    src = tmp_path / "names.c"
    src.write_text('#include <stdio.h>\n#include "segscope_names.h"\nint main(void){'
                   'printf("%s %s %s %s %s %s\\n", SEGSCOPE_TOPIC_STAMP_RECORDS, SEGSCOPE_TOPIC_ALTMARK_BLOCKS,'
                   'SEGSCOPE_TOPIC_METRICS, SEGSCOPE_TOPIC_DEADLETTER, SEGSCOPE_TOPIC_TOPOLOGY,'
                   'SEGSCOPE_BPFFS_PIN_ROOT); return 0; }\n')
    exe = tmp_path / "names"
    subprocess.run(["cc", "-Werror", "-Wall", f"-I{REPO / 'schemas' / 'c'}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out == [names.TOPIC_STAMP_RECORDS, names.TOPIC_ALTMARK_BLOCKS, names.TOPIC_METRICS,
                   names.TOPIC_DEADLETTER, names.TOPIC_TOPOLOGY, names.BPFFS_PIN_ROOT]
