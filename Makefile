# drain-gate — `make run` starts a local Envoy with the filter; `make test` proves it.
# Every target installs what it needs, idempotently.

SHELL    := /bin/bash
TARGET   := wasm32-wasip1
WASM     := target/$(TARGET)/release/drain_gate.wasm
VENV     := .venv
PY       := $(VENV)/bin/python
APT_PKGS := haproxy wrk nghttp2-client curl socat

.PHONY: all build run test lint unit integration deps deps-rust deps-apt clean

all: build

## Dependencies -------------------------------------------------------------
deps: deps-rust deps-apt $(VENV)/.installed

deps-rust:
	@rustup target list --installed | grep -qx $(TARGET) || rustup target add $(TARGET)
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt

deps-apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: tests/requirements.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	@touch $@

## Build ---------------------------------------------------------------------
build: deps-rust
	cargo build --release --target $(TARGET)
	@ls -l $(WASM) | awk '{print "built $(WASM): " $$5 " bytes"}'

## Run -----------------------------------------------------------------------
run: build $(VENV)/.installed
	PYTHONPATH=. $(PY) -m tests.harness.run

## Test ----------------------------------------------------------------------
test: deps build lint unit integration

lint: deps-rust
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --lib --target $(TARGET) -- -D warnings

unit:
	cargo test --lib

integration: build $(VENV)/.installed
	PYTHONPATH=. $(PY) -m pytest tests -q -p no:cacheprovider $(PYTEST_ARGS)

clean:
	cargo clean
	rm -rf out
