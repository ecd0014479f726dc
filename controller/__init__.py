"""segscope controller: a declarative intent file applied to the nodes' agents (README.md here)."""

import sys
from pathlib import Path

# The generated gRPC modules live in schemas/python/segscope_proto (make -C schemas proto); make
# `python -m controller` work from the repository without a PYTHONPATH.
_SCHEMAS = str(Path(__file__).resolve().parent.parent / "schemas" / "python")
if _SCHEMAS not in sys.path:
    sys.path.append(_SCHEMAS)
