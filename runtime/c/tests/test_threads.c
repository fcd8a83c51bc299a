/* test_threads.c: one model run from many threads at once gives, bit for bit, what serial runs give.
 *
 * For each fixture of tests/make_fixtures.py used below (a native plan on the pool, a native plan
 * with a data-dependent output size, portable programs, one with data-dependent sizes), CASES
 * inputs of different shapes and values are run serially first; then THREADS threads, released
 * together, each run ROUNDS of them on the same open model (each thread in its own order),
 * through mlpack_run and, where every output's shape follows from the inputs, mlpack_run_into on
 * every other round, and compare every output's shape and bytes with the serial run of that
 * input. The native plans run with a pool of 2 (the runs share it: one holds it, the others run
 * on their own threads), native_mlp with a pool of 1 as well. Last, a thread's mlpack_run outputs
 * must stay as they were while another thread runs the model on other sizes. `make tsan` builds
 * this with -fsanitize=thread: the engine's synchronization itself.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine.h"

#define THREADS 8
#define ROUNDS 200
#define CASES 12
#define MAXT 8          /* inputs or outputs of a fixture */

static const char *dir;

typedef struct tensor_copy {   /* an input or a serial output, owned */
  mlpack_dtype dtype;
  size_t rank;
  int64_t shape[8];
  void *data;
  size_t nbytes;
} tensor_copy;

typedef struct fixture {
  const char *name;
  mlpack_model *m;
  size_t ni, no;
  int into;                            /* every output's shape follows from the inputs */
  mlpack_tensor in[CASES][MAXT];       /* views of inputs[] */
  tensor_copy inputs[CASES][MAXT];
  tensor_copy want[CASES][MAXT];       /* the serial run's outputs */
} fixture;

static uint64_t rng_next(uint64_t *s) {   /* splitmix64: the same inputs on every machine */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Values every fixture below accepts: floats in [-2, 2) with a third exact zeros (NonZero and
 * the computed count see both), small integers (token ids, argmax ties). */
static void fill(void *data, mlpack_dtype dt, size_t count, uint64_t *s) {
  for (size_t i = 0; i < count; i++) {
    uint64_t r = rng_next(s);
    switch (dt) {
    case MLPACK_F32:
      ((float *)data)[i] = r % 3 == 0 ? 0.0f : (float)((double)(r >> 11) / 9007199254740992.0 * 4 - 2);
      break;
    case MLPACK_I64: ((int64_t *)data)[i] = (int64_t)(r % 10); break;
    case MLPACK_I32: ((int32_t *)data)[i] = (int32_t)(r % 7) - 3; break;
    default: memset((char *)data + i * mlpack_dtype_size(dt), (int)(r & 1), mlpack_dtype_size(dt)); break;
    }
  }
}

/* Case c's inputs: every symbol sized 1 + (c * 5 + k) % 9 for the k-th symbol met (the same size
 * wherever a symbol recurs), fixed dims as the signature says. */
static void make_inputs(fixture *f, int c) {
  const char *syms[16];
  int64_t vals[16];
  size_t nsym = 0;
  uint64_t seed = 1000u + (uint64_t)c * 7919u;
  for (size_t i = 0; i < f->ni; i++) {
    mlpack_tensor_info info;
    mlpack_input_info(f->m, i, &info);
    tensor_copy *t = &f->inputs[c][i];
    t->dtype = info.dtype;
    t->rank = info.rank;
    size_t count = 1;
    for (size_t d = 0; d < info.rank; d++) {
      int64_t n = info.dims[d];
      if (info.dim_syms[d]) {
        size_t k = 0;
        while (k < nsym && strcmp(syms[k], info.dim_syms[d]) != 0) k++;
        if (k == nsym && nsym < 16) { syms[nsym] = info.dim_syms[d]; vals[nsym++] = 1 + (c * 5 + (int)k) % 9; }
        n = k < nsym ? vals[k] : 1;
      }
      t->shape[d] = n;
      count *= (size_t)n;
    }
    t->nbytes = count * mlpack_dtype_size(info.dtype);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    fill(t->data, info.dtype, count, &seed);
    f->in[c][i] = (mlpack_tensor){.name = info.name, .dtype = t->dtype, .rank = t->rank, .shape = t->shape,
                                  .data = t->data, .nbytes = t->nbytes};
  }
}

static void copy_outputs(const mlpack_tensor *out, size_t n, tensor_copy *to) {
  for (size_t o = 0; o < n; o++) {
    to[o].dtype = out[o].dtype;
    to[o].rank = out[o].rank;
    memcpy(to[o].shape, out[o].shape, out[o].rank * sizeof *to[o].shape);
    to[o].nbytes = out[o].nbytes;
    to[o].data = malloc(out[o].nbytes ? out[o].nbytes : 1);
    memcpy(to[o].data, out[o].data, out[o].nbytes);
  }
}

/* 0 when out[] is bit for bit the serial run of case c */
static int differs(const fixture *f, int c, const mlpack_tensor *out) {
  for (size_t o = 0; o < f->no; o++) {
    const tensor_copy *w = &f->want[c][o];
    if (out[o].dtype != w->dtype || out[o].rank != w->rank || out[o].nbytes != w->nbytes ||
        memcmp(out[o].shape, w->shape, w->rank * sizeof *w->shape) != 0 ||
        memcmp(out[o].data, w->data, w->nbytes) != 0)
      return 1;
  }
  return 0;
}

static int setup(fixture *f, const char *name, int threads) {
  memset(f, 0, sizeof *f);
  f->name = name;
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.mlpack", dir, name);
  mlpack_options o;
  mlpack_options_init(&o);
  o.threads = threads;
  mlpack_error *err = NULL;
  f->m = mlpack_open(path, &o, &err);
  CHECK(f->m != NULL, "%s: open: %s", name, err ? mlpack_error_message(err) : "?");
  mlpack_error_free(err);
  if (!f->m) return -1;
  f->ni = mlpack_input_count(f->m);
  f->no = mlpack_output_count(f->m);
  CHECK(f->ni <= MAXT && f->no <= MAXT, "%s: too many inputs or outputs for this test", name);
  if (f->ni > MAXT || f->no > MAXT) return -1;
  f->into = 1;
  for (size_t o = 0; o < f->no; o++) {   /* an output dim no input's symbol sizes: data decides */
    mlpack_tensor_info info;
    mlpack_output_info(f->m, o, &info);
    for (size_t d = 0; d < info.rank; d++) {
      const char *sym = info.dim_syms[d];
      int bound = !sym || strchr(sym, '$') != NULL;   /* (no fixture here has an expression) */
      for (size_t i = 0; !bound && i < f->ni; i++) {
        mlpack_tensor_info in;
        mlpack_input_info(f->m, i, &in);
        for (size_t k = 0; k < in.rank; k++) bound |= in.dim_syms[k] && strcmp(in.dim_syms[k], sym) == 0;
      }
      if (!bound) f->into = 0;
    }
  }
  for (int c = 0; c < CASES; c++) {
    make_inputs(f, c);
    mlpack_tensor out[MAXT];
    err = NULL;
    mlpack_status st = mlpack_run(f->m, f->in[c], f->ni, out, f->no, &err);
    CHECK(st == MLPACK_OK, "%s case %d: serial run: %s", name, c, err ? mlpack_error_message(err) : "?");
    mlpack_error_free(err);
    if (st != MLPACK_OK) return -1;
    copy_outputs(out, f->no, f->want[c]);
  }
  return 0;
}

static void teardown(fixture *f) {
  for (int c = 0; c < CASES; c++)
    for (size_t i = 0; i < MAXT; i++) {
      free(f->inputs[c][i].data);
      free(f->want[c][i].data);
    }
  mlpack_close(f->m);
}

typedef struct worker {
  fixture *f;
  pthread_barrier_t *start;
  int id;
  int runs, mismatches, failures;
  char first[256];   /* the first failure's message */
} worker;

static void *work(void *arg) {
  worker *w = arg;
  fixture *f = w->f;
  void *mem[MAXT] = {0};
  for (size_t o = 0; o < f->no; o++) {   /* run_into's memory: the largest output of any case */
    size_t most = 1;
    for (int c = 0; c < CASES; c++) most = f->want[c][o].nbytes > most ? f->want[c][o].nbytes : most;
    mem[o] = malloc(most);
  }
  pthread_barrier_wait(w->start);
  for (int r = 0; r < ROUNDS; r++) {
    int c = (w->id * 7 + r * (w->id % 3 + 1)) % CASES;   /* each thread its own order */
    int into = f->into && (r + w->id) % 2 == 1;
    mlpack_tensor out[MAXT];
    for (size_t o = 0; o < f->no; o++)
      out[o] = (mlpack_tensor){.data = mem[o], .nbytes = f->want[c][o].nbytes};
    mlpack_error *err = NULL;
    mlpack_status st = into ? mlpack_run_into(f->m, f->in[c], f->ni, out, f->no, &err)
                            : mlpack_run(f->m, f->in[c], f->ni, out, f->no, &err);
    w->runs++;
    if (st != MLPACK_OK) {
      if (!w->failures++)
        snprintf(w->first, sizeof w->first, "%s", err ? mlpack_error_message(err) : "(no message)");
    } else if (differs(f, c, out)) {
      if (!w->mismatches++ && !w->failures)
        snprintf(w->first, sizeof w->first, "case %d (%s) differs from the serial run", c,
                 into ? "mlpack_run_into" : "mlpack_run");
    }
    mlpack_error_free(err);
  }
  for (size_t o = 0; o < f->no; o++) free(mem[o]);
  return NULL;
}

static void run_threads(const char *name, int pool_threads) {
  static fixture f;   /* (large: not on the stack) */
  if (setup(&f, name, pool_threads) != 0) {
    if (f.m) teardown(&f);
    return;
  }
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  pthread_t tids[THREADS];
  worker ws[THREADS];
  int started = 0;
  for (int t = 0; t < THREADS; t++) {
    ws[t] = (worker){.f = &f, .start = &start, .id = t};
    started += pthread_create(&tids[t], NULL, work, &ws[t]) == 0;
  }
  CHECK(started == THREADS, "%s: started %d of %d threads", name, started, THREADS);
  if (started < THREADS) exit(mp_check_report("test_threads"));   /* the barrier would never open */
  int runs = 0;
  for (int t = 0; t < THREADS; t++) {
    pthread_join(tids[t], NULL);
    runs += ws[t].runs;
    CHECK(ws[t].failures == 0 && ws[t].mismatches == 0, "%s (pool of %d), thread %d: %d failed, %d differ: %s",
          name, pool_threads, t, ws[t].failures, ws[t].mismatches, ws[t].first);
  }
  pthread_barrier_destroy(&start);
  CHECK(runs == THREADS * ROUNDS, "%s: %d runs", name, runs);
  /* and serially again afterwards: the model is as it was (a context per thread, all freed at close) */
  mlpack_tensor out[MAXT];
  mlpack_error *err = NULL;
  CHECK(mlpack_run(f.m, f.in[3], f.ni, out, f.no, &err) == MLPACK_OK && !differs(&f, 3, out),
        "%s: a serial run after the threads", name);
  mlpack_error_free(err);
  teardown(&f);
}

/* mlpack_run's outputs are the calling thread's: another thread's runs leave them as they were. */
typedef struct holder {
  fixture *f;
  pthread_barrier_t *step;
  int ok;
} holder;

static void *hold(void *arg) {
  holder *h = arg;
  fixture *f = h->f;
  mlpack_tensor out[MAXT];
  mlpack_error *err = NULL;
  h->ok = mlpack_run(f->m, f->in[0], f->ni, out, f->no, &err) == MLPACK_OK;
  mlpack_error_free(err);
  pthread_barrier_wait(h->step);   /* 1: our outputs are out */
  pthread_barrier_wait(h->step);   /* 2: the main thread has run other cases */
  h->ok = h->ok && !differs(f, 0, out);
  return NULL;
}

static void test_outputs_are_per_thread(void) {
  static fixture f;
  if (setup(&f, "native_mlp", 2) != 0) {
    if (f.m) teardown(&f);
    return;
  }
  pthread_barrier_t step;
  pthread_barrier_init(&step, NULL, 2);
  holder h = {.f = &f, .step = &step};
  pthread_t tid;
  CHECK(pthread_create(&tid, NULL, hold, &h) == 0, "thread");
  pthread_barrier_wait(&step);
  for (int c = 1; c < CASES; c++) {   /* other sizes: a shared buffer would be reused or freed */
    mlpack_tensor out[MAXT];
    mlpack_error *err = NULL;
    CHECK(mlpack_run(f.m, f.in[c], f.ni, out, f.no, &err) == MLPACK_OK && !differs(&f, c, out),
          "native_mlp case %d on the main thread", c);
    mlpack_error_free(err);
  }
  pthread_barrier_wait(&step);
  pthread_join(tid, NULL);
  CHECK(h.ok, "a thread's outputs changed while another thread ran the model");
  pthread_barrier_destroy(&step);
  teardown(&f);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  dir = getenv("MLPACK_FIXTURES") ? getenv("MLPACK_FIXTURES") : "build/fixtures";
  run_threads("native_mlp", 2);
  run_threads("native_mlp", 1);
  run_threads("native_computed", 2);
  static const char *const portable[] = {"two", "nonzero", "softmax", "prefix", "matmul", "argreduce"};
  for (size_t i = 0; i < sizeof portable / sizeof *portable; i++) run_threads(portable[i], 1);
  test_outputs_are_per_thread();
  return mp_check_report("test_threads");
}
