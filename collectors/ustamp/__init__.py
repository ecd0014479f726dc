"""ustamp: user-space STAMP Session-Reflector and Session-Sender/collector.

Sockets only (no XDP): for kernels, containers or modes the XDP datapath cannot do, and
the baseline of the benchmarks. Same session model as datapath/stamp_reflector
(`add-session --ssid N [--sender ADDR] [--return-sids ...] [--format ptp|ntp] [--stateful]`)
and the same `struct stamp_record` (schemas/c/stamp_record.h) as the XDP collector.

    python -m collectors.ustamp reflector ...
    python -m collectors.ustamp sender ...

See collectors/ustamp/README.md.
"""

import os
import sys

# The wire-format package lives in schemas/python (pytest adds it via pytest.ini). Make ustamp
# runnable from the repository root without installing it: add it when missing.
try:
    import segscope_schemas  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "schemas", "python"))
