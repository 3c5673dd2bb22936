# schedswitchd: `make demo` runs the main job, `make test` passes the tests.
# Both install what they need on a fresh Debian 12 machine and are quick once it is there.

# The venv's interpreter: the distribution's python3 when it is 3.11 or newer, the one the
# service runs (docs/service.md), else the first python3 in PATH (whose venv's pip then
# names the version it needs when it is older). A python3 that a version manager puts first
# in PATH may be built without the distribution's optimisations, and the benchmarks measure
# the daemon on the venv's interpreter (docs/performance.md, "The interpreter"). Expanded
# when the venv is made, after the packages below are installed.
PYTHON ?= $(or $(shell for p in /usr/bin/python3 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && command -v $$p && break; \
	done),python3)
VENV := .venv
VPY := $(VENV)/bin/python
BUILD := build
PYLIBBPF := pylibbpf==0.0.6

APT_PACKAGES := clang clang-16 clang-19 llvm bpftool libbpf-dev libsystemd-dev pkg-config gcc make \
	qemu-system-x86 busybox-static kmod zstd xz-utils cpio binutils \
	systemd strace \
	dbus-daemon dbus-bin libglib2.0-bin polkitd power-profiles-daemon gamemode util-linux \
	python3 python3-venv python3-dev

.PHONY: all deps kernel schedulers test lint typecheck pytest unit demo bench clean test-objects fuzz fuzz-props \
	man completions install install-desktop
all: test

$(BUILD)/.apt-stamp: tools/ensure-apt.sh Makefile
	@mkdir -p $(BUILD)
	@tools/ensure-apt.sh $(APT_PACKAGES)
	@touch $@

$(VENV)/.stamp: pyproject.toml $(BUILD)/.apt-stamp
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --upgrade pip
	@# setuptools warns on every editable install that ./schedswitchd shadows the package: expected here.
	@PYTHONWARNINGS='ignore:Editable installation' $(VPY) -m pip install -q --no-warn-script-location -e '.[dev,bench,dbus]'
	@# The reference libbpf of tests/vm/test_corpus.py (1.6, linked into this wheel's extension
	@# module and called through ctypes; Debian 12's is 1.1): without its Python side's
	@# dependency (llvmlite, ~170 MB), which that test never imports.
	@$(VPY) -m pip install -q --no-deps $(PYLIBBPF)
	@touch $@

deps: $(VENV)/.stamp

# Debian sid's sched_ext kernel, cached machine-wide in /var/cache/schedswitchd/kernel
# (downloaded once, ~125 MB; a complete cache is reused without network).
# build/sid/ gets symlinks to its vmlinux.h and vmlinux.btf (replaced only when they change).
kernel: deps
	@$(VPY) -m tools.sidkernel --link-dir $(BUILD)/sid >/dev/null

$(BUILD)/sid/vmlinux.h: | kernel
	@test -e $@

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: deps
	$(VENV)/bin/mypy

# The whole suite: every build output and the sid kernel are required (missing ones fail).
pytest: deps kernel test-objects schedulers
	SCHEDSWITCHD_FULL_SUITE=1 $(VENV)/bin/pytest -q

# The fast tier: no root, no VM, no kernel download, nothing slow by design (the `slow`
# marker: bulk kernel-BTF comparisons, load runs); tests needing build outputs or the
# kernel cache skip when they are absent (after `make test-objects` / `make kernel` they run).
# One pytest-xdist worker per CPU.
unit: deps
	$(VENV)/bin/pytest -q -n auto -m "not vm and not root and not slow"

# BPF test objects: every tests/bpf/*.bpf.c -> build/tests/bpf/*.bpf.o, against a vmlinux.h
# dumped from the host's running kernel (never committed).
BPF_CLANG ?= clang
BPF_CFLAGS := -O2 -g -target bpf -D__TARGET_ARCH_x86
TEST_BPF_SRCS := $(wildcard tests/bpf/*.bpf.c)
TEST_BPF_OBJS := $(patsubst tests/bpf/%.bpf.c,$(BUILD)/tests/bpf/%.bpf.o,$(TEST_BPF_SRCS))

$(BUILD)/host/vmlinux.h: | $(BUILD)/.apt-stamp
	@mkdir -p $(@D)
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp
	@mv $@.tmp $@

$(BUILD)/tests/bpf/%.bpf.o: tests/bpf/%.bpf.c $(wildcard tests/bpf/*.h) $(BUILD)/host/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(BPF_CFLAGS) -I$(BUILD)/host -Itests/bpf -c $< -o $@

# Arena test objects (tests/bpf/arena_*.bpf.c) use `__arena` pointers (LLVM address space 1,
# addr_space_cast): clang 18 or later. The other objects stay on BPF_CLANG.
ARENA_CLANG ?= clang-19
ARENA_TEST_OBJS := $(patsubst tests/bpf/%.bpf.c,$(BUILD)/tests/bpf/%.bpf.o,$(wildcard tests/bpf/arena_*.bpf.c))
$(ARENA_TEST_OBJS): BPF_CLANG = $(ARENA_CLANG)

# Multi-file test objects: tests/bpf/NAME/*.bpf.c, each compiled as above into
# build/tests/bpf/parts/NAME/, then linked into build/tests/bpf/NAME.bpf.o by bpftool's
# static linker (`bpftool gen object`, as scx links its multi-file schedulers).
TEST_LINKED := $(sort $(patsubst tests/bpf/%/,%,$(dir $(wildcard tests/bpf/*/*.bpf.c))))
TEST_LINKED_OBJS := $(patsubst %,$(BUILD)/tests/bpf/%.bpf.o,$(TEST_LINKED))

$(BUILD)/tests/bpf/parts/%.bpf.o: tests/bpf/%.bpf.c $(wildcard tests/bpf/*.h) $(BUILD)/host/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(BPF_CFLAGS) -I$(BUILD)/host -Itests/bpf -c $< -o $@

define LINKED_TEST_OBJ
$(BUILD)/tests/bpf/$(1).bpf.o: $(patsubst tests/bpf/%.bpf.c,$(BUILD)/tests/bpf/parts/%.bpf.o,$(wildcard tests/bpf/$(1)/*.bpf.c))
	bpftool gen object $$@ $$^
endef
$(foreach n,$(TEST_LINKED),$(eval $(call LINKED_TEST_OBJ,$(n))))


# Executables embedding BPF objects, as an installed scx_* scheduler embeds its skeleton's
# object: none, one (profile.bpf.o) and two (globals.bpf.o, then profile.bpf.o).
EMBED_DIR := $(BUILD)/tests/embed
EMBED_EXES := $(EMBED_DIR)/no_obj $(EMBED_DIR)/one_obj $(EMBED_DIR)/two_obj
$(EMBED_DIR)/no_obj: tests/embed/embed.c
	@mkdir -p $(@D)
	gcc -O1 -o $@ $<
$(EMBED_DIR)/one_obj: tests/embed/embed.c $(BUILD)/tests/bpf/profile.bpf.o
	@mkdir -p $(@D)
	gcc -O1 -DOBJ1='"$(BUILD)/tests/bpf/profile.bpf.o"' -o $@ $<
$(EMBED_DIR)/two_obj: tests/embed/embed.c $(BUILD)/tests/bpf/globals.bpf.o $(BUILD)/tests/bpf/profile.bpf.o
	@mkdir -p $(@D)
	gcc -O1 -DOBJ1='"$(BUILD)/tests/bpf/globals.bpf.o"' \
		-DOBJ2='"$(BUILD)/tests/bpf/profile.bpf.o"' -o $@ $<

# Schedulers run as their own programs (tests/vm/exec/*.c, tests/vm/test_executables_vm.py):
# linked with the system's libbpf (libbpf-dev and pkg-config in APT_PACKAGES).
EXEC_DIR := $(BUILD)/tests/exec
EXEC_EXES := $(patsubst tests/vm/exec/%.c,$(EXEC_DIR)/%,$(wildcard tests/vm/exec/*.c))
$(EXEC_DIR)/%: tests/vm/exec/%.c | $(BUILD)/.apt-stamp
	@mkdir -p $(@D)
	gcc -O1 -Wall -o $@ $< $$(pkg-config --cflags --libs libbpf)

test-objects: $(TEST_BPF_OBJS) $(TEST_LINKED_OBJS) $(EMBED_EXES) $(EXEC_EXES)

# Sample sched_ext schedulers, against the sched_ext VM kernel's vmlinux.h: bpf/NAME.bpf.c ->
#   build/bpf/NAME.bpf.o                .struct_ops.link (our loader)
#   build/bpf/NAME.legacy.bpf.o         -DSCX_LEGACY_STRUCT_OPS: .struct_ops, for libbpf 1.1's
#                                       `bpftool struct_ops register`
#   build/bpf/NAME[.legacy].nokmod.bpf.o  the same without the .kmod_btfs section
SCHED_SRCS := $(wildcard bpf/*.bpf.c)
SCHED_OBJS := $(foreach v,bpf legacy.bpf nokmod.bpf legacy.nokmod.bpf,\
	$(patsubst bpf/%.bpf.c,$(BUILD)/bpf/%.$(v).o,$(SCHED_SRCS)))
SCHED_CFLAGS := $(BPF_CFLAGS) -Wno-missing-declarations -I$(BUILD)/sid -Ibpf

$(BUILD)/bpf/%.legacy.nokmod.bpf.o: bpf/%.bpf.c $(wildcard bpf/*.h) $(BUILD)/sid/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(SCHED_CFLAGS) -DSCX_LEGACY_STRUCT_OPS -DKMOD_BTFS_DISABLE -c $< -o $@

$(BUILD)/bpf/%.legacy.bpf.o: bpf/%.bpf.c $(wildcard bpf/*.h) $(BUILD)/sid/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(SCHED_CFLAGS) -DSCX_LEGACY_STRUCT_OPS -c $< -o $@

$(BUILD)/bpf/%.nokmod.bpf.o: bpf/%.bpf.c $(wildcard bpf/*.h) $(BUILD)/sid/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(SCHED_CFLAGS) -DKMOD_BTFS_DISABLE -c $< -o $@

$(BUILD)/bpf/%.bpf.o: bpf/%.bpf.c $(wildcard bpf/*.h) $(BUILD)/sid/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(SCHED_CFLAGS) -c $< -o $@

# Deliberately broken schedulers for the daemon's VM tests (tests/vm/bpf/*.bpf.c), built the
# same way: build/tests/vm/bpf/NAME.bpf.o.
VM_TEST_SRCS := $(wildcard tests/vm/bpf/*.bpf.c)
VM_TEST_OBJS := $(patsubst tests/vm/bpf/%.bpf.c,$(BUILD)/tests/vm/bpf/%.bpf.o,$(VM_TEST_SRCS))

$(BUILD)/tests/vm/bpf/%.bpf.o: tests/vm/bpf/%.bpf.c $(wildcard bpf/*.h) $(BUILD)/sid/vmlinux.h
	@mkdir -p $(@D)
	$(BPF_CLANG) $(SCHED_CFLAGS) -c $< -o $@

schedulers: $(SCHED_OBJS) $(VM_TEST_OBJS)

test: lint typecheck pytest

# Boots the sched_ext VM, runs the daemon with config/schedswitchd.toml and plays a short
# launcher session (tools/demo.py); the last line is a JSON summary.
demo: deps kernel schedulers
	@$(VPY) -m tools.demo

# Host benchmarks (one table), then the switch-latency benchmark in the sched_ext VM, with
# more hits of the standby hit and its lane at the largest count than of the other columns
# (the target compares their medians): bench/results/{host.md,switch_latency.md,
# switch_latency.png}, then the no-scheduler gap's composition and kernel profile (two
# boots): bench/results/gap_profile.txt. bench/README.md says how long each takes.
# A missed target (exit status 2) is reported, not fatal; a failure to run is.
bench: deps kernel test-objects schedulers
	$(VPY) bench/host.py --out bench/results/host.md || test $$? -eq 2
	$(VPY) bench/switch_latency.py --hit-reps 121 --out bench/results || test $$? -eq 2
	$(VPY) bench/gap_profile.py --out bench/results

# Longer robustness runs than `make test` has time for (not part of it):
# - tools/fuzz.py: FUZZ_INPUTS mutated inputs (default 100,000) on each of five surfaces
#   (objects, BTF, profiles and expressions, configs, protocol) in long-lived workers; only
#   the project's typed errors are allowed, no input may take over 5 s of CPU or 1 GiB.
#   Counts per surface and outcome in build/fuzz/report.{md,json}, reproducers of findings
#   under build/fuzz/findings/; exit 1 on any finding (after the flood has run too).
#   FUZZ_JOBS workers at once, each surface's inputs split among FUZZ_SHARDS of them;
# - the daemon under a flood of 200 clients for 30 s (its resident memory before, at the
#   end and after is printed; an admin's status must be answered throughout).
# `make fuzz-props` runs the hypothesis property tests of the opener, the BTF reader and the
# protocol with FUZZ_SCALE times their examples instead (tools/fuzz_report.py sums them).
# docs/fuzzing.md has the method and the figures of a run.
FUZZ_INPUTS ?= 100000
FUZZ_JOBS ?= 2
FUZZ_SHARDS ?= 1
FUZZ_SCALE ?= 5
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_FLOOD_CLIENTS ?= 200
FUZZ_FLOOD_S ?= 30
fuzz: deps test-objects
	@mkdir -p $(FUZZ_DIR) && rm -rf $(FUZZ_DIR)/findings
	$(VPY) -m tools.fuzz run --inputs $(FUZZ_INPUTS) --jobs $(FUZZ_JOBS) --shards $(FUZZ_SHARDS) \
		--out $(FUZZ_DIR); \
	rc=$$?; \
	SCHEDSWITCHD_FLOOD_CLIENTS=$(FUZZ_FLOOD_CLIENTS) SCHEDSWITCHD_FLOOD_S=$(FUZZ_FLOOD_S) \
		$(VENV)/bin/pytest -q -s -rxX -p no:cacheprovider tests/daemon/test_flood.py && exit $$rc

fuzz-props: deps test-objects
	@mkdir -p $(FUZZ_DIR) && rm -f $(FUZZ_DIR)/stats.jsonl $(FUZZ_DIR)/junit.xml
	SCHEDSWITCHD_FUZZ_SCALE=$(FUZZ_SCALE) SCHEDSWITCHD_FUZZ_STATS=$(FUZZ_DIR)/stats.jsonl $(VENV)/bin/pytest -q -p no:cacheprovider --junitxml=$(FUZZ_DIR)/junit.xml tests/bpf/test_object_fuzz.py tests/bpf/btf/test_btf_fuzz.py tests/daemon/test_protocol.py "tests/daemon/test_server.py::test_arbitrary_bytes_over_the_socket" || true
	$(VPY) -m tools.fuzz_report $(FUZZ_DIR) --out $(FUZZ_DIR)/props.md

# Man pages (build/man/schedswitchd.8, schedswitchctl.1, schedswitch-run.1,
# schedswitch-gamemode.1) and bash/zsh completions (build/completions/{bash,zsh}/) of the four
# commands, generated from their argparse parsers (tools/cli_docs.py: argparse-manpage and
# shtab, dev dependencies).
man: deps
	@$(VPY) -m tools.cli_docs --man $(BUILD)/man >/dev/null

completions: deps
	@$(VPY) -m tools.cli_docs --completions $(BUILD)/completions >/dev/null

# Installs the man pages and completions under $(DESTDIR)$(PREFIX) (the package itself:
# `pip install .`, see docs/service.md).
PREFIX ?= /usr/local
CLI_PROGS := schedswitchd schedswitchctl schedswitch-run schedswitch-gamemode
install: man completions
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions
	install -m 0644 $(BUILD)/man/schedswitchctl.1 $(BUILD)/man/schedswitch-run.1 \
		$(BUILD)/man/schedswitch-gamemode.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 $(BUILD)/man/schedswitchd.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0644 $(patsubst %,$(BUILD)/completions/bash/%,$(CLI_PROGS)) \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/
	install -m 0644 $(patsubst %,$(BUILD)/completions/zsh/_%,$(CLI_PROGS)) \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions/

# The desktop faces' system files (docs/desktop.md): org.scx.Loader's bus policy and activation
# file, its polkit action, and schedswitch-gamemode's user unit. Under $(DESTDIR)/usr whatever
# PREFIX is: dbus-daemon, polkitd and systemd's user manager read these directories and not
# /usr/local. GameMode's session activation file is left out on purpose: it would shadow
# gamemoded's own (docs/desktop.md says when to install it).
DESKTOP_FILES := dbus/org.scx.Loader.conf:share/dbus-1/system.d \
	dbus/org.scx.Loader.service:share/dbus-1/system-services \
	polkit/org.scx.Loader.policy:share/polkit-1/actions \
	systemd/user/schedswitch-gamemode.service:lib/systemd/user
install-desktop:
	@set -e; for f in $(DESKTOP_FILES); do \
		src=$${f%%:*}; dir=$(DESTDIR)/usr/$${f#*:}; \
		install -d $$dir && install -m 0644 $$src $$dir/; \
	done

clean:
	rm -rf $(BUILD) .mypy_cache .pytest_cache .ruff_cache
