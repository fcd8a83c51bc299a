/* executor.h: the executor table's row, and the executors it names.
 *
 * An executor runs one format of code layer, named by its media type (media.h). The table
 * (executors.c) is the one place that says which formats this engine runs: select.c asks it
 * whether an artifact's code can run on this host (is there a row, and does the row's host check
 * pass), api_open.c opens the chosen artifact with the same row, and mlpack_run and mlpack_close
 * go through the row the model was opened with. A new device is one .c file defining open, run
 * and close (and a host check if it needs one), declared below, and one row in executors.c.
 */
#ifndef MLPACK_EXECUTOR_H
#define MLPACK_EXECUTOR_H

#include "engine.h"

/* mp_executor (engine.h) is opaque: each executor's own state, cast back in its own file. */

struct mp_executor_kind {
  const char *media_type;   /* the code layer it runs */
  /* Non-zero, with the reason in why[0..n), when what only this executor knows keeps this host
   * from running `a` (a missing driver, say). select.c has already checked the platform, the
   * device, the CPU features and min_runtime. NULL: nothing more to check. */
  int (*host_fault)(const mp_artifact *a, const mp_host *h, char *why, size_t n);
  /* Load `a` for model m, whose signature, options and pool are set: *out, or NULL and an error. */
  mlpack_status (*open)(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err);
  /* One run: read run->inputs, write run->outputs (mp_run_output for those the run sizes).
   * Runs of one executor may overlap (threads): x is shared (anything of it a run changes, it
   * changes under a lock), what a run writes is its own, and it spreads work only over
   * run->pool (NULL: the calling thread alone). */
  mlpack_status (*run)(mp_executor *x, const mp_run *run, mlpack_error **err);
  void (*close)(mp_executor *x);   /* also for x == NULL */
};

/* The row that runs code of this media type; NULL when none does or media_type is NULL. */
const mp_executor_kind *mp_executor_for(const char *media_type);

/* ---------------------------------------------------------------- portable.c */
/* The portable program interpreter (application/vnd.mlpack.program.portable.v1+json). */
mlpack_status mp_portable_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err);
mlpack_status mp_portable_run(mp_executor *x, const mp_run *run, mlpack_error **err);
void mp_portable_close(mp_executor *x);

/* ---------------------------------------------------------------- native.c */
/* A cpu artifact (application/vnd.mlpack.code.elf.v1): its kernel library (loader.c) running its
 * plan (plan.c) on the model's pool. */
mlpack_status mp_native_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err);
mlpack_status mp_native_run(mp_executor *x, const mp_run *run, mlpack_error **err);
void mp_native_close(mp_executor *x);

/* ---------------------------------------------------------------- cuda.c */
/* A cuda artifact (application/vnd.mlpack.code.ptx.v1, with an optional cubin layer): its plan
 * launched on the GPU through the CUDA driver, opened at run time. */
mlpack_status mp_cuda_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err);
mlpack_status mp_cuda_run(mp_executor *x, const mp_run *run, mlpack_error **err);
void mp_cuda_close(mp_executor *x);

#endif /* MLPACK_EXECUTOR_H */
