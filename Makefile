# `make test` is the one command that sets up everything the tests need
# (OpenSSH server and GNU time from Debian, the Python test stand-ins from PyPI)
# and runs the whole suite. CI (.ci/run) runs exactly this.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps system-deps lint unit bench

test: deps lint unit

system-deps:
	@if [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/time ]; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openssh-server openssh-client time >/dev/null; \
	fi

deps: system-deps
	$(PYTHON) -m pip install -q -e ".[dev]"

lint:
	$(PYTHON) -m ruff check .

unit:
	$(PYTHON) -m pytest -q -p no:cacheprovider -n 2

bench:
	$(PYTHON) benchmarks/run_all.py
