"""The ArangoDB the topology tests write to (helper of conftest.py and the e2e test).

By default an in-process STAND-IN (tests/topology/arango_standin.py, not ArangoDB) on a free
port. With SEGSCOPE_ARANGO_URL (+ SEGSCOPE_ARANGO_USER, SEGSCOPE_ARANGO_PASSWORD) the same tests
run against that real ArangoDB; each test uses its own database `segscope_test_<random>`,
dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass

from arango_standin import ArangoStandin


@dataclass
class ArangoTarget:
    url: str
    user: str
    password: str
    db_name: str
    standin: ArangoStandin | None  # None: a real ArangoDB


@contextlib.contextmanager
def arango_target():
    """The stand-in, or the real ArangoDB of SEGSCOPE_ARANGO_URL, with a fresh database name."""
    db_name = f"segscope_test_{uuid.uuid4().hex[:10]}"
    url = os.environ.get("SEGSCOPE_ARANGO_URL")
    if url:
        user = os.environ.get("SEGSCOPE_ARANGO_USER", "root")
        password = os.environ.get("SEGSCOPE_ARANGO_PASSWORD", "")
        try:
            yield ArangoTarget(url, user, password, db_name, None)
        finally:
            from arango import ArangoClient

            sys_db = ArangoClient(hosts=url).db("_system", username=user, password=password)
            if sys_db.has_database(db_name):
                sys_db.delete_database(db_name)
        return
    with ArangoStandin() as standin:
        yield ArangoTarget(standin.url, standin.user, standin.password, db_name, standin)
