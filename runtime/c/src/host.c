/* host.c: what this machine can run: OS, OCI architecture, x86-64 psABI level, CPU features.
 *
 * Feature names are the ones artifacts write in org.mlpack.cpu.features: the Linux
 * /proc/cpuinfo spellings plus the LLVM ones (sse4_2 and sse4.2, abm and lzcnt, asimd and neon),
 * as runtime/host.py reports them, so either spelling in an annotation matches.
 * x86 comes from cpuid (and xgetbv: AVX and AVX-512 count only when the OS saves their state;
 * AMX only when it saves the tile state and, on Linux, grants it to this process: the kernel
 * asks each process to request it with arch_prctl before its first tile instruction, and
 * detection makes that request, so a host that reports amx_tile can run tile code at once);
 * aarch64 from getauxval(AT_HWCAP/AT_HWCAP2); riscv64 from AT_HWCAP's single-letter ISA bits
 * (the vector extension is "v"; its vectors are at least 128 bits, V 1.0's zvl128b).
 * CUDA: cuda_sm is 0 here. Probing means dlopen("libcuda.so.1") and cuInit, which is slow, so
 * api_open.c asks cuda.c's mp_cuda_probe only for a container that has a cuda artifact.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "engine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if (defined(__aarch64__) || defined(__riscv)) && defined(__linux__)
#include <sys/auxv.h>
#endif

static void mp_feature_add(mp_host *h, const char *name) {
  size_t n = strlen(h->features);
  snprintf(h->features + n, sizeof h->features - n, "%s%s", n ? "," : "", name);
}

int mp_host_has_feature(const mp_host *h, const char *feature) {
  return !*feature || mp_list_has(h->features, feature);
}

int mp_list_has(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == len && memcmp(p, name, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

void mp_host_describe(const mp_host *h, char *buf, size_t size) {
  char cpu[32], gpu[32];
  if (h->x86_level) snprintf(cpu, sizeof cpu, "x86-64 v%d", h->x86_level);
  else snprintf(cpu, sizeof cpu, "%s", h->architecture);
  if (h->cuda_sm) snprintf(gpu, sizeof gpu, "cuda sm_%d", h->cuda_sm);
  else snprintf(gpu, sizeof gpu, "no CUDA GPU");
  snprintf(buf, size, "%s/%s %s, %s", h->os, h->architecture, cpu, gpu);
}

#if defined(__x86_64__)
typedef struct { unsigned leaf, sub; char reg; unsigned bit; const char *names; } mp_x86_bit;

/* names: the cpuinfo spelling, then aliases, separated by '|' */
static const mp_x86_bit mp_x86_bits[] = {
    {1, 0, 'd', 0, "fpu"}, {1, 0, 'd', 8, "cx8"}, {1, 0, 'd', 15, "cmov"}, {1, 0, 'd', 23, "mmx"},
    {1, 0, 'd', 24, "fxsr"}, {1, 0, 'd', 25, "sse"}, {1, 0, 'd', 26, "sse2"},
    {1, 0, 'c', 0, "pni|sse3"}, {1, 0, 'c', 9, "ssse3"}, {1, 0, 'c', 12, "fma"}, {1, 0, 'c', 13, "cx16"},
    {1, 0, 'c', 19, "sse4_1|sse4.1"}, {1, 0, 'c', 20, "sse4_2|sse4.2"}, {1, 0, 'c', 22, "movbe"},
    {1, 0, 'c', 23, "popcnt"}, {1, 0, 'c', 26, "xsave"}, {1, 0, 'c', 27, "osxsave"}, {1, 0, 'c', 28, "avx"},
    {1, 0, 'c', 29, "f16c"},
    {7, 0, 'b', 3, "bmi1|bmi"}, {7, 0, 'b', 5, "avx2"}, {7, 0, 'b', 8, "bmi2"}, {7, 0, 'b', 16, "avx512f"},
    {7, 0, 'b', 17, "avx512dq"}, {7, 0, 'b', 28, "avx512cd"}, {7, 0, 'b', 30, "avx512bw"},
    {7, 0, 'b', 31, "avx512vl"}, {7, 0, 'c', 11, "avx512_vnni|avx512vnni"}, {7, 1, 'a', 4, "avx_vnni|avxvnni"},
    {7, 1, 'a', 5, "avx512_bf16|avx512bf16"}, {7, 0, 'd', 23, "avx512_fp16|avx512fp16"},
    {7, 0, 'd', 24, "amx_tile|amx-tile"}, {7, 0, 'd', 22, "amx_bf16|amx-bf16"},
    {0x80000001, 0, 'c', 0, "lahf_lm|sahf"}, {0x80000001, 0, 'c', 5, "abm|lzcnt"},
};

static int mp_x86_needs_avx_state(const char *names) {
  return strncmp(names, "avx", 3) == 0 || strncmp(names, "fma", 3) == 0 || strncmp(names, "f16c", 4) == 0;
}

/* Whether this process may use the AMX tile data: the OS saves it (XCR0 bits 17, 18) and, on
 * Linux, grants it (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; granting twice is harmless). */
static int mp_x86_tile_state(unsigned long long xcr0) {
  if ((xcr0 & 0x60000ull) != 0x60000ull) return 0;
#if defined(__linux__)
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
  return 0;
#endif
}

static void mp_x86_detect(mp_host *h) {
  unsigned max = __get_cpuid_max(0, NULL), max_ext = __get_cpuid_max(0x80000000, NULL);
  unsigned a, b, c, d, ecx1 = 0;
  if (max >= 1) { __cpuid_count(1, 0, a, b, c, d); ecx1 = c; }
  /* the OS must save YMM (XCR0 bits 1,2) for AVX and opmask/ZMM (bits 5,6,7) for AVX-512 */
  unsigned long long xcr0 = 0;
  if (ecx1 & (1u << 27)) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = ((unsigned long long)hi << 32) | lo;
  }
  int os_avx = (xcr0 & 6) == 6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  int os_amx = -1;  /* asked only on a cpu with AMX: the request has a (small) lasting effect */
  for (size_t i = 0; i < sizeof mp_x86_bits / sizeof *mp_x86_bits; i++) {
    const mp_x86_bit *bit = &mp_x86_bits[i];
    if (bit->leaf >= 0x80000000 ? bit->leaf > max_ext : bit->leaf > max) continue;
    __cpuid_count(bit->leaf, bit->sub, a, b, c, d);
    unsigned reg = bit->reg == 'a' ? a : bit->reg == 'b' ? b : bit->reg == 'c' ? c : d;
    if (!(reg & (1u << bit->bit))) continue;
    if (mp_x86_needs_avx_state(bit->names) && !os_avx) continue;
    if (strncmp(bit->names, "avx512", 6) == 0 && !os_avx512) continue;
    if (strncmp(bit->names, "amx", 3) == 0) {
      if (os_amx < 0) os_amx = mp_x86_tile_state(xcr0);
      if (!os_amx) continue;
    }
    char names[64];
    snprintf(names, sizeof names, "%s", bit->names);
    char *save = NULL;
    for (char *tok = strtok_r(names, "|", &save); tok; tok = strtok_r(NULL, "|", &save)) mp_feature_add(h, tok);
  }
}
#endif

/* psABI levels (runtime/host.py X86_LEVELS): a level counts only if every lower one does. */
static int mp_x86_level(const mp_host *h) {
  static const char *const levels[3][10] = {
      {"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3", NULL},
      {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave", NULL},
      {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", NULL}};
  int level = 1;  /* every x86-64 CPU is v1 */
  for (int l = 0; l < 3; l++) {
    for (int i = 0; levels[l][i]; i++)
      if (!mp_host_has_feature(h, levels[l][i])) return level;
    level = l + 2;
  }
  return level;
}

#if defined(__aarch64__) && defined(__linux__)
static void mp_arm_detect(mp_host *h) {
  unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  /* bit numbers from the kernel's uapi asm/hwcap.h; spelled out so old headers still build */
  if (hw & (1ul << 1)) { mp_feature_add(h, "asimd"); mp_feature_add(h, "neon"); }
  if (hw & (1ul << 9)) { mp_feature_add(h, "fphp"); mp_feature_add(h, "fullfp16"); }
  if (hw & (1ul << 10)) { mp_feature_add(h, "asimdhp"); mp_feature_add(h, "fp16"); }
  if (hw & (1ul << 20)) { mp_feature_add(h, "asimddp"); mp_feature_add(h, "dotprod"); }
  if (hw & (1ul << 22)) mp_feature_add(h, "sve");
  if (hw & (1ul << 23)) { mp_feature_add(h, "asimdfhm"); mp_feature_add(h, "fp16fml"); }
  if (hw2 & (1ul << 1)) mp_feature_add(h, "sve2");
  if (hw2 & (1ul << 13)) mp_feature_add(h, "i8mm");
  if (hw2 & (1ul << 14)) mp_feature_add(h, "bf16");
}
#endif

#if defined(__riscv) && defined(__linux__)
static void mp_riscv_detect(mp_host *h) {
  unsigned long hw = getauxval(AT_HWCAP);
  /* the kernel's COMPAT_HWCAP_ISA_<X>: bit (X - 'A') for each single-letter extension */
  static const char *letters[] = {"i", "m", "a", "f", "d", "c", "v"};
  for (size_t i = 0; i < sizeof letters / sizeof *letters; i++)
    if (hw & (1ul << (letters[i][0] - 'a'))) mp_feature_add(h, letters[i]);
}
#endif

void mp_host_detect(mp_host *out) {
  memset(out, 0, sizeof *out);
#if defined(__linux__)
  out->os = "linux";
#elif defined(__APPLE__)
  out->os = "darwin";
#else
  out->os = "unknown";
#endif
#if defined(__x86_64__)
  out->architecture = "amd64";
  mp_x86_detect(out);
  out->x86_level = mp_x86_level(out);
#elif defined(__aarch64__)
  out->architecture = "arm64";
#if defined(__linux__)
  mp_arm_detect(out);
#endif
#elif defined(__riscv) && __riscv_xlen == 64
  out->architecture = "riscv64";
#if defined(__linux__)
  mp_riscv_detect(out);
#endif
#else
  out->architecture = "unknown";
#endif
  out->cuda_sm = 0;  /* (api_open.c probes the driver when a container has cuda artifacts) */
  out->cuda_why[0] = 0;
}
