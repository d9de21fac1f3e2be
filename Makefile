# libflame build. `make` builds lib/ and examples/ (no network, no Python); `make run` installs
# what the build lacks, then runs the main job on the embedded default; `make test` installs what
# the build and tests lack, then runs every test. CUDA objects are built when nvcc is found
# (override with CUDA=0 or CUDA=1); the Redis feature source (hiredis) and NUMA placement
# (libnuma) are built unless WITH_REDIS=0 / WITH_NUMA=0, which leave stand-ins returning
# FLAME_ERR_UNSUPPORTED (tests/check-optional-modules.sh builds and tests that). Python tooling runs from the checkout's virtual environment
# (VENV, default .venv, made by `make venv` from PYTHON with requirements.txt's pins).

VERSION := $(shell sed -n 's/^\#define FLAME_VERSION_STRING "\(.*\)"/\1/p' include/flame/flame.h)
MAJOR   := $(word 1,$(subst ., ,$(VERSION)))

# the public headers: flame.h and one per concern, all installed
HEADERS := $(wildcard include/flame/*.h)

PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DESTDIR    ?=

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
PYTHON  ?= python3
VENV    ?= .venv
VENV_PY := $(abspath $(VENV))/bin/python

# -O2 everywhere, -O3 for the CPU kernels (loop vectorization); no -march: the library runs
# on any x86-64 and OpenBLAS picks its kernels at run time.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS  ?= -O2 -g
BASE_CFLAGS := -std=c11 $(WARN) -fPIC -fvisibility=hidden -D_DEFAULT_SOURCE -DFLAME_BUILDING \
               -Iinclude -Isrc $(shell pkg-config --cflags openblas 2>/dev/null || pkg-config --cflags cblas 2>/dev/null)
LDLIBS  := -lcjson -lopenblas -lpthread -lm

# ---- optional modules: each is its library's code, or (=0) a stand-in file whose entry points
# return FLAME_ERR_UNSUPPORTED; tests learn which through FLAME_WITH_REDIS / FLAME_WITH_NUMA
WITH_REDIS ?= 1
WITH_NUMA  ?= 1
OPTIONAL_OFF := $(if $(filter 1,$(WITH_REDIS)),src/features/no_redis.c,src/features/redis.c) \
                $(if $(filter 1,$(WITH_NUMA)),src/mem/no_numa.c,src/mem/numa.c)
OPTIONAL_LIBS := $(if $(filter 1,$(WITH_REDIS)),-lhiredis) $(if $(filter 1,$(WITH_NUMA)),-lnuma)
OPTIONAL_DEFS := -DFLAME_WITH_REDIS=$(if $(filter 1,$(WITH_REDIS)),1,0) -DFLAME_WITH_NUMA=$(if $(filter 1,$(WITH_NUMA)),1,0)
LDLIBS += $(OPTIONAL_LIBS)

SRC := $(filter-out src/engine/no_cuda.c,$(wildcard src/core/*.c src/model/*.c src/cpu/*.c src/engine/*.c src/api/*.c))
# ---- memory: NUMA, pinned pool, shared-memory user cache; $(sort) drops duplicates
SRC += $(wildcard src/mem/*.c src/features/*.c src/icache/*.c src/ucache/*.c src/kvcache/*.c)
# ---- the batch-profile scheduler
SRC += $(wildcard src/sched/*.c src/metrics/*.c)
# ---- the kernels as a public API (flame/kernels.h; their GPU side is cuda/kernels_api.cu)
SRC += $(wildcard src/kernels/*.c)
SRC := $(sort $(filter-out $(OPTIONAL_OFF),$(SRC)))
# ---- end memory
OBJ := $(SRC:%.c=build/%.o)

# GPU architectures of every CUDA object (the library also embeds compute_90 PTX for newer GPUs;
# the Hopper attention kernel is sm_90a only, its own rule below)
CUDA_ARCHS := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90

ifeq ($(CUDA),1)
CU_SRC := $(wildcard cuda/*.cu)
CU_OBJ := $(CU_SRC:%.cu=build/%.o)
NVFLAGS := -O2 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -DFLAME_BUILDING -DFLAME_WITH_CUDA -Iinclude -Isrc \
           -DFL_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' \
           $(CUDA_ARCHS) -gencode arch=compute_90,code=compute_90
BASE_CFLAGS += -DFLAME_WITH_CUDA
# cuBLASLt is dlopen'ed by cuda/cublaslt_loader.cu when a GPU engine is made (not linked)
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
CU_SRC :=
CU_OBJ := build/cuda/no_cuda.o
endif

SONAME   := libflame.so.$(MAJOR)
SHLIB    := lib/libflame.so.$(VERSION)
STLIB    := lib/libflame.a
EXAMPLES := examples/flame-score examples/flame-server examples/flame-bench
# the public embedding bag pooling into a device buffer (CUDA builds)
EXAMPLES += $(if $(filter 1,$(CUDA)),examples/tbe-gpu)
# (test_numa is libnuma's: without it, test_optional_modules checks the stand-in)
C_TESTS  := $(filter-out $(if $(filter 1,$(WITH_NUMA)),,tests/test_numa.c),$(wildcard tests/test_*.c))
TESTS    := $(patsubst tests/%.c,build/tests/%,$(C_TESTS))
# kernel tests that call the CUDA launch wrappers (nvcc; CUDA=1 builds only)
TESTS    += $(if $(filter 1,$(CUDA)),$(patsubst tests/%.cu,build/tests/%,$(wildcard tests/test_*.cu)))
BENCHES  := $(if $(wildcard bench/beauty_bench.c),bench/beauty-bench)
BENCHES  += bench/cache-bench
BENCHES  += bench/slot-pool-bench # executor hand-off: tail latency of concurrent callers
BENCHES  += bench/e2e-bench # end-to-end flame_score_batch (any device)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/embedding-bench) # the TBE kernel vs copy bandwidth (nvcc)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/attention-bench) # SUMI attention kernels (nvcc)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/activation-bench) # the erf-GELU pass vs a copy of the same bytes (nvcc)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/kernels-api-bench) # the public kernels vs the internal ones (nvcc)
BENCHES  += bench/cpu-embedding-bench # int8 tables: the CPU embedding bag, float32 vs int8 rows
BENCHES  += bench/kernels-api-cpu-bench # the public kernels on the CPU vs the engine's kernels called directly
BENCHES  += bench/tbe-pack-bench # host ids of a GPU embedding bag: validation and staging vs memcpy
BENCHES  += bench/metrics-bench # the cost of a Prometheus scrape
BENCHES  += bench/kv-cache-bench # the user-history KV cache vs the cache off (any device)

.PHONY: all lib examples test test-build test-gpu bench run install uninstall clean deps deps-test abi-dump venv venv-bench \
        test-sanitize san-run dist distcheck wheel

all: lib examples

lib: $(SHLIB) lib/libflame.so.$(MAJOR) lib/libflame.so $(STLIB)

# Each C object depends on the headers it includes, as the compiler lists them (-MMD) into a
# .d file beside it; -MP keeps a removed header from breaking the build.
DEPFLAGS := -MMD -MP

# The settings the objects in build/ are compiled with. A change rewrites the stamp every object
# depends on, so switching CUDA=0 and 1 (or WITH_REDIS, WITH_NUMA, CFLAGS, CUDA_ARCHS) rebuilds
# them; before, a switch linked objects compiled for the other setting (duplicate or missing
# symbols) unless the build was cleaned first.
BUILD_SETTINGS := CUDA=$(CUDA) WITH_REDIS=$(WITH_REDIS) WITH_NUMA=$(WITH_NUMA) CFLAGS=$(CFLAGS) CUDA_ARCHS=$(CUDA_ARCHS)
SETTINGS_STAMP := build/settings
SETTINGS_CHECK := $(shell mkdir -p build && { [ "$$(cat $(SETTINGS_STAMP) 2>/dev/null)" = '$(BUILD_SETTINGS)' ] || \
                    printf '%s\n' '$(BUILD_SETTINGS)' >$(SETTINGS_STAMP); })

build/%.o: %.c $(SETTINGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) $(if $(findstring src/cpu/,$<)$(findstring src/kernels/tbe_cpu.c,$<)$(findstring src/kernels/tbe_pack.c,$<),-O3) -c $< -o $@

build/cuda/%.o: cuda/%.cu $(wildcard cuda/*.cuh) $(wildcard src/*/*.h) $(HEADERS) $(SETTINGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# the Hopper attention kernel (wgmma) exists only as sm_90a machine code; it is launched on compute
# capability 9.0 alone. ptxas's report of it is kept (build/cuda/attention_wgmma.ptxas) for
# tests/check-kernel-resources.sh: no spills, no serialised wgmma.
build/cuda/attention_wgmma.o: NVFLAGS := $(filter-out -gencode arch=%,$(NVFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v
build/cuda/attention_wgmma.o: cuda/attention_wgmma.cu $(wildcard cuda/*.cuh) $(wildcard src/*/*.h) $(HEADERS) $(SETTINGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@ 2>$(@:.o=.ptxas) || { cat $(@:.o=.ptxas) >&2; exit 1; }
	@grep -v -e '^ptxas info' -e 'bytes stack frame' $(@:.o=.ptxas) >&2 || true # warnings, if any

build/cuda/no_cuda.o: src/engine/no_cuda.c $(SETTINGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(SHLIB): $(OBJ) $(CU_OBJ) src/libflame.map
	@mkdir -p lib
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=src/libflame.map -Wl,--no-undefined \
	    -o $@ $(OBJ) $(CU_OBJ) $(LDLIBS)

lib/libflame.so.$(MAJOR): $(SHLIB)
	ln -sf $(notdir $(SHLIB)) $@
lib/libflame.so: lib/libflame.so.$(MAJOR)
	ln -sf $(SONAME) $@

$(STLIB): $(OBJ) $(CU_OBJ)
	@mkdir -p lib
	rm -f $@ && ar rcs $@ $^

# flame.pc is generated at install time so it names the PREFIX/LIBDIR/INCLUDEDIR installed to.
PC_SED := -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|; s|@VERSION@|$(VERSION)|' \
          -e 's|@PRIVATE_LIBS@|$(LDLIBS)|'

# Programs link the shared library found next to them (rpath $ORIGIN/../lib).
PROG_LDFLAGS := -Llib -Wl,-rpath,'$$ORIGIN/../lib' -lflame -lm -lpthread
PROG_CFLAGS  := -std=c11 $(WARN) -D_DEFAULT_SOURCE -Iinclude -Isrc -Iexamples/common $(OPTIONAL_DEFS) $(CFLAGS)

examples: $(EXAMPLES)
examples/flame-score: $(wildcard examples/flame_score/*.c examples/flame_score/*.h) $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -Iexamples/flame_score -o $@ $(filter %.c,$^) $(PROG_LDFLAGS) -lcjson

examples/tbe-gpu: examples/tbe_gpu/tbe_gpu.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -I$(CUDA_HOME)/include -o $@ $< $(PROG_LDFLAGS) -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread
# the HTTP example: /metrics and /score on libmicrohttpd (scripts/install-deps installs it)
examples/flame-server: examples/flame_server/main.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ examples/flame_server/main.c $(PROG_LDFLAGS) -lmicrohttpd -lcjson
# the load generator: open-loop arrivals through a scheduler or direct calls
examples/flame-bench: $(wildcard examples/flame_bench/*.c examples/flame_bench/*.h) $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $(filter %.c,$^) $(PROG_LDFLAGS)

bench: $(BENCHES)
bench/beauty-bench: bench/beauty_bench.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS)
# item cache hit ratio vs LRU, hit-path throughput, flame_score through the cache
bench/cache-bench: bench/cache_bench.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS)
# the executor slot pool against a mutex and one condition variable (internal: static library)
bench/slot-pool-bench: bench/slot_pool_bench.c src/core/slot_pool.h $(STLIB)
	$(CC) $(PROG_CFLAGS) -o $@ $< $(STLIB) $(LDLIBS)
# flame_score_batch end to end on any device (bench/run_gpu_bench.py drives it)
bench/e2e-bench: bench/e2e_bench.c bench/e2e_clients.c bench/e2e_bench.h bench/stage_p50.h $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ bench/e2e_bench.c bench/e2e_clients.c $(PROG_LDFLAGS) -lcjson
# calls the internal kernel wrapper, so it links the static library and the CUDA libs
bench/embedding-bench: bench/embedding_bench.cu cuda/kernels.cuh cuda/common.cuh $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Iexamples/common $(CUDA_ARCHS) -c $< -o build/bench/embedding_bench.o
	$(CC) -o $@ build/bench/embedding_bench.o $(STLIB) $(LDLIBS)

# SUMI attention: calls the internal kernel wrappers, so it links the static library and the CUDA libs
bench/attention-bench: bench/attention_bench.cu cuda/kernels.cuh cuda/attention_tc.cuh cuda/attention_wgmma.cuh cuda/common.cuh $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Iexamples/common $(CUDA_ARCHS) -c $< -o build/bench/attention_bench.o
	$(CC) -o $@ build/bench/attention_bench.o $(STLIB) $(LDLIBS)

# the erf-GELU pass: calls the internal wrapper, so it links the static library and the CUDA libs
bench/activation-bench: bench/activation_bench.cu cuda/kernels.cuh cuda/common.cuh $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Iexamples/common $(CUDA_ARCHS) -c $< -o build/bench/activation_bench.o
	$(CC) -o $@ build/bench/activation_bench.o $(STLIB) $(LDLIBS)

# the public kernels (flame/kernels.h) against the internal kernels they wrap: links the static library
bench/kernels-api-bench: bench/kernels_api_bench.cu cuda/kernels.cuh cuda/common.cuh include/flame/kernels.h $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Iexamples/common $(CUDA_ARCHS) -c $< -o build/bench/kernels_api_bench.o
	$(CC) -o $@ build/bench/kernels_api_bench.o $(STLIB) $(LDLIBS)

# the public CPU kernels against the internal ones: links the static library
bench/kernels-api-cpu-bench: bench/kernels_api_cpu_bench.c src/cpu/kernels.h include/flame/kernels.h $(STLIB)
	$(CC) $(PROG_CFLAGS) -o $@ $< $(STLIB) $(LDLIBS)
bench/tbe-pack-bench: bench/tbe_pack_bench.c src/kernels/tbe_pack.h $(STLIB)
	$(CC) $(PROG_CFLAGS) -o $@ $< $(STLIB) $(LDLIBS)
bench/metrics-bench: bench/metrics_bench.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS)
bench/kv-cache-bench: bench/kv_cache_bench.c bench/stage_p50.h $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS) -lcjson

# int8 tables: calls the internal CPU kernel, so it links the static library
bench/cpu-embedding-bench: bench/cpu_embedding_bench.c src/cpu/kernels.h $(STLIB)
	$(CC) $(PROG_CFLAGS) -o $@ $< $(STLIB) $(LDLIBS)

build/tests/%: tests/%.c $(wildcard tests/*.h) $(SHLIB) lib/libflame.so $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(PROG_CFLAGS) -Wl,-rpath,'$(CURDIR)/lib' -o $@ $< $(STLIB) -lcmocka $(LDLIBS)

build/tests/%: tests/%.cu $(wildcard tests/*.h) $(wildcard cuda/*.cuh) $(STLIB)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Itests $(CUDA_ARCHS) -c $< -o $@.o
	$(CC) -o $@ $@.o $(STLIB) -lcmocka $(LDLIBS)

# ---- set-up: installs what a fresh Debian/Ubuntu machine lacks (apt; root or sudo), nothing
# when all is there. deps: the build; deps-test: the build, the tests and the tooling's venv.
deps:
	@./scripts/install-deps

deps-test:
	@./scripts/install-deps --tests
	@$(MAKE) --no-print-directory venv

# The Python tooling's virtual environment: remade when requirements.txt changes, else left
# alone (no network). The package itself is not installed there: the tooling runs it from
# python/ (PYTHONPATH), as a checkout's user does.
VENV_PKGS       := numpy safetensors pytest setuptools prometheus_client
VENV_BENCH_PKGS := onnx onnxruntime
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt scripts/make-venv
	@./scripts/make-venv $(PYTHON) $(VENV) $(VENV_PKGS)
	@touch $@
# the benchmark drivers' peers (bench/run_cpu_bench.py), same pins
venv-bench: venv
	@./scripts/make-venv $(PYTHON) $(VENV) $(VENV_BENCH_PKGS)

# ---- the main job: the embedded default model on synthetic requests (no Python). The build
# runs after deps has installed what it needs, also under make -j.
run: deps
	@$(MAKE) --no-print-directory all
	./examples/flame-score

# ---- tests
SHARED ?= $(or $(FLAME_SHARED_DIR),../shared)
BEAUTY_FLAME := build/beauty.flame.safetensors

$(BEAUTY_FLAME): python/flame/tools/convert.py | $(VENV)/.installed
	@mkdir -p build
	@if [ -f "$(SHARED)/data/amazon-beauty/iclrec-beauty.safetensors" ]; then \
	    PYTHONPATH=python $(VENV_PY) -m flame.tools.convert iclrec "$(SHARED)/data/amazon-beauty/iclrec-beauty.safetensors" $@; \
	else echo "note: $(SHARED)/data/amazon-beauty absent: the Beauty tests will say they are skipped"; fi

test: deps-test
	@$(MAKE) --no-print-directory test-build
	@PYTHON=$(VENV_PY) ./tests/run-tests.sh $(TESTS)

test-build: all $(TESTS) $(BEAUTY_FLAME)

# The ABI baseline of this release (tests/check-abi.sh compares every build with it): written
# once when a release's ABI is frozen, never to make a test pass.
abi-dump: lib
	abidw --headers-dir include/flame --no-show-locs --no-corpus-path --no-comp-dir-path --drop-private-types $(SHLIB) \
	    > abi/libflame-$(basename $(VERSION)).abi

# (a GPU machine may have no network: pytest runs from $(VENV) where it exists, else python3)
test-gpu: all $(TESTS)
	FLAME_REQUIRE_GPU=1 ./tests/run-tests.sh $(TESTS)

# ---- sanitizers: the library (CPU-only) and every C test suite built with
# -fsanitize=thread into build-tsan/ and -fsanitize=address,undefined into build-asan/, then
# run; any report fails the run. OpenBLAS runs single-threaded there (its threads are not
# instrumented).
SAN_SRC   := $(SRC) src/engine/no_cuda.c
SAN_DIR   ?= build-san
SAN       ?= address,undefined
SAN_FLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all -g
SAN_CFLAGS := $(filter-out -DFLAME_WITH_CUDA,$(BASE_CFLAGS))
SAN_LIBS  := -lcjson -lopenblas $(OPTIONAL_LIBS) -lpthread -lm
SAN_TESTS := $(patsubst tests/%.c,$(SAN_DIR)/tests/%,$(C_TESTS))

test-sanitize: $(BEAUTY_FLAME)
	$(MAKE) --no-print-directory san-run SAN=thread SAN_DIR=build-tsan
	$(MAKE) --no-print-directory san-run SAN=address,undefined SAN_DIR=build-asan

$(SAN_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(SAN_CFLAGS) $(CFLAGS) $(SAN_FLAGS) $(DEPFLAGS) -c $< -o $@

$(SAN_DIR)/libflame.a: $(SAN_SRC:%.c=$(SAN_DIR)/obj/%.o)
	rm -f $@ && ar rcs $@ $^

$(SAN_DIR)/tests/%: tests/%.c $(wildcard tests/*.h) $(SAN_DIR)/libflame.a
	@mkdir -p $(dir $@)
	$(CC) $(PROG_CFLAGS) $(SAN_FLAGS) -o $@ $< $(SAN_DIR)/libflame.a -lcmocka $(SAN_LIBS)

san-run: $(SAN_TESTS)
	OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
	    FLAME_C_ONLY=1 ./tests/run-tests.sh $(SAN_TESTS)

# The CMake package (find_package(flame CONFIG)) goes to LIBDIR/cmake/flame and names the
# library and header directories relative to itself, so a staged or moved tree still works.
CMAKEDIR := $(LIBDIR)/cmake/flame
CMAKE_SED = -e 's|@VERSION@|$(VERSION)|g; s|@MAJOR@|$(MAJOR)|g; s|@SONAME@|$(SONAME)|g; s|@SHLIB_NAME@|$(notdir $(SHLIB))|g' \
            -e "s|@REL_LIBDIR@|$$(realpath -m --relative-to=$(CMAKEDIR) $(LIBDIR))|g" \
            -e "s|@REL_INCLUDEDIR@|$$(realpath -m --relative-to=$(CMAKEDIR) $(INCLUDEDIR))|g"

install: lib
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/flame $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(CMAKEDIR)
	install -m 0644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/flame/
	install -m 0755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libflame.so
	install -m 0644 $(STLIB) $(DESTDIR)$(LIBDIR)/
	sed $(PC_SED) pkgconfig/flame.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/flame.pc
	sed $(CMAKE_SED) cmake/flameConfig.cmake.in > $(DESTDIR)$(CMAKEDIR)/flameConfig.cmake
	sed $(CMAKE_SED) cmake/flameConfigVersion.cmake.in > $(DESTDIR)$(CMAKEDIR)/flameConfigVersion.cmake

uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/flame/,$(notdir $(HEADERS))) $(DESTDIR)$(LIBDIR)/libflame.so* \
	      $(DESTDIR)$(LIBDIR)/libflame.a $(DESTDIR)$(LIBDIR)/pkgconfig/flame.pc \
	      $(DESTDIR)$(CMAKEDIR)/flameConfig.cmake $(DESTDIR)$(CMAKEDIR)/flameConfigVersion.cmake
	-rmdir $(DESTDIR)$(INCLUDEDIR)/flame $(DESTDIR)$(CMAKEDIR) 2>/dev/null

# ---- source tarball: the committed tree at HEAD (git archive), which builds and tests like a
# checkout; distcheck builds an extracted copy and runs its main job.
DIST := build/libflame-$(VERSION).tar.gz
dist:
	@mkdir -p build
	git archive --format=tar.gz --prefix=libflame-$(VERSION)/ -o $(DIST) HEAD
	@echo "$(DIST)"

distcheck: dist
	./tests/check-dist.sh $(DIST)

# ---- a wheel of the Python package with this build's library inside it (flame/$(SONAME)),
# for a machine without libflame installed; `pip install ./python` makes one without it.
WHEEL_DIR := build/wheel
# WHEEL_PY: another Python with pip and setuptools (the tests pass theirs; a GPU machine has no
# network to make the venv)
wheel: lib $(if $(WHEEL_PY),,| $(VENV)/.installed)
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	cp -r python $(WHEEL_DIR)/src
	rm -rf $(WHEEL_DIR)/src/build $(WHEEL_DIR)/src/*.egg-info
	cp $(SHLIB) $(WHEEL_DIR)/src/flame/$(SONAME)
	$(or $(WHEEL_PY),$(VENV_PY)) -m pip wheel -q --no-deps --no-build-isolation --no-index -w $(WHEEL_DIR) \
	    --config-settings=--build-option=--plat-name=linux_$(shell uname -m) $(WHEEL_DIR)/src
	@ls $(WHEEL_DIR)/*.whl

clean:
	rm -rf build build-tsan build-asan lib/libflame* $(EXAMPLES) $(BENCHES)

# ---- fuzzing (docs/security.md "Fuzzing"): one libFuzzer harness per parser in tests/fuzz/,
# built with clang, ASan and UBSan into build-fuzz/ and run FUZZ_SECONDS each from the seed
# corpus in tests/fuzz/corpus/<target>/ (new inputs go to build-fuzz/corpus/<target>/).
# Any crash, leak, timeout or broken invariant fails the target and leaves its input in
# build-fuzz/artifacts/<target>/. clang and its fuzzer runtime are installed only here.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_DIR     := build-fuzz
FUZZ_FLAGS   := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
FUZZ_CFLAGS  := $(filter-out -Werror -DFLAME_WITH_CUDA,$(BASE_CFLAGS))
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(filter-out $(if $(filter 1,$(WITH_REDIS)),,tests/fuzz/fuzz_redis.c),$(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_OBJ     := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(sort $(SRC) src/engine/no_cuda.c))

.PHONY: fuzz fuzz-build fuzz-deps
fuzz: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts/$$t; \
	    echo "fuzz $$t: $(FUZZ_SECONDS) s"; \
	    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    OPENBLAS_NUM_THREADS=1 $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=2048 \
	        -max_len=65536 -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ \
	        $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t 2>$(FUZZ_DIR)/fuzz_$$t.log \
	        || { tail -n 60 $(FUZZ_DIR)/fuzz_$$t.log; echo "fuzz $$t FAILED (log: $(FUZZ_DIR)/fuzz_$$t.log)"; exit 1; }; \
	    grep -E '^stat::number_of_executed_units|^stat::new_units_added' $(FUZZ_DIR)/fuzz_$$t.log | tr '\n' ' '; echo; \
	done

fuzz-build: fuzz-deps $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)

# clang 14 (Debian 12) ships -fsanitize=fuzzer in libclang-rt-14-dev (package libclang-rt-dev)
fuzz-deps:
	@printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' | \
	    $(FUZZ_CC) -fsanitize=fuzzer,address -x c - -o /dev/null 2>/dev/null || \
	    { echo "installing clang and its fuzzer runtime (apt-get)"; \
	      SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO apt-get update -qq && \
	      $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null; }

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_FLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/libflame.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_DIR)/libflame.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Werror -D_GNU_SOURCE $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_DIR)/libflame.a \
	    -lcjson -lopenblas $(OPTIONAL_LIBS) -lpthread -lm

# the header dependencies the compiler wrote (see DEPFLAGS)
-include $(wildcard $(OBJ:.o=.d) build/cuda/no_cuda.d $(SAN_DIR)/obj/src/*/*.d $(FUZZ_DIR)/obj/src/*/*.d)
