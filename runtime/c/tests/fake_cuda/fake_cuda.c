/* fake_cuda.c: a stand-in libcuda for testing the engine's CUDA executor (src/cuda.c) on
 * machines without a GPU.
 *
 * It answers the driver API calls cuda.c makes, with host memory for device memory, and runs a
 * launched kernel by calling the kernel of the same name in a cuda-emulated kernel library
 * (FAKE_CUDA_KERNELS: the ELF of a `cuda-emulated` artifact, the same kernel bodies compiled for
 * this CPU, block by block: codegen/targets/cuda/module.py). So everything the executor does
 * (probing, module loading and its cubin-to-PTX fallback, weights, buffers, kernel parameters,
 * launches, computed symbols, index errors, copies back) runs for real, and the outputs are
 * checked against the float64 reference by the tests (tests/runtime/test_cuda_executor.py).
 *
 * Environment: FAKE_CUDA_KERNELS (required for launches), FAKE_CUDA_SM (compute capability as
 * digits, default 80), FAKE_CUDA_INIT (a cuInit result to return, default 0), FAKE_CUDA_COUNT
 * (devices, default 1), FAKE_CUDA_CUBIN_OK (1: accept a cubin image; default: refuse it with
 * CUDA_ERROR_NO_BINARY_FOR_GPU, as a driver older than the cubin's toolkit would, so the PTX is
 * loaded). A launch whose parameters disagree with what the PTX declares, or whose symbol values
 * disagree with the device push constants, fails with CUDA_ERROR_INVALID_VALUE.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlpack_abi.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, NOT_FOUND = 500, NO_BINARY = 209, INVALID_IMAGE = 200 };

#define MAX_KERNELS 4096
typedef struct { char name[256]; int params; int index; } entry;
static entry entries[MAX_KERNELS];
static int entry_count;
static const mlpack_kernel_table *table;
static int launches;

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

int fake_cuda_launches(void) { return launches; }

CUresult cuInit(unsigned flags) { (void)flags; return env_int("FAKE_CUDA_INIT", 0); }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_COUNT", 1); return OK; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  int sm = env_int("FAKE_CUDA_SM", 80);
  if (attr == 75) *v = sm / 10;
  else if (attr == 76) *v = sm % 10;
  else return INVALID_VALUE;
  return OK;
}
static int ctx_token;
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &ctx_token; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
CUresult cuCtxPushCurrent_v2(void *ctx) { return ctx == &ctx_token ? OK : INVALID_VALUE; }
CUresult cuCtxPopCurrent_v2(void **ctx) { *ctx = &ctx_token; return OK; }

/* PTX entries: ".visible .entry NAME(" followed by ".param" lines up to ")" */
static int parse_ptx(const char *ptx) {
  entry_count = 0;
  for (const char *p = strstr(ptx, ".entry "); p; p = strstr(p + 1, ".entry ")) {
    if (entry_count == MAX_KERNELS) return -1;
    entry *e = &entries[entry_count++];
    const char *name = p + 7, *open = strchr(name, '(');
    if (!open || (size_t)(open - name) >= sizeof e->name) return -1;
    memcpy(e->name, name, (size_t)(open - name));
    e->name[open - name] = 0;
    const char *close = strchr(open, ')');
    if (!close) return -1;
    e->params = 0;
    for (const char *q = strstr(open, ".param"); q && q < close; q = strstr(q + 1, ".param")) e->params++;
    e->index = -1;
  }
  return 0;
}

CUresult cuModuleLoadData(void **module, const void *image) {
  if (!memcmp(image, "\x7f" "ELF", 4)) return env_int("FAKE_CUDA_CUBIN_OK", 0) ? INVALID_IMAGE : NO_BINARY;
  if (parse_ptx(image) != 0) return INVALID_IMAGE;
  const char *path = getenv("FAKE_CUDA_KERNELS");
  if (!path) return INVALID_IMAGE;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const mlpack_kernel_table *(*get)(void) = lib ? (const mlpack_kernel_table *(*)(void))dlsym(lib, "mlpack_kernel_table_v1") : NULL;
  if (!get) {
    fprintf(stderr, "fake_cuda: cannot load %s: %s\n", path, dlerror());
    return INVALID_IMAGE;
  }
  table = get();
  *module = lib;
  return OK;
}
CUresult cuModuleUnload(void *m) { (void)m; return OK; }
CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
  (void)module;
  for (int i = 0; i < entry_count; i++) {
    if (strcmp(entries[i].name, name)) continue;
    for (uint32_t k = 0; table && k < table->kernel_count; k++)
      if (!strcmp(table->names[k], name)) {
        entries[i].index = (int)k;
        *fn = &entries[i];
        return OK;
      }
  }
  return NOT_FOUND;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return 2;
  memset(m, 0xcd, n);   /* (device memory starts as garbage) */
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { (void)st; memcpy((void *)(uintptr_t)d, s, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; memcpy(d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *st) { (void)st; memset((void *)(uintptr_t)d, v, n); return OK; }
/* a stream records the launches made while it captures (a CUDA graph: a list replayed) */
typedef struct { entry *e; unsigned gx, bx; uint64_t params[300]; } launch;
typedef struct { int capturing; launch *recorded; size_t count; } stream;
typedef struct { launch *launches; size_t count; } graph;
static int graph_launches;
int fake_cuda_graph_launches(void) { return graph_launches; }

CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = calloc(1, sizeof(stream)); return *s ? OK : 2; }
CUresult cuStreamDestroy_v2(void *s) {
  if (s) free(((stream *)s)->recorded);
  free(s);
  return OK;
}
/* (NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the driver's special streams) */
static stream *own(void *s) { return (uintptr_t)s > 2 ? s : NULL; }
CUresult cuStreamSynchronize(void *s) { return own(s) && own(s)->capturing ? INVALID_VALUE : OK; }
CUresult cuStreamBeginCapture_v2(void *s, int mode) {
  (void)mode;
  stream *st = own(s);
  if (!st || st->capturing) return INVALID_VALUE;
  st->capturing = 1;
  st->count = 0;
  return OK;
}
CUresult cuStreamEndCapture(void *s, void **g) {
  stream *st = own(s);
  if (!st || !st->capturing) return INVALID_VALUE;
  st->capturing = 0;
  graph *gr = calloc(1, sizeof *gr);
  if (!gr) return 2;
  gr->launches = st->recorded;
  gr->count = st->count;
  st->recorded = NULL;
  st->count = 0;
  *g = gr;
  return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
  (void)flags;
  graph *src = g, *dst = calloc(1, sizeof *dst);
  if (!dst) return 2;
  dst->launches = malloc((src->count + 1) * sizeof(launch));
  memcpy(dst->launches, src->launches, src->count * sizeof(launch));
  dst->count = src->count;
  *exec = dst;
  return OK;
}
CUresult cuGraphDestroy(void *g) {
  if (g) free(((graph *)g)->launches);
  free(g);
  return OK;
}
CUresult cuGraphExecDestroy(void *g) { return cuGraphDestroy(g); }

static CUresult run(entry *e, unsigned gx, unsigned bx, void **params);

CUresult cuGraphLaunch(void *exec, void *s) {
  graph *g = exec;
  (void)s;
  for (size_t i = 0; i < g->count; i++) {
    launch *l = &g->launches[i];
    void *params[300];
    for (int j = 0; j < l->e->params; j++) params[j] = &l->params[j];
    CUresult r = run(l->e, l->gx, l->bx, params);
    if (r != OK) return r;
  }
  graph_launches++;
  return OK;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *s, void **params, void **extra) {
  entry *e = f;
  if (!e || e->index < 0 || gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem || extra || !params ||
      e->params > 300)
    return INVALID_VALUE;
  stream *st = own(s);
  if (st && st->capturing) {   /* recorded, run by cuGraphLaunch */
    launch *grown = realloc(st->recorded, (st->count + 1) * sizeof(launch));
    if (!grown) return 2;
    st->recorded = grown;
    launch *l = &st->recorded[st->count++];
    l->e = e;
    l->gx = gx;
    l->bx = bx;
    for (int j = 0; j < e->params; j++) l->params[j] = *(uint64_t *)params[j];
    return OK;
  }
  return run(e, gx, bx, params);
}

static CUresult run(entry *e, unsigned gx, unsigned bx, void **params) {
  const char *kinds = table->bindings[e->index];
  int nb = (int)strlen(kinds), nsym = e->params - nb - 2;
  if (nsym < 0) return INVALID_VALUE;
  void *bindings[256];
  if (nb > 256) return INVALID_VALUE;
  for (int j = 0; j < nb; j++) bindings[j] = (void *)(uintptr_t)*(CUdeviceptr *)params[j];
  int64_t *push = (int64_t *)(uintptr_t)*(CUdeviceptr *)params[nb + nsym];
  mlpack_kernel_error *error = (mlpack_kernel_error *)(uintptr_t)*(CUdeviceptr *)params[nb + nsym + 1];
  for (int i = 0; i < nsym; i++)   /* the parameters carry the values the push constants hold */
    if (*(int64_t *)params[nb + i] != push[i]) return INVALID_VALUE;
  (void)bx;
  mlpack_dispatch d = {.bindings = bindings, .push = push, .workgroup_count = gx, .error = error};
  for (unsigned w = 0; w < gx; w++) table->kernels[e->index](&d, w);
  launches++;
  return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case OK: *s = "CUDA_SUCCESS"; return OK;
  case 100: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
  case NO_BINARY: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return OK;
  case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
  case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
  default: *s = NULL; return INVALID_VALUE;
  }
}
