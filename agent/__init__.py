"""segscope node agent (README.md here)."""

import os as _os

# gRPC core's fork handlers run at every real fork() of this process (the agent runs tools in
# subprocesses every second) while other threads are inside gRPC: its own log says it then
# skips them, and they are the documented cause of corrupted TLS streams after Popen
# (grpc/grpc#28557: "Stream removed ... TSI_DATA_CORRUPTED", seen in CI) and of hangs. Nothing
# here uses gRPC in a forked child (children exec at once), so they are switched off before grpc
# is imported; an operator's explicit setting wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
