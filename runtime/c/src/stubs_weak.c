/* stubs_weak.c: weak fallbacks for the execution half of the engine (native.c, plan.c,
 * loader.c, pool.c, portable.c, api_run.c), so libmlpack links and the container/selection half
 * can be tested before that code lands. A strong definition in any linked object replaces each of
 * these. The pool fallback is a real (serial) pool: it runs every index on the caller's thread.
 * An executor's run and close are never reached without its open, which fails. */
#include <stdlib.h>

#include "engine.h"
#include "executor.h"

#define MP_WEAK __attribute__((weak))

MP_WEAK mlpack_status mp_native_open(mlpack_model *m, const mp_artifact *a, mp_executor **out,
                                     mlpack_error **err) {
  (void)m; (void)a;
  *out = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "the native plan executor is not built into this libmlpack");
}

MP_WEAK mlpack_status mp_native_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  (void)x; (void)run;
  return mp_fail(err, MLPACK_ERR_LOAD, "the native plan executor is not built into this libmlpack");
}

MP_WEAK void mp_native_close(mp_executor *x) { (void)x; }

MP_WEAK mlpack_status mp_portable_open(mlpack_model *m, const mp_artifact *a, mp_executor **out,
                                       mlpack_error **err) {
  (void)m; (void)a;
  *out = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "the portable interpreter is not built into this libmlpack");
}

MP_WEAK mlpack_status mp_portable_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  (void)x; (void)run;
  return mp_fail(err, MLPACK_ERR_LOAD, "the portable interpreter is not built into this libmlpack");
}

MP_WEAK void mp_portable_close(mp_executor *x) { (void)x; }

MP_WEAK mlpack_status mp_library_load(const void *elf, size_t size, const char *what, mp_library **out,
                                      const mlpack_kernel_table **table, mlpack_error **err) {
  (void)elf; (void)size;
  *out = NULL;
  *table = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "%s: the kernel loader is not built into this libmlpack", what);
}

MP_WEAK void mp_library_unload(mp_library *lib) { (void)lib; }

struct mp_serial_pool { int threads; };

MP_WEAK mp_pool *mp_pool_create(int threads) {
  struct mp_serial_pool *p = malloc(sizeof *p);
  if (p) p->threads = 1;
  (void)threads;
  return (mp_pool *)p;
}

MP_WEAK int mp_pool_threads(const mp_pool *p) { return p ? ((const struct mp_serial_pool *)p)->threads : 0; }

MP_WEAK void mp_pool_run(mp_pool *p, uint32_t count, void (*fn)(void *ctx, uint32_t i), void *ctx) {
  (void)p;
  for (uint32_t i = 0; i < count; i++) fn(ctx, i);
}

MP_WEAK mp_pool *mp_pool_acquire(mp_pool *p) { return p; }   /* serial: nothing to share */

MP_WEAK void mp_pool_release(mp_pool *p) { (void)p; }

MP_WEAK void mp_pool_destroy(mp_pool *p) { free(p); }

MP_WEAK mlpack_status mlpack_run(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                                 mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err) {
  (void)model; (void)inputs; (void)n_inputs; (void)outputs; (void)n_outputs;
  if (err) *err = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "mlpack_run is not built into this libmlpack");
}

MP_WEAK mlpack_status mlpack_run_into(mlpack_model *model, const mlpack_tensor *inputs,
                                      size_t n_inputs, mlpack_tensor *outputs, size_t n_outputs,
                                      mlpack_error **err) {
  (void)model; (void)inputs; (void)n_inputs; (void)outputs; (void)n_outputs;
  if (err) *err = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "mlpack_run_into is not built into this libmlpack");
}

MP_WEAK mlpack_status mp_run_output(const mp_run *run, size_t i, const int64_t *shape, void **data,
                                    mlpack_error **err) {
  (void)run; (void)i; (void)shape;
  *data = NULL;
  return mp_fail(err, MLPACK_ERR_LOAD, "mp_run_output is not built into this libmlpack");
}

MP_WEAK void mp_run_release(mlpack_model *m) { (void)m; }   /* (no run ever made a context) */
