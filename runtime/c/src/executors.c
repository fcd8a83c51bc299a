/* executors.c: the executor table: every code format this engine runs, and what runs it.
 *
 * Selection (select.c) and loading (api_open.c) both read this one table, so the artifacts
 * judged runnable here are exactly those the engine can open. A code format with no row (a
 * lone cubin layer) is passed over with a reason; whether a CUDA GPU is there is selection's
 * device check (select.c, from the driver probe of api_open.c). A new device: its .c file, its
 * functions declared in executor.h, and one row below.
 */
#include <string.h>

#include "executor.h"
#include "media.h"

static const mp_executor_kind mp_executors[] = {
    /* code layer         host check  open              run              close */
    {MP_PROGRAM_PORTABLE, NULL,       mp_portable_open, mp_portable_run, mp_portable_close},
    {MP_CODE_ELF,         NULL,       mp_native_open,   mp_native_run,   mp_native_close},
    {MP_CODE_PTX,         NULL,       mp_cuda_open,     mp_cuda_run,     mp_cuda_close},
};

const mp_executor_kind *mp_executor_for(const char *media_type) {
  for (size_t i = 0; media_type && i < sizeof mp_executors / sizeof *mp_executors; i++)
    if (!strcmp(media_type, mp_executors[i].media_type)) return &mp_executors[i];
  return NULL;
}
