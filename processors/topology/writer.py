"""Thin ArangoDB writer over python-arango: create what is missing, upsert by _key, annotate edges.

Endpoints it uses (and all the stand-in in tests/topology/arango_standin.py implements):
HTTP Basic auth (default) or JWT (`auth_method="jwt"`: POST /_open/auth), database list/create,
collection list/create, gharial get/create, document insert with overwriteMode=update (an upsert
by _key: a replay rewrites the same documents, never adds one), document delete by key, and
/_api/cursor for the three AQL texts below.

Modes:
  own       database `segscope` (default): collections segscope_node, segscope_link,
            segscope_srv6_sid, segscope_path (documents), segscope_graph_edge (edges) and the
            named graph segscope_graph (segscope_graph_edge: segscope_node -> segscope_node)
  jalapeno  an existing Jalapeno database (`jalapeno`): never creates nodes, links or edges;
            UPDATEs the measurement fields of existing igpv6_graph edge documents matched by
            local_link_ip/remote_link_ip, and upserts path documents into segscope_path (created
            if missing) whose src/dst point at Jalapeno's igp_node documents found by name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from processors.topology.model import Names

log = logging.getLogger("segscope.topology.writer")

QUERY_ALL = "FOR d IN @@collection RETURN d"
QUERY_ANNOTATE_EDGE = (
    "FOR e IN @@edges FILTER e.local_link_ip == @local_ip AND e.remote_link_ip == @remote_ip "
    "UPDATE e WITH @patch IN @@edges RETURN NEW._key"
)
QUERY_NODE_BY_NAME = "FOR n IN @@nodes FILTER n.name == @name LIMIT 1 RETURN n._id"


class WriterError(RuntimeError):
    pass


@dataclass
class WriterCounters:
    documents_upserted: int = 0
    documents_deleted: int = 0
    document_errors: int = 0
    edges_annotated: int = 0
    edges_unmatched: int = 0
    write_errors: int = 0


class ArangoWriter:
    def __init__(
        self,
        url: str,
        db_name: str = "segscope",
        username: str = "root",
        password: str = "",
        mode: str = "own",
        names: Names | None = None,
        timeout_s: float = 10.0,
        auth_method: str = "basic",
    ):
        if mode not in ("own", "jalapeno"):
            raise ValueError(f"mode {mode!r}: use 'own' or 'jalapeno'")
        from arango import ArangoClient
        from arango.http import DefaultHTTPClient

        self.mode, self.db_name, self.names = mode, db_name, names or Names()
        # One quick retry: the sink retries a failed flush itself every interval, so urllib3's
        # default 3 retries with backoff would only stall the processor while ArangoDB is away.
        http = DefaultHTTPClient(request_timeout=timeout_s, retry_attempts=1, backoff_factor=0.1)
        self.client = ArangoClient(hosts=url, http_client=http, request_timeout=timeout_s)
        self._auth = dict(username=username, password=password, auth_method=auth_method)
        self.db = self.client.db(db_name, **self._auth)  # jwt: fetches a token (POST /_open/auth) now
        self.counters = WriterCounters()

    # -- schema -------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the database (own mode), collections and graph that are missing."""
        n = self.names
        if self.mode == "own":
            sys_db = self.client.db("_system", **self._auth)
            if not sys_db.has_database(self.db_name):
                sys_db.create_database(self.db_name)
            for coll in (n.nodes, n.links, n.sids, n.paths):
                self._ensure_collection(coll, edge=False)
            self._ensure_collection(n.edges, edge=True)
            if not self.db.has_graph(n.graph):
                self.db.create_graph(
                    n.graph,
                    edge_definitions=[
                        {
                            "edge_collection": n.edges,
                            "from_vertex_collections": [n.nodes],
                            "to_vertex_collections": [n.nodes],
                        }
                    ],
                )
        else:
            for coll in (n.jalapeno_nodes, n.jalapeno_edges):
                if not self.db.has_collection(coll):
                    raise WriterError(
                        f"jalapeno mode: database {self.db_name!r} has no collection {coll!r}; "
                        f"is this a Jalapeno database (igp-graph running)?"
                    )
            self._ensure_collection(n.paths, edge=False)

    def _ensure_collection(self, name: str, edge: bool) -> None:
        if not self.db.has_collection(name):
            self.db.create_collection(name, edge=edge)

    # -- writes -------------------------------------------------------------------------
    def upsert(self, collection: str, docs: list[dict]) -> int:
        """Insert-or-update by _key (overwriteMode=update: fields not in `docs` are kept)."""
        if not docs:
            return 0
        results = self.db.collection(collection).insert_many(docs, overwrite_mode="update", silent=False)
        errors = [r for r in results if not isinstance(r, dict)]
        self.counters.documents_upserted += len(results) - len(errors)
        if errors:
            self.counters.document_errors += len(errors)
            raise WriterError(f"{len(errors)} of {len(docs)} upserts into {collection} failed, first: {errors[0]}")
        return len(results)

    def delete(self, collection: str, keys: list[str]) -> int:
        if not keys:
            return 0
        results = self.db.collection(collection).delete_many([{"_key": k} for k in keys])
        done = sum(1 for r in results if isinstance(r, dict))
        self.counters.documents_deleted += done
        return done

    def annotate_jalapeno_edges(self, annotations: list[dict]) -> tuple[int, int]:
        """UPDATE measurement fields of existing Jalapeno edges; returns (matched, unmatched)."""
        matched = unmatched = 0
        for a in annotations:
            keys = list(
                self.db.aql.execute(
                    QUERY_ANNOTATE_EDGE,
                    bind_vars={
                        "@edges": self.names.jalapeno_edges,
                        "local_ip": a["local_ip"],
                        "remote_ip": a["remote_ip"],
                        "patch": a["fields"],
                    },
                )
            )
            if keys:
                matched += len(keys)
            else:
                unmatched += 1
        self.counters.edges_annotated += matched
        self.counters.edges_unmatched += unmatched
        return matched, unmatched

    def jalapeno_node_id(self, name: str) -> str | None:
        ids = list(
            self.db.aql.execute(QUERY_NODE_BY_NAME, bind_vars={"@nodes": self.names.jalapeno_nodes, "name": name})
        )
        return ids[0] if ids else None

    # -- reads (status, tests) ----------------------------------------------------------
    def all_documents(self, collection: str) -> list[dict]:
        return list(self.db.aql.execute(QUERY_ALL, bind_vars={"@collection": collection}))
