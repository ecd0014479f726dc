# segscope — top-level entry points. README.md: `make demo` and `make test`.
# Each part has its own Makefile; this one only orders them.
VENV   := .local/venv
PY     := $(VENV)/bin/python
PARTS  := datapath collectors netlab schemas bench tests/e2e/tools

.PHONY: setup build demo test test-quick test-cluster test-durations bench images debs clean

setup:                       ## install everything from the package registries (idempotent)
	bash scripts/setup.sh

build:                      ## build eBPF objects, loaders, sender, streamer, delay relay, C tests, test tools
	for p in $(PARTS); do $(MAKE) -C $$p || exit 1; done

demo: setup build            ## the whole pipeline on an emulated SRv6 network, ~1 min
	$(PY) scripts/demo.py

test:                        ## setup, build and every test, as root (CI runs exactly this), in parallel groups
	bash scripts/test.sh

test-quick: setup build      ## units, codecs, BPF_PROG_TEST_RUN: no services, < 3 min (tests/schedule.toml)
	bash scripts/test.sh --quick

test-cluster: setup build    ## the chart on a local single-node Kubernetes (docs/kubernetes-local.md), alone
	$(PY) -m pytest -p no:cacheprovider -q tests/deploy/cluster_install.py

test-durations:              ## every test, then tests/durations.json (balances the groups) rewritten
	bash scripts/test.sh --save-durations

bench: setup build           ## benchmarks; figures go to docs/benchmarks.md
	bash bench/run_all.sh

images: setup build         ## container images with buildah from Debian packages (no daemon, no registry)
	bash scripts/images.sh

debs: setup build           ## Debian packages segscope-agent and segscope-processors in build/debs (dpkg-deb)
	$(PY) packaging/debian/build.py

clean:
	for p in $(PARTS); do $(MAKE) -C $$p clean; done
