"""TopologySink: keep ArangoDB equal to what the document model says.

flush() computes the model's documents, diffs them against what was last written successfully
and sends the difference (upserts by _key, deletes of documents the model no longer produces).
After a failed write the next flush checks (and if need be recreates) the database, collections,
graph and indexes and rewrites every document once (the database may have been dropped or
restored); everything is idempotent, so a retry or a replay of the input topics never duplicates
a document. Used by the Faust app (processors/topology/app.py) and directly by the tests.

Every `refresh_s` (and at the first write) the sink also
- jalapeno mode: rewrites every edge annotation, changed or not: igp-graph rewrites the TE
  fields (`unidir_link_delay` as 0 when BGP-LS carries none) from each BGP-LS ls_link message,
  so a value written only on change would be gone after the next one;
- both modes: removes measurement fields older than `stale_after_s` from the edges
  (ArangoWriter.expire_measurements), found by their own timestamp field, so edges a previous
  run of the processor annotated are cleaned too. The model leaves the same points out of what
  it writes (min_measured_at_ns), so an expired value is never written back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from processors.topology.jalapeno_sids import SidTable
from processors.topology.model import TopologyModel, diff_documents
from processors.topology.writer import ArangoWriter

log = logging.getLogger("segscope.topology.sink")


@dataclass
class SinkCounters:
    flushes: int = 0
    flush_errors: int = 0
    schema_ready: int = 0
    refreshes: int = 0
    link_events_out: int = 0
    documents_read_back: int = 0
    # jalapeno mode: SRv6 SID documents read from Jalapeno at the last load, those whose structure
    # cannot expand a container (missing, inconsistent), those of no named igp_node; load failures
    jalapeno_sids_read: int = 0
    jalapeno_sids_unusable: int = 0
    jalapeno_sids_unnamed: int = 0
    jalapeno_sid_load_errors: int = 0


class TopologySink:
    def __init__(
        self,
        model: TopologyModel,
        writer: ArangoWriter,
        refresh_s: float = 30.0,
        stale_after_s: float | None = None,
        link_events: Callable[[str, list[str]], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ):
        """link_events(collection, keys): called with the igpv6_graph keys annotated by each write
        (jalapeno mode), e.g. JalapenoKafka.link_events; returns how many events it sent."""
        self.model, self.writer = model, writer
        self.refresh_s, self.stale_after_s = refresh_s, stale_after_s
        self.link_events = link_events
        self.monotonic, self.wall_ns = monotonic, wall_ns
        self.written: dict[str, dict[str, dict]] = {}
        self.written_annotations: dict[tuple[str, str], dict] = {}
        self.schema_ready = False
        self.counters = SinkCounters()
        self.last_error: str | None = None
        self._jalapeno_ids: dict[str, str | None] = {}
        self._last_refresh: float | None = None
        self._last_sid_load: float | None = None

    def cutoff_ns(self) -> int | None:
        """Measurements dated before this are expired (None: they never expire)."""
        if self.stale_after_s is None:
            return None
        return self.wall_ns() - int(self.stale_after_s * 1e9)

    def snapshot(self) -> dict:
        """What to write, computed from the model (call in the thread that mutates the model)."""
        cutoff = self.cutoff_ns()
        docs = self.model.documents(cutoff)
        if self.writer.mode == "own":
            return {"docs": docs, "cutoff_ns": cutoff}
        return {
            "paths": docs[self.model.names.paths],
            "annotations": self.model.jalapeno_annotations(cutoff),
            "cutoff_ns": cutoff,
        }

    def write(self, snap: dict) -> dict[str, int]:
        """Write a snapshot (blocking I/O: the app runs it in an executor thread)."""
        self.counters.flushes += 1
        try:
            if not self.schema_ready:
                self.writer.ensure_schema()
                self.schema_ready = True
                self.counters.schema_ready += 1
                # (re)connected, or this worker just became the leader (app.py): diff against what
                # the database holds now, not against what this worker wrote last; it may have lost
                # documents, or another worker wrote (and the model may have dropped some since)
                self.written, self.written_annotations = self._read_written(), {}
                self._last_refresh = None
            now = self.monotonic()
            refresh = self._last_refresh is None or now - self._last_refresh >= self.refresh_s
            if "docs" in snap:
                # expire first: the edge documents are replaced whole, so writing first would drop the
                # stale fields uncounted (and leave only the edges the model no longer has to expiry)
                expired = self._expire(snap.get("cutoff_ns")) if refresh else 0
                stats = self._write_own(snap["docs"])
            else:
                # after: check_ip_edges (at a refresh) may have found ip-graph's collection just now
                stats = self._write_jalapeno(snap, refresh)
                expired = self._expire(snap.get("cutoff_ns")) if refresh else 0
            stats["expired"] = expired
            if refresh:
                self._last_refresh = now
                self.counters.refreshes += 1
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

    def take_over(self) -> None:
        """Another worker may have written since this one did (app.py: this worker just became the
        leader): the next write reads the database first and sends what differs from the model."""
        self.schema_ready = False

    def _read_written(self) -> dict[str, dict[str, dict]]:
        """Own mode: the documents in the database now, as documents() shapes them (without
        ArangoDB's _id/_rev), so the next diff updates what differs and deletes what the model
        no longer has, whoever wrote it. Jalapeno mode: {} (paths are upserted, never deleted)."""
        if self.writer.mode != "own":
            return {}
        n = self.model.names
        out = {}
        for coll in (n.nodes, n.links, n.sids, n.edges, n.paths):
            docs = self.writer.all_documents(coll)
            out[coll] = {d["_key"]: {k: v for k, v in d.items() if k not in ("_id", "_rev")} for d in docs}
        self.counters.documents_read_back += sum(len(d) for d in out.values())
        return out

    def flush(self) -> dict[str, int]:
        self.load_jalapeno_sids()
        return self.write(self.snapshot())

    def load_jalapeno_sids(self) -> None:
        """Jalapeno mode, first and every refresh_s: read the routers' SRv6 SIDs into the model
        (blocking I/O; before snapshot(), so a snapshot's paths use them). A failed read keeps the
        table held and is tried again at the next call."""
        if self.writer.mode != "jalapeno":
            return
        now = self.monotonic()
        if self._last_sid_load is not None and now - self._last_sid_load < self.refresh_s:
            return
        try:
            table = SidTable.from_documents(*self.writer.jalapeno_srv6_sids())
        except Exception as e:
            self.counters.jalapeno_sid_load_errors += 1
            log.warning("reading Jalapeno's SRv6 SIDs failed (will retry): %r", e)
            return
        self.model.jalapeno_sids = table  # one reference swap: the event loop's readers see old or new
        self._last_sid_load = now
        self.counters.jalapeno_sids_read = len(table.locators) + len(table.bad) + table.unnamed
        self.counters.jalapeno_sids_unusable = len(table.bad)
        self.counters.jalapeno_sids_unnamed = table.unnamed

    def _expire(self, cutoff_ns: int | None) -> int:
        if cutoff_ns is None:
            return 0
        n = self.model.names
        if self.writer.mode == "own":
            colls = [n.edges]
        else:
            colls = [n.jalapeno_edges] + ([n.jalapeno_ip_edges] if self.writer.ip_edges_present else [])
        return sum(self.writer.expire_measurements(c, cutoff_ns) for c in colls)

    def _write_own(self, docs: dict[str, dict[str, dict]]) -> dict[str, int]:
        upserts, deletes = diff_documents(self.written, docs)
        n = self.model.names
        # vertices before edges, edges before deletes of vertices (a graph stays consistent)
        order = [n.nodes, n.sids, n.links, n.edges, n.paths]
        stats = {"upserted": 0, "deleted": 0}
        for coll in order + [c for c in upserts if c not in order]:
            # edges whole: a measured field the newest point lacks (documents() leaves it out) must go
            stats["upserted"] += self.writer.upsert(coll, upserts.get(coll, []), replace=coll == n.edges)
        for coll in [n.paths, n.edges, n.links, n.sids, n.nodes]:
            stats["deleted"] += self.writer.delete(coll, deletes.get(coll, []))
        self.written = docs
        return stats

    def _jalapeno_node(self, name: str) -> str | None:
        if self._jalapeno_ids.get(name) is None:
            self._jalapeno_ids[name] = self.writer.jalapeno_node_id(name)
        return self._jalapeno_ids[name]

    def _write_jalapeno(self, snap: dict, refresh: bool) -> dict[str, int]:
        if refresh:
            self.writer.check_ip_edges()  # ip-graph may have started since
            due = list(snap["annotations"])
        else:
            due = [
                a
                for a in snap["annotations"]
                if self.written_annotations.get((a["local_ip"], a["remote_ip"])) != a["fields"]
            ]
        res = self.writer.annotate_jalapeno_edges(due)
        for a in due:
            self.written_annotations[(a["local_ip"], a["remote_ip"])] = a["fields"]
        if self.link_events is not None and res["keys"]:
            self.counters.link_events_out += self.link_events(self.model.names.jalapeno_edges, res["keys"])
        paths = []
        for doc in snap["paths"].values():
            # point at Jalapeno's igp_node documents (never our own node keys) when they exist
            paths.append(
                {**doc, "src": self._jalapeno_node(doc["src_node"]), "dst": self._jalapeno_node(doc["dst_node"])}
            )
        upserts, _ = diff_documents(self.written, {self.model.names.paths: {d["_key"]: d for d in paths}})
        up = self.writer.upsert(self.model.names.paths, upserts.get(self.model.names.paths, []))
        self.written = {self.model.names.paths: {d["_key"]: d for d in paths}}
        return {
            "annotated": res["annotated"],
            "unmatched": res["unmatched"],
            "ip_annotated": res["ip_annotated"],
            "ip_unmatched": res["ip_unmatched"],
            "upserted": up,
        }
