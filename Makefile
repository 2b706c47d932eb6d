# marlhf build. `make` builds build/marlhf; `make test` builds and runs the test suite;
# `make test SANITIZE=1` does the same under AddressSanitizer + UBSan in build-asan/.

CC      ?= gcc
SANITIZE ?= 0
# Compile on every core unless the command line says how many jobs (-j N). On CI's two
# cores this halves the build. (No --output-sync: it would hold back the test runner's
# lines until the whole suite ends.)
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc)
endif
# FUZZ=1 (used by `make fuzz`): clang with libFuzzer's coverage, ASan and UBSan, in
# build-fuzz/, without CUDA and MPI; see docs/fuzzing.md.
FUZZ ?= 0
ifeq ($(FUZZ),1)
CC      := clang
BUILD   ?= build-fuzz
OPT     := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
CUDA    ?= 0
MPI     ?= 0
else ifeq ($(SANITIZE),1)
BUILD   ?= build-asan
OPT     := -O2 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
BUILD   ?= build
OPT     := -O3 -march=native -g
endif

# CUDA backend (src/ops/cuda): built whenever nvcc is found, except in the sanitizer
# build; `make CUDA=0` leaves it out. CI compiles it with -Werror on machines without a
# GPU, so it cannot rot; `--device cuda` then fails with a clear message at run time.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(SANITIZE),1)
CUDA ?= 0
endif
ifneq ($(NVCC),)
CUDA ?= 1
else
CUDA ?= 0
endif
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_90: the H100/H200. Override with e.g. CUDA_ARCH=sm_80 for an A100.
CUDA_ARCH ?= sm_90
# ptxas fails the build when a kernel spills registers or keeps anything in local memory
# (a stack frame): either would put a kernel's hot loop on device memory, which no CPU check
# can see (an unrolled loop no longer unrolled moved the attention forward's accumulators
# to a 304-byte stack frame once). Strict for the architectures every kernel is checked
# clean on with CUDA 13 (CI builds sm_90); elsewhere (sm_100 and sm_120: the wmma backward
# kernels spill a few bytes) the check is off rather than a failed build. PTXAS_STRICT=0/1
# overrides. A kernel that needs local memory on purpose says so here.
PTXAS_CHECKED_ARCHS := sm_80 sm_86 sm_89 sm_90
PTXAS_STRICT ?= $(if $(filter $(CUDA_ARCH),$(PTXAS_CHECKED_ARCHS)),1,0)
ifeq ($(PTXAS_STRICT),1)
PTXAS_GUARD := -Xptxas --warn-on-spills,--warn-on-local-memory-usage,--warning-as-error
endif
NVCCFLAGS := -std=c++20 -O3 -arch=$(CUDA_ARCH) -Isrc -DMARLHF_CUDA -Werror all-warnings $(PTXAS_GUARD) \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-fPIC,-fvisibility=hidden -MMD -MP

# OpenBLAS, OpenMP build: it shares one thread pool with our own OpenMP kernels
# (see docs/architecture.md, "Threads"). Debian ships it without a dev symlink.
OPENBLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS    := -L$(OPENBLAS_DIR) -l:libopenblas.so.0 -Wl,-rpath,$(OPENBLAS_DIR)

# -fPIC and hidden visibility: the same objects make build/libmarlhf.so (`make lib`), which
# exports only the embedding API of include/marlhf.h (MARLHF_API).
CFLAGS  := -std=c17 $(OPT) -Wall -Wextra -Wshadow -Wno-unused-parameter -fopenmp \
           -fPIC -fvisibility=hidden -D_GNU_SOURCE -Isrc -Iinclude -MMD -MP
LDLIBS  := $(BLAS_LIBS) -ljansson -lpcre2-8 -llink-grammar -lcurl -lmicrohttpd -lpthread -lm -fopenmp

# STATIC_DEPS=1 links OpenBLAS, jansson and PCRE2 statically: the binaries that travel to
# a GPU machine without those packages (tests/gpu/run.sh).
ifeq ($(STATIC_DEPS),1)
LDLIBS  := -Wl,-Bstatic -lopenblas -ljansson -lpcre2-8 -Wl,-Bdynamic -llink-grammar -lcurl -lmicrohttpd \
           -lgfortran -lpthread -lm -fopenmp
endif

# MPI (multi-process data parallel, docs/distributed.md): built whenever pkg-config finds
# Open MPI or MPICH (scripts/setup installs Open MPI); `make MPI=0` leaves it out, and so
# does the static bundle for GPU machines. A plain `marlhf` run never starts MPI.
MPI_PKG := $(firstword $(foreach p,ompi-c mpich,$(shell pkg-config --exists $(p) 2>/dev/null && echo $(p))))
ifeq ($(STATIC_DEPS),1)
MPI ?= 0
endif
ifneq ($(MPI_PKG),)
MPI ?= 1
else
MPI ?= 0
endif
ifeq ($(MPI),1)
ifeq ($(MPI_PKG),)
$(error MPI=1 but pkg-config finds neither ompi-c nor mpich (scripts/setup installs libopenmpi-dev))
endif
CFLAGS  += -DMARLHF_MPI $(shell pkg-config --cflags $(MPI_PKG))
LDLIBS  += $(shell pkg-config --libs $(MPI_PKG))
endif

LIB_SRC := $(filter-out src/cli/main.c,$(shell find src -name '*.c' | sort))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
ifeq ($(CUDA),1)
CFLAGS  += -DMARLHF_CUDA
CUDA_SRC := $(sort $(wildcard src/ops/cuda/*.cu))
LIB_OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.o)
# cuBLASLt is opened when --device cuda opens the backend (ops/cuda/cublaslt_library.cuh), not
# linked: linked, its 500 MB were mapped and relocated at every start, a CPU run's included
# (165 MB resident before main). The runtime is linked statically for the same reason. The
# name to open is the toolkit's own (its SONAME, e.g. libcublasLt.so.13).
CUBLASLT_SONAME := $(or $(shell objdump -p $(CUDA_HOME)/lib64/libcublasLt.so 2>/dev/null | awk '/SONAME/ {print $$2}'),libcublasLt.so)
NVCCFLAGS += -DMARLHF_CUBLASLT_SONAME='"$(CUBLASLT_SONAME)"'
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

# Objects are rebuilt when the flags change (CUDA on/off changes cpu_backend.c, MPI on/off dist.c).
FLAGS_STAMP := $(BUILD)/flags.stamp
FLAGS_NOW := $(CC) $(CFLAGS) CUDA=$(CUDA) $(CUDA_ARCH) STATIC=$(STATIC_DEPS) MPI=$(MPI)
$(shell mkdir -p $(BUILD) && (echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP)))
CLI_OBJ := $(BUILD)/src/cli/main.o
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# C++ tests: the CUDA kernels' source run on the CPU (src/ops/cuda/cpu_emulation.h).
CXXFLAGS := -std=c++17 $(OPT) -Wall -Wextra -Wshadow -Wno-unused-parameter -fno-strict-aliasing -pthread \
            -D_GNU_SOURCE -Isrc -Itests -MMD -MP
TEST_CXX_SRC := $(sort $(wildcard tests/test_*.cpp))
TEST_CXX_BIN := $(TEST_CXX_SRC:tests/%.cpp=$(BUILD)/tests/%)
TEST_BIN += $(TEST_CXX_BIN)
$(TEST_CXX_BIN): LDLIBS += -lstdc++
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# Stand-alone C tools (tools/gguf_dump.c is a debugging aid and not built).
TOOL_BIN := $(BUILD)/tools/reproduction_summary

# Programs that use the embedding API (include/marlhf.h) the way an outside program
# would: linked against the shared library, found next to them through the rpath.
EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)

.PHONY: all lib test tests bench clean setup prerequisites demo
# No file is deleted as an intermediate one: the objects and the emulated backend's header copies
# ($(BUILD)/emulated) that only pattern rules name would go at the end of the first build, and
# the next make -- tests/gpu/run.sh's, in the middle of `make test` -- made them again and
# relinked what uses them: every emulated binary, build/marlhf_emulated among them, which
# tests/cli/gpu_emulated.sh's mpirun ranks, beside it, then failed to start (CI, 2026-12-06).
.SECONDARY:
all: $(BUILD)/marlhf $(TOOL_BIN)

# The library for other programs: include/marlhf.h with either of these (docs/embedding.md).
lib: $(BUILD)/libmarlhf.a $(BUILD)/libmarlhf.so

$(BUILD)/libmarlhf.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(BUILD)/libmarlhf.so: $(LIB_OBJ) src/api/exports.map
	$(CC) $(OPT) -shared -Wl,--no-undefined -Wl,-soname,libmarlhf.so -Wl,--version-script,src/api/exports.map \
	      -o $@ $(LIB_OBJ) $(LDLIBS)

$(BUILD)/examples/%: examples/%.c include/marlhf.h $(BUILD)/libmarlhf.so
	@mkdir -p $(dir $@)
	$(CC) -std=c17 $(OPT) -Wall -Wextra -Werror -Iinclude -o $@ $< -L$(BUILD) -lmarlhf -Wl,-rpath,'$$ORIGIN/..'

$(BUILD)/marlhf: $(CLI_OBJ) $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cpp $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

$(BUILD)/tools/%: $(BUILD)/tools/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

# The GPU checks (tests/gpu/run.sh) are built with the CUDA backend but run only on a GPU.
ifeq ($(CUDA),1)
GPU_TEST_BIN := $(BUILD)/tests/gpu/test_cuda $(BUILD)/tests/gpu/test_collectives
endif

# The same checks against the CUDA backend's own source run on CPU threads
# (tests/emulated_cuda: a CPU runtime, cuBLASLt and WMMA; tests/cli/gpu_emulated.sh runs it).
# Each .cu file is compiled by the host C++ compiler after its launches
# `kernel<<<config>>>(args)` are rewritten to
# `emulation::launcher([=](auto... arguments) { kernel(arguments...); }, EMULATED_KERNEL_ADDRESS(kernel), config)(args)`
# (line for line, so diagnostics name the .cu file's lines), and so are the .cuh headers
# (copies under $(BUILD)/emulated/src, found first); the rest of the program is the plain
# build's objects. cuBLASLt's loader is replaced by tests/emulated_cuda/cublaslt.cpp, NCCL's
# by tests/emulated_cuda/nccl.cpp (collectives over dist/dist.h's MPI).
ifeq ($(CUDA),1)
EMULATED_CUDA_SRC := $(filter-out src/ops/cuda/cublaslt_library.cu src/ops/cuda/nccl_library.cu,$(CUDA_SRC))
EMULATED_CUDA_OBJ := $(EMULATED_CUDA_SRC:%.cu=$(BUILD)/emulated/%.o) $(BUILD)/emulated/tests/emulated_cuda/cublaslt.o \
                     $(BUILD)/emulated/tests/emulated_cuda/nccl.o
# -ffp-contract=off: g++ fuses a * b + c into one rounding wherever its inlining puts them
# side by side (C++'s default), so the emulated backend's numbers moved in the last bits
# with changes to this runtime's plumbing (measured: 20 SFT steps' final loss 4.148091 ->
# 4.148246 when the launch closure was restructured); without it they depend on the
# kernels' source alone, as the CPU backend's (ISO C: off) do.
EMULATED_CXXFLAGS := $(filter-out -std=c++17 -Isrc,$(CXXFLAGS)) -ffp-contract=off -std=c++20 -Werror -Wno-shadow -DMARLHF_CUDA \
                     -DMARLHF_CUDA_EMULATED -I$(BUILD)/emulated/src -Isrc -Itests/emulated_cuda/include
EMULATED_CUDA_HEADERS := $(patsubst %,$(BUILD)/emulated/%,$(wildcard src/ops/cuda/*.cuh))
EMULATED_LAUNCH_SED := s/([A-Za-z_][A-Za-z0-9_:]*(<[^;]*>)?)<<<(.*)>>>\(/emulation::launcher([=](auto... arguments) { \1(arguments...); }, EMULATED_KERNEL_ADDRESS(\1), \3)(/
GPU_TEST_BIN += $(BUILD)/tests/gpu/test_cuda_emulated $(BUILD)/tests/gpu/test_collectives_emulated $(BUILD)/marlhf_emulated
# The benchmarks tests/gpu/run.sh runs, over the emulated backend (tests/cli/gpu_bench_emulated.sh).
EMULATED_BENCH := train_step decode ops_breakdown
GPU_TEST_BIN += $(EMULATED_BENCH:%=$(BUILD)/bench/%_emulated)
endif

$(BUILD)/emulated/%.cuh: %.cuh Makefile
	@mkdir -p $(dir $@)
	@{ echo '#line 1 "$<"'; sed -E '$(EMULATED_LAUNCH_SED)' $<; } > $@

$(BUILD)/emulated/%.o: %.cu $(FLAGS_STAMP) $(EMULATED_CUDA_HEADERS) $(wildcard tests/emulated_cuda/*.h tests/emulated_cuda/include/*.h)
	@mkdir -p $(dir $@)
	@{ echo '#line 1 "$<"'; sed -E '$(EMULATED_LAUNCH_SED)' $<; } > $(BUILD)/emulated/$*.cu.cpp
	$(CXX) $(EMULATED_CXXFLAGS) -c $(BUILD)/emulated/$*.cu.cpp -o $@

$(BUILD)/emulated/%.o: %.cpp $(FLAGS_STAMP) $(EMULATED_CUDA_HEADERS) $(wildcard tests/emulated_cuda/*.h tests/emulated_cuda/include/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(EMULATED_CXXFLAGS) -c $< -o $@

$(BUILD)/tests/gpu/test_cuda_emulated: $(BUILD)/tests/gpu/test_cuda.o $(filter-out $(CUDA_SRC:%.cu=$(BUILD)/%.o),$(LIB_OBJ)) $(EMULATED_CUDA_OBJ)
	$(CXX) $(OPT) -pthread -o $@ $^ $(filter-out -lcudart_static,$(LDLIBS))

$(BUILD)/tests/gpu/test_collectives_emulated: $(BUILD)/tests/gpu/test_collectives.o $(filter-out $(CUDA_SRC:%.cu=$(BUILD)/%.o),$(LIB_OBJ)) $(EMULATED_CUDA_OBJ)
	$(CXX) $(OPT) -pthread -o $@ $^ $(filter-out -lcudart_static,$(LDLIBS))

# marlhf itself over the emulated backend: `--device cuda` runs on CPU threads
# (tests/gpu/run.sh's SFT and PPO runs without a GPU: MARLHF_GPU_TEST_DEVICE=emulated).
$(BUILD)/marlhf_emulated: $(CLI_OBJ) $(filter-out $(CUDA_SRC:%.cu=$(BUILD)/%.o),$(LIB_OBJ)) $(EMULATED_CUDA_OBJ)
	$(CXX) $(OPT) -pthread -o $@ $^ $(filter-out -lcudart_static,$(LDLIBS))

$(BUILD)/bench/%_emulated: $(BUILD)/bench/%.o $(filter-out $(CUDA_SRC:%.cu=$(BUILD)/%.o),$(LIB_OBJ)) $(EMULATED_CUDA_OBJ)
	$(CXX) $(OPT) -pthread -o $@ $^ $(filter-out -lcudart_static,$(LDLIBS))

# The bench programs too: tests/cli/bad_input.sh checks bench/train_step's options, and a
# bench program that no longer compiles fails the suite instead of the next measurement.
tests: $(BUILD)/marlhf $(TOOL_BIN) $(TEST_BIN) $(GPU_TEST_BIN) $(EXAMPLE_BIN) $(BENCH_BIN)

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(BUILD)/libmarlhf.a
	$(CC) $(OPT) -o $@ $^ $(LDLIBS)

# Coverage-guided fuzzing of the file readers (developers; needs clang and libomp-dev):
# `make fuzz` builds build-fuzz/fuzz/<target> from tests/fuzz/fuzz_reader.c, one per reader
# of tests/fuzz/readers.h, and seeds build-fuzz/corpus/<target>/ from the test fixtures.
FUZZ_TARGETS := safetensors gguf gguf_tokenizer tokenizer_json config_json chat_template jsonl json_schema regex gbnf \
                chat_request completion_request embeddings_request reward_request judge_response reward_answer \
                tool_answer
fuzz_safetensors    := -DFUZZ_READER=read_safetensors -DFUZZ_FILE='"x.safetensors"'
fuzz_gguf           := -DFUZZ_READER=read_gguf -DFUZZ_FILE='"x.gguf"'
fuzz_gguf_tokenizer := -DFUZZ_READER=read_tokenizer -DFUZZ_FILE='"x.gguf"'
fuzz_tokenizer_json := -DFUZZ_READER=read_tokenizer -DFUZZ_FILE='"tokenizer.json"' -DFUZZ_FOLDER
fuzz_config_json    := -DFUZZ_READER=read_config -DFUZZ_FILE='"config.json"'
fuzz_chat_template  := -DFUZZ_READER=read_chat_template -DFUZZ_FILE='"tokenizer_config.json"'
fuzz_jsonl          := -DFUZZ_READER=read_dataset -DFUZZ_FILE='"x.jsonl"'
fuzz_json_schema    := -DFUZZ_READER=read_json_schema -DFUZZ_FILE='"x.schema.json"'
fuzz_regex          := -DFUZZ_READER=read_regex -DFUZZ_FILE='"x.regex"'
fuzz_gbnf           := -DFUZZ_READER=read_gbnf -DFUZZ_FILE='"x.gbnf"'
fuzz_chat_request   := -DFUZZ_READER=read_chat_request -DFUZZ_FILE='"x.json"'
fuzz_completion_request := -DFUZZ_READER=read_completion_request -DFUZZ_FILE='"x.json"'
fuzz_embeddings_request := -DFUZZ_READER=read_embeddings_request -DFUZZ_FILE='"x.json"'
fuzz_reward_request := -DFUZZ_READER=read_reward_request -DFUZZ_FILE='"x.json"'
fuzz_judge_response := -DFUZZ_READER=read_judge_response -DFUZZ_FILE='"x.json"'
fuzz_reward_answer  := -DFUZZ_READER=read_reward_answer -DFUZZ_FILE='"x.json"'
fuzz_tool_answer    := -DFUZZ_READER=read_tool_answer -DFUZZ_FILE='"answer.txt"'

$(BUILD)/fuzz/%: tests/fuzz/fuzz_reader.c tests/fuzz/readers.h $(BUILD)/libmarlhf.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(fuzz_$*) -fsanitize=fuzzer,address,undefined -o $@ $< $(BUILD)/libmarlhf.a $(LDLIBS)

.PHONY: fuzz fuzz-targets
fuzz-targets: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/%)

fuzz:
	@$(MAKE) --no-print-directory FUZZ=1 fuzz-targets
	@tests/fuzz/seed_corpus.sh build-fuzz/corpus

# Debian packages (scripts/setup) and the SmolLM2 model the tests and demo use.
prerequisites:
	@scripts/setup
	@scripts/fetch-model

# The test command of the README. Runs every test binary; ends with "N passed, N failed".
test: prerequisites
	@$(MAKE) --no-print-directory tests SANITIZE=$(SANITIZE)
	@BUILD=$(BUILD) tests/run.sh

# The main job of the README: SFT -> RM -> MA-PPO on the Austen task, then runs/demo/report.html.
demo: prerequisites
	@$(MAKE) --no-print-directory all
	@scripts/demo

bench: $(BUILD)/marlhf $(BENCH_BIN)

setup:
	scripts/setup

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
