"""segscope controller: a declarative intent file applied to the nodes' agents (README.md here)."""

import os as _os
import sys
from pathlib import Path

# gRPC core's fork handlers run at every real fork() of this process (the controller's tests and the
# demo start processes) while other threads are inside gRPC: its own log says it then
# skips them, and they are the documented cause of corrupted TLS streams after Popen
# (grpc/grpc#28557: "Stream removed ... TSI_DATA_CORRUPTED", seen in CI) and of hangs. Nothing
# here uses gRPC in a forked child (children exec at once), so they are switched off before grpc
# is imported; an operator's explicit setting wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The generated gRPC modules live in schemas/python/segscope_proto (make -C schemas proto); make
# `python -m controller` work from the repository without a PYTHONPATH. First on the path: this
# checkout's generated API must win over another checkout's a shared venv may point at (a .pth).
_SCHEMAS = str(Path(__file__).resolve().parent.parent / "schemas" / "python")
if _SCHEMAS not in sys.path:
    sys.path.insert(0, _SCHEMAS)
