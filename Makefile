# tally: two commands matter.
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing, builds, runs every test
CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)
# Two cores: keep the test harness from running more binaries than that at once.
TEST_THREADS ?= 2

.PHONY: all build build-ci deps test test-nostd prebuild test-glibc test-rust test-wheel test-aarch64 test-aarch64-e2e test-loom test-slurm wheel bench demo dist cluster-bench clean fmt perf image

all: build

# The shipped binaries, linked against glibc 2.28 (scripts/build/release.sh says
# how); also copied to target/release/.
build:
	scripts/build/release.sh

deps:
	@scripts/build/deps.sh
	@scripts/build/deps-py.sh

demo: deps build
	./target/release/tally demo

# What make test builds for this host, it builds once: the `ci` profile
# (Cargo.toml: release code without thin LTO, whose link of every test binary
# was most of CI's compile time), linked by zig against glibc 2.28's symbols as
# `make build` links the shipped binaries (scripts/build/release.sh). So the
# test binaries, the tally and plugin the suites start, and the ones
# test-glibc and test-wheel check and package are one build; `make build`
# compiles the release profile (thin LTO, line tables) apart and checks its
# own glibc floor.
NATIVE := $(shell uname -m)-unknown-linux-gnu
PY_TOOLS := $(CURDIR)/target/py-tools/bin
CI_CARGO = PATH=$(PY_TOOLS):$$PATH cargo-zigbuild
CI_FLAGS = --profile ci --target $(NATIVE).2.28
CI_BIN := target/$(NATIVE)/ci

# The x86 build first, on every core; then the x86 suites (test-rust) while
# the aarch64 build, the aarch64 kernels' tests and the no_std check run beside
# them at nice 10 (scripts/build/prebuild.sh), in the CPU the suites leave
# idle (beside the x86 build they only slowed it down: both are compilers);
# then the suites that use those builds.
test: deps
	@$(MAKE) --no-print-directory build-ci
	@$(MAKE) --no-print-directory -j2 test-rust prebuild
	@$(MAKE) --no-print-directory test-glibc test-wheel test-aarch64-e2e
	@echo "make test: all suites passed"

prebuild:
	scripts/build/prebuild.sh

# One build of every target: the plugin's cdylib (which `cargo test` does not
# build; its tests load it from there), the test binaries, and the benchmarks
# (benches/, so they cannot rot; `make bench` runs them). Built apart, `-p
# tally-nccl-plugin` resolved features without the workspace's and compiled
# the engine a second time.
build-ci:
	$(CI_CARGO) zigbuild $(CI_FLAGS) --workspace --all-targets

test-rust: build-ci
	$(CI_CARGO) test $(CI_FLAGS) --workspace -- --test-threads=$(TEST_THREADS)

# The no_std core type-checked (a library: what could fail to build without
# std fails there); make test runs it beside the suites (prebuild.sh).
test-nostd:
	$(CARGO) check -q -p tally-engine --no-default-features
	@echo "no_std core (reduce, wire) builds without std: ok"

# The tally-nccl wheel (pip install): `tally` and the plugin as `make build`
# linked them, tagged manylinux_2_28, into target/wheels/ (scripts/build/wheel.sh).
wheel: build
	scripts/build/wheel.sh

# The wheel, packed from test-rust's build, installed into a fresh venv and
# tested from there only; after test-rust, whose plugin harness it reruns
# against the installed library.
test-wheel:
	WHEEL_BIN=$(CI_BIN) scripts/build/test-wheel.sh

# The binaries load on glibc 2.28 (Amazon Linux 2023, Ubuntu 20.04+, RHEL 8+):
# test-rust's, linked as the shipped ones are (release.sh checks those).
test-glibc:
	scripts/build/check-glibc.sh --floor 2.28 $(CI_BIN)/tally $(CI_BIN)/libnccl_net_tally.so

test-aarch64:
	scripts/build/test-aarch64.sh

# The aarch64 tally, plugin and ncclNet harness under qemu-user: agg and ring over
# tcp and shm, f32 and bf16, CollNet, a server killed mid-run (failover).
test-aarch64-e2e:
	scripts/build/test-aarch64-e2e.sh

# config/slurm/'s files under a real Slurm (Debian's slurmctld, slurmd, munge,
# installed if missing), six nodes emulated as network namespaces of this host,
# the sbatch submitted unchanged (tests/slurm/run.sh says what it checks). As
# root; 25 to 75 s on 2 cores. Not in `make test`: it needs root, namespaces and
# Slurm's packages. Uses the tally that make test builds, else target/release's
# (TALLY=path to choose).
test-slurm:
	tests/slurm/run.sh

# Loom models of the lock-free state lcores share (engine/loom; not in `make test`:
# loom builds in a target of its own).
test-loom:
	cd engine/loom && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$(CURDIR)/target-loom $(CARGO) test --release

# cargo bench benchmarks (benches/): reduce kernels, wire codec, slab arithmetic, shm round trip.
bench:
	$(CARGO) bench -p tally-benches

cluster-bench: deps build
	scripts/bench/cluster.sh

dist: deps
	scripts/build/dist.sh

# The server image (docker/Dockerfile) with docker, podman or buildah, whichever
# works here; the name config/k8s runs. Offline (no image registry):
#   scripts/build/image-local-base.sh && make build && \
#   make image BINARIES=prebuilt BASE=localhost/debian:bookworm-slim
# Also: PLATFORMS=linux/amd64,linux/arm64 PUSH=1 ENGINE=podman RUST_IMAGE=... EFA_INSTALLER=1.38.0
IMAGE ?= registry.example.com/tally:0.1.0
image:
	IMAGE='$(IMAGE)' BINARIES='$(BINARIES)' BASE='$(BASE)' RUST_IMAGE='$(RUST_IMAGE)' PLATFORMS='$(PLATFORMS)' \
	PUSH='$(PUSH)' ENGINE='$(ENGINE)' EFA_INSTALLER='$(EFA_INSTALLER)' BUILD_NETWORK='$(BUILD_NETWORK)' \
	CARGO_FLAGS='$(CARGO_FLAGS)' BUILD_FLAGS='$(BUILD_FLAGS)' scripts/build/image.sh

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
