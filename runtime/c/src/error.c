/* error.c: mlpack_error objects and the mp_fail helper every other file reports through.
 *
 * An error is a status code plus a heap message. When even that allocation fails we hand out a
 * static error (never freed) so that callers always get a message for MLPACK_ERR_NOMEM.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct mlpack_error {
  mlpack_status code;
  char *message;
  int is_static;
};

static struct mlpack_error mp_error_nomem = {MLPACK_ERR_NOMEM, "out of memory", 1};

static char *mp_error_format(const char *fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  if (n < 0) return NULL;
  char *text = malloc((size_t)n + 1);
  if (text) vsnprintf(text, (size_t)n + 1, fmt, ap);
  return text;
}

mlpack_status mp_fail(mlpack_error **err, mlpack_status code, const char *fmt, ...) {
  if (!err) return code;
  /* keep the first error: the innermost report names the fault most precisely */
  if (*err) return code;
  struct mlpack_error *e = malloc(sizeof *e);
  va_list ap;
  va_start(ap, fmt);
  char *text = e ? mp_error_format(fmt, ap) : NULL;
  va_end(ap);
  if (!e || !text) {
    free(e);
    free(text);
    *err = &mp_error_nomem;
    return code;
  }
  e->code = code;
  e->message = text;
  e->is_static = 0;
  *err = e;
  return code;
}

mlpack_status mlpack_error_code(const mlpack_error *err) { return err ? err->code : MLPACK_OK; }

const char *mlpack_error_message(const mlpack_error *err) { return err ? err->message : ""; }

void mlpack_error_free(mlpack_error *err) {
  if (!err || err->is_static) return;
  free(err->message);
  free(err);
}

void mp_index_message(char *buf, size_t cap, const char *node, int wraps, const char *what,
                      const char *tensor, const char *dim, int64_t v, int64_t n) {
  if (!node)
    snprintf(buf, cap, "%s %%%s dim %s: index %lld out of range for dim of size %lld (valid 0..%lld)",
             what, tensor, dim, (long long)v, (long long)n, (long long)(n - 1));
  else if (!wraps)
    snprintf(buf, cap, "%s: index %lld out of range for dim of size %lld (valid 0..%lld)", node,
             (long long)v, (long long)n, (long long)(n - 1));
  else
    snprintf(buf, cap, "%s: index %lld out of range for dim of size %lld (valid %lld..%lld)", node,
             (long long)(v < 0 ? v - n : v), (long long)n, (long long)-n, (long long)(n - 1));
}
