# qosd — the two set-up commands of a fresh machine are `make demo` and
# `make test`; both install what they need first (as root).

SHELL := /bin/bash
CARGO ?= cargo
# Debian packages the build, the tests and the demo need.
APT_PKGS := clang llvm libelf-dev zlib1g-dev pkg-config make bpftool \
            memcached nginx-light redis-server wrk stress-ng linux-cpupower \
            prometheus libfontconfig-dev curl procps iproute2 ruby-grpc
QOSD := target/release/qosd

.PHONY: all deps tracefs build fixtures test demo bench fmt lint clean

all: build

## deps: install missing Debian packages (needs root), mount tracefs
deps:
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "make deps: need root to install: $$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@# The packaged servers must not hold the ports or CPUs the tests use.
	@-systemctl stop nginx memcached redis-server prometheus >/dev/null 2>&1 || true
	@$(MAKE) --no-print-directory tracefs

tracefs:
	@if [ ! -d /sys/kernel/tracing/events ]; then \
	  mount -t tracefs tracefs /sys/kernel/tracing && echo "mounted tracefs at /sys/kernel/tracing"; \
	fi

build: deps
	$(CARGO) build --release --workspace --all-targets

## fixtures: the gRPC fixture servers and load client (Go: PATH or
## /usr/local/go/bin/go), grpcio from PyPI
fixtures:
	bash scenarios/fixtures/grpc-server/build.sh target/grpc-fixture

## test: every test, real eBPF and real servers included (run as root)
test: build fixtures
	$(CARGO) test --release --workspace -- --test-threads=2

## demo: a real server under load, followed live by `qosd trace`
demo: build
	bash scenarios/demo.sh

## bench: figures into BENCHMARKS.md
bench: build fixtures
	bash scenarios/bench.sh

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

clean:
	$(CARGO) clean
