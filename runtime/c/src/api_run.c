/* api_run.c: mlpack_run, the checks between the caller's tensors and the executor.
 *
 * Inputs are matched to the signature by name and checked (dtype, rank, fixed dims, nbytes when
 * given); size symbols are bound from the first input that has them and every later use must
 * agree. Output shapes follow from the signature; an output dim whose symbol no input binds is
 * data-dependent (NonZero, TopK with a dynamic k): its buffer is left NULL and the executor
 * allocates it through mp_run_output once it knows the size.
 *
 * Any number of threads may run one model at once. mlpack_run's outputs (and the shapes both
 * entry points hand back) live in the calling thread's run context, found by pthread_self() in
 * the model's list under run_mu and made on the thread's first run: they stay valid until that
 * thread's next run of the model, whatever other threads run meanwhile, and are freed at close
 * (mp_run_release). A run leases the model's pool for its whole length when no other run holds
 * it, and otherwise runs on its calling thread (pool.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "executor.h"
#include "media.h"

#define MP_MAX_SYMS 64
#define MP_ALIGN 64

typedef struct mp_binding {        /* the symbols of one run */
  const char *names[MP_MAX_SYMS];
  int64_t values[MP_MAX_SYMS];
  const char *bound_by[MP_MAX_SYMS];  /* the input that bound it; NULL while unbound */
  size_t count;
} mp_binding;

static void *mp_alloc_aligned(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, MP_ALIGN, n ? n : MP_ALIGN) != 0) return NULL;  /* never a NULL for 0 */
  return p;
}

static long mp_sym_find(const mp_binding *b, const char *name) {
  for (size_t i = 0; i < b->count; i++)
    if (strcmp(b->names[i], name) == 0) return (long)i;
  return -1;
}

static mlpack_status mp_sym_collect(const mp_sig *sigs, size_t n, mp_binding *b, mlpack_error **err) {
  for (size_t i = 0; i < n; i++)
    for (size_t d = 0; d < sigs[i].rank; d++) {
      const char *s = sigs[i].dim_syms[d];
      if (!s || sigs[i].dim_is_expr[d] || mp_sym_find(b, s) >= 0) continue;  /* (expressions: below) */
      if (b->count == MP_MAX_SYMS)
        return mp_fail(err, MLPACK_ERR_FORMAT, "the signature has more than %d size symbols", MP_MAX_SYMS);
      b->names[b->count++] = s;
    }
  return MLPACK_OK;
}

/* elements * element size, refusing overflow */
static mlpack_status mp_shape_bytes(const int64_t *shape, size_t rank, mlpack_dtype dt, size_t *out) {
  size_t n = mlpack_dtype_size(dt);
  for (size_t d = 0; d < rank; d++) {
    if (shape[d] < 0) return MLPACK_ERR_INPUT;
    if (shape[d] != 0 && n > SIZE_MAX / (uint64_t)shape[d]) return MLPACK_ERR_INPUT;
    n *= (size_t)shape[d];
  }
  *out = n;
  return MLPACK_OK;
}

static const mlpack_tensor *mp_find_input(const mlpack_tensor *ts, size_t n, const char *name,
                                          size_t *count) {
  const mlpack_tensor *hit = NULL;
  *count = 0;
  for (size_t i = 0; i < n; i++)
    if (ts[i].name && strcmp(ts[i].name, name) == 0) {
      if (!hit) hit = &ts[i];
      (*count)++;
    }
  return hit;
}

static mlpack_status mp_check_names(const mlpack_model *m, const mlpack_tensor *ts, size_t n,
                                    mlpack_error **err) {
  for (size_t i = 0; i < n; i++) {
    if (!ts[i].name)
      return mp_fail(err, MLPACK_ERR_INPUT, "input %zu has no name", i);
    size_t k = 0;
    while (k < m->input_count && strcmp(m->inputs[k].name, ts[i].name) != 0) k++;
    if (k == m->input_count) {
      char list[512] = "";
      for (size_t j = 0; j < m->input_count; j++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s'%s'", j ? ", " : "", m->inputs[j].name);
      }
      return mp_fail(err, MLPACK_ERR_INPUT, "unknown input '%s' (the model's inputs: %s)",
                     ts[i].name, list);
    }
  }
  return MLPACK_OK;
}

static mlpack_status mp_bind_dim(const mp_sig *s, size_t d, int64_t size, mp_binding *b,
                                 mlpack_error **err) {
  const char *sym = s->dim_syms[d];
  if (!sym) {
    if (s->dims[d] != size)
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, expected %lld", s->name,
                     s->dim_names[d], (long long)size, (long long)s->dims[d]);
    return MLPACK_OK;
  }
  long k = mp_sym_find(b, sym);
  if (k < 0) return mp_fail(err, MLPACK_ERR_FORMAT, "symbol '%s' is not in the signature", sym);
  if (!b->bound_by[k]) {
    b->values[k] = size;
    b->bound_by[k] = s->name;
  } else if (b->values[k] != size) {
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, but input '%s' bound %s=%lld",
                   s->name, s->dim_names[d], (long long)size, b->bound_by[k], sym,
                   (long long)b->values[k]);
  }
  return MLPACK_OK;
}

static mlpack_status mp_check_input(const mp_sig *s, const mlpack_tensor *t, mp_binding *b,
                                    int64_t *shape_out, mlpack_error **err) {
  if (t->dtype != s->dtype)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' has dtype %s, expected %s", s->name,
                   mlpack_dtype_name(t->dtype), mlpack_dtype_name(s->dtype));
  if (t->rank != s->rank)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' has rank %zu, expected %zu", s->name, t->rank,
                   s->rank);
  if (s->rank > 0 && !t->shape)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' has no shape", s->name);
  for (size_t d = 0; d < s->rank; d++) {
    if (t->shape[d] < 0)
      return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is negative (%lld)", s->name,
                     s->dim_names[d], (long long)t->shape[d]);
    shape_out[d] = t->shape[d];
    mlpack_status st = mp_bind_dim(s, d, t->shape[d], b, err);
    if (st != MLPACK_OK) return st;
  }
  size_t need;
  if (mp_shape_bytes(t->shape, s->rank, s->dtype, &need) != MLPACK_OK)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' is too large", s->name);
  /* nbytes 0 means "not stated" (the C example in mlpack.h leaves it out) */
  if (t->nbytes != 0 && t->nbytes != need)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' has %zu bytes, its shape needs %zu", s->name,
                   t->nbytes, need);
  if (need > 0 && !t->data)
    return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' has no data", s->name);
  return MLPACK_OK;
}

static mlpack_status mp_bind_inputs(const mlpack_model *m, const mlpack_tensor *ts, size_t n,
                                    mp_binding *b, const void **data, int64_t *shapes,
                                    mlpack_error **err) {
  mlpack_status st = mp_check_names(m, ts, n, err);
  for (size_t i = 0; st == MLPACK_OK && i < m->input_count; i++) {
    const mp_sig *s = &m->inputs[i];
    size_t count;
    const mlpack_tensor *t = mp_find_input(ts, n, s->name, &count);
    if (!t) return mp_fail(err, MLPACK_ERR_INPUT, "missing input '%s'", s->name);
    if (count > 1) return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' is given %zu times", s->name, count);
    st = mp_check_input(s, t, b, &shapes[i * 8], err);
    data[i] = t->data;
  }
  return st;
}

/* A calling thread's outputs: those of its last run, and the memory kept for its next. */
struct mp_run_ctx {
  pthread_t owner;
  int busy;                  /* a run of the owner is inside the model (a nested one fails) */
  void **data;               /* the outputs of the owner's last run (owned) */
  int64_t *shapes;           /* output_count x 8 */
  /* each output's allocation while no run holds it, kept for the next run of that size or
   * less (a fresh allocation of megabytes per run costs page faults), and its capacity */
  void **keep;
  size_t *cap;
  mp_run_ctx *next;          /* in the model's list */
};

static void mp_ctx_free(mp_run_ctx *c, size_t outputs) {
  for (size_t i = 0; i < outputs; i++) {
    if (c->data) free(c->data[i]);
    if (c->keep) free(c->keep[i]);
  }
  free(c->data);
  free(c->shapes);
  free(c->keep);
  free(c->cap);
  free(c);
}

void mp_run_release(mlpack_model *m) {
  if (!m) return;
  while (m->runs) {
    mp_run_ctx *c = m->runs;
    m->runs = c->next;
    mp_ctx_free(c, m->output_count);
  }
}

/* The last run's outputs go back to the keep list (their memory is reused, not freed). */
static void mp_outputs_clear(const mlpack_model *m, mp_run_ctx *c) {
  for (size_t i = 0; i < m->output_count; i++) {
    if (c->data[i]) {
      c->keep[i] = c->data[i];
      c->data[i] = NULL;
    }
  }
}

/* Each thread remembers the context of the model it ran last, so a thread running one model
 * over and over finds its context without the lock. A model is known by its serial number
 * (unique in the process, given with its first context), not only its address: a model opened
 * where a closed one was is another model, whose contexts this thread has not seen. */
static _Thread_local struct { const mlpack_model *model; uint64_t serial; mp_run_ctx *ctx; } mp_last;
static atomic_uint_fast64_t mp_serials;

/* The calling thread's context, made on its first run (the list is searched under the lock;
 * only this thread ever adds its own, so making it needs no lock), marked busy and cleared of
 * the last run's outputs. */
static mlpack_status mp_ctx_enter(mlpack_model *m, mp_run_ctx **out, mlpack_error **err) {
  mp_run_ctx *c = NULL;
  if (mp_last.model == m && mp_last.serial == atomic_load_explicit(&m->run_serial, memory_order_relaxed))
    c = mp_last.ctx;
  pthread_t self = c ? c->owner : pthread_self();
  if (!c) {
    pthread_mutex_lock(&m->run_mu);
    c = m->runs;
    while (c && !pthread_equal(c->owner, self)) c = c->next;
    pthread_mutex_unlock(&m->run_mu);
  }
  if (!c) {
    size_t n = m->output_count ? m->output_count : 1;
    c = calloc(1, sizeof *c);
    if (c) {
      c->owner = self;
      c->data = calloc(n, sizeof *c->data);
      c->shapes = calloc(n * 8, sizeof *c->shapes);
      c->keep = calloc(n, sizeof *c->keep);
      c->cap = calloc(n, sizeof *c->cap);
    }
    if (!c || !c->data || !c->shapes || !c->keep || !c->cap) {
      if (c) mp_ctx_free(c, 0);
      return mp_fail(err, MLPACK_ERR_NOMEM, "mlpack_run: out of memory");
    }
    pthread_mutex_lock(&m->run_mu);
    c->next = m->runs;
    m->runs = c;
    if (atomic_load_explicit(&m->run_serial, memory_order_relaxed) == 0)
      atomic_store_explicit(&m->run_serial, atomic_fetch_add(&mp_serials, 1) + 1, memory_order_relaxed);
    pthread_mutex_unlock(&m->run_mu);
  }
  mp_last.model = m;
  mp_last.serial = atomic_load_explicit(&m->run_serial, memory_order_relaxed);
  mp_last.ctx = c;
  if (c->busy)   /* a kernel or callback running the model again: its outputs are in use */
    return mp_fail(err, MLPACK_ERR_RUNTIME, "mlpack_run: this thread is already inside a run of "
                   "this model");
  c->busy = 1;
  mp_outputs_clear(m, c);
  *out = c;
  return MLPACK_OK;
}

/* Output i's memory for `need` bytes: the kept allocation when it is large enough. */
static void *mp_output_memory(mp_run_ctx *c, size_t i, size_t need) {
  if (c->keep[i] && c->cap[i] >= need) {
    void *p = c->keep[i];
    c->keep[i] = NULL;
    return p;
  }
  free(c->keep[i]);
  c->keep[i] = NULL;
  void *p = mp_alloc_aligned(need);
  c->cap[i] = p ? need : 0;
  return p;
}

/* Shapes of the outputs from the bound symbols; -1 where data decides. A size expression
 * (format 1.1) is evaluated with the bound symbols; one that is negative or overflows is an
 * input error (the inputs' sizes make it so). */
static mlpack_status mp_output_shapes(const mlpack_model *m, const mp_binding *b, int64_t *shapes, int *known,
                                      mlpack_error **err) {
  const char *names[MP_MAX_SYMS];
  int64_t values[MP_MAX_SYMS];
  size_t count = 0;
  for (size_t k = 0; k < b->count; k++)
    if (b->bound_by[k]) names[count] = b->names[k], values[count++] = b->values[k];
  for (size_t i = 0; i < m->output_count; i++) {
    const mp_sig *s = &m->outputs[i];
    known[i] = 1;
    for (size_t d = 0; d < 8; d++) shapes[i * 8 + d] = 0;
    for (size_t d = 0; d < s->rank; d++) {
      int64_t v = s->dims[d];
      if (s->dim_is_expr[d]) {
        const char *why;
        int st = mp_size_eval(s->dim_syms[d], names, values, count, &v, &why);
        if (st == MP_SIZE_BAD_VALUE)
          return mp_fail(err, MLPACK_ERR_INPUT, "output '%s' dim '%s' = %s: %s for these inputs", s->name,
                         s->dim_names[d], s->dim_syms[d], why);
        if (st != MP_SIZE_OK) v = -1;   /* names a symbol only the run computes */
      } else if (s->dim_syms[d]) {
        long k = mp_sym_find(b, s->dim_syms[d]);
        v = (k >= 0 && b->bound_by[k]) ? b->values[k] : -1;
      }
      if (v < 0) known[i] = 0;
      shapes[i * 8 + d] = v;
    }
  }
  return MLPACK_OK;
}

/* Output i's bytes at the shape mp_output_shapes found for it. */
static mlpack_status mp_planned_bytes(const mlpack_model *m, const mp_run_ctx *c, size_t i, size_t *need,
                                      mlpack_error **err) {
  if (mp_shape_bytes(&c->shapes[i * 8], m->outputs[i].rank, m->outputs[i].dtype, need) != MLPACK_OK)
    return mp_fail(err, MLPACK_ERR_INPUT, "output '%s' would be too large", m->outputs[i].name);
  return MLPACK_OK;
}

static mlpack_status mp_alloc_outputs(const mlpack_model *m, mp_run_ctx *c, const int *known,
                                      mlpack_error **err) {
  for (size_t i = 0; i < m->output_count; i++) {
    if (!known[i]) continue;
    size_t need = 0;
    mlpack_status st = mp_planned_bytes(m, c, i, &need, err);
    if (st != MLPACK_OK) return st;
    c->data[i] = mp_output_memory(c, i, need);
    if (!c->data[i])
      return mp_fail(err, MLPACK_ERR_NOMEM, "cannot allocate output '%s' (%zu bytes)",
                     m->outputs[i].name, need);
  }
  return MLPACK_OK;
}

mlpack_status mp_run_output(const mp_run *run, size_t i, const int64_t *shape, void **data,
                            mlpack_error **err) {
  const mlpack_model *m = run->model;
  mp_run_ctx *c = run->ctx;
  if (i >= m->output_count)
    return mp_fail(err, MLPACK_ERR_RUNTIME, "executor set output %zu of %zu", i, m->output_count);
  const mp_sig *s = &m->outputs[i];
  int64_t *have = &c->shapes[i * 8];
  for (size_t d = 0; d < s->rank; d++) {
    if (shape[d] < 0 || (s->dim_syms[d] == NULL && shape[d] != s->dims[d]) ||
        (c->data[i] && shape[d] != have[d]))
      return mp_fail(err, MLPACK_ERR_RUNTIME, "output '%s' dim '%s' came out as %lld, expected %lld",
                     s->name, s->dim_names[d], (long long)shape[d],
                     (long long)(c->data[i] ? have[d] : s->dims[d]));
  }
  if (!c->data[i]) {
    size_t need;
    if (mp_shape_bytes(shape, s->rank, s->dtype, &need) != MLPACK_OK)
      return mp_fail(err, MLPACK_ERR_RUNTIME, "output '%s' is too large", s->name);
    c->data[i] = mp_output_memory(c, i, need);
    if (!c->data[i])
      return mp_fail(err, MLPACK_ERR_NOMEM, "cannot allocate output '%s' (%zu bytes)", s->name, need);
    for (size_t d = 0; d < s->rank; d++) have[d] = shape[d];
  }
  run->outputs[i] = c->data[i];
  *data = c->data[i];
  return MLPACK_OK;
}

static void mp_fill_outputs(const mlpack_model *m, const mp_run_ctx *c, mlpack_tensor *outputs) {
  for (size_t i = 0; i < m->output_count; i++) {
    const mp_sig *s = &m->outputs[i];
    size_t nbytes = 0;
    mp_shape_bytes(&c->shapes[i * 8], s->rank, s->dtype, &nbytes);
    outputs[i].name = s->name;
    outputs[i].dtype = s->dtype;
    outputs[i].rank = s->rank;
    outputs[i].shape = &c->shapes[i * 8];
    outputs[i].data = c->data[i];
    outputs[i].nbytes = nbytes;
  }
}

static mlpack_status mp_check_args(mlpack_model *m, const mlpack_tensor *inputs, size_t n_inputs,
                                   mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err) {
  if (!m) return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run: model is NULL");
  if (n_inputs > 0 && !inputs) return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run: inputs is NULL");
  if (n_outputs != m->output_count)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run: the model has %zu outputs, %zu given",
                   m->output_count, n_outputs);
  if (n_outputs > 0 && !outputs) return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run: outputs is NULL");
  if (!m->executor) return mp_fail(err, MLPACK_ERR_RUNTIME, "mlpack_run: the model has no executor");
  if (m->input_count > 8 * 1024 || m->output_count > 8 * 1024)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run: too many inputs or outputs");
  return MLPACK_OK;
}

/* mlpack_run_into: output i goes to the caller's memory. Its shape must follow from the inputs,
 * the memory must hold it, be aligned to its element, and overlap no input and no other output
 * (a kernel would read what another wrote). */
static mlpack_status mp_use_caller_outputs(const mlpack_model *m, mp_run_ctx *c, const mlpack_tensor *given,
                                           const int *known, const void **in_data,
                                           const int64_t *in_shapes, mlpack_error **err) {
  size_t ni = m->input_count;
  for (size_t i = 0; i < m->output_count; i++) {
    const mp_sig *s = &m->outputs[i];
    const mlpack_tensor *t = &given[i];
    if (t->name && strcmp(t->name, s->name) != 0)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: output %zu is '%s', not '%s'", i,
                     s->name, t->name);
    if (!known[i])
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: the shape of output '%s' depends "
                     "on the data, not only on the inputs' shapes; run it with mlpack_run", s->name);
    size_t need = 0;
    mlpack_status st = mp_planned_bytes(m, c, i, &need, err);
    if (st != MLPACK_OK) return st;
    if (!t->data && need > 0)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: output '%s' has no memory", s->name);
    if (t->nbytes < need)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: output '%s' needs %zu bytes, "
                     "%zu given", s->name, need, t->nbytes);
    size_t item = mlpack_dtype_size(s->dtype);
    if (item > 1 && (uintptr_t)t->data % item != 0)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: output '%s' is not aligned to its "
                     "%zu-byte elements", s->name, item);
    uintptr_t lo = (uintptr_t)t->data, hi = lo + need;
    for (size_t k = 0; k < ni + i && need > 0; k++) {   /* the inputs, then the outputs before */
      int input = k < ni;
      const mp_sig *o = input ? &m->inputs[k] : &m->outputs[k - ni];
      const int64_t *shape = input ? &in_shapes[k * 8] : &c->shapes[(k - ni) * 8];
      uintptr_t olo = (uintptr_t)(input ? in_data[k] : given[k - ni].data);
      size_t on = 0;
      mp_shape_bytes(shape, o->rank, o->dtype, &on);
      if (on > 0 && olo < hi && lo < olo + on)
        return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_into: output '%s' overlaps %s '%s'",
                       s->name, input ? "input" : "output", o->name);
    }
    c->data[i] = t->data;
  }
  return MLPACK_OK;
}

/* Every entry point: `into` says the outputs' memory is the caller's (mlpack_run_into), `device`
 * that it and the inputs' are GPU memory (mlpack_run_device, waiting for `stream` first). */
static mlpack_status mp_run_model(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                                  mlpack_tensor *outputs, size_t n_outputs, int into, int device,
                                  void *stream, mlpack_error **err) {
  mlpack_status st = mp_check_args(model, inputs, n_inputs, outputs, n_outputs, err);
  if (st != MLPACK_OK) return st;
  if (device && strcmp(model->executor_kind->media_type, MP_CODE_PTX) != 0)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_run_device: the model runs on %s (artifact %zu), not on a "
                   "CUDA GPU; give it host memory (mlpack_run)",
                   model->container->artifacts[model->chosen].device, model->chosen);
  mp_run_ctx *ctx = NULL;
  st = mp_ctx_enter(model, &ctx, err);
  if (st != MLPACK_OK) return st;
  size_t ni = model->input_count, no = model->output_count;
  mlpack_tensor *given = into ? calloc(no ? no : 1, sizeof *given) : NULL;
  if (into && given) memcpy(given, outputs, no * sizeof *given);
  if (!into) memset(outputs, 0, n_outputs * sizeof *outputs);   /* (into: left as given on failure) */
  mp_binding *b = calloc(1, sizeof *b);
  const void **in_data = calloc(ni ? ni : 1, sizeof *in_data);
  int64_t *in_shapes = calloc((ni ? ni : 1) * 8, sizeof *in_shapes);
  void **out_data = calloc(no ? no : 1, sizeof *out_data);
  int *known = calloc(no ? no : 1, sizeof *known);
  if (!b || !in_data || !in_shapes || !out_data || !known || (into && !given))
    st = mp_fail(err, MLPACK_ERR_NOMEM, "mlpack_run: out of memory");
  if (st == MLPACK_OK) st = mp_sym_collect(model->inputs, ni, b, err);
  if (st == MLPACK_OK) st = mp_sym_collect(model->outputs, no, b, err);
  if (st == MLPACK_OK) st = mp_bind_inputs(model, inputs, n_inputs, b, in_data, in_shapes, err);
  if (st == MLPACK_OK) st = mp_output_shapes(model, b, ctx->shapes, known, err);
  if (st == MLPACK_OK)
    st = into ? mp_use_caller_outputs(model, ctx, given, known, in_data, in_shapes, err)
              : mp_alloc_outputs(model, ctx, known, err);
  if (st == MLPACK_OK) {
    for (size_t i = 0; i < no; i++) out_data[i] = ctx->data[i];
    /* unbound symbols (data-dependent) are not passed: only what the inputs determine */
    const char *names[MP_MAX_SYMS];
    int64_t values[MP_MAX_SYMS];
    size_t count = 0;
    for (size_t k = 0; k < b->count; k++)
      if (b->bound_by[k]) { names[count] = b->names[k]; values[count++] = b->values[k]; }
    mp_run run = {.inputs = in_data, .outputs = out_data, .sym_names = names, .sym_values = values,
                  .sym_count = count, .model = model, .in_shapes = in_shapes,
                  .out_shapes = ctx->shapes, .pool = mp_pool_acquire(model->pool), .ctx = ctx,
                  .on_device = device, .stream = stream};
    st = model->executor_kind->run(model->executor, &run, err);
    mp_pool_release(run.pool);
    for (size_t i = 0; st == MLPACK_OK && i < no; i++)
      if (!ctx->data[i])
        st = mp_fail(err, MLPACK_ERR_RUNTIME, "the executor did not produce output '%s'",
                     model->outputs[i].name);
  }
  if (st == MLPACK_OK) mp_fill_outputs(model, ctx, outputs);
  if (into) {   /* the caller's memory: never kept, reused or freed by the model */
    for (size_t i = 0; i < no; i++) {
      /* (an empty output given no memory, which an executor allocated: kept, not handed out) */
      if (given && ctx->data[i] && ctx->data[i] != given[i].data) {
        free(ctx->keep[i]);
        ctx->keep[i] = ctx->data[i];
      }
      if (given && st == MLPACK_OK) outputs[i].data = given[i].data;
      ctx->data[i] = NULL;
    }
  } else if (st != MLPACK_OK)
    mp_outputs_clear(model, ctx);
  ctx->busy = 0;
  free(given);
  free(b);
  free(in_data);
  free(in_shapes);
  free(out_data);
  free(known);
  return st;
}

mlpack_status mlpack_run(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                         mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err) {
  return mp_run_model(model, inputs, n_inputs, outputs, n_outputs, 0, 0, NULL, err);
}

mlpack_status mlpack_run_into(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                              mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err) {
  return mp_run_model(model, inputs, n_inputs, outputs, n_outputs, 1, 0, NULL, err);
}

mlpack_status mlpack_run_device(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                                mlpack_tensor *outputs, size_t n_outputs, void *stream, mlpack_error **err) {
  return mp_run_model(model, inputs, n_inputs, outputs, n_outputs, 1, 1, stream, err);
}
