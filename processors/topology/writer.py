"""Thin ArangoDB writer over python-arango: create what is missing, upsert by _key, annotate edges.

Endpoints it uses (and all the stand-in in tests/topology/arango_standin.py implements):
HTTP Basic auth (default) or JWT (`auth_method="jwt"`: POST /_open/auth), database list/create,
collection list/create, index list/create, gharial get/create, document insert with
overwriteMode=update or replace (an upsert by _key: a replay rewrites the same documents, never
adds one),
document delete by key, and /_api/cursor (create, next batch, delete) for the AQL texts below.
Every AQL result is read through python-arango's cursor, so results larger than one batch
(`batch_size`, ArangoDB's default 1000) are fetched batch by batch.

Modes:
  own       database `segscope` (default): collections segscope_node, segscope_link,
            segscope_srv6_sid, segscope_path (documents), segscope_graph_edge (edges) and the
            named graph segscope_graph (segscope_graph_edge: segscope_node -> segscope_node)
  jalapeno  an existing Jalapeno database (`jalapeno`): never creates nodes, links or edges;
            UPDATEs the measurement fields of existing igpv6_graph edge documents (and of
            ip-graph's copies in ipv6_graph) matched by local_link_ip/remote_link_ip, and
            upserts path documents into segscope_path (created if missing) whose src/dst point
            at Jalapeno's igp_node documents found by name; reads ls_srv6_sid and igp_node
            (whole, QUERY_ALL) to expand uSID containers of routers without an agent.
Both modes remove measurement fields older than a cutoff from the edges (expire_measurements).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from processors.topology.model import (
    DELAY_FIELDS,
    INLINE_LINK_DELAY_FIELDS,
    LOSS_FIELDS,
    STAMP_LINK_DELAY_FIELDS,
    Names,
)

log = logging.getLogger("segscope.topology.writer")

# The AQL texts. tests/topology/arango_standin.py holds its own literal copies: change one here
# and the stand-in refuses it (as ArangoDB would refuse a query it cannot parse), so the change
# has to be made there too, deliberately.
QUERY_ALL = "FOR d IN @@collection RETURN d"
# one query per collection per flush: every annotation, matched on the link addresses (indexed:
# INDEX_LINK_IPS); returns what matched so the caller can count what did not. keepNull false: a
# field the newest measurement has no value for comes as null and is removed (model.edge_measurements).
# mergeObjects false: an object field (delay_source, stamp_link_delay, ...) is replaced whole, so a
# key of the old value (the STAMP session of a delay_source now from in-line flows) does not stay
QUERY_ANNOTATE_EDGES = (
    "FOR a IN @annotations "
    "FOR e IN @@edges FILTER e.local_link_ip == a.local_ip AND e.remote_link_ip == a.remote_ip "
    "UPDATE e WITH a.fields IN @@edges OPTIONS { keepNull: false, mergeObjects: false } "
    "RETURN {local_ip: a.local_ip, remote_ip: a.remote_ip, key: NEW._key}"
)
# `!= null` first: in AQL null sorts below every number, so `null < @cutoff_ns` would be true
QUERY_EXPIRE = (
    "FOR e IN @@edges FILTER e.@stamp_field != null AND e.@stamp_field < @cutoff_ns "
    "UPDATE e WITH @unset IN @@edges OPTIONS { keepNull: false } RETURN NEW._key"
)
QUERY_NODE_BY_NAME = "FOR n IN @@nodes FILTER n.name == @name LIMIT 1 RETURN n._id"

# persistent indexes on what the queries above filter on, created if missing (ensure_schema)
INDEX_LINK_IPS = {"name": "segscope_link_ips", "fields": ["local_link_ip", "remote_link_ip"], "sparse": False}
INDEX_DELAY_AT = {"name": "segscope_delay_measured_at", "fields": ["delay_measured_at_ns"], "sparse": True}
INDEX_LOSS_AT = {"name": "segscope_loss_measured_at", "fields": ["loss_measured_at_ns"], "sparse": True}
INDEX_STAMP_LINK_DELAY_AT = {
    "name": "segscope_stamp_link_delay_measured_at",
    "fields": ["stamp_link_delay_measured_at_ns"],
    "sparse": True,
}
INDEX_INLINE_LINK_DELAY_AT = {
    "name": "segscope_inline_link_delay_measured_at",
    "fields": ["inline_link_delay_measured_at_ns"],
    "sparse": True,
}
INDEX_NODE_NAME = {"name": "segscope_node_name", "fields": ["name"], "sparse": True}
# (timestamp field, the fields it dates) for expire_measurements: the link's delay, each source's own
# delay (one may be stale while the other gives the link's delay), the loss
EXPIRY = (
    ("delay_measured_at_ns", DELAY_FIELDS),
    ("stamp_link_delay_measured_at_ns", STAMP_LINK_DELAY_FIELDS),
    ("inline_link_delay_measured_at_ns", INLINE_LINK_DELAY_FIELDS),
    ("loss_measured_at_ns", LOSS_FIELDS),
)
# the sparse indexes of the expiry's timestamp fields, on every edge collection written
EXPIRY_INDEXES = (INDEX_DELAY_AT, INDEX_STAMP_LINK_DELAY_AT, INDEX_INLINE_LINK_DELAY_AT, INDEX_LOSS_AT)


class WriterError(RuntimeError):
    pass


@dataclass
class WriterCounters:
    documents_upserted: int = 0
    documents_deleted: int = 0
    document_errors: int = 0
    edges_annotated: int = 0
    edges_unmatched: int = 0
    ip_edges_annotated: int = 0
    ip_edges_unmatched: int = 0
    edges_expired: int = 0
    indexes_created: int = 0
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
        batch_size: int = 1000,
    ):
        if mode not in ("own", "jalapeno"):
            raise ValueError(f"mode {mode!r}: use 'own' or 'jalapeno'")
        from arango import ArangoClient
        from arango.http import DefaultHTTPClient

        self.mode, self.db_name, self.names = mode, db_name, names or Names()
        self.batch_size = batch_size
        # One quick retry: the sink retries a failed flush itself every interval, so urllib3's
        # default 3 retries with backoff would only stall the processor while ArangoDB is away.
        http = DefaultHTTPClient(request_timeout=timeout_s, retry_attempts=1, backoff_factor=0.1)
        self.client = ArangoClient(hosts=url, http_client=http, request_timeout=timeout_s)
        self._auth = dict(username=username, password=password, auth_method=auth_method)
        self.db = self.client.db(db_name, **self._auth)  # jwt: fetches a token (POST /_open/auth) now
        self.counters = WriterCounters()
        # jalapeno mode: whether ip-graph's collection exists (checked by ensure_schema)
        self.ip_edges_present = False

    # -- schema -------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the database (own mode), collections, graph and indexes that are missing."""
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
            for index in EXPIRY_INDEXES:
                self.ensure_index(n.edges, index)
            return
        for coll in (n.jalapeno_nodes, n.jalapeno_edges):
            if not self.db.has_collection(coll):
                raise WriterError(
                    f"jalapeno mode: database {self.db_name!r} has no collection {coll!r}; "
                    f"is this a Jalapeno database (igp-graph running)? The names are set by "
                    f"SEGSCOPE_TOPOLOGY_JALAPENO_NODES / SEGSCOPE_TOPOLOGY_JALAPENO_EDGES"
                )
        self._ensure_collection(n.paths, edge=False)
        self.ensure_index(n.jalapeno_nodes, INDEX_NODE_NAME)
        self.check_ip_edges()

    def check_ip_edges(self) -> bool:
        """Is ip-graph's edge collection there (it may start after us)? Index it when it is."""
        n = self.names
        present = bool(n.jalapeno_ip_edges) and self.db.has_collection(n.jalapeno_ip_edges)
        if present != self.ip_edges_present:
            log.info("jalapeno mode: ip-graph collection %r present: %s", n.jalapeno_ip_edges, present)
        self.ip_edges_present = present
        for coll in (n.jalapeno_edges, n.jalapeno_ip_edges) if present else (n.jalapeno_edges,):
            for index in (INDEX_LINK_IPS, *EXPIRY_INDEXES):
                self.ensure_index(coll, index)
        return present

    def _ensure_collection(self, name: str, edge: bool) -> None:
        if not self.db.has_collection(name):
            self.db.create_collection(name, edge=edge)

    def ensure_index(self, collection: str, index: dict) -> bool:
        """Create the persistent index if the collection has none on the same fields (ArangoDB
        would also answer an identical create with the existing index; listing first keeps the
        counter honest and never touches an index someone else made on those fields)."""
        existing = self.db.collection(collection).indexes()
        if any(list(i.get("fields") or []) == index["fields"] for i in existing):
            return False
        self.db.collection(collection).add_index(
            {"type": "persistent", "fields": index["fields"], "sparse": index["sparse"], "name": index["name"]}
        )
        self.counters.indexes_created += 1
        return True

    # -- writes -------------------------------------------------------------------------
    def upsert(self, collection: str, docs: list[dict], replace: bool = False) -> int:
        """Insert-or-update by _key (overwriteMode=update: fields not in `docs` are kept; replace:
        the stored document becomes `docs`' exactly, a field not there is gone)."""
        if not docs:
            return 0
        mode = "replace" if replace else "update"
        results = self.db.collection(collection).insert_many(docs, overwrite_mode=mode, silent=False)
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

    def _query(self, query: str, bind_vars: dict) -> list:
        """All rows of a query, batch by batch (the cursor fetches the next batch while iterated
        and is deleted on the server when we leave early)."""
        with self.db.aql.execute(query, bind_vars=bind_vars, batch_size=self.batch_size) as cursor:
            return list(cursor)

    def annotate_edges(self, collection: str, annotations: list[dict]) -> tuple[list[str], list[dict]]:
        """UPDATE the fields of existing edges matched by local/remote link IP; returns (keys
        updated, annotations that matched no edge). Never creates an edge."""
        if not annotations:
            return [], []
        rows = self._query(
            QUERY_ANNOTATE_EDGES,
            {
                "@edges": collection,
                "annotations": [
                    {"local_ip": a["local_ip"], "remote_ip": a["remote_ip"], "fields": a["fields"]} for a in annotations
                ],
            },
        )
        hit = {(r["local_ip"], r["remote_ip"]) for r in rows}
        return [r["key"] for r in rows], [a for a in annotations if (a["local_ip"], a["remote_ip"]) not in hit]

    def annotate_jalapeno_edges(self, annotations: list[dict]) -> dict:
        """igp-graph's edges, then ip-graph's copies (when its collection exists). Returns
        {"keys": igpv6_graph keys updated, "annotated", "unmatched", "ip_annotated", "ip_unmatched"}."""
        keys, unmatched = self.annotate_edges(self.names.jalapeno_edges, annotations)
        self.counters.edges_annotated += len(keys)
        self.counters.edges_unmatched += len(unmatched)
        out = {"keys": keys, "annotated": len(keys), "unmatched": len(unmatched), "ip_annotated": 0, "ip_unmatched": 0}
        if self.ip_edges_present:
            ip_keys, ip_unmatched = self.annotate_edges(self.names.jalapeno_ip_edges, annotations)
            self.counters.ip_edges_annotated += len(ip_keys)
            self.counters.ip_edges_unmatched += len(ip_unmatched)
            out.update(ip_annotated=len(ip_keys), ip_unmatched=len(ip_unmatched))
        return out

    def expire_measurements(self, collection: str, cutoff_ns: int) -> int:
        """Remove segscope's delay (loss) fields from edges whose delay_measured_at_ns
        (loss_measured_at_ns) is older than cutoff_ns, and each delay source's value by its own
        timestamp; returns how many edges lost fields (an edge counts once per collection)."""
        expired: set[str] = set()
        for stamp_field, fields in EXPIRY:
            expired.update(
                self._query(
                    QUERY_EXPIRE,
                    {
                        "@edges": collection,
                        "stamp_field": stamp_field,
                        "cutoff_ns": cutoff_ns,
                        "unset": {f: None for f in fields},
                    },
                )
            )
        self.counters.edges_expired += len(expired)
        return len(expired)

    def jalapeno_srv6_sids(self) -> tuple[list[dict], list[dict]]:
        """(ls_srv6_sid documents, igp_node documents): the routers' SRv6 SIDs and the nodes they
        belong to (jalapeno_sids.SidTable joins them). No SIDs when the collection is absent (a
        Jalapeno without SRv6, or names.jalapeno_sids empty)."""
        n = self.names
        if not n.jalapeno_sids or not self.db.has_collection(n.jalapeno_sids):
            return [], []
        return self.all_documents(n.jalapeno_sids), self.all_documents(n.jalapeno_nodes)

    def jalapeno_node_id(self, name: str) -> str | None:
        ids = self._query(QUERY_NODE_BY_NAME, {"@nodes": self.names.jalapeno_nodes, "name": name})
        return ids[0] if ids else None

    # -- reads (status, tests) ----------------------------------------------------------
    def all_documents(self, collection: str) -> list[dict]:
        return self._query(QUERY_ALL, {"@collection": collection})
