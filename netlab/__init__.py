"""netlab — emulated SRv6 networks in network namespaces, from a topology file.

from netlab import Lab
with Lab.up("netlab/topologies/line5.yaml", prefix="e2e", delay_us={"ar": (2000, 1000)}) as lab:
    lab.run("H1", ["ping", "-6", "-c", "3", "fd00:b::1"], check=True)
"""

from .lab import Lab, LabError, LossHandle, relay_flow, relay_ground_truth, relay_lateness_us, status, teardown
from .topology import Reorder, Topology, TopologyError, load

__all__ = [
    "Lab",
    "LabError",
    "LossHandle",
    "Reorder",
    "Topology",
    "TopologyError",
    "load",
    "relay_flow",
    "relay_ground_truth",
    "relay_lateness_us",
    "status",
    "teardown",
]
