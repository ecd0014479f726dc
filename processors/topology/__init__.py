"""Topology processor: node views + measurements -> ArangoDB documents shaped like Jalapeno's.

model.py   document model (pure Python)        (line protocol: segscope_schemas.line_protocol)
writer.py  python-arango writer (thin)         app.py        Faust app (python -m processors.topology)
"""
