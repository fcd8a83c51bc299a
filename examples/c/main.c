/* mlpack_run_example: open a container, show what the engine chose and why, run it once (or -r N
 * times), print each output's shape and first values.
 *
 *   mlpack_run_example [-t THREADS] [-d DEVICE] [-p PRECISION] [-S] [-k KEYS] [-n COUNT] [-r REPEAT]
 *                      [-o PREFIX] MODEL.mlpack [INPUT ...]
 *
 * INPUT is one of
 *   NAME=D0,D1,...:FILE.bin   a raw little-endian row-major file of that shape
 *   NAME=D0,D1,...            seeded random data of that shape
 *   NAME:FILE.bin, FILE.bin   a file; the shape is the signature's (every dim fixed); a bare
 *                             FILE.bin is the next input in signature order
 * An input not given is random (fixed seed) with its symbolic dims set to 1. -o PREFIX writes
 * each output to PREFIX<name>.bin. THREADS 0 (default) lets the engine read MLPACK_NUM_THREADS,
 * else use every core. -S (strict) refuses the portable interpreter as a fallback. -k KEYS sets the
 * trust policy (Ed25519 public key files or folders, ':'-separated; default MLPACK_TRUSTED_KEYS):
 * the container must be signed by one of them, checked before any code loads. Every failure
 * prints the engine's message and exits non-zero.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlpack.h"

#define MAX_RANK 16

typedef struct {
  const char *name;
  int64_t shape[MAX_RANK];
  size_t rank;        /* 0 with has_shape == 0: take the signature's */
  int has_shape;
  const char *file;   /* NULL: random */
} input_arg;

/* usage and file errors exit 2 */
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mlpack_run_example: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* engine failures exit 1 with the engine's own message (it names the file/input/dim at fault) */
static void die_err(const char *what, mlpack_error *err) {
  fprintf(stderr, "mlpack_run_example: %s failed (status %d): %s\n", what, (int)mlpack_error_code(err),
          mlpack_error_message(err));
  mlpack_error_free(err);
  exit(1);
}

static void print_info(const char *kind, size_t i, const mlpack_tensor_info *t) {
  printf("%s %zu: %s %s [", kind, i, t->name, mlpack_dtype_name(t->dtype));
  for (size_t d = 0; d < t->rank; d++) {
    printf("%s%s=", d ? ", " : "", t->dim_names[d]);
    if (t->dim_syms[d]) printf("$%s", t->dim_syms[d]);
    else printf("%lld", (long long)t->dims[d]);
  }
  printf("]\n");
}

static void print_shape(const int64_t *shape, size_t rank) {
  printf("[");
  for (size_t d = 0; d < rank; d++) printf("%s%lld", d ? ", " : "", (long long)shape[d]);
  printf("]");
}

/* "D0,D1,..." ("" is a scalar) */
static void parse_shape(const char *s, input_arg *a) {
  a->has_shape = 1;
  a->rank = 0;
  while (*s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 0 || a->rank == MAX_RANK || (*end && *end != ','))
      die("bad shape '%s' for input %s (want D0,D1,...)", s, a->name);
    a->shape[a->rank++] = v;
    s = *end ? end + 1 : end;
  }
}

static void parse_input(char *arg, input_arg *a) {
  memset(a, 0, sizeof *a);
  char *eq = strchr(arg, '='), *colon;
  if (eq) {  /* NAME=SHAPE[:FILE] */
    *eq = 0;
    a->name = arg;
    if ((colon = strchr(eq + 1, ':'))) { *colon = 0; a->file = colon + 1; }
    parse_shape(eq + 1, a);
  } else if ((colon = strchr(arg, ':'))) {  /* NAME:FILE */
    *colon = 0;
    a->name = arg;
    a->file = colon + 1;
  } else {  /* FILE: positional */
    a->file = arg;
  }
}

/* xorshift64*: the same numbers on every platform, so runs here and under qemu agree */
static uint64_t rng_state;
static uint64_t rng_next(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint16_t f32_to_f16(float f) {  /* round to nearest even; enough for [-1, 1) test data */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
  if (e < 103) return (uint16_t)sign;  /* too small even for a subnormal */
  if (e < 113) {                        /* subnormal half */
    m |= 0x800000;
    uint32_t shift = 126 - e, h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((e - 112) << 10) | (m >> 13), rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | (h > 0x7bff ? 0x7c00 : h));
}

static double f16_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? m / 1024.0 / 16384.0 : e == 31 ? (m ? NAN : INFINITY) : (1 + m / 1024.0);
  if (e && e != 31) v = e >= 15 ? v * (double)(1u << (e - 15)) : v / (double)(1u << (15 - e));
  return (h & 0x8000) ? -v : v;
}

/* floats uniform in [-1, 1); integers in [0, 10) (small enough to index any embedding table) */
static void fill_random(void *data, mlpack_dtype dt, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next();
    float f = (float)((double)(r >> 11) / 9007199254740992.0 * 2 - 1);
    int64_t k = (int64_t)(r % 10);
    switch (dt) {
      case MLPACK_BOOL: ((uint8_t *)data)[i] = (uint8_t)(r & 1); break;
      case MLPACK_I8: case MLPACK_U8: ((uint8_t *)data)[i] = (uint8_t)k; break;
      case MLPACK_I16: case MLPACK_U16: ((uint16_t *)data)[i] = (uint16_t)k; break;
      case MLPACK_I32: case MLPACK_U32: ((uint32_t *)data)[i] = (uint32_t)k; break;
      case MLPACK_I64: case MLPACK_U64: ((uint64_t *)data)[i] = (uint64_t)k; break;
      case MLPACK_F16: ((uint16_t *)data)[i] = f32_to_f16(f); break;
      case MLPACK_BF16: {  /* truncation: bf16 is the top half of an f32 */
        uint32_t x;
        memcpy(&x, &f, 4);
        ((uint16_t *)data)[i] = (uint16_t)(x >> 16);
        break;
      }
      case MLPACK_F32: ((float *)data)[i] = f; break;
      case MLPACK_F64: ((double *)data)[i] = (double)f; break;
      default: break;
    }
  }
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
    case MLPACK_F16: return f16_to_double(((const uint16_t *)data)[i]);
    case MLPACK_BF16: {
      uint32_t x = (uint32_t)((const uint16_t *)data)[i] << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
    case MLPACK_F32: return ((const float *)data)[i];
    case MLPACK_F64: return ((const double *)data)[i];
    default: return 0;
  }
}

static void *read_file(const char *path, size_t want, const char *input) {
  FILE *f = fopen(path, "rb");
  if (!f) die("input %s: cannot open '%s'", input, path);
  void *buf = malloc(want ? want : 1);
  size_t got = buf ? fread(buf, 1, want, f) : 0;
  int extra = fgetc(f) != EOF;  /* a longer file means the shape is wrong: say so, don't truncate */
  fclose(f);
  if (!buf || got != want || extra)
    die("input %s: '%s' is not %zu bytes (the shape x dtype size)", input, path, want);
  return buf;
}

static void write_output(const char *prefix, const mlpack_tensor *t) {
  char path[4096];
  int n = snprintf(path, sizeof path, "%s", prefix);
  /* output names come from the model: keep only characters that are safe in a file name */
  for (const char *c = t->name; *c && n < (int)sizeof path - 5; c++)
    path[n++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                *c == '_' || *c == '-' || *c == '.' ? *c : '_';
  snprintf(path + n, sizeof path - (size_t)n, ".bin");
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(t->data, 1, t->nbytes, f) != t->nbytes || fclose(f)) die("cannot write '%s'", path);
  printf("  wrote %s\n", path);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  mlpack_options opts;
  mlpack_options_init(&opts);
  const char *out_prefix = NULL;
  int show = 8, repeat = 1, c;
  while ((c = getopt(argc, argv, "t:d:p:Sk:n:r:o:h")) != -1) {
    switch (c) {
      case 't': opts.threads = atoi(optarg); break;
      case 'd': opts.device = optarg; break;
      case 'p': opts.precision = optarg; break;
      case 'S': opts.strict = 1; break;
      case 'k': opts.trusted_keys = optarg; break;
      case 'n': show = atoi(optarg); break;
      case 'r': repeat = atoi(optarg) > 0 ? atoi(optarg) : 1; break;
      case 'o': out_prefix = optarg; break;
      default:
        fprintf(stderr, "usage: %s [-t THREADS] [-d DEVICE] [-p PRECISION] [-S] [-k KEYS] [-n COUNT] [-r REPEAT] "
                "[-o PREFIX] MODEL.mlpack [NAME=D0,D1,...[:FILE.bin] | NAME:FILE.bin | FILE.bin ...]\n",
                argv[0]);
        return 2;
    }
  }
  if (optind >= argc) die("no model given (try -h)");
  const char *path = argv[optind++];

  mlpack_error *err = NULL;
  double t0 = now();
  mlpack_model *m = mlpack_open(path, &opts, &err);
  if (!m) die_err("mlpack_open", err);
  printf("mlpack %s: opened %s in %.1f ms\n", mlpack_version_string(), path, (now() - t0) * 1e3);
  if (mlpack_signer(m)) printf("signed by trusted key %s\n", mlpack_signer(m));

  /* what was chosen, then every artifact's verdict: the reasons say what to change to get another */
  size_t na = mlpack_artifact_count(m);
  for (int pass = 0; pass < 2; pass++) {  /* the chosen one first, then all of them */
    for (size_t i = 0; i < na; i++) {
      mlpack_artifact_info a;
      char where[64];
      if (mlpack_artifact_info_get(m, i, &a) != MLPACK_OK) continue;
      snprintf(where, sizeof where, "%s%s%s", a.architecture[0] ? a.architecture : "any",
               a.variant[0] ? "/" : "", a.variant);
      if (pass == 0 && a.chosen)
        printf("using artifact %zu (%s %s %s): %s\n", i, a.device, a.precision, where, a.reason);
      if (pass == 1)
        printf("  artifact %zu: %-8s %-4s %-8s %-12s %s\n", i, a.device, a.precision, where,
               a.runnable ? "runnable" : "not runnable", a.reason);
    }
  }

  size_t ni = mlpack_input_count(m), no = mlpack_output_count(m);
  mlpack_tensor_info *iinfo = calloc(ni + 1, sizeof *iinfo), oinfo;
  for (size_t i = 0; i < ni; i++) {
    if (mlpack_input_info(m, i, &iinfo[i]) != MLPACK_OK) die("cannot read input %zu's info", i);
    print_info("input", i, &iinfo[i]);
  }
  for (size_t i = 0; i < no; i++) {
    if (mlpack_output_info(m, i, &oinfo) != MLPACK_OK) die("cannot read output %zu's info", i);
    print_info("output", i, &oinfo);
  }

  /* match the command line's inputs to the signature; the rest are random */
  input_arg *args = calloc(ni + 1, sizeof *args);
  int *given = calloc(ni + 1, sizeof *given);
  for (size_t next = 0; optind < argc; optind++) {
    input_arg a;
    parse_input(argv[optind], &a);
    size_t k = ni;
    if (a.name) {
      for (k = 0; k < ni && strcmp(iinfo[k].name, a.name); k++) {}
      if (k == ni) die("the model has no input named '%s'", a.name);
    } else {
      while (next < ni && given[next]) next++;
      if ((k = next) == ni) die("more inputs given than the model has (at '%s')", a.file);
    }
    if (given[k]) die("input %s given twice", iinfo[k].name);
    given[k] = 1;
    a.name = iinfo[k].name;
    args[k] = a;
  }

  mlpack_tensor *in = calloc(ni + 1, sizeof *in);
  for (size_t i = 0; i < ni; i++) {
    input_arg *a = &args[i];
    a->name = iinfo[i].name;
    if (!a->has_shape) {  /* the signature's shape; a symbolic dim is 1 for random data only */
      a->rank = iinfo[i].rank;
      for (size_t d = 0; d < a->rank; d++) {
        if (iinfo[i].dims[d] < 0 && a->file)
          die("input %s: dim %s is symbolic; give the shape: NAME=D0,D1,...:FILE", a->name,
              iinfo[i].dim_names[d]);
        a->shape[d] = iinfo[i].dims[d] < 0 ? 1 : iinfo[i].dims[d];
      }
    }
    size_t count = 1;
    for (size_t d = 0; d < a->rank; d++) count *= (size_t)a->shape[d];
    size_t nbytes = count * mlpack_dtype_size(iinfo[i].dtype);
    void *data;
    if (a->file) {
      data = read_file(a->file, nbytes, a->name);
    } else {
      if (!(data = malloc(nbytes ? nbytes : 1))) die("out of memory for input %s", a->name);
      rng_state = 0x9E3779B97F4A7C15ULL + i;  /* fixed seed per input */
      fill_random(data, iinfo[i].dtype, count);
    }
    /* the shape and dtype are passed as given: mismatches are the engine's to report */
    in[i] = (mlpack_tensor){.name = a->name, .dtype = iinfo[i].dtype, .rank = a->rank,
                            .shape = a->shape, .data = data, .nbytes = nbytes};
    printf("input %s: ", a->name);
    print_shape(a->shape, a->rank);
    printf(" from %s\n", a->file ? a->file : "random (fixed seed)");
  }

  mlpack_tensor *out = calloc(no + 1, sizeof *out);
  double best = 1e30, total = 0;
  for (int r = 0; r < repeat; r++) {
    double t = now();
    if (mlpack_run(m, in, ni, out, no, &err) != MLPACK_OK) die_err("mlpack_run", err);
    t = now() - t;
    total += t;
    if (t < best) best = t;
  }
  printf("ran %d time%s: %.3f ms mean, %.3f ms best\n", repeat, repeat == 1 ? "" : "s",
         total / repeat * 1e3, best * 1e3);

  for (size_t i = 0; i < no; i++) {
    const mlpack_tensor *t = &out[i];
    size_t count = t->nbytes / (mlpack_dtype_size(t->dtype) ? mlpack_dtype_size(t->dtype) : 1);
    printf("output %s: %s ", t->name, mlpack_dtype_name(t->dtype));
    print_shape(t->shape, t->rank);
    printf(" =");
    for (size_t k = 0; k < count && (int)k < show; k++) printf(" %.9g", value_at(t->data, t->dtype, k));
    printf("%s\n", (size_t)show < count ? " ..." : "");
    if (out_prefix) write_output(out_prefix, t);
  }

  for (size_t i = 0; i < ni; i++) free(in[i].data);
  free(in); free(out); free(args); free(given); free(iinfo);
  mlpack_close(m);  /* outputs belong to the model: read them before this */
  return 0;
}
