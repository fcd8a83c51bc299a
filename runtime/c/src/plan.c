/* plan.c: the native executor: runs a cpu artifact's plan (spec/SPEC.md section 7).
 *
 * At create: the kernel library is loaded from memory (loader.c), the config's "plan" is parsed
 * and checked against the kernel table and the signature, and weights are looked up by name in
 * the weights archive (they stay in the file's mapping, never copied). At run: symbols are read
 * from the input shapes (symbol_sources), the arena is grown if the symbols need more (64-byte
 * aligned, kept between runs), every buffer's base address is resolved, and the dispatches run
 * in order, each spread over the pool; mp_pool_run returns after the last workgroup, which is
 * the barrier between dispatches.
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

#include "engine.h"

enum { MP_BUF_INPUT, MP_BUF_OUTPUT, MP_BUF_WEIGHT, MP_BUF_ARENA };

typedef struct mp_buffer {
  int kind;
  size_t index;                    /* input / output index */
  const void *weight;              /* weight data (in the mapping) */
  const mp_json *offset, *size;    /* arena slice */
  const mp_json *shape;            /* output: its dims' expressions (ONNX order), or NULL */
} mp_buffer;

typedef struct mp_dispatch_plan {
  uint32_t kernel;
  const mp_json *workgroups;
  size_t *bindings;
  size_t binding_count;
  const mp_json *checks;           /* ABI 1.2: what each index check of the kernel indexes, or NULL */
} mp_dispatch_plan;

typedef struct mp_native {
  mp_executor base;
  mlpack_model *model;
  char what[96];                   /* "artifact 2 (cpu x86_64)" for messages */
  mp_library *lib;
  const mlpack_kernel_table *table;
  mp_tensor_archive weights;
  int have_weights;
  const char **symbols;            /* push-constant order */
  size_t *src_input, *src_axis;    /* symbol_sources, per symbol (the first one) */
  size_t symbol_count;
  size_t (*sources)[3];            /* every symbol_sources entry: symbol, input, axis */
  size_t source_count;
  size_t *src_dispatch;            /* per symbol: the dispatch computing it, or SIZE_MAX */
  const mp_json **src_bound;       /* per computed symbol: its bound */
  const char **names_now;          /* symbols as plan expressions see them: NULL until known */
  mp_buffer *buffers;
  size_t buffer_count;
  mp_dispatch_plan *dispatches;
  size_t dispatch_count;
  const mp_json *arena_size;
  size_t arena_align;
  void *arena;
  size_t arena_cap;
  /* per-run scratch */
  int64_t *push;
  void **bases;
  void **bind;                     /* one dispatch's bindings */
  size_t max_bindings;
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

/* ---------------------------------------------------------------- parsing the plan */

static int mp_json_uint(const mp_json *j, size_t limit, size_t *out) {
  if (!j || j->kind != MP_JSON_NUMBER || !j->is_int || j->integer < 0 || (uint64_t)j->integer >= limit)
    return -1;
  *out = (size_t)j->integer;
  return 0;
}

static const mp_json *mp_plan_array(const mp_json *plan, const char *key) {
  const mp_json *a = mp_json_get(plan, key);
  return (a && a->kind == MP_JSON_ARRAY) ? a : NULL;
}

static mlpack_status mp_parse_symbols(mp_native *n, const mp_json *plan, mlpack_error **err) {
  const mp_json *syms = mp_plan_array(plan, "symbols");
  const mp_json *srcs = mp_plan_array(plan, "symbol_sources");
  if (!syms) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'symbols' list", n->what);
  n->symbol_count = syms->length;
  n->symbols = calloc(syms->length + 1, sizeof *n->symbols);
  n->src_input = calloc(syms->length + 1, sizeof *n->src_input);
  n->src_axis = calloc(syms->length + 1, sizeof *n->src_axis);
  n->push = calloc(syms->length + 1, sizeof *n->push);
  n->sources = calloc((srcs ? srcs->length : 0) + 1, sizeof *n->sources);
  n->src_dispatch = calloc(syms->length + 1, sizeof *n->src_dispatch);
  n->src_bound = calloc(syms->length + 1, sizeof *n->src_bound);
  n->names_now = calloc(syms->length + 1, sizeof *n->names_now);
  if (!n->symbols || !n->src_input || !n->src_axis || !n->push || !n->sources || !n->src_dispatch ||
      !n->src_bound || !n->names_now)
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
  for (size_t i = 0; i < syms->length; i++) {
    if (syms->items[i]->kind != MP_JSON_STRING)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol %zu is not a string", n->what, i);
    n->symbols[i] = syms->items[i]->string;
    n->src_input[i] = SIZE_MAX;
    n->src_dispatch[i] = SIZE_MAX;
  }
  size_t inputs = 0;
  for (size_t k = 0; srcs && k < srcs->length; k++) {
    const mp_json *s = srcs->items[k];
    const char *name = mp_json_get_string(s, "symbol");
    size_t input, axis, i = 0;
    while (name && i < n->symbol_count && strcmp(n->symbols[i], name) != 0) i++;
    if (name && i < n->symbol_count && mp_json_get(s, "dispatch")) {  /* computed (ABI 1.1) */
      size_t disp;
      n->src_bound[i] = mp_json_get(s, "bound");
      /* the dispatch index is checked against the dispatch list once it is parsed */
      if (mp_json_uint(mp_json_get(s, "dispatch"), SIZE_MAX, &disp) || !n->src_bound[i] ||
          n->src_dispatch[i] != SIZE_MAX || n->src_input[i] != SIZE_MAX)
        return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol_sources entry %zu is malformed", n->what, k);
      n->src_dispatch[i] = disp;
      continue;
    }
    if (!name || i == n->symbol_count || n->src_dispatch[i] != SIZE_MAX ||
        mp_json_uint(mp_json_get(s, "input"), n->model->input_count, &input) ||
        mp_json_uint(mp_json_get(s, "axis"), n->model->inputs[input].rank, &axis))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol_sources entry %zu is malformed", n->what, k);
    if (n->src_input[i] == SIZE_MAX) { n->src_input[i] = input; n->src_axis[i] = axis; }
    n->sources[inputs][0] = i;
    n->sources[inputs][1] = input;
    n->sources[inputs][2] = axis;
    inputs++;
  }
  n->source_count = inputs;
  for (size_t i = 0; i < n->symbol_count; i++)
    if (n->src_input[i] == SIZE_MAX && n->src_dispatch[i] == SIZE_MAX)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol '%s' has no symbol_sources entry",
                     n->what, n->symbols[i]);
  return MLPACK_OK;
}

static mlpack_status mp_parse_weight(mp_native *n, const mp_json *b, mp_buffer *out, size_t i,
                                     mlpack_error **err) {
  const char *name = mp_json_get_string(b, "name");
  if (!name) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (weight) has no name", n->what, i);
  const mp_tensor_entry *e = n->have_weights ? mp_tensors_find(&n->weights, name) : NULL;
  if (!e)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu names weight '%s', which the weights layer lacks",
                   n->what, i, name);
  out->weight = e->data;
  return MLPACK_OK;
}

static mlpack_status mp_parse_buffer(mp_native *n, const mp_json *b, size_t i, mlpack_error **err) {
  mp_buffer *out = &n->buffers[i];
  const char *kind = mp_json_get_string(b, "kind");
  if (!kind) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu has no kind", n->what, i);
  if (strcmp(kind, "input") == 0 || strcmp(kind, "output") == 0) {
    int in = kind[0] == 'i';
    out->kind = in ? MP_BUF_INPUT : MP_BUF_OUTPUT;
    if (mp_json_uint(mp_json_get(b, "index"), in ? n->model->input_count : n->model->output_count, &out->index))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (%s) has a bad index", n->what, i, kind);
    out->shape = in ? NULL : mp_json_get(b, "shape");
    if (out->shape && (out->shape->kind != MP_JSON_ARRAY || out->shape->length != n->model->outputs[out->index].rank))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (output) has a shape that is not one "
                     "expression per dim", n->what, i);
    return MLPACK_OK;
  }
  if (strcmp(kind, "weight") == 0) {
    out->kind = MP_BUF_WEIGHT;
    return mp_parse_weight(n, b, out, i, err);
  }
  if (strcmp(kind, "arena") == 0) {
    out->kind = MP_BUF_ARENA;
    out->offset = mp_json_get(b, "offset");
    out->size = mp_json_get(b, "size");
    if (!out->offset || !out->size)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (arena) needs offset and size", n->what, i);
    return MLPACK_OK;
  }
  return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu has unknown kind '%s'", n->what, i, kind);
}

static mlpack_status mp_parse_buffers(mp_native *n, const mp_json *plan, mlpack_error **err) {
  const mp_json *bufs = mp_plan_array(plan, "buffers");
  if (!bufs) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'buffers' list", n->what);
  n->buffer_count = bufs->length;
  n->buffers = calloc(bufs->length + 1, sizeof *n->buffers);
  n->bases = calloc(bufs->length + 1, sizeof *n->bases);
  if (!n->buffers || !n->bases) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
  for (size_t i = 0; i < bufs->length; i++) {
    mlpack_status st = mp_parse_buffer(n, bufs->items[i], i, err);
    if (st != MLPACK_OK) return st;
  }
  return MLPACK_OK;
}

static mlpack_status mp_parse_dispatch(mp_native *n, const mp_json *j, size_t i, mlpack_error **err) {
  mp_dispatch_plan *d = &n->dispatches[i];
  size_t kernel;
  const mp_json *binds = mp_json_get(j, "bindings");
  d->workgroups = mp_json_get(j, "workgroups");
  if (mp_json_uint(mp_json_get(j, "kernel"), n->table->kernel_count, &kernel))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan dispatch %zu names a kernel the library lacks (it has %u)",
                   n->what, i, n->table->kernel_count);
  if (!d->workgroups || !binds || binds->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan dispatch %zu needs workgroups and bindings", n->what, i);
  d->kernel = (uint32_t)kernel;
  d->checks = mp_json_get(j, "checks");
  if (d->checks && d->checks->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan dispatch %zu has checks that are not a list", n->what, i);
  d->binding_count = binds->length;
  d->bindings = calloc(binds->length + 1, sizeof *d->bindings);
  if (!d->bindings) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
  for (size_t k = 0; k < binds->length; k++)
    if (mp_json_uint(binds->items[k], n->buffer_count, &d->bindings[k]))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan dispatch %zu binding %zu is not a buffer index",
                     n->what, i, k);
  if (binds->length > n->max_bindings) n->max_bindings = binds->length;
  return MLPACK_OK;
}

static mlpack_status mp_parse_dispatches(mp_native *n, const mp_json *plan, mlpack_error **err) {
  const mp_json *ds = mp_plan_array(plan, "dispatches");
  if (!ds) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'dispatches' list", n->what);
  n->dispatch_count = ds->length;
  n->dispatches = calloc(ds->length + 1, sizeof *n->dispatches);
  if (!n->dispatches) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
  for (size_t i = 0; i < ds->length; i++) {
    mlpack_status st = mp_parse_dispatch(n, ds->items[i], i, err);
    if (st != MLPACK_OK) return st;
  }
  n->bind = calloc(n->max_bindings + 1, sizeof *n->bind);
  return n->bind ? MLPACK_OK : mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", n->what);
}

static mlpack_status mp_parse_plan(mp_native *n, const mp_json *plan, mlpack_error **err) {
  if (!plan || plan->kind != MP_JSON_OBJECT)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: the config has no plan", n->what);
  const mp_json *abi = mp_json_get(plan, "abi");
  if (!abi || abi->kind != MP_JSON_NUMBER || !abi->is_int || abi->integer != (int64_t)MLPACK_ABI_VERSION)
    return mp_fail(err, MLPACK_ERR_VERSION, "%s: plan is for kernel ABI %lld, this runtime knows ABI %u",
                   n->what, abi && abi->is_int ? (long long)abi->integer : -1LL, MLPACK_ABI_VERSION);
  const mp_json *minor = mp_json_get(plan, "abi_minor");
  if (minor && (minor->kind != MP_JSON_NUMBER || !minor->is_int || minor->integer < 0 ||
                minor->integer > (int64_t)MLPACK_ABI_MINOR))
    return mp_fail(err, MLPACK_ERR_VERSION, "%s: plan is for kernel ABI %u.%lld, this runtime knows ABI %u.%u",
                   n->what, MLPACK_ABI_VERSION, minor->is_int ? (long long)minor->integer : -1LL,
                   MLPACK_ABI_VERSION, MLPACK_ABI_MINOR);
  n->arena_size = mp_json_get(plan, "arena_size");
  size_t align = 64;
  const mp_json *aj = mp_json_get(plan, "arena_align");
  if (aj && (mp_json_uint(aj, 4097, &align) || align == 0 || (align & (align - 1))))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan arena_align must be a power of two up to 4096", n->what);
  n->arena_align = align < 64 ? 64 : align;
  mlpack_status st = mp_parse_symbols(n, plan, err);
  if (st == MLPACK_OK) st = mp_parse_buffers(n, plan, err);
  if (st == MLPACK_OK) st = mp_parse_dispatches(n, plan, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->symbol_count; i++)
    if (n->src_dispatch[i] != SIZE_MAX && n->src_dispatch[i] >= n->dispatch_count)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol '%s' is computed by dispatch %zu, which the plan lacks",
                   n->what, n->symbols[i], n->src_dispatch[i]);
  return st;
}

/* ---------------------------------------------------------------- running */

static mlpack_status mp_eval(mp_native *n, const mp_json *e, const char *what, int64_t *out,
                             mlpack_error **err) {
  mlpack_status st = mp_expr_eval(e, n->names_now, n->push, n->symbol_count, out, err);
  if (st != MLPACK_OK) return st;
  if (*out < 0)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: plan %s evaluates to %lld", n->what, what, (long long)*out);
  return MLPACK_OK;
}

static mlpack_status mp_read_symbols(mp_native *n, const mp_run *run, mlpack_error **err) {
  for (size_t i = 0; i < n->symbol_count; i++) {
    int computed = n->src_dispatch[i] != SIZE_MAX;
    n->push[i] = computed ? 0 : run->in_shapes[n->src_input[i] * 8 + n->src_axis[i]];
    n->names_now[i] = computed ? NULL : n->symbols[i];   /* unknown until its dispatch ran */
  }
  for (size_t k = 0; k < n->source_count; k++) {   /* every other source must agree */
    size_t i = n->sources[k][0], in = n->sources[k][1], ax = n->sources[k][2];
    int64_t v = run->in_shapes[in * 8 + ax];
    if (v != n->push[i]) {
      const mp_sig *s = &n->model->inputs[in], *f = &n->model->inputs[n->src_input[i]];
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, but input '%s' bound %s=%lld",
                     s->name, s->dim_names[ax], (long long)v, f->name, n->symbols[i], (long long)n->push[i]);
    }
  }
  return MLPACK_OK;
}

static mlpack_status mp_grow_arena(mp_native *n, mlpack_error **err) {
  int64_t size = 0;
  if (n->arena_size) {
    mlpack_status st = mp_eval(n, n->arena_size, "arena_size", &size, err);
    if (st != MLPACK_OK) return st;
  }
  if ((uint64_t)size <= n->arena_cap && n->arena) return MLPACK_OK;
  free(n->arena);
  n->arena = NULL;
  n->arena_cap = 0;
  size_t bytes = ((size_t)size + n->arena_align - 1) / n->arena_align * n->arena_align;
  if (posix_memalign(&n->arena, n->arena_align, bytes ? bytes : n->arena_align) != 0) {
    n->arena = NULL;
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate the %lld-byte arena", n->what, (long long)size);
  }
  n->arena_cap = bytes;
  return MLPACK_OK;
}

static mlpack_status mp_resolve_buffer(mp_native *n, const mp_run *run, size_t i, mlpack_error **err) {
  const mp_buffer *b = &n->buffers[i];
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
  const mp_buffer *b = &n->buffers[i];
  int64_t shape[8] = {0};
  for (size_t d = 0; d < b->shape->length && d < 8; d++) {
    mlpack_status st = mp_eval(n, b->shape->items[d], "output shape", &shape[d], err);
    if (st != MLPACK_OK) return st;
  }
  return mp_run_output(run, b->index, shape, &n->bases[i], err);
}

/* After dispatch i: the symbols it computes, checked against their bounds, become known. */
static mlpack_status mp_publish_symbols(mp_native *n, size_t i, mlpack_error **err) {
  for (size_t k = 0; k < n->symbol_count; k++) {
    if (n->src_dispatch[k] != i) continue;
    int64_t v = n->push[k], bound;
    mlpack_status st = mp_eval(n, n->src_bound[k], "symbol bound", &bound, err);
    if (st != MLPACK_OK) return st;
    if (v < 0 || v > bound)
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu computed %s=%lld, outside its bound 0..%lld",
                     n->what, i, n->symbols[k], (long long)v, (long long)bound);
    n->names_now[k] = n->symbols[k];
  }
  return MLPACK_OK;
}

/* A kernel's report of an index out of range, as the message the interpreters give. */
static mlpack_status mp_index_fail(const mp_native *n, const mp_dispatch_plan *p, size_t i,
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
  const mp_dispatch_plan *p = &n->dispatches[i];
  int64_t groups;
  mlpack_status st = mp_eval(n, p->workgroups, "workgroups", &groups, err);
  if (st != MLPACK_OK) return st;
  if (groups > (int64_t)UINT32_MAX)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: dispatch %zu has %lld workgroups", n->what, i, (long long)groups);
  int computes = 0;
  for (size_t k = 0; k < n->symbol_count; k++) computes |= n->src_dispatch[k] == i;
  if (computes && groups != 1)   /* one writer of the push slots, no race */
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: dispatch %zu computes a symbol but has %lld workgroups, not 1",
                   n->what, i, (long long)groups);
  for (size_t k = 0; k < p->binding_count; k++) {
    size_t j = p->bindings[k];
    if (!n->bases[j] && n->buffers[j].kind == MP_BUF_OUTPUT && n->buffers[j].shape) {
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

static mlpack_status mp_native_run(mp_executor *self, const mp_run *run, mlpack_error **err) {
  mp_native *n = (mp_native *)self;
  n->prof_runs++;
  mlpack_status st = mp_read_symbols(n, run, err);
  if (st == MLPACK_OK) st = mp_grow_arena(n, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->buffer_count; i++) st = mp_resolve_buffer(n, run, i, err);
  for (size_t i = 0; st == MLPACK_OK && i < n->dispatch_count; i++) st = mp_dispatch(n, run, i, err);
  /* an output sized at run time that no dispatch bound (a plan that never writes it) */
  for (size_t i = 0; st == MLPACK_OK && i < n->buffer_count; i++)
    if (!n->bases[i] && n->buffers[i].kind == MP_BUF_OUTPUT && n->buffers[i].shape)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: no dispatch writes output %zu", n->what, n->buffers[i].index);
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
  size_t *order = malloc(n->dispatch_count * sizeof *order);
  if (!order) return;
  double total = 0;
  for (size_t i = 0; i < n->dispatch_count; i++) { order[i] = i; total += n->prof_seconds[i]; }
  mp_prof_sort_key = n->prof_seconds;   /* qsort has no context argument in C11 */
  qsort(order, n->dispatch_count, sizeof *order, mp_prof_order);
  fprintf(stderr, "mlpack profile: %s, %zu runs, %.3f ms per run in %zu dispatches\n", n->what,
          n->prof_runs, 1e3 * total / (double)n->prof_runs, n->dispatch_count);
  fprintf(stderr, "%9s %6s %8s  %s\n", "ms/run", "%", "groups", "dispatch: kernel");
  for (size_t r = 0; r < n->dispatch_count; r++) {
    size_t i = order[r];
    uint32_t k = n->dispatches[i].kernel;
    const char *name = n->table->names && k < n->table->kernel_count && n->table->names[k]
                           ? n->table->names[k] : "?";
    fprintf(stderr, "%9.3f %6.1f %8lld  %zu: %s\n", 1e3 * n->prof_seconds[i] / (double)n->prof_runs,
            total > 0 ? 100.0 * n->prof_seconds[i] / total : 0.0, (long long)n->prof_groups[i], i, name);
  }
  free(order);
}

static void mp_native_destroy(mp_executor *self) {
  mp_native *n = (mp_native *)self;
  if (!n) return;
  mp_profile_print(n);
  free(n->prof_seconds);
  free(n->prof_groups);
  for (size_t i = 0; n->dispatches && i < n->dispatch_count; i++) free(n->dispatches[i].bindings);
  free(n->dispatches);
  free(n->buffers);
  free(n->bases);
  free(n->bind);
  free(n->symbols);
  free(n->src_input);
  free(n->src_axis);
  free(n->sources);
  free(n->src_dispatch);
  free(n->src_bound);
  free(n->names_now);
  free(n->push);
  free(n->arena);
  if (n->have_weights) mp_tensors_close(&n->weights);
  mp_library_unload(n->lib);
  free(n);
}

mlpack_status mp_native_create(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err) {
  *out = NULL;
  mp_native *n = calloc(1, sizeof *n);
  if (!n) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  n->base.run = mp_native_run;
  n->base.destroy = mp_native_destroy;
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
  if (st == MLPACK_OK) st = mp_parse_plan(n, mp_json_get(a->config, "plan"), err);
  const char *prof = getenv("MLPACK_PROFILE");
  if (st == MLPACK_OK && prof && *prof && strcmp(prof, "0") != 0 && n->dispatch_count > 0) {
    n->prof_seconds = calloc(n->dispatch_count, sizeof *n->prof_seconds);
    n->prof_groups = calloc(n->dispatch_count, sizeof *n->prof_groups);
    if (!n->prof_seconds || !n->prof_groups)
      st = mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for MLPACK_PROFILE", n->what);
  }
  if (st != MLPACK_OK) { mp_native_destroy(&n->base); return st; }
  *out = &n->base;
  return MLPACK_OK;
}
