/* test_run.c: the execution half through the public API: mlpack_open -> mlpack_run -> close.
 *
 * Fixtures come from tests/make_fixtures.py (`make test` builds them into build/fixtures;
 * MLPACK_FIXTURES overrides the folder). Native: hand-written kernel libraries loaded from
 * memory, the plan's arena, weights and dispatches, the pool; a wrong ABI, a missing table, a
 * failing kernel, a plan naming a missing weight or kernel, and (ABI 1.3) plans whose bindings
 * disagree with the kernel table's, which a version-1 table does not record. Portable: every program of
 * fixtures.list against the NumPy interpreter's outputs; input checks and their messages.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine.h"

static const char *dir;

typedef struct vecs {          /* a NAME.vectors file */
  void *buf;
  mp_blob blob;
  mp_tensor_archive a;
  int ok;
} vecs;

static char *path_of(const char *name, const char *ext) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s/%s%s", dir, name, ext);
  return buf;
}

static int vecs_load(vecs *v, const char *name) {
  memset(v, 0, sizeof *v);
  FILE *f = fopen(path_of(name, ".vectors"), "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (posix_memalign(&v->buf, 64, (size_t)n + 64) != 0) { fclose(f); return -1; }
  size_t got = fread(v->buf, 1, (size_t)n, f);
  fclose(f);
  v->blob.data = v->buf;
  v->blob.size = got;
  mlpack_error *err = NULL;
  if (mp_tensors_open(&v->blob, name, &v->a, &err) != MLPACK_OK) {
    fprintf(stderr, "%s\n", mlpack_error_message(err));
    mlpack_error_free(err);
    free(v->buf);
    return -1;
  }
  v->ok = 1;
  return 0;
}

static void vecs_free(vecs *v) {
  if (v->ok) mp_tensors_close(&v->a);
  free(v->buf);
}

static const mp_tensor_entry *vec(const vecs *v, int c, const char *kind, const char *name) {
  char key[256];
  snprintf(key, sizeof key, "case%d/%s/%s", c, kind, name);
  return mp_tensors_find(&v->a, key);
}

static mlpack_model *open_model(const char *name, int threads, mlpack_error **err) {
  mlpack_options o;
  mlpack_options_init(&o);
  o.threads = threads;
  *err = NULL;
  return mlpack_open(path_of(name, ".mlpack"), &o, err);
}

/* open_model that must succeed: NULL (and a failed check) if it does not */
static mlpack_model *expect_open(const char *name, int threads) {
  mlpack_error *err = NULL;
  mlpack_model *m = open_model(name, threads, &err);
  CHECK(m != NULL, "%s: open failed: %s", name, err ? mlpack_error_message(err) : "?");
  mlpack_error_free(err);
  return m;
}

static double value_at(const void *data, mlpack_dtype dt, size_t i) {
  switch (dt) {
  case MLPACK_BOOL: case MLPACK_U8: return ((const uint8_t *)data)[i];
  case MLPACK_I8: return ((const int8_t *)data)[i];
  case MLPACK_I16: return ((const int16_t *)data)[i];
  case MLPACK_U16: return ((const uint16_t *)data)[i];
  case MLPACK_I32: return ((const int32_t *)data)[i];
  case MLPACK_U32: return ((const uint32_t *)data)[i];
  case MLPACK_I64: return (double)((const int64_t *)data)[i];
  case MLPACK_U64: return (double)((const uint64_t *)data)[i];
  case MLPACK_F32: return ((const float *)data)[i];
  case MLPACK_F64: return ((const double *)data)[i];
  case MLPACK_F16: {
    uint16_t h = ((const uint16_t *)data)[i];
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h >> 15) ? -v : v;
  }
  default: return NAN;
  }
}

/* every output of case c equal (ints, exactly) or close (floats) to the vectors' */
static void compare_outputs(const char *name, const mlpack_tensor *outs, size_t n, const vecs *v, int c) {
  for (size_t o = 0; o < n; o++) {
    const mp_tensor_entry *want = vec(v, c, "output", outs[o].name);
    CHECK(want != NULL, "%s: no expected value for output %s", name, outs[o].name);
    if (!want) continue;
    CHECK(want->dtype == outs[o].dtype, "%s.%s: dtype %d, expected %d", name, outs[o].name, outs[o].dtype, want->dtype);
    CHECK(want->rank == outs[o].rank, "%s.%s: rank %zu, expected %zu", name, outs[o].name, outs[o].rank, want->rank);
    if (want->dtype != outs[o].dtype || want->rank != outs[o].rank) continue;
    int same_shape = 1;
    for (size_t d = 0; d < want->rank; d++) same_shape &= want->shape[d] == outs[o].shape[d];
    CHECK(same_shape, "%s.%s: shape differs (dim 0: %lld vs %lld)", name, outs[o].name,
          (long long)(outs[o].rank ? outs[o].shape[0] : 0), (long long)(want->rank ? want->shape[0] : 0));
    CHECK(want->nbytes == outs[o].nbytes, "%s.%s: %zu bytes, expected %zu", name, outs[o].name, outs[o].nbytes, want->nbytes);
    if (!same_shape || want->nbytes != outs[o].nbytes) continue;
    size_t count = want->nbytes / mlpack_dtype_size(want->dtype), bad = 0, first = 0;
    int is_float = want->dtype == MLPACK_F16 || want->dtype == MLPACK_F32 || want->dtype == MLPACK_F64;
    for (size_t i = 0; i < count; i++) {
      double a = value_at(outs[o].data, want->dtype, i), b = value_at(want->data, want->dtype, i);
      int ok = is_float ? ((isnan(a) && isnan(b)) || a == b || fabs(a - b) <= 1e-5 + 1e-4 * fabs(b)) : a == b;
      if (!ok && !bad++) first = i;
    }
    CHECK(bad == 0, "%s.%s case %d: %zu of %zu values differ; first at %zu: %.9g vs %.9g", name, outs[o].name, c,
          bad, count, first, value_at(outs[o].data, want->dtype, first), value_at(want->data, want->dtype, first));
  }
}

/* run every case of NAME.vectors through the model and compare */
/* The same case through mlpack_run_into, into memory of the sizes mlpack_run gave: the same
 * outputs; or, for an output whose shape depends on the data, a refusal that says so. */
static void run_into(const char *name, mlpack_model *m, const mlpack_tensor *in, size_t ni,
                     const mlpack_tensor *ran, size_t no, const vecs *v, int c) {
  mlpack_tensor out[16];
  void *mem[16] = {0};
  for (size_t i = 0; i < no; i++) {
    mem[i] = malloc(ran[i].nbytes ? ran[i].nbytes : 1);
    out[i] = (mlpack_tensor){.name = ran[i].name, .data = mem[i], .nbytes = ran[i].nbytes};
  }
  mlpack_error *err = NULL;
  mlpack_status st = mlpack_run_into(m, in, ni, out, no, &err);
  if (st == MLPACK_ERR_ARGUMENT) {
    CHECK_CONTAINS(mlpack_error_message(err), "depends on the data");
  } else {
    CHECK(st == MLPACK_OK, "%s case %d: run_into failed: %s", name, c, err ? mlpack_error_message(err) : "?");
    for (size_t i = 0; st == MLPACK_OK && i < no; i++)
      CHECK(out[i].data == mem[i] && out[i].nbytes == ran[i].nbytes && out[i].rank == ran[i].rank,
            "%s case %d: run_into output %zu", name, c, i);
    if (st == MLPACK_OK) compare_outputs(name, out, no, v, c);
  }
  mlpack_error_free(err);
  for (size_t i = 0; i < no; i++) free(mem[i]);
}

static void run_cases(const char *name, mlpack_model *m, int repeat) {
  vecs v;
  CHECK(vecs_load(&v, name) == 0, "%s: cannot read the vectors", name);
  if (!v.ok) return;
  size_t ni = mlpack_input_count(m), no = mlpack_output_count(m);
  CHECK(ni <= 16 && no <= 16, "%s: too many inputs or outputs for this test", name);
  if (ni > 16 || no > 16) { vecs_free(&v); return; }
  for (int c = 0; c < 16; c++) {
    mlpack_tensor in[16], out[16];
    size_t k = 0;
    for (; k < ni && k < 16; k++) {
      mlpack_tensor_info info;
      mlpack_input_info(m, k, &info);
      const mp_tensor_entry *e = vec(&v, c, "input", info.name);
      if (!e) break;
      in[k] = (mlpack_tensor){.name = info.name, .dtype = e->dtype, .rank = e->rank, .shape = e->shape,
                              .data = (void *)e->data, .nbytes = e->nbytes};
    }
    if (k < ni) break;  /* no more cases */
    for (int r = 0; r < repeat; r++) {
      mlpack_error *err = NULL;
      mlpack_status st = mlpack_run(m, in, ni, out, no, &err);
      CHECK(st == MLPACK_OK, "%s case %d: run failed: %s", name, c, err ? mlpack_error_message(err) : "?");
      mlpack_error_free(err);
      if (st != MLPACK_OK) break;
      if (r == 0 || r == repeat - 1) compare_outputs(name, out, no, &v, c);
      if (r == 0) run_into(name, m, in, ni, out, no, &v, c);
    }
  }
  vecs_free(&v);
}

static void test_portable_fixtures(void) {
  FILE *f = fopen(path_of("fixtures", ".list"), "r");
  CHECK(f != NULL, "no fixtures.list in %s (run tests/make_fixtures.py)", dir);
  if (!f) return;
  char name[128];
  int count = 0;
  while (fscanf(f, "%127s", name) == 1) {
    mlpack_model *m = expect_open(name, 1);
    if (!m) continue;
    run_cases(name, m, 2);
    mlpack_close(m);
    count++;
  }
  fclose(f);
  CHECK(count >= 10, "only %d portable fixtures", count);
}

static void test_native(void) {
  for (int threads = 1; threads <= 3; threads++) {
    mlpack_model *m = expect_open("native_mlp", threads);
    if (!m) return;
    mlpack_artifact_info ai;
    CHECK(mlpack_artifact_info_get(m, 0, &ai) == MLPACK_OK && ai.chosen && strcmp(ai.device, "cpu") == 0,
          "the cpu artifact was not chosen");
    run_cases("native_mlp", m, threads == 2 ? 300 : 2);  /* many dispatches through the pool */
    mlpack_close(m);
  }
}

static void expect_open_error(const char *name, mlpack_status code, const char *part) {
  mlpack_error *err = NULL;
  mlpack_model *m = open_model(name, 1, &err);
  CHECK(m == NULL, "%s: opened", name);
  if (m) { mlpack_close(m); return; }
  CHECK(mlpack_error_code(err) == code, "%s: code %d, expected %d (%s)", name, mlpack_error_code(err), code,
        mlpack_error_message(err));
  CHECK_CONTAINS(mlpack_error_message(err), part);
  mlpack_error_free(err);
}

static void test_native_errors(void) {
  expect_open_error("native_bad_abi", MLPACK_ERR_VERSION, "table is version 99");
  expect_open_error("native_no_table", MLPACK_ERR_LOAD, "mlpack_kernel_table_v1");
  expect_open_error("native_no_weight", MLPACK_ERR_FORMAT, "ghost");
  expect_open_error("native_bad_kernel", MLPACK_ERR_FORMAT, "kernel");
  /* ABI 1.3: a dispatch binding one buffer too few would have its kernel read a NULL binding */
  expect_open_error("native_missing_binding", MLPACK_ERR_FORMAT,
                    "plan dispatch 1 binds 2 buffers, but its kernel 1 ('bias_relu') takes 3 ('rrw')");
  expect_open_error("native_weight_written", MLPACK_ERR_FORMAT,
                    "plan dispatch 1 binding 2 is buffer 3 (weight 'b'), which its kernel 1 ('bias_relu') writes");
  expect_open_error("native_input_written", MLPACK_ERR_FORMAT,
                    "plan dispatch 0 binding 2 is buffer 0 (input 0 'x'), which its kernel 0 ('matmul') writes");
  expect_open_error("native_bad_bindings", MLPACK_ERR_LOAD, "kernel 4 of the table has malformed bindings");
  mlpack_model *v1 = expect_open("native_table_v1", 1);  /* records no bindings: runs unchecked */
  if (v1) {
    run_cases("native_mlp", v1, 2);
    mlpack_close(v1);
  }
  mlpack_model *m = expect_open("native_fail", 2);
  if (!m) return;
  float x[8] = {0};
  int64_t shape[2] = {2, 4};
  mlpack_tensor in = {.name = "x", .dtype = MLPACK_F32, .rank = 2, .shape = shape, .data = x};
  mlpack_tensor out[1];
  mlpack_error *err = NULL;
  CHECK(mlpack_run(m, &in, 1, out, 1, &err) == MLPACK_ERR_RUNTIME, "a failing kernel was not reported");
  CHECK_CONTAINS(mlpack_error_message(err), "broken");
  mlpack_error_free(err);
  mlpack_close(m);
}

/* plan ABI 1.1: an output whose size a kernel computes (the count of positives) */
static void test_native_computed(void) {
  for (int threads = 1; threads <= 2; threads++) {
    mlpack_model *m = expect_open("native_computed", threads);
    if (!m) return;
    run_cases("native_computed", m, 3);
    mlpack_close(m);
  }
  expect_open_error("native_computed_newer", MLPACK_ERR_VERSION, "ABI 1.9");
  mlpack_model *m = expect_open("native_computed_unbounded", 1);
  if (!m) return;
  float x[4] = {1, 2, -3, 4};
  int64_t shape[1] = {4};
  mlpack_tensor in = {.name = "x", .dtype = MLPACK_F32, .rank = 1, .shape = shape, .data = x};
  mlpack_tensor out[1];
  mlpack_error *err = NULL;
  CHECK(mlpack_run(m, &in, 1, out, 1, &err) == MLPACK_ERR_RUNTIME, "a symbol past its bound was not refused");
  CHECK_CONTAINS(mlpack_error_message(err), "count=3, outside its bound 0..1");
  mlpack_error_free(err);
  x[0] = x[1] = -1;  /* count 1: within the bound, and the model runs again after the error */
  err = NULL;
  CHECK(mlpack_run(m, &in, 1, out, 1, &err) == MLPACK_OK, "run after a bound error: %s",
        err ? mlpack_error_message(err) : "?");
  CHECK(out[0].rank == 1 && out[0].shape[0] == 1 && ((float *)out[0].data)[0] == 8.0f, "output of count 1");
  mlpack_error_free(err);
  mlpack_close(m);
}

static void expect_run_error(mlpack_model *m, const mlpack_tensor *in, size_t n, const char *part) {
  mlpack_tensor out[4];
  mlpack_error *err = NULL;
  mlpack_status st = mlpack_run(m, in, n, out, mlpack_output_count(m), &err);
  CHECK(st == MLPACK_ERR_INPUT, "status %d for '%s'", st, part);
  CHECK_CONTAINS(mlpack_error_message(err), part);
  mlpack_error_free(err);
}

static void expect_into_error(mlpack_model *m, const mlpack_tensor *in, mlpack_tensor *out,
                              const char *part) {
  mlpack_error *err = NULL;
  mlpack_status st = mlpack_run_into(m, in, 3, out, 1, &err);
  CHECK(st == MLPACK_ERR_ARGUMENT, "status %d for '%s'", st, part);
  CHECK_CONTAINS(mlpack_error_message(err), part);
  mlpack_error_free(err);
}

/* 'two' has one output of 3 x 2 x 8 f32 (192 bytes) */
static void test_run_into_errors(mlpack_model *m, mlpack_tensor *in) {
  static float y[64], big[256];
  mlpack_tensor out = {.name = "y", .data = y, .nbytes = 191};
  expect_into_error(m, in, &out, "output 'y' needs 192 bytes, 191 given");
  out.nbytes = 192;
  out.name = "z";
  expect_into_error(m, in, &out, "output 0 is 'y', not 'z'");
  out.name = NULL;
  out.data = (char *)y + 2;
  expect_into_error(m, in, &out, "output 'y' is not aligned to its 4-byte elements");
  out.data = NULL;
  expect_into_error(m, in, &out, "output 'y' has no memory");
  void *mask = in[1].data;   /* an output over an input's memory */
  in[1].data = big;
  out.data = big + 8;
  expect_into_error(m, in, &out, "output 'y' overlaps input 'mask'");
  in[1].data = mask;
  out = (mlpack_tensor){.data = big + 64, .nbytes = sizeof big - 64 * sizeof *big};
  mlpack_error *err = NULL;
  mlpack_tensor ref[1];
  CHECK(mlpack_run_into(m, in, 3, &out, 1, &err) == MLPACK_OK, "run_into: %s", err ? mlpack_error_message(err) : "?");
  CHECK(out.data == big + 64 && out.nbytes == 192 && out.rank == 3 && strcmp(out.name, "y") == 0,
        "run_into filled in the output");
  CHECK(mlpack_run(m, in, 3, ref, 1, &err) == MLPACK_OK, "run after run_into");
  CHECK(memcmp(ref[0].data, big + 64, 192) == 0 && ref[0].data != (void *)(big + 64),
        "run_into wrote what mlpack_run gives, and mlpack_run still uses its own memory");
  mlpack_error_free(err);
}

static void test_input_errors(void) {
  mlpack_model *m = expect_open("two", 1);
  if (!m) return;
  int64_t ids[16] = {0};
  float mask[18] = {0}, scale[3] = {1, 2, 3};
  int64_t s_ids[2] = {2, 8}, s_mask[2] = {2, 9}, s_scale[1] = {3}, s_scale4[1] = {4};
  mlpack_tensor in[3] = {
      {.name = "ids", .dtype = MLPACK_I64, .rank = 2, .shape = s_ids, .data = ids},
      {.name = "mask", .dtype = MLPACK_F32, .rank = 2, .shape = s_mask, .data = mask},
      {.name = "scale", .dtype = MLPACK_F32, .rank = 1, .shape = s_scale, .data = scale}};
  expect_run_error(m, in, 3, "input 'mask' dim 'seq' is 9, but input 'ids' bound seq=8");
  s_mask[1] = 8;
  in[2].shape = s_scale4;
  expect_run_error(m, in, 3, "input 'scale' dim 'c' is 4, expected 3");
  in[2].shape = s_scale;
  in[1].dtype = MLPACK_F64;
  expect_run_error(m, in, 3, "input 'mask' has dtype f64, expected f32");
  in[1].dtype = MLPACK_F32;
  in[1].rank = 1;
  expect_run_error(m, in, 3, "input 'mask' has rank 1, expected 2");
  in[1].rank = 2;
  expect_run_error(m, in, 2, "missing input 'scale'");
  in[2].name = "scales";
  expect_run_error(m, in, 3, "unknown input 'scales'");
  in[2].name = "scale";
  in[2].nbytes = 4;
  expect_run_error(m, in, 3, "input 'scale' has 4 bytes, its shape needs 12");
  in[2].nbytes = 0;
  mlpack_tensor out[1];
  mlpack_error *err = NULL;
  CHECK(mlpack_run(m, in, 3, out, 1, &err) == MLPACK_OK, "run after errors: %s", mlpack_error_message(err));
  CHECK(out[0].rank == 3 && out[0].shape[0] == 3 && out[0].shape[1] == 2 && out[0].shape[2] == 8,
        "output shape of 'two'");
  test_run_into_errors(m, in);
  mlpack_close(m);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  dir = getenv("MLPACK_FIXTURES") ? getenv("MLPACK_FIXTURES") : "build/fixtures";
  test_native();
  test_native_errors();
  test_native_computed();
  test_input_errors();
  test_portable_fixtures();
  return mp_check_report("test_run");
}
