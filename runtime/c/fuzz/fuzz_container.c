/* fuzz_container.c: libFuzzer target for the container reader (make fuzz; make fuzz-run).
 *
 * Every input is parsed twice by mp_container_open_memory: strictly, and with tar checksums
 * and digests forced to match (mp_fuzz_lax, fuzz builds only) so mutations reach the JSON,
 * descriptor and config checks. A container that opens is then taken further: selection on a
 * fixed AVX-512 host and on an arm64 host, the tensor archives of every artifact, the trust
 * check of its signatures (format 1.2) and the verified copies executors load. */
#include <stdlib.h>
#include <string.h>

#include "../src/engine.h"

extern int mp_fuzz_lax;

static void mp_fuzz_select(const mp_container *c, const mp_host *h, const char *device, double budget) {
  mp_verdict *v = calloc(c->artifact_count, sizeof *v);
  if (!v) return;
  mlpack_options o;
  mlpack_options_init(&o);
  o.device = device;
  o.accuracy_budget = budget;
  size_t chosen;
  mlpack_error *err = NULL;
  mp_select(c, h, &o, v, &chosen, &err);
  mlpack_error_free(err);
  free(v);
}

static void mp_fuzz_tensors(const mp_blob *b) {
  if (!b->size) return;
  mp_tensor_archive a;
  mlpack_error *err = NULL;
  if (mp_tensors_open(b, "fuzz", &a, &err) == MLPACK_OK) {
    for (size_t i = 0; i < a.count; i++) {
      const mp_tensor_entry *e = &a.entries[i];
      volatile uint8_t sink = 0;
      if (e->nbytes) sink ^= ((const uint8_t *)e->data)[e->nbytes - 1];  /* bounds are checked */
      (void)sink;
    }
    mp_tensors_close(&a);
  }
  mlpack_error_free(err);
}

/* The trust check over whatever signatures the input carries, under a fixed key (RFC 8032's
 * first test key), and the executors' verified copies of every layer. */
static void mp_fuzz_trust(const mp_container *c) {
  static uint8_t key[1][32] = {{0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe,
                                0xd3, 0xc9, 0x64, 0x07, 0x3a, 0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6,
                                0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a}};
  static char id[1][72] = {"sha256:0"};
  mp_keyring k = {.keys = key, .ids = id, .count = 1, .source = "fuzz"};
  const char *signer;
  mlpack_error *err = NULL;
  if (mp_trust_check(c, &k, &signer, &err) != MLPACK_OK && !err) abort();
  mlpack_error_free(err);
  for (size_t i = 0; i < c->artifact_count; i++) {
    const mp_blob *blobs[3] = {&c->artifacts[i].code, &c->artifacts[i].weights, &c->artifacts[i].vectors};
    for (int j = 0; j < 3; j++) {
      uint8_t *copy = NULL;
      err = NULL;
      if (blobs[j]->size && mp_blob_copy(c, blobs[j], "fuzz", &copy, &err) != MLPACK_OK && !err) abort();
      free(copy);
      mlpack_error_free(err);
    }
  }
}

static void mp_fuzz_open(const uint8_t *data, size_t size, int lax) {
  mp_container *c = NULL;
  mlpack_error *err = NULL;
  mp_fuzz_lax = lax;
  if (mp_container_open_memory(data, size, "fuzz", 1, &c, &err) == MLPACK_OK) {
    mp_host x86 = {.os = "linux", .architecture = "amd64", .x86_level = 4,
                   .features = "sse4_2,popcnt,avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"};
    mp_host arm = {.os = "linux", .architecture = "arm64", .features = "neon,asimd,fp16,dotprod"};
    mp_fuzz_select(c, &x86, NULL, -1);
    mp_fuzz_select(c, &arm, "cpu", 0.01);
    for (size_t i = 0; i < c->artifact_count; i++) {
      mp_fuzz_tensors(&c->artifacts[i].weights);
      mp_fuzz_tensors(&c->artifacts[i].vectors);
    }
    mp_fuzz_trust(c);
    mp_container_close(c);
  } else if (!err) {
    abort();  /* every failure must come with a message */
  }
  mlpack_error_free(err);
  mp_fuzz_lax = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mp_fuzz_open(data, size, 0);
  mp_fuzz_open(data, size, 1);
  return 0;
}
