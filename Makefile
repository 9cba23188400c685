# README's two commands, in order, on a fresh Debian machine:
#   make demo   a virtualenv in .venv (Debian's Python refuses `pip install` outside
#               one, PEP 668), cloudprof installed into it, and the main job as a dry run
#   make test   what the tests need (OpenSSH server and GNU time from Debian, the
#               [dev] and [docs] extras into the same .venv) and the whole suite
# CI (.ci/run) runs both in a fresh copy of the checkout. Every target uses .venv
# (VENV=... picks another); `. .venv/bin/activate` puts `cloudprof` on your PATH.
PYTHON3 ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# the demo's sweep; CI passes a smaller one (DEMO_ARGS="--frames 8 ...")
DEMO_ARGS ?=
TEST_EXTRAS := .[dev,docs]

# Packages go in with uv (itself a wheel from PyPI, into the venv): the test extras took
# 42 s with pip and 13 s with uv on a 2-core machine, the same versions resolved, byte-
# compiled as pip does (uv alone does not: 4 s, and each first import compiles instead).
# Where uv cannot be had or cannot reach the index (it reads no pip.conf), pip installs.
define install
	{ [ -x $(VENV)/bin/uv ] && $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(1); } || \
	{ echo "uv could not install it: pip does"; \
	  $(PY) -m pip install -q --disable-pip-version-check $(1); }
endef

.PHONY: demo test venv deps system-deps lint unit bench

demo: venv
	$(VENV)/bin/cloudprof sweep --machine n2-highcpu-80 --dry-run $(DEMO_ARGS)

test: deps lint unit

venv: $(VENV)/.installed

# Debian's python3 has no venv module (ensurepip) until python3-venv is installed.
$(VENV)/.installed: pyproject.toml
	@if ! $(PYTHON3) -c "import ensurepip, venv" 2>/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv >/dev/null; \
	fi
	[ -x $(PY) ] || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv || echo "no uv: pip installs"
	$(call install,-e .)
	touch $@

system-deps:
	@if [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/time ]; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openssh-server openssh-client time >/dev/null; \
	fi

deps: venv system-deps
	$(call install,-e "$(TEST_EXTRAS)")

lint:
	$(PY) -m ruff check .

# four test workers on two cores: many tests wait (on SSH, sleeps, a trial's fixed
# duration, a timeout under test), and the cores sat idle while every worker waited. With
# two workers the suite took 814-831 s in a fresh clone; with three 623 s, until the test
# processes' own CPU was cut (moto's images), when the cores sat 12 % idle: 604 s with
# three, 549 s with four (3 % idle). Change the count only after the suite has passed
# beside a CPU hog with it (python3 -c "while True: pass"), three runs in a row.
unit:
	$(PY) -m pytest -q -p no:cacheprovider -n 4 --dist worksteal

# the benchmarks page (docs/benchmarks.md, from benchmarks/results.json):
#   make bench BENCH_ARGS=--quick   fewer rounds and shorter trials
BENCH_ARGS ?=

bench: venv
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)
