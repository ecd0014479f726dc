"""segscope local services (Kafka, InfluxDB, Telegraf): see services/stack.py and README.md.

The name registry's reader lives in schemas/python (pytest adds it via pytest.ini); run from
the repository root without installing it, it is found here."""

import os
import sys

try:
    import segscope_schemas  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "schemas", "python"))
