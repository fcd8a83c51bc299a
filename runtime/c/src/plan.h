/* plan.h: a cpu artifact's plan (spec/SPEC.md section 7) once parsed: plan.c reads the config's
 * "plan" into this, native.c runs it.
 *
 * Parsing checks everything that does not depend on a run (indices in range, kinds known, the
 * ABI version, each dispatch's bindings against its kernel's in the kernel table) so that a run
 * only evaluates expressions. The "prepare" dispatches (ABI 1.4) bind only weights and packed
 * slices and write only packed slices; the run's dispatches only read packed slices. Sizes, offsets and workgroup counts are
 * expressions of the plan's symbols, so they stay JSON (owned by the config) and are evaluated
 * per run; names point into the config too.
 */
#ifndef MLPACK_PLAN_H
#define MLPACK_PLAN_H

#include "engine.h"

enum { MP_BUF_INPUT, MP_BUF_OUTPUT, MP_BUF_WEIGHT, MP_BUF_ARENA, MP_BUF_PACKED };

typedef struct mp_plan_buffer {
  int kind;                        /* MP_BUF_* */
  size_t index;                    /* input / output index */
  const void *weight;              /* weight data (in the mapping) */
  const char *name;                /* weight: its name (in the config), for messages */
  const mp_json *offset, *size;    /* arena slice */
  size_t packed_offset, packed_bytes; /* packed slice (ABI 1.4): constants, within packed_size */
  const mp_json *shape;            /* output: its dims' expressions (ONNX order), or NULL */
} mp_plan_buffer;

typedef struct mp_plan_dispatch {
  uint32_t kernel;
  const mp_json *workgroups;
  size_t *bindings;                /* buffer indices */
  size_t binding_count;
  const mp_json *checks;           /* ABI 1.2: what each index check of the kernel indexes, or NULL */
} mp_plan_dispatch;

typedef struct mp_plan {
  const char **symbols;            /* push-constant order */
  size_t symbol_count;
  size_t *src_input, *src_axis;    /* symbol_sources, per symbol (the first one) */
  size_t (*sources)[3];            /* every input symbol_sources entry: symbol, input, axis */
  size_t source_count;
  size_t *src_dispatch;            /* per symbol: the dispatch computing it (ABI 1.1), or SIZE_MAX */
  const mp_json **src_bound;       /* per computed symbol: its bound */
  mp_plan_buffer *buffers;
  size_t buffer_count;
  mp_plan_dispatch *dispatches;
  size_t dispatch_count;
  mp_plan_dispatch *prepare;       /* ABI 1.4: run once at open, before any run */
  size_t prepare_count;
  size_t packed_size;              /* ABI 1.4: bytes of the packed region the prepare dispatches write */
  size_t max_bindings;             /* the most bindings of one dispatch */
  const mp_json *arena_size;       /* NULL: no arena */
  size_t arena_align;              /* a power of two, at least 64 */
} mp_plan;

/* Parse `json` (the config's "plan") into *p, checked against model m's signature, the kernel
 * library's table (its kernel count and, in a version-2 table, each kernel's bindings) and the
 * artifact's weights (NULL when it has none); `what` names the artifact in messages. On failure
 * *p holds what was parsed so far: mp_plan_free it either way. */
mlpack_status mp_plan_parse(const mp_json *json, const mlpack_model *m, const mlpack_kernel_table *table,
                            const mp_tensor_archive *weights, const char *what, mp_plan *p,
                            mlpack_error **err);
void mp_plan_free(mp_plan *p);

#endif /* MLPACK_PLAN_H */
