/* plan.c: a cpu artifact's plan (spec/SPEC.md section 7), from the config's JSON to an mp_plan
 * (plan.h) that native.c runs.
 *
 * Everything a run would otherwise have to trust is checked here, once: the kernel ABI version
 * and minor, every kernel, buffer, input and output index, every weight name (resolved to its
 * data in the weights layer, which stays in the file's mapping), the arena's alignment and that
 * every symbol has a source: an input's axis or, for a computed symbol (plan ABI 1.1), the one
 * dispatch that writes it, with the bound the arena was sized at. And, where the kernel table
 * records each kernel's bindings (table version 2, ABI 1.3), that every dispatch binds as many
 * buffers as its kernel takes and binds none it writes to a weight (data every run shares) or
 * an input (the caller's array): a plan that disagrees with its kernels would have a kernel
 * read past its bindings or write where it must not. Checks run in the order they always have,
 * so a plan with several faults reports the same one.
 *
 * ABI 1.4: "packed" buffers are slices of the artifact's packed region ("packed_size" bytes,
 * constant offsets and sizes inside it, 64-byte aligned), written once when the artifact is
 * opened by the "prepare" dispatches (a weight packed into the panel a GEMM reads, relaid out),
 * which bind nothing but weights and packed slices and write only packed slices; every run
 * then reads them, and no run's dispatch writes one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct mp_plan_reader {
  mp_plan *p;
  const mlpack_model *model;         /* the signature the plan's indices refer to */
  const mlpack_kernel_table *table;  /* the kernel library's (mp_library_load checked it) */
  uint32_t kernel_count;
  const mp_tensor_archive *weights;  /* NULL: the artifact has no weights layer */
  const char *what;                  /* "artifact 2 (cpu amd64 v3)" for messages */
} mp_plan_reader;

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

static mlpack_status mp_parse_symbols(mp_plan_reader *r, const mp_json *plan, mlpack_error **err) {
  mp_plan *p = r->p;
  const mp_json *syms = mp_plan_array(plan, "symbols");
  const mp_json *srcs = mp_plan_array(plan, "symbol_sources");
  if (!syms) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'symbols' list", r->what);
  p->symbol_count = syms->length;
  p->symbols = calloc(syms->length + 1, sizeof *p->symbols);
  p->src_input = calloc(syms->length + 1, sizeof *p->src_input);
  p->src_axis = calloc(syms->length + 1, sizeof *p->src_axis);
  p->sources = calloc((srcs ? srcs->length : 0) + 1, sizeof *p->sources);
  p->src_dispatch = calloc(syms->length + 1, sizeof *p->src_dispatch);
  p->src_bound = calloc(syms->length + 1, sizeof *p->src_bound);
  if (!p->symbols || !p->src_input || !p->src_axis || !p->sources || !p->src_dispatch || !p->src_bound)
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", r->what);
  for (size_t i = 0; i < syms->length; i++) {
    if (syms->items[i]->kind != MP_JSON_STRING)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol %zu is not a string", r->what, i);
    p->symbols[i] = syms->items[i]->string;
    p->src_input[i] = SIZE_MAX;
    p->src_dispatch[i] = SIZE_MAX;
  }
  size_t inputs = 0;
  for (size_t k = 0; srcs && k < srcs->length; k++) {
    const mp_json *s = srcs->items[k];
    const char *name = mp_json_get_string(s, "symbol");
    size_t input, axis, i = 0;
    while (name && i < p->symbol_count && strcmp(p->symbols[i], name) != 0) i++;
    if (name && i < p->symbol_count && mp_json_get(s, "dispatch")) {  /* computed (ABI 1.1) */
      size_t disp;
      p->src_bound[i] = mp_json_get(s, "bound");
      /* the dispatch index is checked against the dispatch list once it is parsed */
      if (mp_json_uint(mp_json_get(s, "dispatch"), SIZE_MAX, &disp) || !p->src_bound[i] ||
          p->src_dispatch[i] != SIZE_MAX || p->src_input[i] != SIZE_MAX)
        return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol_sources entry %zu is malformed", r->what, k);
      p->src_dispatch[i] = disp;
      continue;
    }
    if (!name || i == p->symbol_count || p->src_dispatch[i] != SIZE_MAX ||
        mp_json_uint(mp_json_get(s, "input"), r->model->input_count, &input) ||
        mp_json_uint(mp_json_get(s, "axis"), r->model->inputs[input].rank, &axis))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol_sources entry %zu is malformed", r->what, k);
    if (p->src_input[i] == SIZE_MAX) { p->src_input[i] = input; p->src_axis[i] = axis; }
    p->sources[inputs][0] = i;
    p->sources[inputs][1] = input;
    p->sources[inputs][2] = axis;
    inputs++;
  }
  p->source_count = inputs;
  for (size_t i = 0; i < p->symbol_count; i++)
    if (p->src_input[i] == SIZE_MAX && p->src_dispatch[i] == SIZE_MAX)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol '%s' has no symbol_sources entry",
                     r->what, p->symbols[i]);
  return MLPACK_OK;
}

static mlpack_status mp_parse_weight(mp_plan_reader *r, const mp_json *b, mp_plan_buffer *out, size_t i,
                                     mlpack_error **err) {
  const char *name = mp_json_get_string(b, "name");
  if (!name) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (weight) has no name", r->what, i);
  const mp_tensor_entry *e = r->weights ? mp_tensors_find(r->weights, name) : NULL;
  if (!e)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu names weight '%s', which the weights layer lacks",
                   r->what, i, name);
  out->weight = e->data;
  out->name = name;
  return MLPACK_OK;
}

static mlpack_status mp_parse_buffer(mp_plan_reader *r, const mp_json *b, size_t i, mlpack_error **err) {
  mp_plan *p = r->p;
  mp_plan_buffer *out = &p->buffers[i];
  const char *kind = mp_json_get_string(b, "kind");
  if (!kind) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu has no kind", r->what, i);
  if (strcmp(kind, "input") == 0 || strcmp(kind, "output") == 0) {
    int in = kind[0] == 'i';
    out->kind = in ? MP_BUF_INPUT : MP_BUF_OUTPUT;
    if (mp_json_uint(mp_json_get(b, "index"), in ? r->model->input_count : r->model->output_count, &out->index))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (%s) has a bad index", r->what, i, kind);
    out->shape = in ? NULL : mp_json_get(b, "shape");
    if (out->shape && (out->shape->kind != MP_JSON_ARRAY || out->shape->length != r->model->outputs[out->index].rank))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (output) has a shape that is not one "
                     "expression per dim", r->what, i);
    return MLPACK_OK;
  }
  if (strcmp(kind, "weight") == 0) {
    out->kind = MP_BUF_WEIGHT;
    return mp_parse_weight(r, b, out, i, err);
  }
  if (strcmp(kind, "packed") == 0) {   /* ABI 1.4: a slice of the packed region */
    size_t off, size;
    out->kind = MP_BUF_PACKED;
    if (mp_json_uint(mp_json_get(b, "offset"), SIZE_MAX, &off) ||
        mp_json_uint(mp_json_get(b, "size"), SIZE_MAX, &size) || off % 64 != 0 ||
        off > r->p->packed_size || size > r->p->packed_size - off)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (packed) needs a 64-byte aligned offset "
                     "and a size within the %zu-byte packed region", r->what, i, r->p->packed_size);
    out->packed_offset = off;
    out->packed_bytes = size;
    return MLPACK_OK;
  }
  if (strcmp(kind, "arena") == 0) {
    out->kind = MP_BUF_ARENA;
    out->offset = mp_json_get(b, "offset");
    out->size = mp_json_get(b, "size");
    if (!out->offset || !out->size)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu (arena) needs offset and size", r->what, i);
    return MLPACK_OK;
  }
  return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan buffer %zu has unknown kind '%s'", r->what, i, kind);
}

static mlpack_status mp_parse_buffers(mp_plan_reader *r, const mp_json *plan, mlpack_error **err) {
  mp_plan *p = r->p;
  const mp_json *bufs = mp_plan_array(plan, "buffers");
  if (!bufs) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'buffers' list", r->what);
  p->buffer_count = bufs->length;
  p->buffers = calloc(bufs->length + 1, sizeof *p->buffers);
  if (!p->buffers) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", r->what);
  for (size_t i = 0; i < bufs->length; i++) {
    mlpack_status st = mp_parse_buffer(r, bufs->items[i], i, err);
    if (st != MLPACK_OK) return st;
  }
  return MLPACK_OK;
}

static const char *const mp_buffer_kinds[] = {"input", "output", "weight", "arena", "packed"};

/* Dispatch i's bindings against what its kernel's table entry says it binds (table version 2;
 * a version-1 table records nothing to check against), and a prepare dispatch's (ABI 1.4)
 * against what prepare may touch: weights and packed slices, whatever the table says. */
static mlpack_status mp_check_bindings(mp_plan_reader *r, const mp_plan_dispatch *d, size_t i,
                                       int prepare, mlpack_error **err) {
  const mlpack_kernel_table *t = r->table;
  const char *stage = prepare ? "prepare dispatch" : "dispatch";
  const char *name = t->names && t->names[d->kernel] ? t->names[d->kernel] : "?";
  for (size_t k = 0; prepare && k < d->binding_count; k++) {
    const mp_plan_buffer *b = &r->p->buffers[d->bindings[k]];
    if (b->kind != MP_BUF_WEIGHT && b->kind != MP_BUF_PACKED)
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan prepare dispatch %zu binding %zu is buffer %zu (%s); "
                     "a prepare dispatch binds only weights and packed buffers", r->what, i, k,
                     d->bindings[k], mp_buffer_kinds[b->kind]);
  }
  if (t->abi_version < 2) return MLPACK_OK;
  const char *kinds = t->bindings[d->kernel];
  size_t want = strlen(kinds);
  if (d->binding_count != want)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu binds %zu buffers, but its kernel %u "
                   "('%s') takes %zu ('%s')", r->what, stage, i, d->binding_count, d->kernel, name, want, kinds);
  for (size_t k = 0; k < want; k++) {
    const mp_plan_buffer *b = &r->p->buffers[d->bindings[k]];
    int bad = prepare ? b->kind != MP_BUF_PACKED
                      : (b->kind == MP_BUF_WEIGHT || b->kind == MP_BUF_INPUT || b->kind == MP_BUF_PACKED);
    if (kinds[k] != MLPACK_BINDING_WRITE || !bad) continue;
    char buf[160];
    if (b->kind == MP_BUF_WEIGHT) snprintf(buf, sizeof buf, "weight '%s'", b->name);
    else if (b->kind == MP_BUF_INPUT) snprintf(buf, sizeof buf, "input %zu '%s'", b->index, r->model->inputs[b->index].name);
    else snprintf(buf, sizeof buf, "%s", mp_buffer_kinds[b->kind]);
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu binding %zu is buffer %zu (%s), which "
                   "its kernel %u ('%s') writes; a kernel may write only %s", r->what, stage, i, k,
                   d->bindings[k], buf, d->kernel, name,
                   prepare ? "a packed buffer when it prepares" : "an output or the arena");
  }
  return MLPACK_OK;
}

static mlpack_status mp_parse_dispatch(mp_plan_reader *r, const mp_json *j, mp_plan_dispatch *d, size_t i,
                                       int prepare, mlpack_error **err) {
  mp_plan *p = r->p;
  const char *stage = prepare ? "prepare dispatch" : "dispatch";
  size_t kernel;
  const mp_json *binds = mp_json_get(j, "bindings");
  d->workgroups = mp_json_get(j, "workgroups");
  if (mp_json_uint(mp_json_get(j, "kernel"), r->kernel_count, &kernel))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu names a kernel the library lacks (it has %u)",
                   r->what, stage, i, r->kernel_count);
  if (!d->workgroups || !binds || binds->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu needs workgroups and bindings", r->what, stage, i);
  d->kernel = (uint32_t)kernel;
  d->checks = mp_json_get(j, "checks");
  if (d->checks && d->checks->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu has checks that are not a list", r->what, stage, i);
  d->binding_count = binds->length;
  d->bindings = calloc(binds->length + 1, sizeof *d->bindings);
  if (!d->bindings) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", r->what);
  for (size_t k = 0; k < binds->length; k++)
    if (mp_json_uint(binds->items[k], p->buffer_count, &d->bindings[k]))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan %s %zu binding %zu is not a buffer index",
                     r->what, stage, i, k);
  if (binds->length > p->max_bindings) p->max_bindings = binds->length;
  return mp_check_bindings(r, d, i, prepare, err);
}

static mlpack_status mp_parse_dispatches(mp_plan_reader *r, const mp_json *plan, mlpack_error **err) {
  mp_plan *p = r->p;
  const mp_json *ds = mp_plan_array(plan, "dispatches");
  if (!ds) return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan has no 'dispatches' list", r->what);
  p->dispatch_count = ds->length;
  p->dispatches = calloc(ds->length + 1, sizeof *p->dispatches);
  if (!p->dispatches) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", r->what);
  for (size_t i = 0; i < ds->length; i++) {
    mlpack_status st = mp_parse_dispatch(r, ds->items[i], &p->dispatches[i], i, 0, err);
    if (st != MLPACK_OK) return st;
  }
  const mp_json *pre = mp_json_get(plan, "prepare");   /* ABI 1.4 */
  if (pre && pre->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan 'prepare' is not a list", r->what);
  p->prepare_count = pre ? pre->length : 0;
  p->prepare = calloc(p->prepare_count + 1, sizeof *p->prepare);
  if (!p->prepare) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", r->what);
  for (size_t i = 0; i < p->prepare_count; i++) {
    mlpack_status st = mp_parse_dispatch(r, pre->items[i], &p->prepare[i], i, 1, err);
    if (st != MLPACK_OK) return st;
  }
  return MLPACK_OK;
}

static mlpack_status mp_parse_plan(mp_plan_reader *r, const mp_json *plan, mlpack_error **err) {
  mp_plan *p = r->p;
  if (!plan || plan->kind != MP_JSON_OBJECT)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: the config has no plan", r->what);
  const mp_json *abi = mp_json_get(plan, "abi");
  if (!abi || abi->kind != MP_JSON_NUMBER || !abi->is_int || abi->integer != (int64_t)MLPACK_ABI_VERSION)
    return mp_fail(err, MLPACK_ERR_VERSION, "%s: plan is for kernel ABI %lld, this runtime knows ABI %u",
                   r->what, abi && abi->is_int ? (long long)abi->integer : -1LL, MLPACK_ABI_VERSION);
  const mp_json *minor = mp_json_get(plan, "abi_minor");
  if (minor && (minor->kind != MP_JSON_NUMBER || !minor->is_int || minor->integer < 0 ||
                minor->integer > (int64_t)MLPACK_ABI_MINOR))
    return mp_fail(err, MLPACK_ERR_VERSION, "%s: plan is for kernel ABI %u.%lld, this runtime knows ABI %u.%u",
                   r->what, MLPACK_ABI_VERSION, minor->is_int ? (long long)minor->integer : -1LL,
                   MLPACK_ABI_VERSION, MLPACK_ABI_MINOR);
  p->arena_size = mp_json_get(plan, "arena_size");
  size_t align = 64;
  const mp_json *aj = mp_json_get(plan, "arena_align");
  if (aj && (mp_json_uint(aj, 4097, &align) || align == 0 || (align & (align - 1))))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan arena_align must be a power of two up to 4096", r->what);
  p->arena_align = align < 64 ? 64 : align;
  const mp_json *packed = mp_json_get(plan, "packed_size");   /* ABI 1.4 */
  if (packed && mp_json_uint(packed, SIZE_MAX, &p->packed_size))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan packed_size is not a byte count", r->what);
  mlpack_status st = mp_parse_symbols(r, plan, err);
  if (st == MLPACK_OK) st = mp_parse_buffers(r, plan, err);
  if (st == MLPACK_OK) st = mp_parse_dispatches(r, plan, err);
  for (size_t i = 0; st == MLPACK_OK && i < p->symbol_count; i++)
    if (p->src_dispatch[i] != SIZE_MAX && p->src_dispatch[i] >= p->dispatch_count)
      st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: plan symbol '%s' is computed by dispatch %zu, which the plan lacks",
                   r->what, p->symbols[i], p->src_dispatch[i]);
  return st;
}

mlpack_status mp_plan_parse(const mp_json *json, const mlpack_model *m, const mlpack_kernel_table *table,
                            const mp_tensor_archive *weights, const char *what, mp_plan *p,
                            mlpack_error **err) {
  memset(p, 0, sizeof *p);
  mp_plan_reader r = {.p = p, .model = m, .table = table, .kernel_count = table->kernel_count,
                      .weights = weights, .what = what};
  return mp_parse_plan(&r, json, err);
}

void mp_plan_free(mp_plan *p) {
  if (!p) return;
  for (size_t i = 0; p->dispatches && i < p->dispatch_count; i++) free(p->dispatches[i].bindings);
  free(p->dispatches);
  for (size_t i = 0; p->prepare && i < p->prepare_count; i++) free(p->prepare[i].bindings);
  free(p->prepare);
  free(p->buffers);
  free(p->symbols);
  free(p->src_input);
  free(p->src_axis);
  free(p->sources);
  free(p->src_dispatch);
  free(p->src_bound);
  memset(p, 0, sizeof *p);
}
