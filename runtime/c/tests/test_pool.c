/* test_pool.c: the thread pool (src/pool.c) runs every workgroup of every job exactly once.
 *
 * Pools of 1 to 5 threads run jobs of many sizes (0, 1, fewer workgroups than threads, many);
 * each workgroup counts itself in an array the test then checks. Some jobs make a few
 * workgroups slow (a thread inside the job when the caller has taken every workgroup and closes
 * it), and some pools sit idle long enough for their workers to go to sleep between jobs. Build
 * it with -fsanitize=thread to check the synchronization itself (`make tsan`).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "engine.h"

#define MAX_COUNT 1000

struct job {
  atomic_int runs[MAX_COUNT];
  uint32_t slow_every;    /* every this many workgroups sleeps a little (0: none) */
};

static void nap(long ns) {
  struct timespec t = {0, ns};
  nanosleep(&t, NULL);
}

static void count_one(void *ctx, uint32_t i) {
  struct job *j = ctx;
  if (j->slow_every && i % j->slow_every == 0) nap(200000);   /* 0.2 ms */
  atomic_fetch_add_explicit(&j->runs[i], 1, memory_order_relaxed);
}

static int run_job(mp_pool *p, uint32_t count, uint32_t slow_every) {
  static struct job j;
  for (uint32_t i = 0; i < MAX_COUNT; i++) atomic_store(&j.runs[i], 0);
  j.slow_every = slow_every;
  mp_pool_run(p, count, count_one, &j);
  int bad = 0;
  for (uint32_t i = 0; i < MAX_COUNT; i++) {
    int want = i < count ? 1 : 0;
    if (atomic_load(&j.runs[i]) != want) bad++;
  }
  return bad;
}

int main(void) {
  static const uint32_t counts[] = {0, 1, 2, 3, 5, 7, 16, 63, 64, 257, 1000};
  for (int threads = 1; threads <= 5; threads++) {
    mp_pool *p = mp_pool_create(threads);
    CHECK(p != NULL, "pool of %d", threads);
    if (!p) continue;
    CHECK(mp_pool_threads(p) == threads, "%d threads, asked %d", mp_pool_threads(p), threads);
    for (int round = 0; round < 200; round++) {
      uint32_t count = counts[round % (sizeof counts / sizeof *counts)];
      uint32_t slow = round % 7 == 3 ? 5 : 0;
      int bad = run_job(p, count, slow);
      CHECK(bad == 0, "%d threads, job %d of %u workgroups: %d ran other than once", threads,
            round, count, bad);
      if (round % 50 == 49) nap(5000000);   /* 5 ms: the workers go to sleep */
    }
    mp_pool_destroy(p);
  }
  mp_pool_destroy(NULL);
  return mp_check_report("test_pool");
}
