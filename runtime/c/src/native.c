/* native.c: the native CPU executor: runs a cpu artifact's plan on the thread pool
 * (spec/SPEC.md section 7; its row in the executor table is application/vnd.mlpack.code.elf.v1).
 *
 * At open: the kernel library is loaded from memory (loader.c), the weights archive is opened
 * (weights stay in the file's mapping, never copied) and the config's "plan" is parsed and
 * checked against the kernel table and the signature (plan.c). At run: symbols are read from the
 * input shapes (symbol_sources), the arena is grown if the symbols need more (64-byte aligned,
 * kept between runs), every buffer's base address is resolved, and the dispatches run in order,
 * each spread over the pool; mp_pool_run returns after the last workgroup, which is the barrier
 * between dispatches.
 *
 * Computed symbols (plan ABI 1.1): a symbol_sources entry {"symbol", "dispatch", "bound"} is a
 * data-dependent size that the kernel of that dispatch (one workgroup) writes into its push
 * slot. Until then the symbol is unknown to plan expressions (an expression naming it fails);
 * after the dispatch its value is checked against the bound (the arena was sized at the bound)
 * and later dispatches see it. An output with a "shape" whose size only the run decides is
 * allocated (mp_run_output) when the first dispatch binds it, with the shape evaluated then.
 *
 * Index checks (plan ABI 1.2): a kernel that meets an index taken from data outside its dim (a
 * token id past an embedding table) reports it in the dispatch's mlpack_kernel_error; the
 * dispatch's "checks" entry {"tensor", "dim", "node", "wraps"} names what that check indexes, so
 * the run fails with MLPACK_ERR_INDEX naming the ONNX node and the index, as ONNX Runtime does.
 *
 * MLPACK_PROFILE=1 in the environment times every dispatch (wall clock around the pool run) and
 * prints, when the model is closed, one line per dispatch sorted by total time: where a model's
 * time goes, kernel by kernel.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "executor.h"
#include "plan.h"

typedef struct mp_native {
  mlpack_model *model;
  char what[96];                   /* "artifact 2 (cpu amd64 v3)" for messages */
  mp_library *lib;
  const mlpack_kernel_table *table;
  mp_tensor_archive weights;
  int have_weights;
  mp_plan plan;
  void *arena;
  size_t arena_cap;
  /* per-run scratch */
  int64_t *push;                   /* the symbols' values, in the plan's order */
  const char **names_now;          /* symbols as plan expressions see them: NULL until known */
  void **bases;                    /* every buffer's base address */
  void **bind;                     /* one dispatch's bindings */
  /* MLPACK_PROFILE: per dispatch, total seconds and the last workgroup count */
  double *prof_seconds;
  int64_t *prof_groups;
  size_t prof_runs;
} mp_native;

typedef struct mp_job {
  mlpack_kernel_fn fn;
  mlpack_dispatch d;
  mlpack_kernel_error error;
  atomic_int failed;
} mp_job;

static mlpack_status mp_eval(mp_native *n, const mp_json *e, const char *what, int64_t *out,
                             mlpack_error **err) {
  mlpack_status st = mp_expr_eval(e, n->names_now, n->push, n->plan.symbol_count, out, err);
  if (st != MLPACK_OK) return st;
  if (*out < 0)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: plan %s evaluates to %lld", n->what, what, (long long)*out);
  return MLPACK_OK;
}

static mlpack_status mp_read_symbols(mp_native *n, const mp_run *run, mlpack_error **err) {
  for (size_t i = 0; i < n->plan.symbol_count; i++) {
    int computed = n->plan.src_dispatch[i] != SIZE_MAX;
    n->push[i] = computed ? 0 : run->in_shapes[n->plan.src_input[i] * 8 + n->plan.src_axis[i]];
    n->names_now[i] = computed ? NULL : n->plan.symbols[i];   /* unknown until its dispatch ran */
  }
  for (size_t k = 0; k < n->plan.source_count; k++) {   /* every other source must agree */
    size_t i = n->plan.sources[k][0], in = n->plan.sources[k][1], ax = n->plan.sources[k][2];
    int64_t v = run->in_shapes[in * 8 + ax];
    if (v != n->push[i]) {
      const mp_sig *s = &n->model->inputs[in], *f = &n->model->inputs[n->plan.src_input[i]];
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, but input '%s' bound %s=%lld",
                     s->name, s->dim_names[ax], (long long)v, f->name, n->plan.symbols[i], (long long)n->push[i]);
    }
  }
  return MLPACK_OK;
}

static mlpack_status mp_grow_arena(mp_native *n, mlpack_error **err) {
  int64_t size = 0;
  if (n->plan.arena_size) {
    mlpack_status st = mp_eval(n, n->plan.arena_size, "arena_size", &size, err);
    if (st != MLPACK_OK) return st;
  }
  if ((uint64_t)size <= n->arena_cap && n->arena) return MLPACK_OK;
  free(n->arena);
  n->arena = NULL;
  n->arena_cap = 0;
  size_t bytes = ((size_t)size + n->plan.arena_align - 1) / n->plan.arena_align * n->plan.arena_align;
  if (posix_memalign(&n->arena, n->plan.arena_align, bytes ? bytes : n->plan.arena_align) != 0) {
    n->arena = NULL;
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate the %lld-byte arena", n->what, (long long)size);
  }
  n->arena_cap = bytes;
  return MLPACK_OK;
}

static mlpack_status mp_resolve_buffer(mp_native *n, const mp_run *run, size_t i, mlpack_error **err) {
  const mp_plan_buffer *b = &n->plan.buffers[i];
  int64_t off, size;
  mlpack_status st;
  switch (b->kind) {
  case MP_BUF_INPUT: n->bases[i] = (void *)run->inputs[b->index]; return MLPACK_OK;
  case MP_BUF_OUTPUT:
    n->bases[i] = NULL;
    if (!run->outputs[b->index] && b->shape) return MLPACK_OK;  /* allocated when first bound */
    if (!run->outputs[b->index])
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: output %zu has a data-dependent shape, which plans cannot produce",
                     n->what, b->index);
    n->bases[i] = run->outputs[b->index];
    return MLPACK_OK;
  case MP_BUF_WEIGHT: n->bases[i] = (void *)b->weight; return MLPACK_OK;
  default:
    st = mp_eval(n, b->offset, "arena offset", &off, err);
    if (st == MLPACK_OK) st = mp_eval(n, b->size, "arena size", &size, err);
    if (st != MLPACK_OK) return st;
    if ((uint64_t)off > n->arena_cap || (uint64_t)size > n->arena_cap - (uint64_t)off)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (arena %lld+%lld) is outside the %zu-byte arena",
                     n->what, i, (long long)off, (long long)size, n->arena_cap);
    n->bases[i] = (uint8_t *)n->arena + off;
    return MLPACK_OK;
  }
}

static void mp_job_run(void *ctx, uint32_t w) {
  mp_job *job = ctx;
  if (job->fn(&job->d, w) != 0) atomic_store_explicit(&job->failed, 1, memory_order_relaxed);
}

/* An output sized at run time, allocated now that the symbols its shape names are known. */
static mlpack_status mp_resolve_output(mp_native *n, const mp_run *run, size_t i, mlpack_error **err) {
  const mp_plan_buffer *b = &n->plan.buffers[i];
  int64_t shape[8] = {0};
  for (size_t d = 0; d < b->shape->length && d < 8; d++) {
    mlpack_status st = mp_eval(n, b->shape->items[d], "output shape", &shape[d], err);
    if (st != MLPACK_OK) return st;
  }
  return mp_run_output(run, b->index, shape, &n->bases[i], err);
}

/* After dispatch i: the symbols it computes, checked against their bounds, become known. */
static mlpack_status mp_publish_symbols(mp_native *n, size_t i, mlpack_error **err) {
  for (size_t k = 0; k < n->plan.symbol_count; k++) {
    if (n->plan.src_dispatch[k] != i) continue;
    int64_t v = n->push[k], bound;
    mlpack_status st = mp_eval(n, n->plan.src_bound[k], "symbol bound", &bound, err);
    if (st != MLPACK_OK) return st;
    if (v < 0 || v > bound)
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu computed %s=%lld, outside its bound 0..%lld",
                     n->what, i, n->plan.symbols[k], (long long)v, (long long)bound);
    n->names_now[k] = n->plan.symbols[k];
  }
  return MLPACK_OK;
}

/* A kernel's report of an index out of range, as the message the interpreters give. */
static mlpack_status mp_index_fail(const mp_native *n, const mp_plan_dispatch *p, size_t i,
                                   const mlpack_kernel_error *e, mlpack_error **err) {
  const mp_json *c = p->checks && e->check < p->checks->length ? p->checks->items[e->check] : NULL;
  if (!c || c->kind != MP_JSON_OBJECT)
    return mp_fail(err, MLPACK_ERR_INDEX, "%s: dispatch %zu: index %lld out of range for a dim of size %lld "
                   "(check %u)", n->what, i, (long long)e->index, (long long)e->size, e->check);
  const mp_json *wraps = mp_json_get(c, "wraps");
  const char *tensor = mp_json_get_string(c, "tensor"), *dim = mp_json_get_string(c, "dim");
  char msg[512];
  mp_index_message(msg, sizeof msg, mp_json_get_string(c, "node"),
                   wraps && wraps->kind == MP_JSON_BOOL && wraps->boolean, "read of",
                   tensor ? tensor : "?", dim ? dim : "?", e->index, e->size);
  return mp_fail(err, MLPACK_ERR_INDEX, "%s: %s", n->what, msg);
}

static mlpack_status mp_dispatch(mp_native *n, const mp_run *run, size_t i, mlpack_error **err) {
  const mp_plan_dispatch *p = &n->plan.dispatches[i];
  int64_t groups;
  mlpack_status st = mp_eval(n, p->workgroups, "workgroups", &groups, err);
  if (st != MLPACK_OK) return st;
  if (groups > (int64_t)UINT32_MAX)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu has %lld workgroups", n->what, i, (long long)groups);
  int computes = 0;
  for (size_t k = 0; k < n->plan.symbol_count; k++) computes |= n->plan.src_dispatch[k] == i;
  if (computes && groups != 1)   /* one writer of the push slots, no race */
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: dispatch %zu computes a symbol but has %lld workgroups, not 1",
                   n->what, i, (long long)groups);
  for (size_t k = 0; k < p->binding_count; k++) {
    size_t j = p->bindings[k];
    if (!n->bases[j] && n->plan.buffers[j].kind == MP_BUF_OUTPUT && n->plan.buffers[j].shape) {
      st = mp_resolve_output(n, run, j, err);
      if (st != MLPACK_OK) return st;
    }
    n->bind[k] = n->bases[j];
  }
  mp_job job = {.fn = n->table->kernels[p->kernel],
                .d = {.bindings = n->bind, .push = n->push, .workgroup_count = (uint32_t)groups}};
  job.d.error = &job.error;   /* (zeroed with job) */
  atomic_init(&job.failed, 0);
  struct timespec t0, t1;
  if (n->prof_seconds) clock_gettime(CLOCK_MONOTONIC, &t0);
  mp_pool_run(n->model->pool, (uint32_t)groups, mp_job_run, &job);
  if (n->prof_seconds) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    n->prof_seconds[i] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    n->prof_groups[i] = groups;
  }
  if (job.error.claimed) return mp_index_fail(n, p, i, &job.error, err);
  if (atomic_load(&job.failed)) {
    const char *name = n->table->names && n->table->names[p->kernel] ? n->table->names[p->kernel] : "?";
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: kernel %u (%s) of dispatch %zu failed", n->what,
                   p->kernel, name, i);
  }
  return computes ? mp_publish_symbols(n, i, err) : MLPACK_OK;
}

mlpack_status mp_native_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  mp_native *n = (mp_native *)x;
  n->prof_runs++;
  mlpack_status st = mp_read_symbols(n, run, err);
  if (st == MLPACK_OK) st = mp_grow_arena(n, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.buffer_count; i++) st = mp_resolve_buffer(n, run, i, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.dispatch_count; i++) st = mp_dispatch(n, run, i, err);
  /* an output sized at run time that no dispatch bound (a plan that never writes it) */
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.buffer_count; i++)
    if (!n->bases[i] && n->plan.buffers[i].kind == MP_BUF_OUTPUT && n->plan.buffers[i].shape)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: no dispatch writes output %zu", n->what, n->plan.buffers[i].index);
  return st;
}

static const double *mp_prof_sort_key;

static int mp_prof_order(const void *a, const void *b) {
  double x = mp_prof_sort_key[*(const size_t *)a], y = mp_prof_sort_key[*(const size_t *)b];
  return (x < y) - (x > y);
}

/* the MLPACK_PROFILE table, on stderr: dispatches by total time, the top ones first */
static void mp_profile_print(const mp_native *n) {
  if (!n->prof_seconds || n->prof_runs == 0 || !n->table) return;
  size_t *order = malloc(n->plan.dispatch_count * sizeof *order);
  if (!order) return;
  double total = 0;
  for (size_t i = 0; i < n->plan.dispatch_count; i++) { order[i] = i; total += n->prof_seconds[i]; }
  mp_prof_sort_key = n->prof_seconds;   /* qsort has no context argument in C11 */
  qsort(order, n->plan.dispatch_count, sizeof *order, mp_prof_order);
  fprintf(stderr, "mlpack profile: %s, %zu runs, %.3f ms per run in %zu dispatches\n", n->what,
          n->prof_runs, 1e3 * total / (double)n->prof_runs, n->plan.dispatch_count);
  fprintf(stderr, "%9s %6s %8s  %s\n", "ms/run", "%", "groups", "dispatch: kernel");
  for (size_t r = 0; r < n->plan.dispatch_count; r++) {
    size_t i = order[r];
    uint32_t k = n->plan.dispatches[i].kernel;
    const char *name = n->table->names && k < n->table->kernel_count && n->table->names[k]
                           ? n->table->names[k] : "?";
    fprintf(stderr, "%9.3f %6.1f %8lld  %zu: %s\n", 1e3 * n->prof_seconds[i] / (double)n->prof_runs,
            total > 0 ? 100.0 * n->prof_seconds[i] / total : 0.0, (long long)n->prof_groups[i], i, name);
  }
  free(order);
}

void mp_native_close(mp_executor *x) {
  mp_native *n = (mp_native *)x;
  if (!n) return;
  mp_profile_print(n);
  free(n->prof_seconds);
  free(n->prof_groups);
  mp_plan_free(&n->plan);
  free(n->bases);
  free(n->bind);
  free(n->names_now);
  free(n->push);
  free(n->arena);
  if (n->have_weights) mp_tensors_close(&n->weights);
  mp_library_unload(n->lib);
  free(n);
}

/* A run's scratch, sized by the plan: push constants, the symbols' names as expressions see
 * them, every buffer's base address and one dispatch's bindings. */
static mlpack_status mp_alloc_scratch(mp_native *n, mlpack_error **err) {
  n->push = calloc(n->plan.symbol_count + 1, sizeof *n->push);
  n->names_now = calloc(n->plan.symbol_count + 1, sizeof *n->names_now);
  n->bases = calloc(n->plan.buffer_count + 1, sizeof *n->bases);
  n->bind = calloc(n->plan.max_bindings + 1, sizeof *n->bind);
  if (!n->push || !n->names_now || !n->bases || !n->bind)
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
  return MLPACK_OK;
}

mlpack_status mp_native_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err) {
  *out = NULL;
  mp_native *n = calloc(1, sizeof *n);
  if (!n) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  n->model = m;
  snprintf(n->what, sizeof n->what, "artifact %zu (%s %s%s%s)", a->index, a->device ? a->device : "?",
           a->architecture ? a->architecture : "", a->variant && *a->variant ? " " : "",
           a->variant ? a->variant : "");
  mlpack_status st = mp_library_load(a->code.data, a->code.size, n->what, &n->lib, &n->table, err);
  if (st == MLPACK_OK && a->weights.size > 0) {
    char what[128];
    snprintf(what, sizeof what, "%s weights", n->what);
    st = mp_tensors_open(&a->weights, what, &n->weights, err);
    n->have_weights = st == MLPACK_OK;
  }
  if (st == MLPACK_OK)
    st = mp_plan_parse(mp_json_get(a->config, "plan"), m, n->table->kernel_count,
                       n->have_weights ? &n->weights : NULL, n->what, &n->plan, err);
  if (st == MLPACK_OK) st = mp_alloc_scratch(n, err);
  const char *prof = getenv("MLPACK_PROFILE");
  if (st == MLPACK_OK && prof && *prof && strcmp(prof, "0") != 0 && n->plan.dispatch_count > 0) {
    n->prof_seconds = calloc(n->plan.dispatch_count, sizeof *n->prof_seconds);
    n->prof_groups = calloc(n->plan.dispatch_count, sizeof *n->prof_groups);
    if (!n->prof_seconds || !n->prof_groups)
      st = mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for MLPACK_PROFILE", n->what);
  }
  if (st != MLPACK_OK) { mp_native_close((mp_executor *)n); return st; }
  *out = (mp_executor *)n;
  return MLPACK_OK;
}
