# The C view of the names registry (schemas/names.toml -> c/segscope_names.h). The header is
# checked in so C builds need no Python; tests/schemas/test_names.py fails when it is stale.
PYTHON ?= ../.local/venv/bin/python
.PHONY: names
names:
	PYTHONPATH=python $(PYTHON) -m segscope_schemas.names --c-header > c/segscope_names.h
