"""STAND-IN for an ArangoDB server: NOT ArangoDB. Only for tests on machines where ArangoDB
cannot be installed (no Debian package, no Docker; see the project notes on this kind of machine).

It implements, in memory, exactly the ArangoDB 3.x HTTP endpoints that python-arango sends for
what segscope's topology writer does (processors/topology/writer.py), with ArangoDB's status
codes, error numbers and response bodies, so the real python-arango client code runs unchanged:

  auth     HTTP Basic (python-arango's default) or a JWT (auth_method="jwt"): every request
           needs one (401 + errorNum 11 otherwise)
  POST   /_open/auth                             user+password -> {"jwt": HS256 token, 1 h}
  GET    /_db/_system/_api/database              list databases          (has_database)
  POST   /_db/_system/_api/database              create database         (create_database)
  GET    /_db/{db}/_api/collection               list collections        (has_collection, verify)
  POST   /_db/{db}/_api/collection               create collection (type 2 document, 3 edge)
  GET    /_db/{db}/_api/index?collection=C       list indexes (primary, edge, persistent)
  POST   /_db/{db}/_api/index?collection=C       create a persistent index; an identical one
                                                 answers 200 with the existing index
  GET    /_db/{db}/_api/gharial/{graph}          get graph / 404         (has_graph)
  POST   /_db/{db}/_api/gharial                  create graph (+ its missing collections)
  POST   /_db/{db}/_api/document/{coll}          insert one/many; overwriteMode=update|replace|
                                                 ignore|conflict, mergeObjects, keepNull
  GET    /_db/{db}/_api/document/{coll}/{key}    read one                (collection.get)
  DELETE /_db/{db}/_api/document/{coll}          delete many by key      (delete_many)
  POST   /_db/{db}/_api/cursor                   AQL: ONLY the query texts in QUERIES below
                                                 (whitespace-insensitive), with bind variables;
                                                 any other query gets 400 / errorNum 1501
  POST|PUT /_db/{db}/_api/cursor/{id}            next batch (PUT is the pre-3.8 spelling)
  DELETE /_db/{db}/_api/cursor/{id}              drop a cursor

ArangoDB's rules it enforces (errors as ArangoDB's lib/Basics/errors.dat numbers them):
  _key      a string of 1..254 bytes of [A-Za-z0-9_-:.@()+,=;$!*'%]: else 1221 "illegal document
            key" (HTTP 400; per document in a batch insert)
  bind vars every @name / @@collection the text declares must be given (1551) and no other
            (1552); a collection bind value must be a string (1553); an unknown collection is
            404 / 1203
  cursors   batchSize (default 1000) rows per answer; hasMore + id while rows remain; the cursor
            is dropped after its last batch; an unknown id is 404 / 1600 "cursor not found"

Anything else answers 501 with a message naming the method and path, so a writer change that
needs a new endpoint fails loudly instead of being silently accepted.

Run standalone:  python tests/topology/arango_standin.py --port 18529 [--user root --password pw]
In tests: `with ArangoStandin() as s: s.url` (port 0 = a free port chosen by the OS).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

KEY_RE = re.compile(r"^[A-Za-z0-9_\-:.@()+,=;$!*'%]{1,254}$")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,255}$")


def _norm(q: str) -> str:
    return " ".join(q.split())


if __name__ == "__main__":  # run as a script: make the repository importable
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The only AQL implemented: the stand-in's OWN copies of the texts the topology writer sends
# (processors/topology/writer.py). Not imported: a query changed there is refused here (1501),
# as ArangoDB refuses what it cannot run, until someone implements the new text below too.
Q_ALL = "FOR d IN @@collection RETURN d"
Q_ANNOTATE_EDGES = (
    "FOR a IN @annotations "
    "FOR e IN @@edges FILTER e.local_link_ip == a.local_ip AND e.remote_link_ip == a.remote_ip "
    "UPDATE e WITH a.fields IN @@edges OPTIONS { keepNull: false, mergeObjects: false } "
    "RETURN {local_ip: a.local_ip, remote_ip: a.remote_ip, key: NEW._key}"
)
Q_EXPIRE = (
    "FOR e IN @@edges FILTER e.@stamp_field != null AND e.@stamp_field < @cutoff_ns "
    "UPDATE e WITH @unset IN @@edges OPTIONS { keepNull: false } RETURN NEW._key"
)
Q_NODE_BY_NAME = "FOR n IN @@nodes FILTER n.name == @name LIMIT 1 RETURN n._id"
QUERIES = {_norm(q): q for q in (Q_ALL, Q_ANNOTATE_EDGES, Q_EXPIRE, Q_NODE_BY_NAME)}
BIND_RE = re.compile(r"@(@?[A-Za-z_][A-Za-z0-9_]*)")
DEFAULT_BATCH_SIZE = 1000  # ArangoDB's default batchSize


def _aql_rank(v) -> int:
    """AQL's type order: null < bool < number < string < array < object."""
    if v is None:
        return 0
    if isinstance(v, bool):
        return 1
    if isinstance(v, (int, float)):
        return 2
    if isinstance(v, str):
        return 3
    return 4 if isinstance(v, list) else 5


def _aql_lt(a, b) -> bool:
    ra, rb = _aql_rank(a), _aql_rank(b)
    return ra < rb if ra != rb else (ra in (1, 2, 3) and a < b)


def valid_key(key) -> bool:
    return isinstance(key, str) and bool(KEY_RE.match(key)) and len(key.encode()) <= 254


class ArangoError(Exception):
    def __init__(self, status: int, num: int, message: str):
        super().__init__(message)
        self.status, self.num, self.message = status, num, message


class Store:
    """Databases -> collections -> documents, in memory."""

    def __init__(self):
        self.lock = threading.Lock()
        self.dbs: dict[str, dict] = {"_system": self._new_db()}
        self.rev = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for tests
        self.cursors: dict[str, dict] = {}  # id -> {"rows": remaining rows, "batch": size, "extra": ...}
        self.next_id = 0
        self.queries: list[str] = []  # normalized text of every query run, for tests

    @staticmethod
    def _new_db() -> dict:
        return {"collections": {}, "graphs": {}}

    def next_rev(self) -> str:
        self.rev += 1
        return f"_r{self.rev:010d}"

    def db(self, name: str) -> dict:
        if name not in self.dbs:
            raise ArangoError(404, 1228, f"database not found: {name}")
        return self.dbs[name]

    def coll(self, db: str, name: str) -> dict:
        colls = self.db(db)["collections"]
        if name not in colls:
            raise ArangoError(404, 1203, f"collection or view not found: {name}")
        return colls[name]

    def create_coll(self, db: str, name: str, ctype: int) -> dict:
        colls = self.db(db)["collections"]
        if not NAME_RE.match(name or ""):
            raise ArangoError(400, 1208, f"illegal name: {name!r}")
        if name in colls:
            raise ArangoError(409, 1207, "duplicate name")
        indexes = [
            {
                "id": f"{name}/0",
                "type": "primary",
                "fields": ["_key"],
                "unique": True,
                "sparse": False,
                "name": "primary",
            }
        ]
        if ctype == 3:
            indexes.append(
                {
                    "id": f"{name}/1",
                    "type": "edge",
                    "fields": ["_from", "_to"],
                    "unique": False,
                    "sparse": False,
                    "name": "edge",
                }
            )
        colls[name] = {"id": str(len(colls) + 1000), "name": name, "type": ctype, "docs": {}, "indexes": indexes}
        return colls[name]


def _merge(old: dict, patch: dict, merge_objects: bool, keep_null: bool) -> dict:
    out = dict(old)
    for k, v in patch.items():
        if v is None and not keep_null:
            out.pop(k, None)
        elif merge_objects and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, True, keep_null)
        else:
            out[k] = v
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "segscope-arango-standin/1"
    store: Store
    user: str
    password: str
    jwt_secret: str

    def log_message(self, fmt, *args):  # quiet: tests read Store.requests instead
        pass

    # -- plumbing -----------------------------------------------------------------------
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        # headers and body in one write: two small writes on a keep-alive connection meet the
        # client's delayed ACK and cost ~40 ms per request
        self._headers_buffer.append(b"\r\n" + data)
        self.flush_headers()

    def _error(self, e: ArangoError) -> None:
        self._send(e.status, {"error": True, "errorNum": e.num, "errorMessage": e.message, "code": e.status})

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ArangoError(400, 600, "invalid JSON in request body") from None

    def _authorized(self) -> bool:
        h = self.headers.get("Authorization", "")
        if h.lower().startswith("bearer "):
            import jwt

            try:
                claims = jwt.decode(h[7:], self.jwt_secret, algorithms=["HS256"], issuer="arangodb")
            except jwt.PyJWTError:
                return False
            return claims.get("preferred_username") == self.user
        if not h.startswith("Basic "):
            return False
        try:
            user, _, pw = base64.b64decode(h[6:]).decode().partition(":")
        except ValueError:
            return False
        return user == self.user and pw == self.password

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.split("/") if p]
        try:
            body = self._body()
            self.store.requests.append((method, url.path))
            if method == "POST" and url.path == "/_open/auth":
                return self._send(*self._open_auth(body or {}))
            if not self._authorized():
                raise ArangoError(401, 11, "not authorized to execute this request")
            db = "_system"
            if len(parts) >= 2 and parts[0] == "_db":
                db, parts = parts[1], parts[2:]
            if parts[:1] != ["_api"] or len(parts) < 2:
                raise ArangoError(501, 9, f"stand-in does not implement {method} {url.path}")
            with self.store.lock:
                status, out = self._route(method, db, parts[1], parts[2:], params, body)
            self._send(status, out)
        except ArangoError as e:
            self._error(e)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def _open_auth(self, body):
        import jwt

        if body.get("username") != self.user or body.get("password") != self.password:
            raise ArangoError(401, 401, "Wrong credentials")
        now = int(time.time())
        token = jwt.encode(
            {"iss": "arangodb", "iat": now, "exp": now + 3600, "preferred_username": self.user},
            self.jwt_secret,
            algorithm="HS256",
        )
        return 200, {"jwt": token}

    # -- routes -------------------------------------------------------------------------
    def _route(self, method, db, api, rest, params, body):
        s = self.store
        if api == "database" and not rest:
            if db != "_system":
                raise ArangoError(403, 1230, "use database _system")
            if method == "GET":
                return 200, {"error": False, "code": 200, "result": sorted(s.dbs)}
            if method == "POST":
                name = (body or {}).get("name")
                if not NAME_RE.match(name or ""):
                    raise ArangoError(400, 1229, f"database name invalid: {name!r}")
                if name in s.dbs:
                    raise ArangoError(409, 1207, "duplicate database name")
                s.dbs[name] = s._new_db()
                return 201, {"error": False, "code": 201, "result": True}
        if api == "collection" and not rest:
            if method == "GET":
                colls = s.db(db)["collections"].values()
                return 200, {
                    "error": False,
                    "code": 200,
                    "result": [
                        {
                            "id": c["id"],
                            "name": c["name"],
                            "isSystem": False,
                            "type": c["type"],
                            "status": 3,
                            "globallyUniqueId": c["id"],
                        }
                        for c in colls
                    ],
                }
            if method == "POST":
                c = s.create_coll(db, (body or {}).get("name"), int((body or {}).get("type", 2)))
                return 200, {
                    "error": False,
                    "code": 200,
                    "id": c["id"],
                    "name": c["name"],
                    "type": c["type"],
                    "status": 3,
                    "isSystem": False,
                    "waitForSync": False,
                    "keyOptions": {"type": "traditional", "allowUserKeys": True},
                }
        if api == "gharial":
            return self._gharial(method, db, rest, body)
        if api == "document" and rest:
            return self._document(method, db, rest, params, body)
        if api == "cursor" and not rest and method == "POST":
            return self._cursor(db, body or {})
        if api == "cursor" and len(rest) == 1 and method in ("POST", "PUT"):
            return self._cursor_next(rest[0])
        if api == "cursor" and len(rest) == 1 and method == "DELETE":
            if self.store.cursors.pop(rest[0], None) is None:
                raise ArangoError(404, 1600, "cursor not found")
            return 202, {"id": rest[0], "error": False, "code": 202}
        if api == "index" and not rest and method in ("GET", "POST"):
            return self._index(method, db, params, body)
        raise ArangoError(501, 9, f"stand-in does not implement {method} /_api/{api}/{'/'.join(rest)}")

    def _graph_body(self, name: str, g: dict) -> dict:
        return {
            "_key": name,
            "_id": f"_graphs/{name}",
            "_rev": g["rev"],
            "name": name,
            "edgeDefinitions": g["edgeDefinitions"],
            "orphanCollections": g["orphanCollections"],
        }

    def _gharial(self, method, db, rest, body):
        graphs = self.store.db(db)["graphs"]
        if method == "GET" and len(rest) == 1:
            if rest[0] not in graphs:
                raise ArangoError(404, 1924, "graph 'name' not found")
            return 200, {"error": False, "code": 200, "graph": self._graph_body(rest[0], graphs[rest[0]])}
        if method == "POST" and not rest:
            name = (body or {}).get("name")
            if not NAME_RE.match(name or ""):
                raise ArangoError(400, 1921, f"invalid graph name {name!r}")
            if name in graphs:
                raise ArangoError(409, 1925, "graph already exists")
            edefs = body.get("edgeDefinitions") or []
            colls = self.store.db(db)["collections"]
            for d in edefs:
                for v in d["from"] + d["to"]:
                    if v not in colls:
                        self.store.create_coll(db, v, 2)
                if d["collection"] not in colls:
                    self.store.create_coll(db, d["collection"], 3)
                elif colls[d["collection"]]["type"] != 3:
                    raise ArangoError(400, 1237, f"{d['collection']} is not an edge collection")
            for v in body.get("orphanCollections") or []:
                if v not in colls:
                    self.store.create_coll(db, v, 2)
            graphs[name] = {
                "rev": self.store.next_rev(),
                "edgeDefinitions": edefs,
                "orphanCollections": body.get("orphanCollections") or [],
            }
            return 202, {"error": False, "code": 202, "graph": self._graph_body(name, graphs[name])}
        raise ArangoError(501, 9, f"stand-in does not implement {method} /_api/gharial/{'/'.join(rest)}")

    def _document(self, method, db, rest, params, body):
        coll = self.store.coll(db, rest[0])
        if method == "GET" and len(rest) == 2:
            doc = coll["docs"].get(rest[1])
            if doc is None:
                raise ArangoError(404, 1202, "document not found")
            return 200, doc
        if method == "POST" and len(rest) == 1:
            many = isinstance(body, list)
            docs = body if many else [body]
            results = [self._insert_one(coll, d, params) for d in docs]
            if not many:
                if "error" in results[0]:
                    raise ArangoError(
                        409 if results[0]["errorNum"] == 1210 else 400,
                        results[0]["errorNum"],
                        results[0]["errorMessage"],
                    )
                return 201, results[0]
            return 202 if any("error" in r for r in results) else 201, results
        if method == "DELETE" and len(rest) == 1:
            results = []
            for item in body or []:
                key = item if isinstance(item, str) else (item or {}).get("_key")
                doc = coll["docs"].pop(key, None)
                results.append(
                    {"_id": f"{coll['name']}/{key}", "_key": key, "_rev": doc["_rev"]}
                    if doc
                    else {"error": True, "errorNum": 1202, "errorMessage": "document not found"}
                )
            return 200, results
        raise ArangoError(501, 9, f"stand-in does not implement {method} /_api/document/{'/'.join(rest)}")

    def _insert_one(self, coll: dict, doc, params) -> dict:
        if not isinstance(doc, dict):
            return {"error": True, "errorNum": 1227, "errorMessage": "invalid document type"}
        mode = params.get("overwriteMode") or ("replace" if params.get("overwrite") == "true" else "conflict")
        merge = params.get("mergeObjects", "true") != "false"
        keep_null = params.get("keepNull", "true") != "false"
        key = doc["_key"] if "_key" in doc else str(self.store.rev + 1_000_000)  # no _key: generated
        if not valid_key(key):
            return {"error": True, "errorNum": 1221, "errorMessage": "illegal document key"}
        old = coll["docs"].get(key)
        if old is not None and mode == "conflict":
            return {
                "error": True,
                "errorNum": 1210,
                "errorMessage": "unique constraint violated - in index primary of type primary over '_key'",
            }
        if old is not None and mode == "ignore":
            return {"_id": old["_id"], "_key": key, "_rev": old["_rev"]}
        body = {k: v for k, v in doc.items() if k not in ("_id", "_rev", "_key")}
        new = _merge(old, body, merge, keep_null) if (old is not None and mode == "update") else body
        if coll["type"] == 3 and not (
            isinstance(new.get("_from"), str)
            and "/" in new["_from"]
            and isinstance(new.get("_to"), str)
            and "/" in new["_to"]
        ):
            return {"error": True, "errorNum": 1233, "errorMessage": "edge attribute missing or invalid"}
        rev = self.store.next_rev()
        new.update({"_key": key, "_id": f"{coll['name']}/{key}", "_rev": rev})
        coll["docs"][key] = new
        out = {"_id": new["_id"], "_key": key, "_rev": rev}
        if old is not None:
            out["_oldRev"] = old["_rev"]
        return out

    # -- indexes --------------------------------------------------------------------------
    def _index(self, method, db, params, body):
        coll = self.store.coll(db, params.get("collection", ""))
        if method == "GET":
            return 200, {
                "error": False,
                "code": 200,
                "indexes": coll["indexes"],
                "identifiers": {i["id"]: i for i in coll["indexes"]},
            }
        body = body or {}
        if body.get("type") != "persistent":
            raise ArangoError(501, 9, f"stand-in implements only persistent indexes, got {body.get('type')!r}")
        fields = body.get("fields")
        if not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields):
            raise ArangoError(400, 10, "index fields must be a non-empty array of attribute names")
        unique, sparse = bool(body.get("unique", False)), bool(body.get("sparse", False))
        for i in coll["indexes"]:
            if (i["type"], i["fields"], i["unique"], i["sparse"]) == ("persistent", fields, unique, sparse):
                return 200, {**i, "isNewlyCreated": False, "error": False, "code": 200}
        name = body.get("name") or f"idx_{len(coll['indexes'])}"
        if any(i["name"] == name for i in coll["indexes"]):
            raise ArangoError(409, 1207, f"duplicate value: index name {name!r} already used")
        index = {
            "id": f"{coll['name']}/{100 + len(coll['indexes'])}",
            "type": "persistent",
            "fields": fields,
            "unique": unique,
            "sparse": sparse,
            "name": name,
            "deduplicate": True,
            "estimates": True,
            "cacheEnabled": False,
        }
        coll["indexes"].append(index)
        return 201, {**index, "isNewlyCreated": True, "error": False, "code": 201}

    # -- AQL ------------------------------------------------------------------------------
    def _check_binds(self, db, text: str, bind: dict) -> None:
        declared = set(BIND_RE.findall(text))
        for name in sorted(declared - set(bind)):
            raise ArangoError(
                400, 1551, f"AQL: no value specified for declared bind parameter '{name}' (while parsing)"
            )
        for name in sorted(set(bind) - declared):
            raise ArangoError(400, 1552, f"AQL: bind parameter '{name}' was not declared in the query (while parsing)")
        for name in sorted(declared):
            if name.startswith("@"):
                if not isinstance(bind[name], str):
                    raise ArangoError(400, 1553, f"AQL: bind parameter '{name}' has an invalid value or type")
                if bind[name] not in self.store.db(db)["collections"]:
                    raise ArangoError(404, 1203, f"AQL: collection or view not found: {bind[name]} (while parsing)")

    def _cursor(self, db, body):
        query, bind = _norm(body.get("query", "")), body.get("bindVars") or {}
        if not query:
            raise ArangoError(400, 1502, "query is empty")
        if query not in QUERIES:
            raise ArangoError(
                400, 1501, "AQL: query not implemented by the segscope ArangoDB stand-in (while parsing): " + query
            )
        batch = body.get("batchSize", DEFAULT_BATCH_SIZE)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ArangoError(400, 10, "expecting non-zero value for <batchSize>")
        self._check_binds(db, query, bind)
        self.store.queries.append(query)
        stats = {"writesExecuted": 0, "writesIgnored": 0, "scannedFull": 0, "scannedIndex": 0, "filtered": 0}
        if query == _norm(Q_ALL):
            result = list(self.store.coll(db, bind["@collection"])["docs"].values())
            stats["scannedFull"] = len(result)
        elif query == _norm(Q_NODE_BY_NAME):
            docs = self.store.coll(db, bind["@nodes"])["docs"].values()
            result = [d["_id"] for d in docs if d.get("name") == bind["name"]][:1]
        elif query == _norm(Q_ANNOTATE_EDGES):
            result = self._annotate(db, bind, stats)
        else:
            result = self._expire(db, bind, stats)
        extra = {"stats": stats, "warnings": []}
        out = {"error": False, "code": 201, "cached": False, "extra": extra}
        if body.get("count"):
            out["count"] = len(result)
        return 201, {**out, **self._batch(result, batch, extra)}

    def _batch(self, rows: list, size: int, extra: dict, cursor_id: str | None = None) -> dict:
        """The first `size` rows; the rest stays in a cursor (dropped with its last batch)."""
        head, rest = rows[:size], rows[size:]
        if not rest:
            if cursor_id is not None:
                self.store.cursors.pop(cursor_id, None)
            return {"result": head, "hasMore": False, **({"id": cursor_id} if cursor_id else {})}
        if cursor_id is None:
            self.store.next_id += 1
            cursor_id = str(900_000 + self.store.next_id)
        self.store.cursors[cursor_id] = {"rows": rest, "batch": size, "extra": extra}
        return {"result": head, "hasMore": True, "id": cursor_id}

    def _cursor_next(self, cursor_id: str):
        c = self.store.cursors.get(cursor_id)
        if c is None:
            raise ArangoError(404, 1600, "cursor not found")
        out = self._batch(c["rows"], c["batch"], c["extra"], cursor_id)
        return 200, {"error": False, "code": 200, "cached": False, "extra": c["extra"], **out}

    def _annotate(self, db, bind, stats) -> list:
        """Q_ANNOTATE_EDGES: every (annotation, edge) pair with equal link addresses; UPDATE
        sets each attribute of a.fields, an object value replacing the stored one whole
        (mergeObjects false), with keepNull false (a null value removes the attribute). Atomic,
        as one query is."""
        coll = self.store.coll(db, bind["@edges"])
        anns = bind["annotations"]
        if not isinstance(anns, list):
            raise ArangoError(400, 1563, "AQL: array expected (while executing)")
        updates, result = {}, []
        for a in anns:
            a = a if isinstance(a, dict) else {}
            for d in coll["docs"].values():
                if d.get("local_link_ip") != a.get("local_ip") or d.get("remote_link_ip") != a.get("remote_ip"):
                    continue
                if not isinstance(a.get("fields"), dict):
                    raise ArangoError(400, 1227, "invalid document type (while executing)")
                base = updates.get(d["_key"], d)
                updates[d["_key"]] = _merge(
                    base, {k: v for k, v in a["fields"].items() if not k.startswith("_")}, False, False
                )
                result.append({"local_ip": a.get("local_ip"), "remote_ip": a.get("remote_ip"), "key": d["_key"]})
        for key, new in updates.items():
            new["_rev"] = self.store.next_rev()
            coll["docs"][key] = new
        stats["writesExecuted"] = len(updates)
        return result

    def _expire(self, db, bind, stats) -> list:
        """Q_EXPIRE: edges whose e[@stamp_field] is not null and < @cutoff_ns get @unset merged
        with keepNull false (a null value removes the attribute)."""
        coll = self.store.coll(db, bind["@edges"])
        field, cutoff, unset = bind["stamp_field"], bind["cutoff_ns"], bind["unset"]
        if not isinstance(field, str) or not field:
            raise ArangoError(400, 1553, "AQL: bind parameter 'stamp_field' has an invalid value or type")
        if not isinstance(unset, dict):
            raise ArangoError(400, 1227, "invalid document type (while executing)")
        result = []
        for key, d in list(coll["docs"].items()):
            v = d.get(field)
            if v is not None and _aql_lt(v, cutoff):
                new = _merge(d, {k: v for k, v in unset.items() if not k.startswith("_")}, True, False)
                new["_rev"] = self.store.next_rev()
                coll["docs"][key] = new
                result.append(key)
        stats["writesExecuted"] = len(result)
        return result


class ArangoStandin:
    """The stand-in on 127.0.0.1:<port> in a thread. Not ArangoDB (see the module docstring)."""

    def __init__(self, port: int = 0, user: str = "root", password: str = "segscope-standin"):
        self.store = Store()
        handler = type(
            "BoundHandler",
            (Handler,),
            {"store": self.store, "user": user, "password": password, "jwt_secret": os.urandom(32).hex()},
        )
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.user, self.password = user, password
        # a short poll interval: shutdown() waits for the loop to notice, 0.5 s by default
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="arango-standin", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "ArangoStandin":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ArangoStandin":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="ArangoDB STAND-IN for segscope tests (not ArangoDB)")
    ap.add_argument("--port", type=int, default=18529)
    ap.add_argument("--user", default="root")
    ap.add_argument("--password", default="segscope-standin")
    args = ap.parse_args()
    s = ArangoStandin(args.port, args.user, args.password).start()
    print(f"arango stand-in on {s.url} (user {args.user})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        s.stop()


if __name__ == "__main__":
    main()
