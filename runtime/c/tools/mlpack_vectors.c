/* mlpack_vectors: run one artifact of a container on every case of a folder of raw input files
 * and write its outputs as raw files. `mlpack validate` and `mlpack build` run it, cross-compiled,
 * under qemu-user for the artifacts of another architecture (packager/emulate.py), and judge the
 * outputs in Python exactly as they judge the artifacts this host runs.
 *
 *   mlpack_vectors [-t THREADS] MODEL.mlpack INDEX DIR
 *
 * DIR/cases holds the count of cases, then for each case and each input in signature order its
 * rank and dims, all as decimal numbers separated by white space; input k of case c is
 * DIR/c.k.in, raw little-endian row-major data of the signature's dtype. Output k of case c goes
 * to DIR/c.k.out, and stdout gets one line per output, "output C K DTYPE RANK D0 D1 ...".
 *
 * Exit status: 0 every case ran; 1 the engine failed (its message on stderr); 2 bad arguments or
 * files; 3 this host cannot run the artifact, and stdout is one line "passed-over REASON".
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlpack.h"

#define MAX_RANK 64

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mlpack_vectors: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

static void die_err(const char *what, mlpack_error *err) {
  fprintf(stderr, "mlpack_vectors: %s failed (status %d): %s\n", what, (int)mlpack_error_code(err),
          mlpack_error_message(err));
  mlpack_error_free(err);
  exit(1);
}

static long long next_number(FILE *f, const char *what) {
  long long v;
  if (fscanf(f, "%lld", &v) != 1 || v < 0) die("cases file: expected %s", what);
  return v;
}

static void *read_input(const char *path, size_t want) {
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open '%s': %s", path, strerror(errno));
  void *buf = malloc(want ? want : 1);
  size_t got = buf ? fread(buf, 1, want, f) : 0;
  int extra = fgetc(f) != EOF;  /* a longer file means a wrong shape: say so, don't truncate */
  fclose(f);
  if (!buf || got != want || extra) die("'%s' is not %zu bytes (its shape times the dtype's size)", path, want);
  return buf;
}

static void write_output(const char *path, const mlpack_tensor *t) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(t->data, 1, t->nbytes, f) != t->nbytes || fclose(f)) die("cannot write '%s'", path);
}

/* artifact `index` opened on its own; when this host cannot run it, its verdict from an open that
 * runs the portable artifact (so no other native artifact is loaded) on stdout, and exit 3 */
static mlpack_model *open_pinned(const char *path, size_t index, int threads) {
  mlpack_options opts;
  mlpack_options_init(&opts);
  opts.threads = threads;
  opts.pin_artifact = (int)index + 1;
  opts.strict = 1;
  /* what the artifact loads (its code, its weights) is hashed from the engine's own copy all the
   * same; the other blobs, every digest checked once more, cost a big model seconds under qemu */
  opts.verify = 0;
  mlpack_error *err = NULL;
  mlpack_model *m = mlpack_open(path, &opts, &err);
  if (m) return m;
  if (mlpack_error_code(err) != MLPACK_ERR_NO_ARTIFACT) die_err("mlpack_open", err);
  mlpack_options_init(&opts);
  opts.device = "portable";
  opts.verify = 0;  /* (as the pinned open) */
  mlpack_error *err2 = NULL;
  mlpack_model *probe = mlpack_open(path, &opts, &err2);
  mlpack_artifact_info a;
  if (probe && mlpack_artifact_info_get(probe, index, &a) == MLPACK_OK && !a.runnable) {
    printf("passed-over %s\n", a.reason);
  } else {  /* no portable artifact to probe with: the pinned open's own message */
    const char *msg = mlpack_error_message(err);
    printf("passed-over ");
    for (; *msg; msg++) putchar(*msg == '\n' ? ' ' : *msg);
    printf("\n");
  }
  if (probe) mlpack_close(probe);
  mlpack_error_free(err2);
  mlpack_error_free(err);
  exit(3);
}

int main(int argc, char **argv) {
  int threads = 0, c;
  while ((c = getopt(argc, argv, "t:")) != -1) {
    if (c != 't') die("usage: mlpack_vectors [-t THREADS] MODEL.mlpack INDEX DIR");
    threads = atoi(optarg);
  }
  if (argc - optind != 3) die("usage: mlpack_vectors [-t THREADS] MODEL.mlpack INDEX DIR");
  const char *path = argv[optind], *dir = argv[optind + 2];
  char *end;
  errno = 0;
  unsigned long long index = strtoull(argv[optind + 1], &end, 10);
  if (*end || end == argv[optind + 1] || errno || index > 1u << 20) die("bad artifact index '%s'", argv[optind + 1]);

  mlpack_model *m = open_pinned(path, (size_t)index, threads);

  size_t ni = mlpack_input_count(m), no = mlpack_output_count(m);
  mlpack_tensor_info *info = calloc(ni + 1, sizeof *info);
  mlpack_tensor *in = calloc(ni + 1, sizeof *in), *out = calloc(no + 1, sizeof *out);
  int64_t(*shapes)[MAX_RANK] = calloc(ni + 1, sizeof *shapes);
  if (!info || !in || !out || !shapes) die("out of memory");
  for (size_t k = 0; k < ni; k++)
    if (mlpack_input_info(m, k, &info[k]) != MLPACK_OK) die("cannot read input %zu's info", k);

  char file[4096];
  snprintf(file, sizeof file, "%s/cases", dir);
  FILE *cases = fopen(file, "r");
  if (!cases) die("cannot open '%s': %s", file, strerror(errno));
  long long n = next_number(cases, "the number of cases");
  for (long long ci = 0; ci < n; ci++) {
    for (size_t k = 0; k < ni; k++) {
      size_t rank = (size_t)next_number(cases, "a rank"), count = 1;
      if (rank > MAX_RANK) die("input %s: rank %zu is over %d", info[k].name, rank, MAX_RANK);
      for (size_t d = 0; d < rank; d++) count *= (size_t)(shapes[k][d] = next_number(cases, "a dim"));
      size_t nbytes = count * mlpack_dtype_size(info[k].dtype);
      snprintf(file, sizeof file, "%s/%lld.%zu.in", dir, ci, k);
      /* the shape and dtype go as given: a mismatch is the engine's to report */
      in[k] = (mlpack_tensor){.name = info[k].name, .dtype = info[k].dtype, .rank = rank,
                              .shape = shapes[k], .data = read_input(file, nbytes), .nbytes = nbytes};
    }
    mlpack_error *err = NULL;
    if (mlpack_run(m, in, ni, out, no, &err) != MLPACK_OK) die_err("mlpack_run", err);
    for (size_t k = 0; k < no; k++) {
      snprintf(file, sizeof file, "%s/%lld.%zu.out", dir, ci, k);
      write_output(file, &out[k]);
      printf("output %lld %zu %s %zu", ci, k, mlpack_dtype_name(out[k].dtype), out[k].rank);
      for (size_t d = 0; d < out[k].rank; d++) printf(" %lld", (long long)out[k].shape[d]);
      printf("\n");
    }
    for (size_t k = 0; k < ni; k++) free(in[k].data);
  }
  fclose(cases);
  free(info); free(in); free(out); free(shapes);
  mlpack_close(m);  /* outputs belong to the model: written out above */
  return fflush(stdout) == 0 ? 0 : 2;
}
