/* cuda.c: the CUDA executor: runs a cuda artifact's plan on the GPU through the driver API
 * (spec/SPEC.md section 7; its row in the executor table is application/vnd.mlpack.code.ptx.v1).
 *
 * The driver is opened at run time: libcuda.so.1 (MLPACK_LIBCUDA names another) with dlopen, its
 * functions found with dlsym, so libmlpack links nothing of CUDA and a host without a driver
 * only ever sees cuda artifacts passed over, with the reason (mp_cuda_probe, once per process,
 * and only for a container that has a cuda artifact: cuInit takes a while).
 *
 * Open: the code layers are the engine's own copies, hashed as read (mp_blob_copy), like every
 * executor's. The module is loaded from the cubin when the artifact has one for this GPU (same
 * major compute capability, minor at least the cubin's: the driver's fatbinary rule), else from
 * the PTX, which the driver compiles for this GPU; a cubin the driver refuses (built by a newer
 * toolkit than the driver, say) falls back to the PTX too. The plan is parsed and checked as the
 * native executor's (plan.c) against a kernel table built from the plan's "cuda" entry (each
 * kernel's name, launch and bindings). The weights are uploaded once, into one allocation.
 *
 * Run: every run takes a scratch context (its own stream, device arena, input and output buffers,
 * push constants and error records: runs on several threads overlap safely), uploads the inputs,
 * launches the dispatches in order on its stream (kernel parameters: the bindings' device
 * addresses, every symbol's value, the device push constants, the dispatch's error record), and
 * downloads the outputs. A dispatch that computes a symbol (plan ABI 1.1) is waited for and its
 * push slot read back before the next is launched. Index errors (ABI 1.2) are read back after the
 * run and reported for the first dispatch that claimed one, as the native executor reports them.
 *
 * With host arrays the inputs are copied to the GPU and the outputs back; mlpack_run_device
 * (api_run.c) hands device pointers instead, so nothing is copied (DLPack in Python).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "media.h"
#include "plan.h"

/* ---------------------------------------------------------------- the driver API, as used */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum { CU_OK = 0, CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76, CU_STREAM_NON_BLOCKING = 1,
       CU_CAPTURE_THREAD_LOCAL = 1 };

static struct {
  pthread_once_t once;
  void *lib;
  int sm;                 /* device 0's compute capability as digits; 0: none usable */
  int driver;             /* cuDriverGetVersion: 12040 is CUDA 12.4 */
  CUdevice device;
  char why[256];          /* why no GPU is usable, when sm == 0 */
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*GetErrorName)(CUresult, const char **);
  /* CUDA graphs (optional: a driver without them runs every dispatch as it comes) */
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  int graphs;
} D = {.once = PTHREAD_ONCE_INIT};

static const char *mp_cu_name(CUresult r) {
  const char *s = NULL;
  if (D.GetErrorName && D.GetErrorName(r, &s) == CU_OK && s) return s;
  return "an unknown CUDA error";
}

typedef struct { void **slot; const char *name; } mp_cuda_fn;

/* dlsym each of fns; the name of the first the driver lacks, or NULL */
static const char *mp_cuda_bind_all(const mp_cuda_fn *fns, size_t n) {
  const char *missing = NULL;
  for (size_t i = 0; i < n; i++)
    if (!(*fns[i].slot = dlsym(D.lib, fns[i].name)) && !missing) missing = fns[i].name;
  return missing;
}

/* every function (versioned names where the driver has _v2 ones); 0 when all are there. The
 * graph functions are optional: without them every run launches its dispatches one by one. */
static int mp_cuda_bind(void) {
  static const mp_cuda_fn fns[] = {
      {(void **)&D.Init, "cuInit"},
      {(void **)&D.DriverGetVersion, "cuDriverGetVersion"},
      {(void **)&D.DeviceGetCount, "cuDeviceGetCount"},
      {(void **)&D.DeviceGet, "cuDeviceGet"},
      {(void **)&D.DeviceGetAttribute, "cuDeviceGetAttribute"},
      {(void **)&D.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
      {(void **)&D.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
      {(void **)&D.CtxPushCurrent, "cuCtxPushCurrent_v2"},
      {(void **)&D.CtxPopCurrent, "cuCtxPopCurrent_v2"},
      {(void **)&D.ModuleLoadData, "cuModuleLoadData"},
      {(void **)&D.ModuleUnload, "cuModuleUnload"},
      {(void **)&D.ModuleGetFunction, "cuModuleGetFunction"},
      {(void **)&D.MemAlloc, "cuMemAlloc_v2"},
      {(void **)&D.MemFree, "cuMemFree_v2"},
      {(void **)&D.MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
      {(void **)&D.MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
      {(void **)&D.MemsetD8Async, "cuMemsetD8Async"},
      {(void **)&D.StreamCreate, "cuStreamCreate"},
      {(void **)&D.StreamDestroy, "cuStreamDestroy_v2"},
      {(void **)&D.StreamSynchronize, "cuStreamSynchronize"},
      {(void **)&D.LaunchKernel, "cuLaunchKernel"},
      {(void **)&D.GetErrorName, "cuGetErrorName"},
  };
  static const mp_cuda_fn graph_fns[] = {
      {(void **)&D.StreamBeginCapture, "cuStreamBeginCapture_v2"},
      {(void **)&D.StreamEndCapture, "cuStreamEndCapture"},
      {(void **)&D.GraphInstantiate, "cuGraphInstantiateWithFlags"},
      {(void **)&D.GraphLaunch, "cuGraphLaunch"},
      {(void **)&D.GraphExecDestroy, "cuGraphExecDestroy"},
      {(void **)&D.GraphDestroy, "cuGraphDestroy"},
  };
  const char *missing = mp_cuda_bind_all(fns, sizeof fns / sizeof *fns);
  if (missing) {
    snprintf(D.why, sizeof D.why, "the CUDA driver lacks %s", missing);
    return -1;
  }
  D.graphs = mp_cuda_bind_all(graph_fns, sizeof graph_fns / sizeof *graph_fns) == NULL;
  return 0;
}

static void mp_cuda_probe_once(void) {
  const char *path = getenv("MLPACK_LIBCUDA");
  if (!path || !*path) path = "libcuda.so.1";
  if (!strcmp(path, "0")) {
    snprintf(D.why, sizeof D.why, "MLPACK_LIBCUDA=0 turns CUDA off");
    return;
  }
  D.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!D.lib) {
    const char *e = dlerror();
    snprintf(D.why, sizeof D.why, "no CUDA driver (%.200s)", e ? e : path);
    return;
  }
  if (mp_cuda_bind() != 0) return;
  CUresult r = D.Init(0);
  if (r != CU_OK) {
    snprintf(D.why, sizeof D.why, "the CUDA driver did not start (cuInit: %s)", mp_cu_name(r));
    return;
  }
  int count = 0, major = 0, minor = 0;
  if ((r = D.DeviceGetCount(&count)) != CU_OK || count < 1) {
    snprintf(D.why, sizeof D.why, "the CUDA driver sees no GPU");
    return;
  }
  if ((r = D.DeviceGet(&D.device, 0)) != CU_OK || (r = D.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, D.device)) != CU_OK ||
      (r = D.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, D.device)) != CU_OK) {
    snprintf(D.why, sizeof D.why, "the CUDA driver cannot describe GPU 0 (%s)", mp_cu_name(r));
    return;
  }
  D.DriverGetVersion(&D.driver);
  D.sm = major * 10 + minor;
}

int mp_cuda_probe(const char **why) {
  pthread_once(&D.once, mp_cuda_probe_once);
  if (why) *why = D.why;
  return D.sm;
}

/* ---------------------------------------------------------------- the executor */

typedef struct mp_cuda_kernel {
  CUfunction fn;
  int single;                      /* one thread (a procedure), else a grid of `block` threads */
  unsigned block;
} mp_cuda_kernel;

typedef struct mp_cuda {
  mlpack_model *model;
  char what[96];                   /* "artifact 3 (cuda sm_80)" */
  CUcontext ctx;
  CUmodule module;
  const char *loaded_from;         /* "cubin sm_80" or "PTX (compiled by the driver)" */
  mlpack_kernel_table table;       /* names and bindings from the plan, for plan.c's checks */
  const char **names, **bindings;
  mp_cuda_kernel *kernels;
  size_t kernel_count;
  mp_tensor_archive weights;
  int have_weights;
  uint8_t *weights_copy;
  CUdeviceptr weights_dev;         /* every weight the plan binds, in one allocation */
  CUdeviceptr *weight_at;          /* per plan buffer: its weight's device address (0: not one) */
  mp_plan plan;
  int graphable;                   /* no computed sizes: a run's launches depend only on its key */
  pthread_mutex_t mu;
  struct mp_cuda_scratch *idle;
} mp_cuda;

typedef struct mp_dev_buf { CUdeviceptr ptr; size_t cap; } mp_dev_buf;

typedef struct mp_cuda_scratch {
  struct mp_cuda_scratch *next;
  CUstream stream;
  mp_dev_buf arena, push_dev, errors;
  mp_dev_buf *inputs, *outputs;    /* per signature input / output */
  int64_t *push;
  const char **names_now;
  CUdeviceptr *bases;
  void **out_host;                 /* per output: where its values go (host runs) */
  size_t *out_bytes;
  mlpack_kernel_error *host_errors;
  /* CUDA graph of the dispatches for one key (symbol values and buffer addresses): captured on
   * the second run with the same key, replayed while the key stays */
  CUgraphExec graph;
  uint64_t *key, *graph_key;       /* this run's, and the captured graph's (key_len words) */
  size_t key_len;
  int key_seen;                    /* the last run had this run's key */
} mp_cuda_scratch;

static mlpack_status mp_cu(const mp_cuda *c, CUresult r, const char *call, mlpack_error **err) {
  if (r == CU_OK) return MLPACK_OK;
  return mp_fail(err, r == 2 ? MLPACK_ERR_NOMEM : MLPACK_ERR_RUNTIME, "%s: %s failed: %s", c->what, call,
                 mp_cu_name(r));
}

/* at least `bytes` (one byte when 0) of device memory in b, kept between runs */
static mlpack_status mp_dev_reserve(const mp_cuda *c, mp_dev_buf *b, size_t bytes, mlpack_error **err) {
  if (bytes == 0) bytes = 1;
  if (b->ptr && b->cap >= bytes) return MLPACK_OK;
  if (b->ptr) D.MemFree(b->ptr);
  b->ptr = 0;
  b->cap = 0;
  mlpack_status st = mp_cu(c, D.MemAlloc(&b->ptr, bytes), "cuMemAlloc", err);
  if (st == MLPACK_OK) b->cap = bytes;
  else b->ptr = 0;
  return st;
}

static void mp_dev_release(mp_dev_buf *b) {
  if (b->ptr) D.MemFree(b->ptr);
  b->ptr = 0;
  b->cap = 0;
}

static void mp_cuda_scratch_free(const mp_cuda *c, mp_cuda_scratch *s) {
  if (!s) return;
  mp_dev_release(&s->arena);
  mp_dev_release(&s->push_dev);
  mp_dev_release(&s->errors);
  for (size_t i = 0; s->inputs && i < c->model->input_count; i++) mp_dev_release(&s->inputs[i]);
  for (size_t i = 0; s->outputs && i < c->model->output_count; i++) mp_dev_release(&s->outputs[i]);
  if (s->graph) D.GraphExecDestroy(s->graph);
  if (s->stream) D.StreamDestroy(s->stream);
  free(s->key);
  free(s->graph_key);
  free(s->inputs);
  free(s->outputs);
  free(s->push);
  free(s->names_now);
  free(s->bases);
  free(s->out_host);
  free(s->out_bytes);
  free(s->host_errors);
  free(s);
}

static mlpack_status mp_cuda_scratch_new(const mp_cuda *c, mp_cuda_scratch **out, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  const mlpack_model *m = c->model;
  mp_cuda_scratch *s = calloc(1, sizeof *s);
  int ok = s != NULL;
  if (ok) {
    s->inputs = calloc(m->input_count + 1, sizeof *s->inputs);
    s->outputs = calloc(m->output_count + 1, sizeof *s->outputs);
    s->push = calloc(p->symbol_count + 1, sizeof *s->push);
    s->names_now = calloc(p->symbol_count + 1, sizeof *s->names_now);
    s->bases = calloc(p->buffer_count + 1, sizeof *s->bases);
    s->out_host = calloc(m->output_count + 1, sizeof *s->out_host);
    s->out_bytes = calloc(m->output_count + 1, sizeof *s->out_bytes);
    s->host_errors = calloc(p->dispatch_count + 1, sizeof *s->host_errors);
    s->key_len = p->symbol_count + p->buffer_count;
    s->key = calloc(s->key_len + 1, sizeof *s->key);
    s->graph_key = calloc(s->key_len + 1, sizeof *s->graph_key);
    ok = s->inputs && s->outputs && s->push && s->names_now && s->bases && s->out_host && s->out_bytes &&
         s->host_errors && s->key && s->graph_key;
  }
  if (!ok) {
    mp_cuda_scratch_free(c, s);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for a run's scratch", c->what);
  }
  mlpack_status st = mp_cu(c, D.StreamCreate(&s->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", err);
  if (st == MLPACK_OK) st = mp_dev_reserve(c, &s->push_dev, (p->symbol_count + 1) * sizeof(int64_t), err);
  if (st == MLPACK_OK) st = mp_dev_reserve(c, &s->errors, (p->dispatch_count + 1) * sizeof(mlpack_kernel_error), err);
  if (st != MLPACK_OK) {
    mp_cuda_scratch_free(c, s);
    return st;
  }
  *out = s;
  return MLPACK_OK;
}

static mlpack_status mp_cuda_eval(const mp_cuda *c, const mp_cuda_scratch *s, const mp_json *e, const char *what,
                                  int64_t *out, mlpack_error **err) {
  mlpack_status st = mp_expr_eval(e, s->names_now, s->push, c->plan.symbol_count, out, err);
  if (st != MLPACK_OK) return st;
  if (*out < 0)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: plan %s evaluates to %lld", c->what, what, (long long)*out);
  return MLPACK_OK;
}

static mlpack_status mp_cuda_symbols(const mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  for (size_t i = 0; i < p->symbol_count; i++) {
    int computed = p->src_dispatch[i] != SIZE_MAX;
    s->push[i] = computed ? 0 : run->in_shapes[p->src_input[i] * 8 + p->src_axis[i]];
    s->names_now[i] = computed ? NULL : p->symbols[i];
  }
  for (size_t k = 0; k < p->source_count; k++) {
    size_t i = p->sources[k][0], in = p->sources[k][1], ax = p->sources[k][2];
    int64_t v = run->in_shapes[in * 8 + ax];
    if (v != s->push[i]) {
      const mp_sig *a = &c->model->inputs[in], *f = &c->model->inputs[p->src_input[i]];
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, but input '%s' bound %s=%lld", a->name,
                     a->dim_names[ax], (long long)v, f->name, p->symbols[i], (long long)s->push[i]);
    }
  }
  return MLPACK_OK;
}

static size_t mp_tensor_bytes(const mp_sig *sig, const int64_t *shape) {
  size_t n = mlpack_dtype_size(sig->dtype);
  for (size_t d = 0; d < sig->rank; d++) n *= (size_t)shape[d];
  return n;
}

/* inputs to the GPU (or their device addresses), outputs' device buffers, every base address */
static mlpack_status mp_cuda_buffers(const mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  const mlpack_model *m = c->model;
  mlpack_status st = MLPACK_OK;
  int64_t arena = 0;
  if (p->arena_size && (st = mp_cuda_eval(c, s, p->arena_size, "arena_size", &arena, err))) return st;
  if ((st = mp_dev_reserve(c, &s->arena, (size_t)arena, err))) return st;
  for (size_t i = 0; i < m->input_count && !run->on_device; i++) {
    size_t bytes = mp_tensor_bytes(&m->inputs[i], run->in_shapes + i * 8);
    if ((st = mp_dev_reserve(c, &s->inputs[i], bytes, err))) return st;
    if (bytes && (st = mp_cu(c, D.MemcpyHtoDAsync(s->inputs[i].ptr, run->inputs[i], bytes, s->stream),
                             "cuMemcpyHtoDAsync", err)))
      return st;
  }
  for (size_t i = 0; i < m->output_count; i++) {
    s->out_host[i] = run->outputs[i];
    s->out_bytes[i] = run->outputs[i] ? mp_tensor_bytes(&m->outputs[i], run->out_shapes + i * 8) : 0;
    if (run->outputs[i] && !run->on_device && (st = mp_dev_reserve(c, &s->outputs[i], s->out_bytes[i], err)))
      return st;
  }
  for (size_t i = 0; i < p->buffer_count; i++) {
    const mp_plan_buffer *b = &p->buffers[i];
    int64_t off, size;
    switch (b->kind) {
    case MP_BUF_INPUT:
      s->bases[i] = run->on_device ? (CUdeviceptr)(uintptr_t)run->inputs[b->index] : s->inputs[b->index].ptr;
      break;
    case MP_BUF_OUTPUT:
      s->bases[i] = !run->outputs[b->index] ? 0
                    : run->on_device       ? (CUdeviceptr)(uintptr_t)run->outputs[b->index]
                                           : s->outputs[b->index].ptr;
      if (!run->outputs[b->index] && !b->shape)
        return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: output %zu has a data-dependent shape, which plans cannot produce",
                       c->what, b->index);
      break;
    case MP_BUF_WEIGHT: s->bases[i] = c->weight_at[i]; break;
    default:
      if ((st = mp_cuda_eval(c, s, b->offset, "arena offset", &off, err)) ||
          (st = mp_cuda_eval(c, s, b->size, "arena size", &size, err)))
        return st;
      if ((uint64_t)off > s->arena.cap || (uint64_t)size > s->arena.cap - (uint64_t)off)
        return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (arena %lld+%lld) is outside the %zu-byte arena",
                       c->what, i, (long long)off, (long long)size, s->arena.cap);
      s->bases[i] = s->arena.ptr + (CUdeviceptr)off;
    }
  }
  return MLPACK_OK;
}

/* an output sized at run time, allocated once the symbols its shape names are known */
static mlpack_status mp_cuda_late_output(const mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, size_t i,
                                         mlpack_error **err) {
  const mp_plan_buffer *b = &c->plan.buffers[i];
  int64_t shape[8] = {0};
  for (size_t d = 0; d < b->shape->length && d < 8; d++) {
    mlpack_status st = mp_cuda_eval(c, s, b->shape->items[d], "output shape", &shape[d], err);
    if (st != MLPACK_OK) return st;
  }
  if (run->on_device)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: output %zu's shape depends on the data, so it cannot be written "
                   "into device memory the caller sized beforehand; run with host arrays", c->what, b->index);
  void *host;
  mlpack_status st = mp_run_output(run, b->index, shape, &host, err);
  if (st != MLPACK_OK) return st;
  s->out_host[b->index] = host;
  s->out_bytes[b->index] = mp_tensor_bytes(&c->model->outputs[b->index], shape);
  if ((st = mp_dev_reserve(c, &s->outputs[b->index], s->out_bytes[b->index], err))) return st;
  s->bases[i] = s->outputs[b->index].ptr;
  return MLPACK_OK;
}

static mlpack_status mp_cuda_publish(const mp_cuda *c, mp_cuda_scratch *s, size_t i, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  mlpack_status st = mp_cu(c, D.MemcpyDtoHAsync(s->push, s->push_dev.ptr, p->symbol_count * sizeof(int64_t), s->stream),
                           "cuMemcpyDtoHAsync", err);
  if (st == MLPACK_OK) st = mp_cu(c, D.StreamSynchronize(s->stream), "cuStreamSynchronize", err);
  for (size_t k = 0; st == MLPACK_OK && k < p->symbol_count; k++) {
    if (p->src_dispatch[k] != i) continue;
    int64_t v = s->push[k], bound;
    if ((st = mp_cuda_eval(c, s, p->src_bound[k], "symbol bound", &bound, err))) return st;
    if (v < 0 || v > bound)
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu computed %s=%lld, outside its bound 0..%lld", c->what,
                     i, p->symbols[k], (long long)v, (long long)bound);
    s->names_now[k] = p->symbols[k];
  }
  return st;
}

static mlpack_status mp_cuda_dispatch(const mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, size_t i,
                                      mlpack_error **err) {
  const mp_plan *p = &c->plan;
  const mp_plan_dispatch *d = &p->dispatches[i];
  const mp_cuda_kernel *k = &c->kernels[d->kernel];
  int64_t groups;
  mlpack_status st = mp_cuda_eval(c, s, d->workgroups, "workgroups", &groups, err);
  if (st != MLPACK_OK) return st;
  if (groups > 0x7fffffff)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu has %lld blocks", c->what, i, (long long)groups);
  int computes = 0;
  for (size_t j = 0; j < p->symbol_count; j++) computes |= p->src_dispatch[j] == i;
  if (computes && (groups != 1 || !k->single))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: dispatch %zu computes a symbol but is not one thread", c->what, i);
  if (groups == 0) return MLPACK_OK;
  size_t n = d->binding_count + p->symbol_count + 2;
  uint64_t vals[n];
  void *args[n];
  for (size_t j = 0; j < d->binding_count; j++) {
    size_t b = d->bindings[j];
    if (!s->bases[b] && p->buffers[b].kind == MP_BUF_OUTPUT && p->buffers[b].shape &&
        (st = mp_cuda_late_output(c, s, run, b, err)))
      return st;
    vals[j] = s->bases[b];
  }
  for (size_t j = 0; j < p->symbol_count; j++) vals[d->binding_count + j] = (uint64_t)s->push[j];
  vals[n - 2] = s->push_dev.ptr;
  vals[n - 1] = s->errors.ptr + i * sizeof(mlpack_kernel_error);
  for (size_t j = 0; j < n; j++) args[j] = &vals[j];
  st = mp_cu(c, D.LaunchKernel(k->fn, (unsigned)groups, 1, 1, k->block, 1, 1, 0, s->stream, args, NULL),
             "cuLaunchKernel", err);
  return (st == MLPACK_OK && computes) ? mp_cuda_publish(c, s, i, err) : st;
}

/* the first dispatch (in plan order) whose kernel reported an index out of range */
static mlpack_status mp_cuda_index_errors(const mp_cuda *c, const mp_cuda_scratch *s, mlpack_error **err) {
  for (size_t i = 0; i < c->plan.dispatch_count; i++) {
    const mlpack_kernel_error *e = &s->host_errors[i];
    if (!e->claimed) continue;
    const mp_plan_dispatch *p = &c->plan.dispatches[i];
    const mp_json *chk = p->checks && e->check < p->checks->length ? p->checks->items[e->check] : NULL;
    if (!chk || chk->kind != MP_JSON_OBJECT)
      return mp_fail(err, MLPACK_ERR_INDEX, "%s: dispatch %zu: index %lld out of range for a dim of size %lld (check %u)",
                     c->what, i, (long long)e->index, (long long)e->size, e->check);
    const mp_json *wraps = mp_json_get(chk, "wraps");
    const char *tensor = mp_json_get_string(chk, "tensor"), *dim = mp_json_get_string(chk, "dim");
    char msg[512];
    mp_index_message(msg, sizeof msg, mp_json_get_string(chk, "node"),
                     wraps && wraps->kind == MP_JSON_BOOL && wraps->boolean, "read of", tensor ? tensor : "?",
                     dim ? dim : "?", e->index, e->size);
    return mp_fail(err, MLPACK_ERR_INDEX, "%s: %s", c->what, msg);
  }
  return MLPACK_OK;
}

/* Every dispatch, or the CUDA graph of them: a plan with no computed sizes launches the same
 * kernels with the same parameters whenever the symbols and the buffers' addresses are the same
 * (the inputs' and outputs' are the scratch's own for host runs), so the second run with a key
 * captures the launches into a graph and later ones replay it, one launch instead of one per
 * kernel. A failed capture leaves the run on plain launches. */
static mlpack_status mp_cuda_dispatches(mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  mlpack_status st = MLPACK_OK;
  if (!c->graphable || !D.graphs) {
    for (size_t i = 0; st == MLPACK_OK && i < p->dispatch_count; i++) st = mp_cuda_dispatch(c, s, run, i, err);
    return st;
  }
  for (size_t i = 0; i < p->symbol_count; i++) s->key[i] = (uint64_t)s->push[i];
  for (size_t i = 0; i < p->buffer_count; i++) s->key[p->symbol_count + i] = s->bases[i];
  size_t bytes = s->key_len * sizeof *s->key;
  if (s->graph && !memcmp(s->key, s->graph_key, bytes))
    return mp_cu(c, D.GraphLaunch(s->graph, s->stream), "cuGraphLaunch", err);
  int capture = s->key_seen && !memcmp(s->key, s->graph_key, bytes);
  memcpy(s->graph_key, s->key, bytes);   /* (the key the next run is compared with) */
  s->key_seen = 1;
  if (s->graph) {
    D.GraphExecDestroy(s->graph);
    s->graph = NULL;
  }
  if (capture && D.StreamBeginCapture(s->stream, CU_CAPTURE_THREAD_LOCAL) == CU_OK) {
    for (size_t i = 0; st == MLPACK_OK && i < p->dispatch_count; i++) st = mp_cuda_dispatch(c, s, run, i, err);
    CUgraph g = NULL;
    CUresult r = D.StreamEndCapture(s->stream, &g);
    if (st == MLPACK_OK && r == CU_OK && g && D.GraphInstantiate(&s->graph, g, 0) != CU_OK) s->graph = NULL;
    if (g) D.GraphDestroy(g);
    if (st != MLPACK_OK) return st;
    if (s->graph) return mp_cu(c, D.GraphLaunch(s->graph, s->stream), "cuGraphLaunch", err);
  }
  for (size_t i = 0; st == MLPACK_OK && i < p->dispatch_count; i++) st = mp_cuda_dispatch(c, s, run, i, err);
  return st;
}

static mlpack_status mp_cuda_run_on(mp_cuda *c, mp_cuda_scratch *s, const mp_run *run, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  mlpack_status st = mp_cuda_symbols(c, s, run, err);
  if (st == MLPACK_OK && run->on_device)   /* the caller's work writing the inputs, done first */
    st = mp_cu(c, D.StreamSynchronize((CUstream)run->stream), "cuStreamSynchronize (the caller's stream)", err);
  if (st == MLPACK_OK) st = mp_cuda_buffers(c, s, run, err);
  if (st == MLPACK_OK)
    st = mp_cu(c, D.MemsetD8Async(s->errors.ptr, 0, p->dispatch_count * sizeof(mlpack_kernel_error), s->stream),
               "cuMemsetD8Async", err);
  if (st == MLPACK_OK && p->symbol_count)
    st = mp_cu(c, D.MemcpyHtoDAsync(s->push_dev.ptr, s->push, p->symbol_count * sizeof(int64_t), s->stream),
               "cuMemcpyHtoDAsync", err);
  if (st == MLPACK_OK) st = mp_cuda_dispatches(c, s, run, err);
  for (size_t i = 0; st == MLPACK_OK && i < p->buffer_count; i++)
    if (!s->bases[i] && p->buffers[i].kind == MP_BUF_OUTPUT && p->buffers[i].shape)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: no dispatch writes output %zu", c->what, p->buffers[i].index);
  for (size_t i = 0; st == MLPACK_OK && !run->on_device && i < c->model->output_count; i++)
    if (s->out_host[i] && s->out_bytes[i])
      st = mp_cu(c, D.MemcpyDtoHAsync(s->out_host[i], s->outputs[i].ptr, s->out_bytes[i], s->stream),
                 "cuMemcpyDtoHAsync", err);
  if (st == MLPACK_OK)
    st = mp_cu(c, D.MemcpyDtoHAsync(s->host_errors, s->errors.ptr, p->dispatch_count * sizeof(mlpack_kernel_error),
                                    s->stream), "cuMemcpyDtoHAsync", err);
  /* (wait either way: a failed run must not leave copies in flight into buffers it hands back) */
  mlpack_status done = mp_cu(c, D.StreamSynchronize(s->stream), "cuStreamSynchronize", err);
  if (st == MLPACK_OK) st = done;
  return st == MLPACK_OK ? mp_cuda_index_errors(c, s, err) : st;
}

mlpack_status mp_cuda_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  mp_cuda *c = (mp_cuda *)x;
  mlpack_status st = mp_cu(c, D.CtxPushCurrent(c->ctx), "cuCtxPushCurrent", err);
  if (st != MLPACK_OK) return st;
  pthread_mutex_lock(&c->mu);
  mp_cuda_scratch *s = c->idle;
  if (s) c->idle = s->next;
  pthread_mutex_unlock(&c->mu);
  if (!s) st = mp_cuda_scratch_new(c, &s, err);
  if (st == MLPACK_OK) {
    st = mp_cuda_run_on(c, s, run, err);
    pthread_mutex_lock(&c->mu);
    s->next = c->idle;
    c->idle = s;
    pthread_mutex_unlock(&c->mu);
  }
  CUcontext popped;
  D.CtxPopCurrent(&popped);
  return st;
}

void mp_cuda_close(mp_executor *x) {
  mp_cuda *c = (mp_cuda *)x;
  if (!c) return;
  if (c->ctx && D.CtxPushCurrent(c->ctx) == CU_OK) {
    while (c->idle) {
      mp_cuda_scratch *s = c->idle;
      c->idle = s->next;
      mp_cuda_scratch_free(c, s);
    }
    if (c->weights_dev) D.MemFree(c->weights_dev);
    if (c->module) D.ModuleUnload(c->module);
    CUcontext popped;
    D.CtxPopCurrent(&popped);
  }
  if (c->ctx) D.DevicePrimaryCtxRelease(D.device);
  mp_plan_free(&c->plan);
  if (c->have_weights) mp_tensors_close(&c->weights);
  free(c->weights_copy);
  free(c->weight_at);
  free(c->kernels);
  free(c->names);
  free(c->bindings);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* The plan's "cuda" entry: each kernel's name, launch ("grid" or "single"), block and bindings. */
static mlpack_status mp_cuda_read_kernels(mp_cuda *c, const mp_json *plan, mlpack_error **err) {
  const mp_json *cuda = mp_json_get(plan, "cuda");
  const mp_json *ks = cuda ? mp_json_get(cuda, "kernels") : NULL;
  if (!ks || ks->kind != MP_JSON_ARRAY || ks->length == 0 || ks->length > 1000000)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'cuda' entry with a 'kernels' list", c->what);
  c->kernel_count = ks->length;
  c->kernels = calloc(ks->length, sizeof *c->kernels);
  c->names = calloc(ks->length, sizeof *c->names);
  c->bindings = calloc(ks->length, sizeof *c->bindings);
  if (!c->kernels || !c->names || !c->bindings) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < ks->length; i++) {
    const mp_json *k = ks->items[i], *block = mp_json_get(k, "block");
    const char *name = mp_json_get_string(k, "name"), *launch = mp_json_get_string(k, "launch");
    const char *kinds = mp_json_get_string(k, "bindings");
    if (!name || !kinds || !launch || (strcmp(launch, "grid") && strcmp(launch, "single")) || !block ||
        block->kind != MP_JSON_NUMBER || !block->is_int || block->integer < 1 || block->integer > 1024)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan cuda kernel %zu is malformed (needs name, launch "
                     "grid|single, block 1..1024, bindings)", c->what, i);
    c->names[i] = name;
    c->bindings[i] = kinds;
    c->kernels[i].single = !strcmp(launch, "single");
    c->kernels[i].block = (unsigned)block->integer;
  }
  c->table = (mlpack_kernel_table){.abi_version = MLPACK_KERNEL_TABLE_VERSION, .kernel_count = (uint32_t)ks->length,
                                   .kernels = NULL, .names = c->names, .bindings = c->bindings};
  return MLPACK_OK;
}

/* the module from the cubin where it fits this GPU (and the driver takes it), else the PTX */
static mlpack_status mp_cuda_load_module(mp_cuda *c, const mp_artifact *a, mlpack_error **err) {
  const mp_json *cuda = mp_json_get(mp_json_get(a->config, "plan"), "cuda");
  const mp_json *smj = cuda ? mp_json_get(cuda, "sm") : NULL;
  int sm = smj && smj->kind == MP_JSON_NUMBER && smj->is_int ? (int)smj->integer : a->cuda_sm;
  mlpack_status st;
  if (a->cubin.size && sm / 10 == D.sm / 10 && sm <= D.sm) {
    uint8_t *cubin = NULL;
    if ((st = mp_blob_copy(c->model->container, &a->cubin, c->what, &cubin, err))) return st;
    CUresult r = D.ModuleLoadData(&c->module, cubin);
    free(cubin);
    if (r == CU_OK) {
      c->loaded_from = "cubin";
      return MLPACK_OK;
    }
    c->module = NULL;   /* (a cubin from a newer toolkit than the driver: the PTX instead) */
  }
  uint8_t *ptx = NULL;
  if ((st = mp_blob_copy(c->model->container, &a->code, c->what, &ptx, err))) return st;
  /* PTX is text the driver reads up to its NUL */
  uint8_t *text = realloc(ptx, a->code.size + 1);
  if (!text) {
    free(ptx);
    return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  }
  text[a->code.size] = 0;
  CUresult r = D.ModuleLoadData(&c->module, text);
  free(text);
  c->loaded_from = "PTX";
  return mp_cu(c, r, "cuModuleLoadData (the driver compiling the artifact's PTX)", err);
}

/* every weight the plan binds in one device allocation (256-byte aligned each) */
static mlpack_status mp_cuda_upload_weights(mp_cuda *c, mlpack_error **err) {
  const mp_plan *p = &c->plan;
  c->weight_at = calloc(p->buffer_count + 1, sizeof *c->weight_at);
  if (!c->weight_at) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  size_t total = 0;
  for (size_t i = 0; i < p->buffer_count; i++)
    if (p->buffers[i].kind == MP_BUF_WEIGHT) {
      const mp_tensor_entry *e = mp_tensors_find(&c->weights, p->buffers[i].name);
      total += ((e ? e->nbytes : 0) + 255) & ~(size_t)255;
    }
  if (!total) return MLPACK_OK;
  mlpack_status st = mp_cu(c, D.MemAlloc(&c->weights_dev, total), "cuMemAlloc (weights)", err);
  size_t at = 0;
  for (size_t i = 0; st == MLPACK_OK && i < p->buffer_count; i++) {
    if (p->buffers[i].kind != MP_BUF_WEIGHT) continue;
    const mp_tensor_entry *e = mp_tensors_find(&c->weights, p->buffers[i].name);
    c->weight_at[i] = c->weights_dev + at;
    if (e && e->nbytes)
      st = mp_cu(c, D.MemcpyHtoDAsync(c->weight_at[i], e->data, e->nbytes, NULL), "cuMemcpyHtoD (weights)", err);
    at += ((e ? e->nbytes : 0) + 255) & ~(size_t)255;
  }
  if (st == MLPACK_OK) st = mp_cu(c, D.StreamSynchronize(NULL), "cuStreamSynchronize", err);
  return st;
}

static mlpack_status mp_cuda_open_in(mp_cuda *c, mlpack_model *m, const mp_artifact *a, mlpack_error **err) {
  const mp_json *plan = mp_json_get(a->config, "plan");
  mlpack_status st = mp_cuda_read_kernels(c, plan, err);
  if (st == MLPACK_OK && a->weights.size > 0) {
    char what[128];
    snprintf(what, sizeof what, "%s weights", c->what);
    st = mp_blob_copy(m->container, &a->weights, what, &c->weights_copy, err);
    mp_blob weights = a->weights;
    weights.data = c->weights_copy;
    if (st == MLPACK_OK) st = mp_tensors_open(&weights, what, &c->weights, err);
    c->have_weights = st == MLPACK_OK;
  }
  if (st == MLPACK_OK)
    st = mp_plan_parse(plan, m, &c->table, c->have_weights ? &c->weights : NULL, c->what, &c->plan, err);
  if (st != MLPACK_OK) return st;
  c->graphable = getenv("MLPACK_CUDA_GRAPHS") == NULL || strcmp(getenv("MLPACK_CUDA_GRAPHS"), "0") != 0;
  for (size_t i = 0; i < c->plan.symbol_count; i++) c->graphable &= c->plan.src_dispatch[i] == SIZE_MAX;
  if ((st = mp_cu(c, D.DevicePrimaryCtxRetain(&c->ctx, D.device), "cuDevicePrimaryCtxRetain", err))) {
    c->ctx = NULL;
    return st;
  }
  if ((st = mp_cu(c, D.CtxPushCurrent(c->ctx), "cuCtxPushCurrent", err))) return st;
  st = mp_cuda_load_module(c, a, err);
  for (size_t i = 0; st == MLPACK_OK && i < c->kernel_count; i++) {
    CUresult r = D.ModuleGetFunction(&c->kernels[i].fn, c->module, c->names[i]);
    if (r != CU_OK)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: its %s has no kernel '%.100s' (%s)", c->what, c->loaded_from,
                   c->names[i], mp_cu_name(r));
  }
  if (st == MLPACK_OK) st = mp_cuda_upload_weights(c, err);
  if (st == MLPACK_OK) st = mp_cuda_scratch_new(c, &c->idle, err);   /* the first run's, made now */
  CUcontext popped;
  D.CtxPopCurrent(&popped);
  return st;
}

mlpack_status mp_cuda_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err) {
  *out = NULL;
  const char *why;
  if (!mp_cuda_probe(&why))   /* (selection checked this; a pinned artifact comes here too) */
    return mp_fail(err, MLPACK_ERR_NO_ARTIFACT, "artifact %zu (cuda): %s", a->index, why);
  mp_cuda *c = calloc(1, sizeof *c);
  if (!c) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&c->mu, NULL);
  c->model = m;
  snprintf(c->what, sizeof c->what, "artifact %zu (cuda sm_%d)", a->index, a->cuda_sm);
  mlpack_status st = mp_cuda_open_in(c, m, a, err);
  if (st != MLPACK_OK) {
    mp_cuda_close((mp_executor *)c);
    return st;
  }
  *out = (mp_executor *)c;
  return MLPACK_OK;
}

/* the executor row's host check: a GPU the driver runs, of at least the artifact's SM */
int mp_cuda_host_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  (void)h;
  const char *reason;
  int sm = mp_cuda_probe(&reason);
  if (!sm) {
    snprintf(why, n, "needs a CUDA GPU: %s", reason);
    return 1;
  }
  if (a->cuda_sm > sm) {
    snprintf(why, n, "needs sm_%d, this host's GPU is sm_%d", a->cuda_sm, sm);
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- device memory (mlpack.h) */

static mlpack_status mp_cuda_ready(const char *what, CUcontext *ctx, mlpack_error **err) {
  const char *why;
  if (!mp_cuda_probe(&why)) return mp_fail(err, MLPACK_ERR_NO_ARTIFACT, "%s: no CUDA GPU: %s", what, why);
  CUresult r = D.DevicePrimaryCtxRetain(ctx, D.device);
  if (r != CU_OK) return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: cuDevicePrimaryCtxRetain failed: %s", what, mp_cu_name(r));
  if ((r = D.CtxPushCurrent(*ctx)) != CU_OK) {
    D.DevicePrimaryCtxRelease(D.device);
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: cuCtxPushCurrent failed: %s", what, mp_cu_name(r));
  }
  return MLPACK_OK;
}

static void mp_cuda_done(void) {
  CUcontext popped;
  D.CtxPopCurrent(&popped);
}

mlpack_status mlpack_device_alloc(size_t nbytes, void **out, mlpack_error **err) {
  if (err) *err = NULL;
  if (!out) return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_device_alloc: out is NULL");
  *out = NULL;
  CUcontext ctx;
  mlpack_status st = mp_cuda_ready("mlpack_device_alloc", &ctx, err);
  if (st != MLPACK_OK) return st;
  CUdeviceptr p = 0;
  CUresult r = D.MemAlloc(&p, nbytes ? nbytes : 1);
  mp_cuda_done();
  if (r != CU_OK) {
    D.DevicePrimaryCtxRelease(D.device);
    return mp_fail(err, r == 2 ? MLPACK_ERR_NOMEM : MLPACK_ERR_RUNTIME, "mlpack_device_alloc: cuMemAlloc of %zu "
                   "bytes failed: %s", nbytes, mp_cu_name(r));
  }
  *out = (void *)(uintptr_t)p;   /* (the context stays retained until mlpack_device_free) */
  return MLPACK_OK;
}

void mlpack_device_free(void *ptr) {
  CUcontext ctx;
  if (!ptr || mp_cuda_ready("mlpack_device_free", &ctx, NULL) != MLPACK_OK) return;
  D.MemFree((CUdeviceptr)(uintptr_t)ptr);
  mp_cuda_done();
  D.DevicePrimaryCtxRelease(D.device);   /* this call's retain and the allocation's */
  D.DevicePrimaryCtxRelease(D.device);
}

mlpack_status mlpack_device_copy(void *dst, const void *src, size_t nbytes, int to_device,
                                            mlpack_error **err) {
  if (err) *err = NULL;
  if (nbytes && (!dst || !src)) return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_device_copy: NULL pointer");
  CUcontext ctx;
  mlpack_status st = mp_cuda_ready("mlpack_device_copy", &ctx, err);
  if (st != MLPACK_OK) return st;
  CUresult r = to_device ? D.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, nbytes, NULL)
                         : D.MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, nbytes, NULL);
  if (r == CU_OK) r = D.StreamSynchronize(NULL);
  mp_cuda_done();
  D.DevicePrimaryCtxRelease(D.device);
  if (r != CU_OK) return mp_fail(err, MLPACK_ERR_RUNTIME, "mlpack_device_copy: %s", mp_cu_name(r));
  return MLPACK_OK;
}
