# tally: two commands matter.
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing, builds, runs every test
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)
# Two cores: keep the test harness from running more binaries than that at once.
TEST_THREADS ?= 2

.PHONY: all build deps test test-rust test-aarch64 demo dist cluster-bench clean fmt

all: build

build:
	$(CARGO) build --release --workspace

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

clean:
	$(CARGO) clean
