"""TopologySink: keep ArangoDB equal to what the document model says, writing only what changed.

flush() computes the model's documents, diffs them against what was last written successfully
and sends the difference (upserts by _key, deletes of documents the model no longer produces).
After a failed write the next flush checks (and if need be recreates) the database, collections
and graph and rewrites every document once (the database may have been dropped or restored);
everything is idempotent, so a retry or a replay of the input topics never duplicates a document.
Used by the Faust app (processors/topology/app.py) and directly by the tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from processors.topology.model import TopologyModel, diff_documents
from processors.topology.writer import ArangoWriter

log = logging.getLogger("segscope.topology.sink")


@dataclass
class SinkCounters:
    flushes: int = 0
    flush_errors: int = 0
    schema_ready: int = 0


class TopologySink:
    def __init__(self, model: TopologyModel, writer: ArangoWriter):
        self.model, self.writer = model, writer
        self.written: dict[str, dict[str, dict]] = {}
        self.written_annotations: dict[tuple[str, str], dict] = {}
        self.schema_ready = False
        self.counters = SinkCounters()
        self.last_error: str | None = None
        self._jalapeno_ids: dict[str, str | None] = {}

    def snapshot(self) -> dict:
        """What to write, computed from the model (call in the thread that mutates the model)."""
        if self.writer.mode == "own":
            return {"docs": self.model.documents()}
        docs = self.model.documents()
        return {"paths": docs[self.model.names.paths], "annotations": self.model.jalapeno_annotations()}

    def write(self, snap: dict) -> dict[str, int]:
        """Write a snapshot (blocking I/O: the app runs it in an executor thread)."""
        self.counters.flushes += 1
        try:
            if not self.schema_ready:
                self.writer.ensure_schema()
                self.schema_ready = True
                self.counters.schema_ready += 1
                # (re)connected: write everything once, the database may have lost documents
                self.written, self.written_annotations = {}, {}
            stats = self._write_own(snap["docs"]) if "docs" in snap else self._write_jalapeno(snap)
            self.last_error = None
            return stats
        except Exception as e:
            # check (and if need be recreate) the database and collections again next time:
            # the failure may be a database that was dropped under us
            self.schema_ready = False
            self.counters.flush_errors += 1
            self.writer.counters.write_errors += 1
            self.last_error = repr(e)
            log.warning("topology flush failed (will retry): %r", e)
            return {"error": 1}

    def flush(self) -> dict[str, int]:
        return self.write(self.snapshot())

    def _write_own(self, docs: dict[str, dict[str, dict]]) -> dict[str, int]:
        upserts, deletes = diff_documents(self.written, docs)
        n = self.model.names
        # vertices before edges, edges before deletes of vertices (a graph stays consistent)
        order = [n.nodes, n.sids, n.links, n.edges, n.paths]
        stats = {"upserted": 0, "deleted": 0}
        for coll in order + [c for c in upserts if c not in order]:
            stats["upserted"] += self.writer.upsert(coll, upserts.get(coll, []))
        for coll in [n.paths, n.edges, n.links, n.sids, n.nodes]:
            stats["deleted"] += self.writer.delete(coll, deletes.get(coll, []))
        self.written = docs
        return stats

    def _jalapeno_node(self, name: str) -> str | None:
        if self._jalapeno_ids.get(name) is None:
            self._jalapeno_ids[name] = self.writer.jalapeno_node_id(name)
        return self._jalapeno_ids[name]

    def _write_jalapeno(self, snap: dict) -> dict[str, int]:
        changed = [
            a
            for a in snap["annotations"]
            if self.written_annotations.get((a["local_ip"], a["remote_ip"])) != a["fields"]
        ]
        matched, unmatched = self.writer.annotate_jalapeno_edges(changed)
        for a in changed:
            self.written_annotations[(a["local_ip"], a["remote_ip"])] = a["fields"]
        paths = []
        for doc in snap["paths"].values():
            # point at Jalapeno's igp_node documents (never our own node keys) when they exist
            paths.append(
                {**doc, "src": self._jalapeno_node(doc["src_node"]), "dst": self._jalapeno_node(doc["dst_node"])}
            )
        upserts, _ = diff_documents(self.written, {self.model.names.paths: {d["_key"]: d for d in paths}})
        up = self.writer.upsert(self.model.names.paths, upserts.get(self.model.names.paths, []))
        self.written = {self.model.names.paths: {d["_key"]: d for d in paths}}
        return {"annotated": matched, "unmatched": unmatched, "upserted": up}
