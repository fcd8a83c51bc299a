/* native.c: the native CPU executor: runs a cpu artifact's plan on the thread pool
 * (spec/SPEC.md section 7; its row in the executor table is application/vnd.mlpack.code.elf.v1).
 *
 * At open: the kernel library is loaded from memory (loader.c) and the weights archive is opened,
 * each from the engine's own copy of its blob, hashed as read (mp_blob_copy: what runs is what was
 * verified, whatever happens to the file), and the config's "plan" is parsed and
 * checked against the kernel table and the signature (plan.c). At run: symbols are read from the
 * input shapes (symbol_sources), the arena is grown if the symbols need more (64-byte aligned,
 * kept between runs), every buffer's base address is resolved, and the dispatches run in order,
 * each spread over the pool; mp_pool_run returns after the last workgroup, which is the barrier
 * between dispatches.
 *
 * Runs may overlap: the executor (library, table, plan, weights) is only read while running, and
 * everything a run writes (arena, push constants, base addresses, bindings, profile counts) is a
 * scratch context taken from the executor's free list (under its mutex; one spare context is
 * swapped in and out with an atomic exchange, no lock) and returned after, so runs on N threads
 * at once use N scratch contexts and a lone caller always reuses the same one.
 * The pool is the run's (run->pool, leased in api_run.c): NULL when another run holds it, and
 * then the dispatches run on the calling thread.
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
 * Packed weights (plan ABI 1.4): the weights layer holds the model's weights as they are, the
 * same bytes for every target; what a target reads in another form (a GEMM's packed panels, a
 * weight relaid out) its "prepare" dispatches compute once, here at open, into the executor's
 * packed region, after the weights were read and hashed. Then every run reads the region. A
 * weight that only prepare dispatches read is not needed again: the pages it fills in the
 * engine's copy are given back to the system as soon as the last prepare dispatch reading it
 * has run (madvise), so a model's weights are resident about once, not twice.
 *
 * MLPACK_PROFILE=1 in the environment times every dispatch (wall clock around the pool run) and
 * prints, when the model is closed, one line per dispatch sorted by total time: where a model's
 * time goes, kernel by kernel. A scratch context counts its own runs; they are added to the
 * executor's totals when it is returned.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE   /* madvise */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
  uint8_t *weights_copy;           /* the weights the plan binds: the engine's verified copy */
  size_t weights_size;
  uint8_t *packed;                 /* ABI 1.4: the region the prepare dispatches wrote */
  double prepare_seconds;          /* (MLPACK_PROFILE) */
  mp_plan plan;
  int keeps_sizes;                 /* no symbol a dispatch computes: a run's sizes hold for the
                                      next run at the same symbols (mp_scratch.last_push) */
  pthread_mutex_t mu;              /* guards idle and the profile totals */
  struct mp_scratch *idle;         /* scratch contexts no run holds */
  _Atomic(struct mp_scratch *) spare;  /* one more, taken and given back without the lock */
  /* MLPACK_PROFILE: per dispatch, total seconds and the last workgroup count */
  double *prof_seconds;
  int64_t *prof_groups;
  size_t prof_runs;
} mp_native;

/* One run's scratch, sized by the plan. */
typedef struct mp_scratch {
  const mp_native *n;
  struct mp_scratch *next;         /* in the executor's idle list */
  void *arena;
  size_t arena_cap;
  int64_t *push;                   /* the symbols' values, in the plan's order */
  const char **names_now;          /* symbols as plan expressions see them: NULL until known */
  void **bases;                    /* every buffer's base address */
  void **bind;                     /* one dispatch's bindings */
  double *prof_seconds;            /* MLPACK_PROFILE: as the executor's, since last returned */
  int64_t *prof_groups;
  size_t prof_runs;
  /* The sizes of the last run that succeeded, reused by a run at the same symbols: each
   * dispatch's workgroup count and the arena buffers' bases (the plan's expressions, trees
   * of JSON evaluated by name, took 6% of MobileNetV3's run at a dynamic batch). Only where
   * every symbol comes from an input's shape: a symbol a dispatch computes may change. */
  int64_t *last_push;
  int64_t *groups;
  int have_last;
} mp_scratch;

typedef struct mp_job {
  mlpack_kernel_fn fn;
  mlpack_dispatch d;
  mlpack_kernel_error error;
  atomic_int failed;
} mp_job;

static mlpack_status mp_eval(const mp_scratch *s, const mp_json *e, const char *what, int64_t *out,
                             mlpack_error **err) {
  const mp_native *n = s->n;
  mlpack_status st = mp_expr_eval(e, s->names_now, s->push, n->plan.symbol_count, out, err);
  if (st != MLPACK_OK) return st;
  if (*out < 0)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: plan %s evaluates to %lld", n->what, what, (long long)*out);
  return MLPACK_OK;
}

static mlpack_status mp_read_symbols(mp_scratch *s, const mp_run *run, mlpack_error **err) {
  const mp_native *n = s->n;
  for (size_t i = 0; i < n->plan.symbol_count; i++) {
    int computed = n->plan.src_dispatch[i] != SIZE_MAX;
    s->push[i] = computed ? 0 : run->in_shapes[n->plan.src_input[i] * 8 + n->plan.src_axis[i]];
    s->names_now[i] = computed ? NULL : n->plan.symbols[i];   /* unknown until its dispatch ran */
  }
  for (size_t k = 0; k < n->plan.source_count; k++) {   /* every other source must agree */
    size_t i = n->plan.sources[k][0], in = n->plan.sources[k][1], ax = n->plan.sources[k][2];
    int64_t v = run->in_shapes[in * 8 + ax];
    if (v != s->push[i]) {
      const mp_sig *a = &n->model->inputs[in], *f = &n->model->inputs[n->plan.src_input[i]];
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, but input '%s' bound %s=%lld",
                     a->name, a->dim_names[ax], (long long)v, f->name, n->plan.symbols[i], (long long)s->push[i]);
    }
  }
  return MLPACK_OK;
}

static mlpack_status mp_grow_arena(mp_scratch *s, mlpack_error **err) {
  const mp_native *n = s->n;
  int64_t size = 0;
  if (n->plan.arena_size) {
    mlpack_status st = mp_eval(s, n->plan.arena_size, "arena_size", &size, err);
    if (st != MLPACK_OK) return st;
  }
  if ((uint64_t)size <= s->arena_cap && s->arena) return MLPACK_OK;
  free(s->arena);
  s->arena = NULL;
  s->arena_cap = 0;
  size_t bytes = ((size_t)size + n->plan.arena_align - 1) / n->plan.arena_align * n->plan.arena_align;
  if (posix_memalign(&s->arena, n->plan.arena_align, bytes ? bytes : n->plan.arena_align) != 0) {
    s->arena = NULL;
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate the %lld-byte arena", n->what, (long long)size);
  }
  s->arena_cap = bytes;
  return MLPACK_OK;
}

/* Buffer i's base for this run; `same`: the last run's symbols, so an arena buffer keeps its
 * base (the arena was not regrown: its size is theirs). */
static mlpack_status mp_resolve_buffer(mp_scratch *s, const mp_run *run, size_t i, int same,
                                       mlpack_error **err) {
  const mp_native *n = s->n;
  const mp_plan_buffer *b = &n->plan.buffers[i];
  int64_t off, size;
  mlpack_status st;
  switch (b->kind) {
  case MP_BUF_INPUT: s->bases[i] = (void *)run->inputs[b->index]; return MLPACK_OK;
  case MP_BUF_OUTPUT:
    s->bases[i] = NULL;
    if (!run->outputs[b->index] && b->shape) return MLPACK_OK;  /* allocated when first bound */
    if (!run->outputs[b->index])
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: output %zu has a data-dependent shape, which plans cannot produce",
                     n->what, b->index);
    s->bases[i] = run->outputs[b->index];
    return MLPACK_OK;
  case MP_BUF_WEIGHT: s->bases[i] = (void *)b->weight; return MLPACK_OK;
  case MP_BUF_PACKED: s->bases[i] = n->packed + b->packed_offset; return MLPACK_OK;
  default:
    if (same) return MLPACK_OK;
    st = mp_eval(s, b->offset, "arena offset", &off, err);
    if (st == MLPACK_OK) st = mp_eval(s, b->size, "arena size", &size, err);
    if (st != MLPACK_OK) return st;
    if ((uint64_t)off > s->arena_cap || (uint64_t)size > s->arena_cap - (uint64_t)off)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (arena %lld+%lld) is outside the %zu-byte arena",
                     n->what, i, (long long)off, (long long)size, s->arena_cap);
    s->bases[i] = (uint8_t *)s->arena + off;
    return MLPACK_OK;
  }
}

static void mp_job_run(void *ctx, uint32_t w) {
  mp_job *job = ctx;
  if (job->fn(&job->d, w) != 0) atomic_store_explicit(&job->failed, 1, memory_order_relaxed);
}

/* An output sized at run time, allocated now that the symbols its shape names are known. */
static mlpack_status mp_resolve_output(mp_scratch *s, const mp_run *run, size_t i, mlpack_error **err) {
  const mp_plan_buffer *b = &s->n->plan.buffers[i];
  int64_t shape[8] = {0};
  for (size_t d = 0; d < b->shape->length && d < 8; d++) {
    mlpack_status st = mp_eval(s, b->shape->items[d], "output shape", &shape[d], err);
    if (st != MLPACK_OK) return st;
  }
  return mp_run_output(run, b->index, shape, &s->bases[i], err);
}

/* After dispatch i: the symbols it computes, checked against their bounds, become known. */
static mlpack_status mp_publish_symbols(mp_scratch *s, size_t i, mlpack_error **err) {
  const mp_native *n = s->n;
  for (size_t k = 0; k < n->plan.symbol_count; k++) {
    if (n->plan.src_dispatch[k] != i) continue;
    int64_t v = s->push[k], bound;
    mlpack_status st = mp_eval(s, n->plan.src_bound[k], "symbol bound", &bound, err);
    if (st != MLPACK_OK) return st;
    if (v < 0 || v > bound)
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu computed %s=%lld, outside its bound 0..%lld",
                     n->what, i, n->plan.symbols[k], (long long)v, (long long)bound);
    s->names_now[k] = n->plan.symbols[k];
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

/* Dispatch i of the run (p is plan.dispatches + i), or, with `prepare`, prepare dispatch i
 * (plan.prepare + i: no symbols, no outputs, not profiled). `same`: the last run's symbols,
 * whose workgroup count it keeps. */
static mlpack_status mp_dispatch(mp_scratch *s, const mp_run *run, const mp_plan_dispatch *p, size_t i,
                                 int prepare, int same, mlpack_error **err) {
  const mp_native *n = s->n;
  int64_t groups;
  mlpack_status st = MLPACK_OK;
  if (same) groups = s->groups[i];
  else st = mp_eval(s, p->workgroups, "workgroups", &groups, err);
  if (st != MLPACK_OK) return st;
  if (!prepare) s->groups[i] = groups;
  if (groups > (int64_t)UINT32_MAX)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: %s %zu has %lld workgroups", n->what,
                   prepare ? "prepare dispatch" : "dispatch", i, (long long)groups);
  int computes = 0;
  for (size_t k = 0; !prepare && k < n->plan.symbol_count; k++) computes |= n->plan.src_dispatch[k] == i;
  if (computes && groups != 1)   /* one writer of the push slots, no race */
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: dispatch %zu computes a symbol but has %lld workgroups, not 1",
                   n->what, i, (long long)groups);
  for (size_t k = 0; k < p->binding_count; k++) {
    size_t j = p->bindings[k];
    if (!s->bases[j] && n->plan.buffers[j].kind == MP_BUF_OUTPUT && n->plan.buffers[j].shape) {
      st = mp_resolve_output(s, run, j, err);
      if (st != MLPACK_OK) return st;
    }
    s->bind[k] = s->bases[j];
  }
  mp_job job = {.fn = n->table->kernels[p->kernel],
                .d = {.bindings = s->bind, .push = s->push, .workgroup_count = (uint32_t)groups}};
  job.d.error = &job.error;   /* (zeroed with job) */
  atomic_init(&job.failed, 0);
  struct timespec t0, t1;
  if (s->prof_seconds) clock_gettime(CLOCK_MONOTONIC, &t0);
  mp_pool_run(run->pool, (uint32_t)groups, mp_job_run, &job);
  if (s->prof_seconds && !prepare) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s->prof_seconds[i] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    s->prof_groups[i] = groups;
  }
  if (job.error.claimed) return mp_index_fail(n, p, i, &job.error, err);
  if (atomic_load(&job.failed)) {
    const char *name = n->table->names && n->table->names[p->kernel] ? n->table->names[p->kernel] : "?";
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: kernel %u (%s) of %s %zu failed", n->what,
                   p->kernel, name, prepare ? "prepare dispatch" : "dispatch", i);
  }
  return computes ? mp_publish_symbols(s, i, err) : MLPACK_OK;
}

static void mp_scratch_free(mp_scratch *s) {
  if (!s) return;
  free(s->arena);
  free(s->push);
  free(s->names_now);
  free(s->bases);
  free(s->bind);
  free(s->prof_seconds);
  free(s->prof_groups);
  free(s->last_push);
  free(s->groups);
  free(s);
}

/* A new scratch context: push constants, the symbols' names as expressions see them, every
 * buffer's base address, one dispatch's bindings (and, profiling, its own counts). The arena
 * is allocated by the first run, at the size its symbols need. */
static mlpack_status mp_scratch_new(const mp_native *n, mp_scratch **out, mlpack_error **err) {
  mp_scratch *s = calloc(1, sizeof *s);
  int ok = s != NULL;
  if (ok) {
    s->n = n;
    s->push = calloc(n->plan.symbol_count + 1, sizeof *s->push);
    s->names_now = calloc(n->plan.symbol_count + 1, sizeof *s->names_now);
    s->bases = calloc(n->plan.buffer_count + 1, sizeof *s->bases);
    s->bind = calloc(n->plan.max_bindings + 1, sizeof *s->bind);
    s->last_push = calloc(n->plan.symbol_count + 1, sizeof *s->last_push);
    s->groups = calloc(n->plan.dispatch_count + 1, sizeof *s->groups);
    ok = s->push && s->names_now && s->bases && s->bind && s->last_push && s->groups;
  }
  if (ok && n->prof_seconds) {
    s->prof_seconds = calloc(n->plan.dispatch_count, sizeof *s->prof_seconds);
    s->prof_groups = calloc(n->plan.dispatch_count, sizeof *s->prof_groups);
    ok = s->prof_seconds && s->prof_groups;
  }
  if (!ok) {
    mp_scratch_free(s);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for a run's scratch", n->what);
  }
  *out = s;
  return MLPACK_OK;
}

/* An idle scratch context, or a new one when every one is in a run. A lone caller takes and
 * gives back the spare one: an exchange each way, no lock. */
static mlpack_status mp_scratch_take(mp_native *n, mp_scratch **out, mlpack_error **err) {
  mp_scratch *s = atomic_exchange_explicit(&n->spare, NULL, memory_order_acquire);
  if (!s) {
    pthread_mutex_lock(&n->mu);
    s = n->idle;
    if (s) n->idle = s->next;
    pthread_mutex_unlock(&n->mu);
  }
  if (s) {
    *out = s;
    return MLPACK_OK;
  }
  return mp_scratch_new(n, out, err);
}

static void mp_scratch_return(mp_native *n, mp_scratch *s) {
  mp_scratch *none = NULL;
  if (!s->prof_seconds && atomic_compare_exchange_strong_explicit(&n->spare, &none, s, memory_order_release,
                                                                  memory_order_relaxed))
    return;
  pthread_mutex_lock(&n->mu);
  if (s->prof_seconds) {   /* the profile totals are the executor's: its counts move there */
    for (size_t i = 0; i < n->plan.dispatch_count; i++) {
      n->prof_seconds[i] += s->prof_seconds[i];
      if (s->prof_groups[i]) n->prof_groups[i] = s->prof_groups[i];
      s->prof_seconds[i] = 0;
    }
    n->prof_runs += s->prof_runs;
    s->prof_runs = 0;
  }
  s->next = n->idle;
  n->idle = s;
  pthread_mutex_unlock(&n->mu);
}

mlpack_status mp_native_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  mp_native *n = (mp_native *)x;
  mp_scratch *s;
  mlpack_status st = mp_scratch_take(n, &s, err);
  if (st != MLPACK_OK) return st;
  s->prof_runs++;
  st = mp_read_symbols(s, run, err);
  size_t push_bytes = n->plan.symbol_count * sizeof *s->push;
  int same = st == MLPACK_OK && n->keeps_sizes && s->have_last &&
             !memcmp(s->push, s->last_push, push_bytes);
  s->have_last = 0;
  if (st == MLPACK_OK && !same) st = mp_grow_arena(s, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.buffer_count; i++)
    st = mp_resolve_buffer(s, run, i, same, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.dispatch_count; i++)
    st = mp_dispatch(s, run, &n->plan.dispatches[i], i, 0, same, err);
  /* an output sized at run time that no dispatch bound (a plan that never writes it) */
  for (size_t i = 0; st == MLPACK_OK && i < n->plan.buffer_count; i++)
    if (!s->bases[i] && n->plan.buffers[i].kind == MP_BUF_OUTPUT && n->plan.buffers[i].shape)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: no dispatch writes output %zu", n->what, n->plan.buffers[i].index);
  if (st == MLPACK_OK && n->keeps_sizes) {
    memcpy(s->last_push, s->push, push_bytes);
    s->have_last = 1;
  }
  mp_scratch_return(n, s);
  return st;
}

/* the MLPACK_PROFILE table, on stderr: dispatches by total time, the top ones first */
static void mp_profile_print(const mp_native *n) {
  if (n->prof_seconds && n->plan.prepare_count)
    fprintf(stderr, "mlpack profile: %s prepared its packed weights (%zu bytes, %zu dispatches) at open "
            "in %.3f ms\n", n->what, n->plan.packed_size, n->plan.prepare_count, 1e3 * n->prepare_seconds);
  if (!n->prof_seconds || n->prof_runs == 0 || !n->table) return;
  size_t *order = malloc(n->plan.dispatch_count * sizeof *order);
  if (!order) return;
  double total = 0;
  for (size_t i = 0; i < n->plan.dispatch_count; i++) {   /* insertion sort: no global for qsort */
    size_t j = i;
    for (; j > 0 && n->prof_seconds[order[j - 1]] < n->prof_seconds[i]; j--) order[j] = order[j - 1];
    order[j] = i;
    total += n->prof_seconds[i];
  }
  fprintf(stderr, "mlpack profile: %s, %zu runs, %.3f ms per run in %zu dispatches\n", n->what,
          n->prof_runs, 1e3 * total / (double)n->prof_runs, n->plan.dispatch_count);
  fprintf(stderr, "%9s %6s %8s  %s\n", "ms/run", "%", "groups", "dispatch: kernel");
  for (size_t r = 0; r < n->plan.dispatch_count; r++) {
    size_t i = order[r];
    uint32_t k = n->plan.dispatches[i].kernel;
    const char *name = n->table->names && k < n->table->kernel_count && n->table->names[k]
                           ? n->table->names[k] : "?";
    fprintf(stderr, "%9.4f %6.1f %8lld  %zu: %s\n", 1e3 * n->prof_seconds[i] / (double)n->prof_runs,
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
  mp_scratch_free(atomic_load(&n->spare));   /* (no run is inside: every scratch context is idle) */
  while (n->idle) {
    mp_scratch *s = n->idle;
    n->idle = s->next;
    mp_scratch_free(s);
  }
  pthread_mutex_destroy(&n->mu);
  if (n->have_weights) mp_tensors_close(&n->weights);
  free(n->weights_copy);
  free(n->packed);
  mp_library_unload(n->lib);
  free(n);
}

/* Whether buffer j (a weight) is bound by a run's dispatch, or by a prepare dispatch after the
 * first `after`: then its bytes are still needed. */
static int mp_weight_needed(const mp_plan *p, size_t j, size_t after) {
  for (size_t i = 0; i < p->dispatch_count; i++)
    for (size_t k = 0; k < p->dispatches[i].binding_count; k++)
      if (p->dispatches[i].bindings[k] == j) return 1;
  for (size_t i = after; i < p->prepare_count; i++)
    for (size_t k = 0; k < p->prepare[i].binding_count; k++)
      if (p->prepare[i].bindings[k] == j) return 1;
  return 0;
}

/* Give back the whole pages of the engine's weight copy that only weight buffer j fills,
 * unless another weight buffer still needed (a run's, or a later prepare dispatch's) overlaps
 * them. The pages read as zeros after, and nothing reads them. */
static void mp_release_weight(mp_native *n, size_t j, size_t after) {
  const mp_plan *p = &n->plan;
  const mp_tensor_entry *e = n->have_weights ? mp_tensors_find(&n->weights, p->buffers[j].name) : NULL;
  if (!e || mp_weight_needed(p, j, after)) return;
  uintptr_t page = 4096, base = (uintptr_t)n->weights_copy;
  uintptr_t lo = ((uintptr_t)e->data + page - 1) / page * page;
  uintptr_t hi = ((uintptr_t)e->data + e->nbytes) / page * page;
  if (lo < base || hi > base + n->weights_size || lo >= hi) return;
  for (size_t k = 0; k < p->buffer_count; k++) {   /* (another name over the same bytes) */
    if (k == j || p->buffers[k].kind != MP_BUF_WEIGHT || !mp_weight_needed(p, k, after)) continue;
    uintptr_t a = (uintptr_t)p->buffers[k].weight, b2 = a;
    const mp_tensor_entry *o = mp_tensors_find(&n->weights, p->buffers[k].name);
    if (o) b2 = a + o->nbytes;
    if (a < hi && b2 > lo) return;
  }
  madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ABI 1.4: run the prepare dispatches once, on the model's pool (no run holds it yet), into a
 * new packed region, giving back each weight's pages after the last one reading it. */
static mlpack_status mp_prepare(mp_native *n, mp_pool *pool, mlpack_error **err) {
  const mp_plan *p = &n->plan;
  if (posix_memalign((void **)&n->packed, 64, p->packed_size ? p->packed_size : 64) != 0) {
    n->packed = NULL;
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate the %zu-byte packed region", n->what,
                   p->packed_size);
  }
  mp_scratch *s = n->idle;
  for (size_t i = 0; i < p->buffer_count; i++) {
    s->bases[i] = NULL;
    if (p->buffers[i].kind == MP_BUF_WEIGHT) s->bases[i] = (void *)p->buffers[i].weight;
    if (p->buffers[i].kind == MP_BUF_PACKED) s->bases[i] = n->packed + p->buffers[i].packed_offset;
  }
  for (size_t i = 0; i < p->symbol_count; i++) s->names_now[i] = NULL;   /* no symbol is known */
  mp_run run = {.model = n->model, .pool = mp_pool_acquire(pool)};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  mlpack_status st = MLPACK_OK;
  for (size_t i = 0; st == MLPACK_OK && i < p->prepare_count; i++) {
    st = mp_dispatch(s, &run, &p->prepare[i], i, 1, 0, err);
    for (size_t k = 0; st == MLPACK_OK && k < p->prepare[i].binding_count; k++) {
      size_t j = p->prepare[i].bindings[k];
      if (p->buffers[j].kind == MP_BUF_WEIGHT) mp_release_weight(n, j, i + 1);
    }
  }
  mp_pool_release(run.pool);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  n->prepare_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return st;
}

mlpack_status mp_native_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err) {
  *out = NULL;
  mp_native *n = calloc(1, sizeof *n);
  if (!n) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&n->mu, NULL);
  atomic_init(&n->spare, NULL);
  n->model = m;
  snprintf(n->what, sizeof n->what, "artifact %zu (%s %s%s%s)", a->index, a->device ? a->device : "?",
           a->architecture ? a->architecture : "", a->variant && *a->variant ? " " : "",
           a->variant ? a->variant : "");
  /* what is loaded is what was hashed: the engine's own copies, never the file's mapping */
  uint8_t *code = NULL;
  mlpack_status st = mp_blob_copy(m->container, &a->code, n->what, &code, err);
  if (st == MLPACK_OK) st = mp_library_load(code, a->code.size, n->what, &n->lib, &n->table, err);
  free(code);
  if (st == MLPACK_OK && a->weights.size > 0) {
    char what[128];
    snprintf(what, sizeof what, "%s weights", n->what);
    st = mp_blob_copy(m->container, &a->weights, what, &n->weights_copy, err);
    n->weights_size = a->weights.size;
    mp_blob weights = a->weights;
    weights.data = n->weights_copy;
    if (st == MLPACK_OK) st = mp_tensors_open(&weights, what, &n->weights, err);
    n->have_weights = st == MLPACK_OK;
  }
  if (st == MLPACK_OK)
    st = mp_plan_parse(mp_json_get(a->config, "plan"), m, n->table,
                       n->have_weights ? &n->weights : NULL, n->what, &n->plan, err);
  n->keeps_sizes = st == MLPACK_OK;   /* (as cuda.c's graphable) */
  for (size_t i = 0; n->keeps_sizes && i < n->plan.symbol_count; i++)
    n->keeps_sizes = n->plan.src_dispatch[i] == SIZE_MAX;
  const char *prof = getenv("MLPACK_PROFILE");
  if (st == MLPACK_OK && prof && *prof && strcmp(prof, "0") != 0 && n->plan.dispatch_count > 0) {
    n->prof_seconds = calloc(n->plan.dispatch_count, sizeof *n->prof_seconds);
    n->prof_groups = calloc(n->plan.dispatch_count, sizeof *n->prof_groups);
    if (!n->prof_seconds || !n->prof_groups)
      st = mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for MLPACK_PROFILE", n->what);
  }
  if (st == MLPACK_OK) st = mp_scratch_new(n, &n->idle, err);   /* the first run's, made now */
  if (st == MLPACK_OK && n->plan.prepare_count) st = mp_prepare(n, m->pool, err);
  if (st != MLPACK_OK) { mp_native_close((mp_executor *)n); return st; }
  *out = (mp_executor *)n;
  return MLPACK_OK;
}
