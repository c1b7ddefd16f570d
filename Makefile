# tally: two commands matter.
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing, builds, runs every test
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)
# Two cores: keep the test harness from running more binaries than that at once.
TEST_THREADS ?= 2

.PHONY: all build deps test test-rust test-aarch64 demo dist cluster-bench clean fmt perf

all: build

build:
	$(CARGO) build --release --workspace
	@# NCCL looks for libnccl-net-<name>.so; cargo names cdylibs with underscores.
	ln -sf libnccl_net_tally.so target/release/libnccl-net-tally.so

deps:
	@scripts/deps.sh

demo: deps build
	./target/release/tally demo

test: deps build test-rust test-aarch64
	@echo "make test: all suites passed"

test-rust:
	$(CARGO) test --release --workspace -- --test-threads=$(TEST_THREADS)
	$(CARGO) build -p tally-engine --no-default-features
	@echo "no_std core (reduce, wire) builds without std: ok"

test-aarch64:
	scripts/test-aarch64.sh

cluster-bench: deps build
	scripts/cluster-bench.sh

dist: deps
	scripts/dist.sh

fmt:
	$(CARGO) fmt --all

# Profile the demo with perf (docs/profiling.md). Hardware cycles where the
# host exposes them, else the cpu-clock software event (VMs, containers).
# Debian 12: apt-get install -y linux-perf.
PERF ?= perf
PERF_DATA ?= target/perf.data
TALLY ?= ./target/release/tally
perf:
	@command -v $(PERF) >/dev/null || { echo "make perf: perf not found (Debian 12: apt-get install -y linux-perf)"; exit 1; }
	$(CARGO) build --release -p tally-cli
	@ev=cycles; $(PERF) stat -e cycles true >/dev/null 2>&1 || ev=cpu-clock; \
	echo "make perf: recording '$(TALLY) demo' with -e $$ev -g into $(PERF_DATA)"; \
	$(PERF) record -q -e $$ev -g -o $(PERF_DATA) -- $(TALLY) demo > $(PERF_DATA).demo.log 2>&1 || { tail -20 $(PERF_DATA).demo.log; exit 1; }
	@echo "make perf: top symbols (self time); full report: $(PERF) report -i $(PERF_DATA)"
	@$(PERF) report -i $(PERF_DATA) --stdio --no-children -g none --sort comm,dso,symbol --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep -v '^$$' | head -30

clean:
	$(CARGO) clean
