# marlhf build. `make` builds build/marlhf; `make test` builds and runs the test suite;
# `make test SANITIZE=1` does the same under AddressSanitizer + UBSan in build-asan/.

CC      ?= gcc
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
BUILD   := build-asan
OPT     := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD   := build
OPT     := -O3 -march=native -g
endif

# OpenBLAS, OpenMP build: it shares one thread pool with our own OpenMP kernels
# (see docs/architecture.md, "Threads"). Debian ships it without a dev symlink.
OPENBLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS    := -L$(OPENBLAS_DIR) -l:libopenblas.so.0 -Wl,-rpath,$(OPENBLAS_DIR)

CFLAGS  := -std=c17 $(OPT) -Wall -Wextra -Wshadow -Wno-unused-parameter -fopenmp \
           -D_GNU_SOURCE -Isrc -MMD -MP
LDLIBS  := $(BLAS_LIBS) -ljansson -lpcre2-8 -llink-grammar -lm -fopenmp

LIB_SRC := $(filter-out src/cli/main.c,$(shell find src -name '*.c' | sort))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(BUILD)/src/cli/main.o
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test tests bench clean setup prerequisites demo
all: $(BUILD)/marlhf

$(BUILD)/libmarlhf.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(BUILD)/marlhf: $(CLI_OBJ) $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

tests: $(BUILD)/marlhf $(TEST_BIN)

# Debian packages (scripts/setup) and the SmolLM2 model the tests and demo use.
prerequisites:
	@scripts/setup
	@scripts/fetch-model

# The test command of the README. Runs every test binary; ends with "N passed, N failed".
test: prerequisites
	@$(MAKE) --no-print-directory tests SANITIZE=$(SANITIZE)
	@BUILD=$(BUILD) tests/run.sh

# The main job of the README (for now: convert SmolLM2 and score text with it).
demo: prerequisites
	@$(MAKE) --no-print-directory all
	@scripts/demo

bench: $(BUILD)/marlhf $(BENCH_BIN)

setup:
	scripts/setup

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
