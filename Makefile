# libflame build. `make` builds lib/ and examples/; `make test` runs every test; `make run`
# runs the main job on the embedded default. CUDA objects are built when nvcc is found
# (override with CUDA=0 or CUDA=1).

VERSION := $(shell sed -n 's/^\#define FLAME_VERSION_STRING "\(.*\)"/\1/p' include/flame/flame.h)
MAJOR   := $(word 1,$(subst ., ,$(VERSION)))

PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DESTDIR    ?=

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
PYTHON  ?= python3

# -O2 everywhere, -O3 for the CPU kernels (loop vectorization); no -march: the library runs
# on any x86-64 and OpenBLAS picks its kernels at run time.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS  ?= -O2 -g
BASE_CFLAGS := -std=c11 $(WARN) -fPIC -fvisibility=hidden -D_DEFAULT_SOURCE -DFLAME_BUILDING \
               -Iinclude -Isrc $(shell pkg-config --cflags openblas 2>/dev/null || pkg-config --cflags cblas 2>/dev/null)
LDLIBS  := -lcjson -lopenblas -lhiredis -fopenmp -lpthread -lm

SRC := $(filter-out src/core/no_cuda.c,$(wildcard src/core/*.c src/model/*.c src/cpu/*.c src/engine/*.c src/api/*.c))
# ---- memory (issue 4): NUMA, pinned pool, shared-memory user cache; $(sort) drops duplicates
SRC += $(wildcard src/mem/*.c src/cache/*.c)
# ---- the batch-profile scheduler
SRC += $(wildcard src/sched/*.c)
SRC := $(sort $(SRC))
LDLIBS += -lnuma
# ---- end memory
OBJ := $(SRC:%.c=build/%.o)

ifeq ($(CUDA),1)
CU_SRC := $(wildcard cuda/*.cu)
CU_OBJ := $(CU_SRC:%.cu=build/%.o)
NVFLAGS := -O2 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -DFLAME_BUILDING -DFLAME_WITH_CUDA -Iinclude -Isrc \
           -DFL_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' \
           -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
           -gencode arch=compute_90,code=compute_90
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
EXAMPLES := examples/flame-score
TESTS    := $(patsubst tests/%.c,build/tests/%,$(wildcard tests/test_*.c))
# issue 3: kernel tests that call the CUDA launch wrappers (nvcc; CUDA=1 builds only)
TESTS    += $(if $(filter 1,$(CUDA)),$(patsubst tests/%.cu,build/tests/%,$(wildcard tests/test_*.cu)))
BENCHES  := $(if $(wildcard bench/beauty_bench.c),bench/beauty-bench)
BENCHES  += bench/cache-bench # issue 4
BENCHES  += bench/e2e-bench # issue 3: end-to-end flame_score_batch (any device)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/embedding-bench) # issue 3: the TBE kernel vs copy bandwidth (nvcc)
BENCHES  += $(if $(filter 1,$(CUDA)),bench/attention-bench) # SUMI attention kernels (nvcc)
BENCHES  += bench/cpu-embedding-bench # int8 tables: the CPU embedding bag, float32 vs int8 rows

.PHONY: all lib examples test test-c test-python test-gpu bench run install uninstall clean deps test-sanitize san-run

all: lib examples

lib: $(SHLIB) lib/libflame.so.$(MAJOR) lib/libflame.so $(STLIB)

build/%.o: %.c $(wildcard include/flame/*.h) $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(if $(findstring src/cpu/,$<),-O3) $(if $(findstring src/cpu/dot.c,$<),-fopenmp) -c $< -o $@

build/cuda/%.o: cuda/%.cu $(wildcard cuda/*.cuh) $(wildcard src/*/*.h) include/flame/flame.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# the Hopper attention kernel (wgmma) exists only as sm_90a machine code; it is launched on compute
# capability 9.0 alone
build/cuda/attention_wgmma.o: NVFLAGS := $(filter-out -gencode arch=%,$(NVFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v

build/cuda/no_cuda.o: src/core/no_cuda.c src/core/device.h src/engine/cuda_backend.h
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

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
PROG_CFLAGS  := -std=c11 $(WARN) -D_DEFAULT_SOURCE -Iinclude -Isrc $(CFLAGS)

examples: $(EXAMPLES)
examples/flame-score: $(wildcard examples/flame_score/*.c examples/flame_score/*.h) $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -Iexamples/flame_score -o $@ $(filter %.c,$^) $(PROG_LDFLAGS) -lcjson

bench: $(BENCHES)
bench/beauty-bench: bench/beauty_bench.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS)
# issue 4: item cache hit ratio vs LRU, hit-path throughput, flame_score through the cache
bench/cache-bench: bench/cache_bench.c $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ $< $(PROG_LDFLAGS)
# issue 3: flame_score_batch end to end on any device (bench/run_gpu_bench.py drives it)
bench/e2e-bench: bench/e2e_bench.c bench/e2e_clients.c bench/e2e_bench.h $(SHLIB) lib/libflame.so
	$(CC) $(PROG_CFLAGS) -o $@ bench/e2e_bench.c bench/e2e_clients.c $(PROG_LDFLAGS) -lcjson
# issue 3: calls the internal kernel wrapper, so it links the static library and the CUDA libs
bench/embedding-bench: bench/embedding_bench.cu cuda/kernels.cuh cuda/common.cuh $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -gencode arch=compute_80,code=sm_80 \
	    -gencode arch=compute_90,code=sm_90 -c $< -o build/bench/embedding_bench.o
	$(CC) -o $@ build/bench/embedding_bench.o $(STLIB) $(LDLIBS)

# SUMI attention: calls the internal kernel wrappers, so it links the static library and the CUDA libs
bench/attention-bench: bench/attention_bench.cu cuda/kernels.cuh cuda/attention_wgmma.cuh cuda/common.cuh $(STLIB)
	@mkdir -p build/bench
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -gencode arch=compute_80,code=sm_80 \
	    -gencode arch=compute_90,code=sm_90 -c $< -o build/bench/attention_bench.o
	$(CC) -o $@ build/bench/attention_bench.o $(STLIB) $(LDLIBS)

# int8 tables: calls the internal CPU kernel, so it links the static library
bench/cpu-embedding-bench: bench/cpu_embedding_bench.c src/cpu/kernels.h $(STLIB)
	$(CC) $(PROG_CFLAGS) -o $@ $< $(STLIB) $(LDLIBS)

build/tests/%: tests/%.c $(wildcard tests/*.h) $(SHLIB) lib/libflame.so $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(PROG_CFLAGS) -Wl,-rpath,'$(CURDIR)/lib' -o $@ $< $(STLIB) -lcmocka $(LDLIBS)

build/tests/%: tests/%.cu $(wildcard tests/*.h) $(wildcard cuda/*.cuh) $(STLIB)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc -Icuda -Itests -gencode arch=compute_80,code=sm_80 \
	    -gencode arch=compute_90,code=sm_90 -c $< -o $@.o
	$(CC) -o $@ $@.o $(STLIB) -lcmocka $(LDLIBS)

# ---- set-up: installs what a fresh Debian machine lacks (root or sudo), then nothing else
deps:
	@./scripts/install-deps

# ---- the main job: the embedded default model on synthetic requests
run: deps all
	./examples/flame-score

# ---- tests
SHARED ?= $(or $(FLAME_SHARED_DIR),../shared)
BEAUTY_FLAME := build/beauty.flame.safetensors

$(BEAUTY_FLAME): python/flame/convert.py
	@mkdir -p build
	@if [ -f "$(SHARED)/data/amazon-beauty/iclrec-beauty.safetensors" ]; then \
	    PYTHONPATH=python $(PYTHON) -m flame.convert iclrec "$(SHARED)/data/amazon-beauty/iclrec-beauty.safetensors" $@; \
	else echo "note: $(SHARED)/data/amazon-beauty absent: the Beauty tests will say they are skipped"; fi

test: deps all $(TESTS) $(BEAUTY_FLAME)
	@./tests/run-tests.sh $(TESTS)

test-gpu: all $(TESTS)
	FLAME_REQUIRE_GPU=1 ./tests/run-tests.sh $(TESTS)

# ---- sanitizers (issue 4): the library (CPU-only) and every C test suite built with
# -fsanitize=thread into build-tsan/ and -fsanitize=address,undefined into build-asan/, then
# run; any report fails the run. OpenBLAS runs single-threaded there (its threads are not
# instrumented).
SAN_SRC   := $(SRC) src/core/no_cuda.c
SAN_DIR   ?= build-san
SAN       ?= address,undefined
SAN_FLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all -g
SAN_CFLAGS := $(filter-out -DFLAME_WITH_CUDA,$(BASE_CFLAGS))
SAN_LIBS  := -lcjson -lopenblas -lhiredis -lnuma -lpthread -lm
SAN_TESTS := $(patsubst tests/%.c,$(SAN_DIR)/tests/%,$(wildcard tests/test_*.c))

test-sanitize: $(BEAUTY_FLAME)
	$(MAKE) --no-print-directory san-run SAN=thread SAN_DIR=build-tsan
	$(MAKE) --no-print-directory san-run SAN=address,undefined SAN_DIR=build-asan

$(SAN_DIR)/obj/%.o: %.c $(wildcard include/flame/*.h) $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(SAN_CFLAGS) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

$(SAN_DIR)/libflame.a: $(SAN_SRC:%.c=$(SAN_DIR)/obj/%.o)
	rm -f $@ && ar rcs $@ $^

$(SAN_DIR)/tests/%: tests/%.c $(wildcard tests/*.h) $(SAN_DIR)/libflame.a
	@mkdir -p $(dir $@)
	$(CC) $(PROG_CFLAGS) $(SAN_FLAGS) -o $@ $< $(SAN_DIR)/libflame.a -lcmocka $(SAN_LIBS)

san-run: $(SAN_TESTS)
	OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
	    FLAME_C_ONLY=1 ./tests/run-tests.sh $(SAN_TESTS)

install: lib
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/flame $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 0644 include/flame/flame.h $(DESTDIR)$(INCLUDEDIR)/flame/flame.h
	install -m 0755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libflame.so
	install -m 0644 $(STLIB) $(DESTDIR)$(LIBDIR)/
	sed $(PC_SED) pkgconfig/flame.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/flame.pc

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/flame/flame.h $(DESTDIR)$(LIBDIR)/libflame.so* \
	      $(DESTDIR)$(LIBDIR)/libflame.a $(DESTDIR)$(LIBDIR)/pkgconfig/flame.pc
	-rmdir $(DESTDIR)$(INCLUDEDIR)/flame 2>/dev/null

clean:
	rm -rf build build-tsan build-asan lib/libflame* $(EXAMPLES) $(BENCHES)
