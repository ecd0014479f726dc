"""Loss processor: alternate-marking block records (Kafka) -> per-flow, per-block loss (line protocol)."""
import os
import sys

# The wire-format package lives in schemas/python (pytest adds it via pytest.ini). Make the
# worker runnable from the repository root without installing it: add it when missing.
try:
    import segscope_schemas  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "schemas", "python"))
