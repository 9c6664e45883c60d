# Makefile — a thin wrapper over CMake and the scripts in tools/.
#
#   make            build build/ (Release)
#   make setup      install what is missing: Debian packages, .venv, the default model
#   make serve      setup, build, then serve with policies/default.lua
#   make test       setup, build build/ and build-asan/, run every test suite
#   make golden     setup --golden (llama-cpp-python), then tools/gen_*.py
#   make fuzz       libFuzzer build (clang) in build-fuzz/, each target for FUZZ_SECONDS
#   make clean      remove the build directories
#
# Everything that needs installing is installed by tools/setup.sh; each step
# is skipped when already done, so repeating a target costs only the build.

NPROC        := $(shell nproc 2>/dev/null || echo 2)
CMAKE        ?= cmake
BUILD        ?= build
BUILD_ASAN   ?= build-asan
BUILD_FUZZ   ?= build-fuzz
FUZZ_SECONDS ?= 60
POLICY       ?= policies/default.lua

# ccache (installed by tools/setup.sh) keeps compiled objects between
# builds and between clones: paths are hashed relative to the checkout.
CCACHE := $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
LAUNCHER := -DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE)
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
endif

.PHONY: all build build-asan build-fuzz setup setup-golden serve test golden fuzz clean

all: build

# Configure once; later builds let CMake re-configure itself when its inputs change.
build:
	@test -f $(BUILD)/CMakeCache.txt || $(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER)
	$(CMAKE) --build $(BUILD) -j$(NPROC)

build-asan:
	@test -f $(BUILD_ASAN)/CMakeCache.txt || $(CMAKE) -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Release \
		-DLI_SANITIZE=ON -DLI_CUDA=OFF $(LAUNCHER)
	$(CMAKE) --build $(BUILD_ASAN) -j$(NPROC)

build-fuzz:
	@test -f $(BUILD_FUZZ)/CMakeCache.txt || $(CMAKE) -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=Release \
		-DLI_FUZZ=ON -DLI_CUDA=OFF -DCMAKE_C_COMPILER=clang
	$(CMAKE) --build $(BUILD_FUZZ) -j$(NPROC)

setup:
	tools/setup.sh

setup-golden:
	tools/setup.sh --golden

# Targets run their steps in order even under make -j.
serve:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	./$(BUILD)/luainfer serve $(POLICY)

test:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory build-asan
	tools/run_tests.sh $(BUILD) $(BUILD_ASAN)

golden:
	@$(MAKE) --no-print-directory setup-golden
	@$(MAKE) --no-print-directory build
	@set -e; for g in tools/gen_*.py; do echo "== $$g"; .venv/bin/python $$g; done

# New inputs libFuzzer finds go to $(BUILD_FUZZ)/corpus/NAME, crashes to
# $(BUILD_FUZZ)/crash-*; the committed seeds in tests/fuzz/corpus stay as they are.
fuzz:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build-fuzz
	@set -e; for f in tests/fuzz/fuzz_*.c; do \
		name=$$(basename $$f .c); \
		mkdir -p $(BUILD_FUZZ)/corpus/$$name; \
		echo "== $$name: $(FUZZ_SECONDS) s"; \
		./$(BUILD_FUZZ)/$$name -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(BUILD_FUZZ)/ $(BUILD_FUZZ)/corpus/$$name tests/fuzz/corpus/$$name; \
	done

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
