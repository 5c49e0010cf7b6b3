# qosd — the two set-up commands of a fresh machine are `make demo` and
# `make test`; both install what they need first (as root).

SHELL := /bin/bash
CARGO ?= cargo
# Debian packages the build, the tests and the demo need.
APT_PKGS := clang llvm libelf-dev zlib1g-dev pkg-config make bpftool \
            memcached nginx-light redis-server redis-tools wrk stress-ng linux-cpupower \
            prometheus libfontconfig-dev curl procps iproute2 \
            systemd util-linux man-db ruby-grpc etcd-server openssl iperf3
QOSD := target/release/qosd

# `make install` layout; `make install PREFIX=/usr DESTDIR=pkgroot` for a
# package. The binary looks for /etc/qosd/config.yaml whatever PREFIX is.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
MANDIR ?= $(PREFIX)/share/man
UNITDIR ?= $(PREFIX)/lib/systemd/system
DATADIR ?= $(PREFIX)/share
RUNDIR ?= /run/qosd
# The binary to install (tests install the one cargo test built).
QOSD_BIN ?= $(QOSD)
# Tools the deployment tests use, built from the Go module proxy.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
TOOLS := target/tools
KUBECONFORM_VERSION := v0.8.0
# The API server of the Kubernetes tests (Debian has etcd and no
# kube-apiserver): built from the Go module proxy, a few minutes once.
KUBE_VERSION := v1.32.4

.PHONY: all deps tools tracefs build fixtures test test-k8s test-kernels demo bench fmt lint layout clean install uninstall man

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
	@$(MAKE) --no-print-directory tracefs tools

## tools: kubeconform (Kubernetes manifest validator) and kube-apiserver into target/tools
tools: $(TOOLS)/kubeconform $(TOOLS)/kube-apiserver

$(TOOLS)/kube-apiserver: deploy/kubernetes/tools/build-kube-apiserver.sh
	KUBE_VERSION=$(KUBE_VERSION) GO=$(GO) bash deploy/kubernetes/tools/build-kube-apiserver.sh $@

$(TOOLS)/kubeconform:
	@mkdir -p $(TOOLS)
	GOBIN=$(abspath $(TOOLS)) GOFLAGS=-mod=mod $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

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
	$(CARGO) test --release --workspace --no-fail-fast -- --test-threads=2
	# The exact-count trace suites again with the histograms in the kernel
	# (docs/aggregation.md); --workspace keeps the same build.
	QOSD_AGGREGATE=kernel $(CARGO) test --release --workspace --no-fail-fast \
		--test trace_real --test trace_pipelined --test trace_tls --test trace_sockets \
		-- --test-threads=2

## test-kernels: the root suites of the sensors and actuators on Debian 12's
## and 13's kernels (guests with cgroup v2 only) and this host; docs/kernels.md
## (matrix.sh builds the fixtures and only the test binaries its suites name)
test-kernels: deps
	bash kernels/matrix.sh

## test-k8s: qosd against a real API server (etcd + kube-apiserver on loopback)
test-k8s: build
	$(CARGO) test --release -p qosd-manager --test kube_real --test deploy_kubernetes -- --test-threads=1

## demo: search ramped beside a batch job under PARTIES (CPU quota), then the static split, compared
demo: build
	bash scenarios/demo.sh

## bench: figures into BENCHMARKS.md
bench: build fixtures
	bash scenarios/bench.sh

## install: binary, config, policies, systemd unit, man pages, completions
install:
	@if [ "$(QOSD_BIN)" = "$(QOSD)" ]; then $(CARGO) build --release -p qosd-manager --bin qosd; fi
	install -D -m 0755 $(QOSD_BIN) $(DESTDIR)$(BINDIR)/qosd
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/qosd/policies $(DESTDIR)$(RUNDIR)
	@# An operator's edited config is kept; the new default goes beside it.
	@for f in config.yaml policies/*.yaml; do \
	  dst=$(DESTDIR)$(SYSCONFDIR)/qosd/$$f; \
	  if [ -e $$dst ] && ! cmp -s $$f $$dst; then \
	    install -m 0644 $$f $$dst.new; echo "kept $$dst (edited); new default: $$dst.new"; \
	  else install -m 0644 $$f $$dst; fi; \
	done
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|/usr/local/bin/qosd|$(BINDIR)/qosd|g; s|/etc/qosd/|$(SYSCONFDIR)/qosd/|g' \
	  deploy/systemd/qosd.service > $(DESTDIR)$(UNITDIR)/qosd.service
	install -d $(DESTDIR)$(MANDIR)/man1
	$(DESTDIR)$(BINDIR)/qosd completions --man $(DESTDIR)$(MANDIR)/man1 >/dev/null
	install -d $(DESTDIR)$(DATADIR)/bash-completion/completions \
	  $(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	$(DESTDIR)$(BINDIR)/qosd completions bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/qosd
	$(DESTDIR)$(BINDIR)/qosd completions zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_qosd
	$(DESTDIR)$(BINDIR)/qosd completions fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/qosd.fish
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed; start with: systemctl start qosd (config: $(SYSCONFDIR)/qosd/config.yaml)"

## uninstall: what install put there, except the config (PURGE=1 removes it too)
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/qosd $(DESTDIR)$(UNITDIR)/qosd.service \
	  $(DESTDIR)$(MANDIR)/man1/qosd.1 $(DESTDIR)$(MANDIR)/man1/qosd-*.1 \
	  $(DESTDIR)$(DATADIR)/bash-completion/completions/qosd \
	  $(DESTDIR)$(DATADIR)/zsh/site-functions/_qosd \
	  $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/qosd.fish
	@if [ "$(PURGE)" = 1 ]; then rm -rf $(DESTDIR)$(SYSCONFDIR)/qosd; \
	else echo "kept $(DESTDIR)$(SYSCONFDIR)/qosd (PURGE=1 removes it)"; fi

## man: man pages from the clap definitions into target/man
man:
	$(CARGO) build --release -p qosd-manager --bin qosd
	$(QOSD) completions --man target/man
	@echo "read with: man -l target/man/qosd.1"

fmt:
	$(CARGO) fmt --all

lint: layout
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

# No source file over 500 lines outside the tests (docs/architecture.md).
layout:
	@over=$$(git ls-files '*.rs' | grep -v -e '/tests/' -e 'tests\.rs$$' | xargs wc -l | \
		awk '$$2 != "total" && $$1 > 500'); \
	if [ -n "$$over" ]; then echo "files over 500 lines outside the tests:"; echo "$$over"; exit 1; fi

clean:
	$(CARGO) clean
