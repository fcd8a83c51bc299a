/* mlp_kernels.c: a hand-written kernel library for the plan executor's tests (test_run.c).
 *
 * Built by make_fixtures.py with `cc -shared -fPIC -nostdlib -ffreestanding`: like the
 * compiler's libraries it imports nothing. y = relu(x @ w + b) with x f32[batch, 4],
 * w f32[4, 3], b f32[3]; one workgroup per row; push[0] is batch. Variants (-D) break one rule
 * each: BAD_ABI (abi_version 99), NO_TABLE (the symbol is not exported), BAD_BINDINGS (a kernel's
 * bindings hold a character other than 'r' and 'w'); TABLE_V1 exports the table of ABI 1.0-1.2
 * (version 1: no bindings, which the engine still runs, unchecked).
 *
 * The table is version 2 (ABI 1.3): each kernel's bindings, 'r' read or 'w' written, in the order
 * its dispatches bind them; the engine refuses a plan that binds another number of buffers, or a
 * weight or input where a kernel writes.
 *
 * A computed symbol (plan ABI 1.1): y = 2 * (the positive elements of x), x f32[n]. `compact`
 * (one workgroup) keeps the positives in a scratch at its bound n and writes their count into
 * push[1]; `twice` (one workgroup per kept element) reads the count like any symbol.
 */
#include "mlpack_abi.h"

#define K 4
#define M 3

/* bindings: x, w, tmp */
static int32_t matmul(const mlpack_dispatch *d, uint32_t row) {
  const float *x = d->bindings[0], *w = d->bindings[1];
  float *y = d->bindings[2];
  if ((int64_t)row >= d->push[0]) return 1;  /* the plan gave more workgroups than rows */
  for (int m = 0; m < M; m++) {
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc += x[row * K + k] * w[k * M + m];
    y[row * M + m] = acc;
  }
  return 0;
}

/* bindings: tmp, b, y */
static int32_t bias_relu(const mlpack_dispatch *d, uint32_t row) {
  const float *t = d->bindings[0], *b = d->bindings[1];
  float *y = d->bindings[2];
  for (int m = 0; m < M; m++) {
    float v = t[row * M + m] + b[m];
    y[row * M + m] = v > 0.0f ? v : 0.0f;
  }
  return 0;
}

static int32_t broken(const mlpack_dispatch *d, uint32_t row) {
  (void)d;
  return row == 1 ? 7 : 0;
}

/* bindings: tmp (f32[n], scratch), x; push: n, count (written) */
static int32_t compact(const mlpack_dispatch *d, uint32_t w) {
  const float *x = d->bindings[1];
  float *t = d->bindings[0];
  int64_t count = 0;
  if (w != 0) return 1;
  for (int64_t i = 0; i < d->push[0]; i++)
    if (x[i] > 0.0f) t[count++] = x[i];
  d->push[1] = count;
  return 0;
}

/* bindings: y (f32[count]), tmp */
static int32_t twice(const mlpack_dispatch *d, uint32_t w) {
  const float *t = d->bindings[1];
  float *y = d->bindings[0];
  if ((int64_t)w >= d->push[1]) return 1;
  y[w] = 2.0f * t[w];
  return 0;
}

static const mlpack_kernel_fn kernels[] = {matmul, bias_relu, broken, compact, twice};
static const char *const names[] = {"matmul", "bias_relu", "broken", "compact", "twice"};
/* `broken` takes bias_relu's bindings (the plan runs it in its place) */
#ifdef BAD_BINDINGS
static const char *const bindings[] = {"rrw", "rrw", "rrw", "wr", "wx"};
#else
static const char *const bindings[] = {"rrw", "rrw", "rrw", "wr", "wr"};
#endif

#if defined(BAD_ABI)
static const mlpack_kernel_table table = {99u, 5, kernels, names, bindings};
#elif defined(TABLE_V1)
static const mlpack_kernel_table table = {1u, 5, kernels, names};
#else
static const mlpack_kernel_table table = {MLPACK_KERNEL_TABLE_VERSION, 5, kernels, names, bindings};
#endif

#ifdef NO_TABLE
__attribute__((visibility("default"))) const mlpack_kernel_table *some_other_name(void) { return &table; }
#else
__attribute__((visibility("default"))) const mlpack_kernel_table *mlpack_kernel_table_v1(void) { return &table; }
#endif
