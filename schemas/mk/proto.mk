# schemas/mk/proto.mk: southbound API. Generates the Python protobuf + gRPC modules
# from proto/segscope/agent/v1/*.proto into python/segscope_proto/ (gitignored), importable as
# segscope_proto.segscope.agent.v1.<name>_pb2 / <name>_pb2_grpc (see proto/README.md).
# Included by schemas/Makefile (its `all` builds `proto`, so `make build` runs it).
#   make -C schemas proto
PROTO_PY   ?= ../.local/venv/bin/python
PROTO_SRCS := $(wildcard proto/segscope/agent/v1/*.proto)
PROTO_OUT  := python/segscope_proto
PROTO_STAMP := $(PROTO_OUT)/.generated

.PHONY: proto clean-proto
all: proto
proto: $(PROTO_STAMP)

# grpc_tools writes `from segscope.agent.v1 import x_pb2` into the *_grpc modules; the repo
# has its own top-level `segscope` package, so those imports are rewritten to segscope_proto.*
# Generated in a scratch directory and swapped in with two renames, so a test running meanwhile
# never sees a half-written package.
$(PROTO_STAMP): $(PROTO_SRCS)
	rm -rf $(PROTO_OUT).new $(PROTO_OUT).old
	mkdir -p $(PROTO_OUT).new
	$(PROTO_PY) -m grpc_tools.protoc -Iproto --python_out=$(PROTO_OUT).new --pyi_out=$(PROTO_OUT).new \
		--grpc_python_out=$(PROTO_OUT).new $(PROTO_SRCS)
	sed -i 's/^from segscope\.agent\.v1 import/from segscope_proto.segscope.agent.v1 import/' \
		$(PROTO_OUT).new/segscope/agent/v1/*.py
	for d in . segscope segscope/agent segscope/agent/v1; do touch $(PROTO_OUT).new/$$d/__init__.py; done
	touch $(PROTO_OUT).new/.generated
	if [ -d $(PROTO_OUT) ]; then mv $(PROTO_OUT) $(PROTO_OUT).old; fi
	mv $(PROTO_OUT).new $(PROTO_OUT)
	rm -rf $(PROTO_OUT).old

clean: clean-proto
clean-proto:
	rm -rf $(PROTO_OUT) $(PROTO_OUT).new $(PROTO_OUT).old
