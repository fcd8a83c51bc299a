/* sha256.c: SHA-256 (FIPS 180-4), for blob digests. A model's weights are hashed when it is
 * opened (hundreds of MB for a large one), so on x86-64 CPUs with the SHA extensions (AMD since
 * Zen, Intel since Goldmont and Ice Lake) the blocks go through SHA-NI (sha256rnds2, ~1.5 GB/s),
 * on aarch64 CPUs with the ARMv8 SHA-256 instructions through those, elsewhere through the plain,
 * portable compression function (~300 MB/s). All compute the same function; which one runs is
 * decided once, from CPUID or the kernel's HWCAP. (qemu-user runs each of those instructions as
 * one helper: a build validating an aarch64 artifact under emulation hashes its weights several
 * times faster than through the emulated plain function.) */
#include <stddef.h>
#include <string.h>

#include "engine.h"

static const uint32_t mp_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define MP_ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void mp_sha256_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = MP_ROR(w[i - 15], 7) ^ MP_ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = MP_ROR(w[i - 2], 17) ^ MP_ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (MP_ROR(e, 6) ^ MP_ROR(e, 11) ^ MP_ROR(e, 25)) + ((e & f) ^ (~e & g)) + mp_k[i] + w[i];
    uint32_t t2 = (MP_ROR(a, 2) ^ MP_ROR(a, 13) ^ MP_ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

/* `blocks` 64-byte blocks through the SHA extensions: the state as ABEF / CDGH, four rounds per
 * sha256rnds2 pair, the message schedule four words at a time (sha256msg1/2). */
__attribute__((target("sha,sse4.1,ssse3"))) static void mp_sha256_hw(uint32_t h[8], const uint8_t *p,
                                                                      size_t blocks) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);   /* big endian */
  __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);    /* CDAB */
  __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);   /* EFGH */
  __m128i s0 = _mm_alignr_epi8(t, s1, 8);                                           /* ABEF */
  s1 = _mm_blend_epi16(s1, t, 0xF0);                                                /* CDGH */
  for (; blocks; blocks--, p += 64) {
    __m128i abef = s0, cdgh = s1, w[4];
    for (int i = 0; i < 4; i++) w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), swap);
    for (int i = 0; i < 16; i++) {   /* rounds 4i .. 4i+3 */
      __m128i msg = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&mp_k[4 * i]));
      s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
      s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(msg, 0x0E));
      if (i < 12) {   /* words 4i+16 .. 4i+19, in the slot of 4i .. 4i+3 */
        __m128i x = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
        x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
        w[i & 3] = _mm_sha256msg2_epu32(x, w[(i + 3) & 3]);
      }
    }
    s0 = _mm_add_epi32(s0, abef);
    s1 = _mm_add_epi32(s1, cdgh);
  }
  t = _mm_shuffle_epi32(s0, 0x1B);                                            /* FEBA */
  s1 = _mm_shuffle_epi32(s1, 0xB1);                                           /* DCHG */
  _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(t, s1, 0xF0));          /* DCBA */
  _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(s1, t, 8));             /* HGFE */
}

/* 1 when this CPU has the SHA extensions (and SSSE3, SSE4.1), else 0; asked once. */
static int mp_sha_hw(void) {
  static int known = -1;   /* (a race only computes the same answer twice) */
  if (known < 0) {
    unsigned a, b, c, d, has = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 9)) && (c & (1u << 19)) &&
        __get_cpuid_count(7, 0, &a, &b, &c, &d))
      has = (b >> 29) & 1u;
    known = (int)has;
  }
  return known;
}
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

/* `blocks` 64-byte blocks through the ARMv8 SHA-256 instructions (the Crypto extension: every
 * Graviton, Ampere, Apple and Cortex-A7x core): the state as ABCD / EFGH, four rounds per
 * sha256h/sha256h2 pair, the message schedule four words at a time (sha256su0/su1). */
__attribute__((target("+sha2"))) static void mp_sha256_hw(uint32_t h[8], const uint8_t *p, size_t blocks) {
  uint32x4_t abcd = vld1q_u32(&h[0]), efgh = vld1q_u32(&h[4]);
  for (; blocks; blocks--, p += 64) {
    uint32x4_t abcd0 = abcd, efgh0 = efgh, w[4];
    for (int i = 0; i < 4; i++) w[i] = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p + 16 * i)));   /* big endian */
    for (int i = 0; i < 16; i++) {   /* rounds 4i .. 4i+3 */
      uint32x4_t wk = vaddq_u32(w[i & 3], vld1q_u32(&mp_k[4 * i])), before = abcd;
      abcd = vsha256hq_u32(abcd, efgh, wk);
      efgh = vsha256h2q_u32(efgh, before, wk);
      if (i < 12)   /* words 4i+16 .. 4i+19, in the slot of 4i .. 4i+3 */
        w[i & 3] = vsha256su1q_u32(vsha256su0q_u32(w[i & 3], w[(i + 1) & 3]), w[(i + 2) & 3], w[(i + 3) & 3]);
    }
    abcd = vaddq_u32(abcd, abcd0);
    efgh = vaddq_u32(efgh, efgh0);
  }
  vst1q_u32(&h[0], abcd);
  vst1q_u32(&h[4], efgh);
}

/* 1 when this CPU has the SHA-256 instructions, else 0; asked once (Linux: the kernel's HWCAP_SHA2
 * bit; macOS: every Apple core has them). */
static int mp_sha_hw(void) {
#if defined(__linux__)
  static int known = -1;   /* (a race only computes the same answer twice) */
  if (known < 0) known = (getauxval(AT_HWCAP) >> 6) & 1u;   /* HWCAP_SHA2 */
  return known;
#elif defined(__APPLE__)
  return 1;
#else
  return 0;
#endif
}
#else
static int mp_sha_hw(void) { return 0; }
static void mp_sha256_hw(uint32_t h[8], const uint8_t *p, size_t blocks) { (void)h; (void)p; (void)blocks; }
#endif

static void mp_sha256_blocks(uint32_t h[8], const uint8_t *p, size_t blocks) {
  if (mp_sha_hw()) {
    mp_sha256_hw(h, p, blocks);
    return;
  }
  for (; blocks; blocks--, p += 64) mp_sha256_block(h, p);
}

void mp_sha256_init(mp_sha256 *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->len = 0;
  s->fill = 0;
}

void mp_sha256_update(mp_sha256 *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->len += n;
  if (s->fill) {
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->buf + s->fill, p, take);
    s->fill += take;
    p += take;
    n -= take;
    if (s->fill < 64) return;
    mp_sha256_blocks(s->h, s->buf, 1);
    s->fill = 0;
  }
  mp_sha256_blocks(s->h, p, n / 64);
  p += n / 64 * 64;
  n %= 64;
  memcpy(s->buf, p, n);
  s->fill = n;
}

void mp_sha256_final(mp_sha256 *s, uint8_t out[32]) {
  uint64_t bits = s->len * 8;
  uint8_t pad[72] = {0x80};
  size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
  uint8_t lenbuf[8];
  for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)(bits >> (56 - 8 * i));
  mp_sha256_update(s, pad, padlen);
  mp_sha256_update(s, lenbuf, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}
