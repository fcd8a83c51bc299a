/* pool.c: the persistent thread pool that runs a dispatch's workgroups.
 *
 * N-1 worker threads plus the caller. A job is (fn, ctx, count); its workgroups are cut into
 * one contiguous share per thread, and a thread that finishes its share takes what is left of
 * the others' (mp_pool_work), so a fast thread simply takes more of them. Jobs are numbered: a
 * worker that finished job g polls for g+1 for up to MP_POOL_SPIN_NS (dispatches of one run
 * follow each other within microseconds, and a futex wake costs more than that), then sleeps
 * on a condition variable.
 *
 * A worker joins a job only while it is open, by raising the count of workers inside it in the
 * same atomic word as the job number (`state`). Once every workgroup is handed out the caller
 * closes the job and waits only for the workers inside it: a worker the scheduler has not run
 * yet (its core busy with another process) never holds a dispatch up, it finds the job closed
 * and waits for the next. mp_pool_run returns only when every workgroup has run and no worker
 * is inside the job, so ctx may live on the caller's stack.
 *
 * The protocol has one caller (the job fields are the caller's, unlocked). Runs of a model that
 * overlap lease the pool for a whole run (mp_pool_acquire, a try-lock): the one that holds it
 * spreads its dispatches over the workers, the others run theirs on their own calling threads
 * (a NULL pool). No run waits for the pool or starts threads of its own, and a lone run always
 * gets it, so its latency is what it was.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* How long a thread polls before it sleeps: a worker for the next job, the caller for the
 * workers inside its job. Long enough to span a run's serial stretches (a one-workgroup
 * dispatch, the caller's own work between dispatches), so that a run's threads stay on their
 * cores: one that sleeps halts its core, and a virtual machine's halted core wakes slowly for a
 * while after idling (MobileNetV2 at 2 threads on a Zen 4 guest: 8.6 ms for a run after 1 s idle
 * and 9.8 for the next three, 4.1 steady, with 2000 pauses of polling, 10-100 us; 4.9 and 4.7
 * with 1 ms). ONNX Runtime's threads poll for longer (tens of ms). */
#define MP_POOL_SPIN_NS 1000000L

/* state: job number in the high 32 bits, then the closed flag, then the workers inside */
#define MP_CLOSED (1ull << 31)
#define MP_INSIDE 0x7fffffffull
#define MP_JOB(s) ((uint32_t)((s) >> 32))

/* A thread's share of a job: the next workgroup to take and the end, on its own cache line. */
struct mp_range {
  _Alignas(64) atomic_uint next;
  uint32_t end;
};

struct mp_pool {
  int threads;
  pthread_t *tids;
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  /* the current job; written by the caller before `state` publishes it (release) */
  void (*fn)(void *ctx, uint32_t i);
  void *ctx;
  uint32_t job;              /* the caller's job number */
  struct mp_range *ranges;   /* per thread: its share of the workgroups */
  atomic_int seats;          /* thread indices handed to the workers, at start */
  atomic_ullong state;
  atomic_int sleepers;       /* workers waiting on work_cv */
  atomic_int stop;
  atomic_int leased;         /* a run holds the pool (mp_pool_acquire) */
};

static inline void mp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Each thread first takes the workgroups of its own share, one at a time and in order, then
 * those left in the others' shares. Consecutive dispatches cut their workgroups the same way,
 * so a thread mostly reads what it wrote itself (in its own core's cache); neighbouring
 * workgroups, which write neighbouring memory, mostly stay on one thread; and a thread the
 * scheduler takes off its core (another process's spinning threads on a busy machine) holds
 * up at most the one workgroup it is running, the others take the rest of its share. */
static void mp_pool_work(mp_pool *p, int seat) {
  int n = p->threads;
  for (int k = 0; k < n; k++) {
    struct mp_range *r = &p->ranges[(seat + k) % n];
    uint32_t i;
    while ((i = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed)) < r->end)
      p->fn(p->ctx, i);
  }
}

static long long mp_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Whether a thread polling since `*start` (0: not yet read) should go on: MP_POOL_SPIN_NS,
 * the clock read once every 64 polls. */
static int mp_keep_polling(long long *start, unsigned i) {
  if (i % 64) return 1;
  long long now = mp_now_ns();
  if (!*start) *start = now;
  return now - *start < MP_POOL_SPIN_NS;
}

/* Wait until the job number differs from `seen` (or stop); returns the new number. */
static uint32_t mp_pool_wait_job(mp_pool *p, uint32_t seen) {
  long long start = 0;
  for (unsigned s = 0; mp_keep_polling(&start, s); s++) {
    uint32_t g = MP_JOB(atomic_load_explicit(&p->state, memory_order_acquire));
    if (g != seen || atomic_load(&p->stop)) return g;
    mp_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  /* sleepers is raised before re-checking the job (both seq_cst), so the caller either sees
   * a sleeper and broadcasts under the mutex, or we see its new job: no lost wake-up. */
  atomic_fetch_add(&p->sleepers, 1);
  while (MP_JOB(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
    pthread_cond_wait(&p->work_cv, &p->mu);
  atomic_fetch_sub(&p->sleepers, 1);
  pthread_mutex_unlock(&p->mu);
  return MP_JOB(atomic_load_explicit(&p->state, memory_order_acquire));
}

/* Join job `g` if it is still open: 1 when joined. */
static int mp_pool_enter(mp_pool *p, uint32_t g) {
  unsigned long long s = atomic_load_explicit(&p->state, memory_order_acquire);
  while (MP_JOB(s) == g && !(s & MP_CLOSED))
    if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return 1;
  return 0;
}

static void *mp_pool_worker(void *arg) {
  mp_pool *p = arg;
  int seat = atomic_fetch_add(&p->seats, 1);
  uint32_t seen = 0;
  for (;;) {
    seen = mp_pool_wait_job(p, seen);
    if (atomic_load(&p->stop)) return NULL;
    if (!mp_pool_enter(p, seen)) continue;   /* closed already: every workgroup was taken */
    mp_pool_work(p, seat);
    unsigned long long s = atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel) - 1;
    if ((s & MP_CLOSED) && (s & MP_INSIDE) == 0) {   /* the caller may be asleep on it */
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

mp_pool *mp_pool_create(int threads) {
  mp_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  if (threads < 1) threads = 1;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  p->threads = 1;
  atomic_init(&p->seats, 1);   /* the caller is seat 0 */
  size_t bytes = ((size_t)threads * sizeof *p->ranges + 63) / 64 * 64;
  void *ranges = NULL;
  if (posix_memalign(&ranges, 64, bytes) != 0) { mp_pool_destroy(p); return NULL; }
  p->ranges = ranges;
  memset(p->ranges, 0, bytes);
  if (threads > 1) {
    p->tids = calloc((size_t)threads - 1, sizeof *p->tids);
    if (!p->tids) { mp_pool_destroy(p); return NULL; }
    for (int t = 0; t < threads - 1; t++) {
      if (pthread_create(&p->tids[t], NULL, mp_pool_worker, p) != 0) break;  /* run with fewer */
      p->threads++;
    }
  }
  return p;
}

int mp_pool_threads(const mp_pool *p) { return p ? p->threads : 1; }

/* The lease hands the job fields from one caller to the next: acquire pairs with release. */
mp_pool *mp_pool_acquire(mp_pool *p) {
  if (!p || p->threads == 1) return p;   /* no workers: mp_pool_run touches nothing shared */
  int free = 0;
  if (atomic_compare_exchange_strong_explicit(&p->leased, &free, 1, memory_order_acquire,
                                              memory_order_relaxed))
    return p;
  return NULL;
}

void mp_pool_release(mp_pool *p) {
  if (p && p->threads > 1) atomic_store_explicit(&p->leased, 0, memory_order_release);
}

void mp_pool_run(mp_pool *p, uint32_t count, void (*fn)(void *ctx, uint32_t i), void *ctx) {
  if (count == 0) return;
  if (!p || p->threads == 1 || count == 1) {  /* nothing to share: no synchronization at all */
    for (uint32_t i = 0; i < count; i++) fn(ctx, i);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  uint32_t n = (uint32_t)p->threads;
  for (uint32_t t = 0; t < n; t++) {
    atomic_store_explicit(&p->ranges[t].next, (uint32_t)((uint64_t)count * t / n),
                          memory_order_relaxed);
    p->ranges[t].end = (uint32_t)((uint64_t)count * (t + 1) / n);
  }
  p->job++;
  atomic_store(&p->state, (unsigned long long)p->job << 32);   /* seq_cst: publishes the job */
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
  }
  mp_pool_work(p, 0);
  /* every workgroup is handed out: close the job, then wait for the workers inside it */
  unsigned long long s = atomic_fetch_or(&p->state, MP_CLOSED) | MP_CLOSED;
  long long start = 0;
  for (unsigned i = 0; (s & MP_INSIDE) && mp_keep_polling(&start, i); i++) {
    mp_cpu_relax();
    s = atomic_load_explicit(&p->state, memory_order_acquire);
  }
  if (!(s & MP_INSIDE)) return;
  pthread_mutex_lock(&p->mu);
  while (atomic_load_explicit(&p->state, memory_order_acquire) & MP_INSIDE)
    pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void mp_pool_destroy(mp_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int t = 0; t < p->threads - 1; t++) pthread_join(p->tids[t], NULL);
  free(p->tids);
  free(p->ranges);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
