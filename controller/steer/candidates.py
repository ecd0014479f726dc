"""Candidate SID lists for a `steering:` entry: the K shortest paths by measured delay over the
topology graph that the topology processor keeps in ArangoDB (schemas/topology.md, own mode).

    python -m controller.steer.candidates --from A --to B --k 3 --decap-sid fc00:3::d6 \\
        --arango http://127.0.0.1:8529 [--db segscope] [--user root] [--password-file F]

prints a `candidates:` list to paste into the entry (names k1.., the path's delay in a comment).
Each link's weight is its measured one-way delay (the edge's `latency`, µs); a link without a
measurement is left out. A path's SID list = the End SID of each node it crosses after the first
(the egress excluded), then the egress's decapsulation SID (`--decap-sid`); a crossed node without
an End SID makes the path unusable (skipped, said on stderr). K paths by Yen's algorithm (loopless,
by increasing delay). The operator reviews them and applies the intent: the controller then
probes each candidate end to end, which is what segscope-steer decides on — the graph only
proposes.
"""

from __future__ import annotations

import argparse
import heapq
import sys

EDGES = "segscope_graph_edge"
SIDS = "segscope_srv6_sid"
QUERY_ALL = "FOR d IN @@collection RETURN d"  # the topology writer's text (the stand-in knows it)

Graph = dict[str, dict[str, float]]  # node -> {neighbour: delay_us}


def shortest(graph: Graph, src: str, dst: str, banned_edges=frozenset(), banned_nodes=frozenset()):
    """Dijkstra: (delay, [nodes]) or None."""
    queue = [(0.0, src, [src])]
    done: set[str] = set()
    while queue:
        cost, node, path = heapq.heappop(queue)
        if node == dst:
            return cost, path
        if node in done:
            continue
        done.add(node)
        for nxt, w in sorted(graph.get(node, {}).items()):
            if nxt in done or nxt in banned_nodes or (node, nxt) in banned_edges:
                continue
            heapq.heappush(queue, (cost + w, nxt, path + [nxt]))
    return None


def k_shortest(graph: Graph, src: str, dst: str, k: int) -> list[tuple[float, list[str]]]:
    """Yen's K shortest loopless paths, by increasing total delay."""
    first = shortest(graph, src, dst)
    if first is None:
        return []
    found = [first]
    pending: list[tuple[float, list[str]]] = []
    while len(found) < k:
        _, last = found[-1]
        for i in range(len(last) - 1):
            root = last[: i + 1]
            banned_edges = {(p[i], p[i + 1]) for _, p in found if p[: i + 1] == root}
            spur = shortest(graph, root[-1], dst, frozenset(banned_edges), frozenset(root[:-1]))
            if spur is None:
                continue
            root_cost = sum(graph[a][b] for a, b in zip(root, root[1:]))
            candidate = (root_cost + spur[0], root[:-1] + spur[1])
            if candidate[1] not in [p for _, p in found] and candidate not in pending:
                heapq.heappush(pending, candidate)
        if not pending:
            break
        found.append(heapq.heappop(pending))
    return found


def sid_list(path: list[str], end_sids: dict[str, str], decap_sid: str) -> tuple[str, ...] | None:
    """The End SID of every node after the first and before the egress, then the decap SID."""
    transit = path[1:-1]
    if any(node not in end_sids for node in transit):
        return None
    return tuple(end_sids[node] for node in transit) + (decap_sid,)


def read_graph(db, interfaces: dict | None = None) -> tuple[Graph, dict[str, str]]:
    """(measured links, each node's End SID) from the topology processor's own-mode collections;
    `interfaces`, when given, gets each measured link's (local, remote) interface names."""
    graph: Graph = {}
    for edge in db.aql.execute(QUERY_ALL, bind_vars={"@collection": EDGES}):
        delay = edge.get("latency")
        if delay is None:
            continue  # not measured: no weight to give it
        a, b = edge["router_id"], edge["remote_router_id"]
        graph.setdefault(a, {})[b] = float(delay)
        if interfaces is not None:
            interfaces[(a, b)] = (edge.get("local_interface") or "", edge.get("remote_interface") or "")
    end_sids: dict[str, str] = {}
    for sid in db.aql.execute(QUERY_ALL, bind_vars={"@collection": SIDS}):
        if (sid.get("srv6_endpoint_behavior") or {}).get("name") == "End":
            end_sids.setdefault(sid["router_id"], sid["srv6_sid"])
    return graph, end_sids


def candidates(graph: Graph, end_sids: dict[str, str], src: str, dst: str, k: int, decap_sid: str, say=print):
    """Up to k (name, delay_us, nodes, SID list), by increasing delay; paths without SIDs skipped."""
    out = []
    for delay, path in k_shortest(graph, src, dst, k + 4):  # a few spare for paths without SIDs
        segs = sid_list(path, end_sids, decap_sid)
        if segs is None:
            say(f"# skipped {'-'.join(path)}: a node on it has no End SID")
            continue
        out.append((f"k{len(out) + 1}", delay, path, segs))
        if len(out) == k:
            break
    return out


def to_yaml(found) -> str:
    lines = ["candidates:"]
    for name, delay, path, segs in found:
        sids = ", ".join(f'"{s}"' for s in segs)
        lines.append(f"  # {'-'.join(path)}: {delay:.0f} us measured one way")
        lines.append(f"  - {{name: {name}, segs: [{sids}], sender_dev: FILL, reflector_dev: FILL}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", required=True, help="the policy's node")
    ap.add_argument("--to", dest="dst", required=True, help="the egress node")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--decap-sid", required=True, help="the egress's decapsulation SID, last of every list")
    ap.add_argument("--arango", required=True, help="ArangoDB URL")
    ap.add_argument("--db", default="segscope")
    ap.add_argument("--user", default="root")
    ap.add_argument("--password-file", help="file holding the password (default: empty)")
    args = ap.parse_args(argv)
    from arango import ArangoClient

    password = open(args.password_file).read().strip() if args.password_file else ""
    db = ArangoClient(hosts=args.arango).db(args.db, username=args.user, password=password)
    graph, end_sids = read_graph(db)
    found = candidates(
        graph, end_sids, args.src, args.dst, args.k, args.decap_sid, say=lambda m: print(m, file=sys.stderr)
    )
    if not found:
        print(f"no measured path from {args.src} to {args.dst} in {args.db}", file=sys.stderr)
        return 1
    print(to_yaml(found), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
