"""Faust stream processors: delay (STAMP records -> delay statistics), loss (altmark blocks ->
block loss), topology (node views + measurements -> ArangoDB). runtime/ holds what they share.

The wire-format package lives in schemas/python (pytest adds it via pytest.ini); a worker run
from the repository root without installing it finds it here."""

import os
import sys

try:
    import segscope_schemas  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "schemas", "python"))
