/* pool.c: the persistent thread pool that runs a dispatch's workgroups.
 *
 * N-1 worker threads plus the caller. A job is (fn, ctx, count); workgroups are handed out with
 * one atomic counter, so a fast thread simply takes more of them. Jobs are numbered
 * (`generation`): a worker that finished job g spins briefly waiting for g+1 (dispatches of one
 * run follow each other within microseconds, and a futex wake costs more than that), then sleeps
 * on a condition variable. mp_pool_run returns only when every workgroup has run and every
 * worker has left the job, so ctx may live on the caller's stack.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "engine.h"

#define MP_POOL_SPIN 2000    /* pause iterations (~10-100 us) of polling before sleeping */

struct mp_pool {
  int threads;
  pthread_t *tids;
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  /* the current job; written by the caller before `generation` is bumped (release) */
  void (*fn)(void *ctx, uint32_t i);
  void *ctx;
  uint32_t count;
  atomic_uint next;          /* next workgroup to hand out */
  atomic_int busy;           /* workers still inside the current job */
  atomic_ulong generation;   /* job number */
  atomic_int sleepers;       /* workers waiting on work_cv */
  atomic_int stop;
};

static inline void mp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void mp_pool_work(mp_pool *p) {
  uint32_t i;
  while ((i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->count)
    p->fn(p->ctx, i);
}

/* Wait until the job number differs from `seen` (or stop); returns the new number. */
static unsigned long mp_pool_wait_job(mp_pool *p, unsigned long seen) {
  for (int s = 0; s < MP_POOL_SPIN; s++) {
    unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);
    if (g != seen || atomic_load(&p->stop)) return g;
    mp_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  /* sleepers is raised before re-checking generation (both seq_cst), so the caller either sees
   * a sleeper and broadcasts under the mutex, or we see its new generation: no lost wake-up. */
  atomic_fetch_add(&p->sleepers, 1);
  while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
    pthread_cond_wait(&p->work_cv, &p->mu);
  atomic_fetch_sub(&p->sleepers, 1);
  pthread_mutex_unlock(&p->mu);
  return atomic_load_explicit(&p->generation, memory_order_acquire);
}

static void *mp_pool_worker(void *arg) {
  mp_pool *p = arg;
  unsigned long seen = 0;
  for (;;) {
    seen = mp_pool_wait_job(p, seen);
    if (atomic_load(&p->stop)) return NULL;
    mp_pool_work(p);
    if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
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

void mp_pool_run(mp_pool *p, uint32_t count, void (*fn)(void *ctx, uint32_t i), void *ctx) {
  if (count == 0) return;
  if (!p || p->threads == 1 || count == 1) {  /* nothing to share: no synchronization at all */
    for (uint32_t i = 0; i < count; i++) fn(ctx, i);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->count = count;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store_explicit(&p->busy, p->threads - 1, memory_order_relaxed);
  atomic_fetch_add(&p->generation, 1);   /* seq_cst: publishes the job */
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
  }
  mp_pool_work(p);
  for (int s = 0; s < MP_POOL_SPIN; s++) {
    if (atomic_load_explicit(&p->busy, memory_order_acquire) == 0) return;
    mp_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  while (atomic_load_explicit(&p->busy, memory_order_acquire) != 0)
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
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
