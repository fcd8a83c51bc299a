/* test_select.c: selection (spec/SPEC.md section 5) on explicit hosts and hand-built artifact
 * lists: what each host picks, the reason every other artifact gets, device/precision requests,
 * the accuracy budget, strict mode and the no-runnable-artifact message. Also host detection
 * and integer expressions (expr.c). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "../src/engine.h"
#include "../src/executor.h"
#include "../src/media.h"
#include "check.h"

static mp_artifact art(const char *device, const char *precision, const char *arch, const char *variant,
                       const char *features, double err) {
  mp_artifact a = {0};
  a.device = device;
  a.precision = precision;
  a.has_platform = arch != NULL;
  a.os = arch ? "linux" : "";
  a.architecture = arch ? arch : "";
  a.variant = variant ? variant : "";
  a.cpu_features = features ? features : "";
  a.min_runtime_text = "0.1.0";
  a.min_runtime[1] = 1;
  a.max_error = err;
  a.latency = -1;
  a.code_media_type = !strcmp(device, "portable") ? MP_PROGRAM_PORTABLE
                      : !strcmp(device, "cuda")   ? MP_CODE_PTX
                                                  : MP_CODE_ELF;
  return a;
}

enum { A_PORTABLE, A_V2, A_V3, A_V4, A_ARM, A_ARM16, A_CUDA, A_V3_16, A_COUNT };

static mp_artifact arts[A_COUNT];
static mp_container box = {.path = "model.mlpack", .artifacts = arts, .artifact_count = A_COUNT};

static void make_artifacts(void) {
  arts[A_PORTABLE] = art("portable", "fp32", NULL, NULL, NULL, 0.0);
  arts[A_V2] = art("cpu", "fp32", "amd64", "v2", "sse4.2,popcnt", 0.0);
  arts[A_V3] = art("cpu", "fp32", "amd64", "v3", "avx2,fma", 0.0);
  arts[A_V4] = art("cpu", "fp32", "amd64", "v4", "avx512f,avx512bw", 0.0);
  arts[A_ARM] = art("cpu", "fp32", "arm64", "v8", "neon", 0.0);
  arts[A_ARM16] = art("cpu", "fp16", "arm64", "v8", "neon,fp16", 1e-3);
  arts[A_CUDA] = art("cuda", "fp32", "amd64", NULL, NULL, 0.0);
  arts[A_CUDA].cuda_sm = 80;
  arts[A_V3_16] = art("cpu", "fp16", "amd64", "v3", "avx2,fma,f16c", 1e-3);
  for (size_t i = 0; i < A_COUNT; i++) arts[i].index = i;
}

static const mp_host avx512 = {"linux", "amd64", 4,
                               "sse4_2,sse4.2,popcnt,avx2,fma,f16c,avx512f,avx512bw,avx512cd,avx512dq,avx512vl", 0};
static const mp_host avx2 = {"linux", "amd64", 3, "sse4_2,sse4.2,popcnt,avx2,fma", 0};
static const mp_host old_x86 = {"linux", "amd64", 1, "sse,sse2", 0};
static const mp_host arm = {"linux", "arm64", 0, "neon,asimd,fp16,dotprod", 0};
static const mp_host gpu = {"linux", "amd64", 3, "sse4_2,sse4.2,popcnt,avx2,fma,f16c", 86};

static mp_verdict v[A_COUNT];

static mlpack_status pick(const mp_host *h, const char *device, const char *precision, double budget, int strict,
                          size_t *chosen, mlpack_error **err) {
  mlpack_options o;
  mlpack_options_init(&o);
  o.device = device;
  o.precision = precision;
  o.accuracy_budget = budget;
  o.strict = strict;
  *chosen = (size_t)-1;
  *err = NULL;
  return mp_select(&box, h, &o, v, chosen, err);
}

static void test_avx512_host(void) {
  size_t c;
  mlpack_error *err;
  CHECK(pick(&avx512, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK, "%s", mlpack_error_message(err));
  CHECK(c == A_V4, "chose %zu", c);
  CHECK(v[A_V4].chosen && v[A_V4].runnable, "v4 verdict");
  CHECK_CONTAINS(v[A_V4].reason, "chosen: x86-64 v4 cpu fp32 (artifact 3) is the most specific artifact this host runs");
  CHECK_CONTAINS(v[A_PORTABLE].reason, "portable: runs anywhere; slower");
  CHECK_CONTAINS(v[A_V2].reason, "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher");
  CHECK_CONTAINS(v[A_V3].reason, "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher");
  CHECK_CONTAINS(v[A_ARM].reason, "passed over: arm64, this host is amd64");
  CHECK(!v[A_ARM].runnable && !v[A_CUDA].runnable, "arm/cuda runnable");
  CHECK_CONTAINS(v[A_CUDA].reason, "passed over: needs a CUDA GPU: this host has none");
  CHECK_CONTAINS(v[A_V3_16].reason, "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher (ask for precision='fp16')");
  for (size_t i = 0; i < A_COUNT; i++) CHECK(v[i].chosen == (i == A_V4), "artifact %zu chosen=%d", i, v[i].chosen);
}

static void test_other_hosts(void) {
  size_t c;
  mlpack_error *err;
  CHECK(pick(&avx2, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_V3, "avx2 host chose %zu", c);
  CHECK_CONTAINS(v[A_V4].reason, "passed over: needs x86-64 v4, this host is x86-64 v3");
  /* no budget: the fastest; unmeasured, the narrower precision of the same specificity */
  CHECK(pick(&arm, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_ARM16, "arm host chose %zu", c);
  CHECK_CONTAINS(v[A_V3].reason, "passed over: amd64, this host is arm64");
  CHECK_CONTAINS(v[A_ARM].reason, "passed over: arm64 cpu fp16 (artifact 5) ranks higher (ask for precision='fp32')");
  CHECK(pick(&arm, NULL, "fp32", -1, 0, &c, &err) == MLPACK_OK && c == A_ARM, "arm fp32 chose %zu", c);
  CHECK(pick(&old_x86, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_PORTABLE, "old x86 chose %zu", c);
  CHECK_CONTAINS(v[A_PORTABLE].reason, "chosen: portable: runs anywhere; slower (no native artifact fits)");
  CHECK_CONTAINS(v[A_V2].reason, "passed over: needs x86-64 v2, this host is x86-64 v1");
  /* a GPU host: the cuda artifact first (an sm_80 one on an sm_86 GPU) */
  CHECK(pick(&gpu, NULL, "fp32", -1, 0, &c, &err) == MLPACK_OK && c == A_CUDA, "gpu host chose %zu", c);
  CHECK_CONTAINS(v[A_V3].reason, "passed over: cuda sm_80 fp32 (artifact 6) ranks higher");
  arts[A_CUDA].cuda_sm = 90;
  CHECK(pick(&gpu, NULL, "fp32", -1, 0, &c, &err) == MLPACK_OK && c == A_V3, "gpu host chose %zu", c);
  CHECK_CONTAINS(v[A_CUDA].reason, "passed over: needs sm_90, this host's GPU is sm_86");
  arts[A_CUDA].cuda_sm = 80;
}

static void test_requests(void) {
  size_t c;
  mlpack_error *err;
  CHECK(pick(&avx512, "portable", NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_PORTABLE, "portable: %zu", c);
  CHECK_CONTAINS(v[A_V4].reason, "passed over: device 'portable' was requested");
  CHECK_CONTAINS(v[A_PORTABLE].reason, "chosen: the portable artifact was requested");
  CHECK(v[A_V4].runnable, "v4 stays runnable when excluded by request");
  CHECK(pick(&avx512, NULL, "fp16", -1, 0, &c, &err) == MLPACK_OK && c == A_V3_16, "fp16: %zu", c);
  CHECK_CONTAINS(v[A_V4].reason, "passed over: precision 'fp16' was requested");
  CHECK(pick(&arm, "cpu", "fp16", -1, 0, &c, &err) == MLPACK_OK && c == A_ARM16, "arm fp16: %zu", c);
  CHECK(pick(&avx512, "tpu", NULL, -1, 0, &c, &err) == MLPACK_ERR_ARGUMENT, "bad device");
  CHECK_CONTAINS(mlpack_error_message(err), "device 'tpu' is not one of cpu, cuda, portable");
  mlpack_error_free(err);
  CHECK(pick(&avx512, NULL, "fp8", -1, 0, &c, &err) == MLPACK_ERR_ARGUMENT, "bad precision");
  mlpack_error_free(err);
}

static mlpack_status pin(const mp_host *h, int artifact_plus_one, int strict, size_t *chosen, mlpack_error **err) {
  mlpack_options o;
  mlpack_options_init(&o);
  o.pin_artifact = artifact_plus_one;
  o.strict = strict;
  *chosen = (size_t)-1;
  *err = NULL;
  return mp_select(&box, h, &o, v, chosen, err);
}

static void test_pinned_artifact(void) {
  size_t c;
  mlpack_error *err = NULL;
  CHECK(pin(&avx512, A_V2 + 1, 0, &c, &err) == MLPACK_OK && c == A_V2, "pinned v2: %zu", c);
  CHECK(strstr(v[A_V4].reason, "artifact") && v[A_V4].runnable, "v4: %s", v[A_V4].reason);
  CHECK(pin(&avx512, A_PORTABLE + 1, 1, &c, &err) == MLPACK_OK && c == A_PORTABLE,
        "a pinned portable artifact is no fallback, even strict");
  CHECK(pin(&avx512, A_ARM + 1, 0, &c, &err) == MLPACK_ERR_NO_ARTIFACT, "pinned arm on amd64");
  CHECK(err && strstr(mlpack_error_message(err), "arm64"), "%s", err ? mlpack_error_message(err) : "");
  mlpack_error_free(err);
  CHECK(pin(&avx512, A_COUNT + 1, 0, &c, &err) == MLPACK_ERR_ARGUMENT, "no such artifact");
  CHECK(err && strstr(mlpack_error_message(err), "there is no artifact"), "message");
  mlpack_error_free(err);
}

static void test_budget(void) {
  size_t c;
  mlpack_error *err;
  /* within 0.01 every artifact qualifies: the fastest is the most specific (v4) */
  CHECK(pick(&avx512, NULL, NULL, 0.01, 0, &c, &err) == MLPACK_OK && c == A_V4, "budget 0.01: %zu", c);
  CHECK_CONTAINS(v[A_V4].reason, "is the fastest artifact within the accuracy budget 0.01 (max_error 0)");
  /* on arm, fp16 is faster than fp32 at the same specificity */
  CHECK(pick(&arm, NULL, NULL, 0.01, 0, &c, &err) == MLPACK_OK && c == A_ARM16, "arm budget: %zu", c);
  CHECK(pick(&arm, NULL, NULL, 0.0005, 0, &c, &err) == MLPACK_OK && c == A_ARM, "arm tight budget: %zu", c);
  CHECK_CONTAINS(v[A_ARM16].reason, "passed over: max_error 0.001 exceeds the accuracy budget 0.0005");
  /* measured at build time, the faster of one target's precisions wins, whatever its name */
  const char *features16 = arts[A_ARM16].cpu_features;
  arts[A_ARM16].cpu_features = arts[A_ARM].cpu_features;   /* the same target */
  arts[A_ARM].latency = 1e-3;
  arts[A_ARM16].latency = 2e-3;
  CHECK(pick(&arm, NULL, NULL, 0.01, 0, &c, &err) == MLPACK_OK && c == A_ARM, "measured: %zu", c);
  /* the same without a budget: no budget picks the fastest, not the widest precision */
  CHECK(pick(&arm, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_ARM, "measured, no budget: %zu", c);
  CHECK_CONTAINS(v[A_ARM].reason, "chosen: arm64 cpu fp32 (artifact 4) is the fastest artifact this host runs (timed at build)");
  arts[A_ARM16].latency = 0.5e-3;
  CHECK(pick(&arm, NULL, NULL, 0.01, 0, &c, &err) == MLPACK_OK && c == A_ARM16, "measured: %zu", c);
  CHECK(pick(&arm, NULL, NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_ARM16, "measured, no budget: %zu", c);
  arts[A_ARM].latency = arts[A_ARM16].latency = -1;
  arts[A_ARM16].cpu_features = features16;
  /* built on an AVX2 host: the v3 artifacts timed, v4 not (that host could not run it); on an
   * AVX-512 host v4 counts as fast as the v3 artifact of its precision it extends, and ranks
   * above it; a faster precision timed at v3 still wins */
  const char *features4 = arts[A_V4].cpu_features;
  arts[A_V4].cpu_features = "avx2,fma,avx512f,avx512bw";   /* a level's features include the lower's */
  arts[A_V3].latency = 2e-3;
  arts[A_V3_16].latency = 3e-3;
  CHECK(pick(&avx512, "cpu", NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_V4, "v4 as v3: %zu", c);
  CHECK_CONTAINS(v[A_V4].reason, "chosen: x86-64 v4 cpu fp32 (artifact 3) is the fastest artifact this host runs "
                 "(as x86-64 v3 cpu fp32 (artifact 2) timed at build, whose instructions it extends)");
  CHECK_CONTAINS(v[A_V3].reason, "passed over: x86-64 v4 cpu fp32 (artifact 3) ranks higher");
  arts[A_V3_16].latency = 1e-3;
  CHECK(pick(&avx512, "cpu", NULL, -1, 0, &c, &err) == MLPACK_OK && c == A_V3_16, "v3 fp16 faster: %zu", c);
  arts[A_V3].latency = arts[A_V3_16].latency = -1;
  arts[A_V4].cpu_features = features4;
  arts[A_ARM].max_error = -1;
  CHECK(pick(&arm, "cpu", NULL, 0.0005, 0, &c, &err) == MLPACK_ERR_NO_ARTIFACT, "no error recorded");
  CHECK_CONTAINS(v[A_ARM].reason, "records no measured error, so it cannot meet the accuracy budget 0.0005");
  mlpack_error_free(err);
  arts[A_ARM].max_error = 0;
}

static void test_no_artifact(void) {
  size_t c;
  mlpack_error *err;
  CHECK(pick(&old_x86, "cpu", NULL, -1, 0, &c, &err) == MLPACK_ERR_NO_ARTIFACT, "old x86 cpu");
  const char *m = mlpack_error_message(err);
  CHECK_CONTAINS(m, "model.mlpack: no artifact runs on this host (linux/amd64 x86-64 v1, no CUDA GPU) as requested:");
  CHECK_CONTAINS(m, "\n  x86-64 v2 cpu fp32 (artifact 1): passed over: needs x86-64 v2, this host is x86-64 v1");
  CHECK_CONTAINS(m, "\n  portable fp32 (artifact 0): passed over: device 'cpu' was requested");
  CHECK_CONTAINS(m, "\n  arm64 cpu fp32 (artifact 4): passed over: arm64, this host is amd64");
  mlpack_error_free(err);
  /* strict: the portable fallback is refused, with the reasons */
  CHECK(pick(&old_x86, NULL, NULL, -1, 1, &c, &err) == MLPACK_ERR_NO_ARTIFACT, "strict");
  CHECK_CONTAINS(mlpack_error_message(err), "running the portable interpreter (slow): no native artifact fits: ");
  CHECK_CONTAINS(mlpack_error_message(err), "strict forbids falling back");
  mlpack_error_free(err);
  CHECK(pick(&old_x86, "portable", NULL, -1, 1, &c, &err) == MLPACK_OK, "asking for portable is no fallback");
  /* a missing feature and a newer min_runtime */
  arts[A_V3].cpu_features = "avx2,fma,avx512_vnni";
  arts[A_V4].min_runtime[0] = 9;
  arts[A_V4].min_runtime_text = "9.0.0";
  CHECK(pick(&avx512, NULL, "fp32", -1, 0, &c, &err) == MLPACK_OK && c == A_V2, "degraded: %zu", c);
  CHECK_CONTAINS(v[A_V3].reason, "passed over: needs avx512_vnni, this host lacks it");
  CHECK_CONTAINS(v[A_V4].reason, "passed over: needs mlpack runtime 9.0.0, this is 0.1.0");
  make_artifacts();
}

/* The executor table: a row for the portable program, native ELF code and PTX (whose row loads
 * a cubin beside it), each complete and found by its own media type. */
static void test_executor_table(void) {
  static const char *const codes[] = {MP_CODE_MEDIA_TYPES};
  size_t rows = 0;
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
    const mp_executor_kind *x = mp_executor_for(codes[i]);
    if (!x) continue;
    rows++;
    CHECK(!strcmp(x->media_type, codes[i]), "row for %s says %s", codes[i], x->media_type);
    CHECK(x->open && x->run && x->close, "row for %s lacks a function", codes[i]);
  }
  CHECK(rows == 3, "%zu rows", rows);
  CHECK(mp_executor_for(MP_PROGRAM_PORTABLE) && mp_executor_for(MP_PROGRAM_PORTABLE)->open == mp_portable_open,
        "portable row");
  CHECK(mp_executor_for(MP_CODE_ELF) && mp_executor_for(MP_CODE_ELF)->open == mp_native_open, "native row");
  CHECK(mp_executor_for(MP_CODE_PTX) && mp_executor_for(MP_CODE_PTX)->open == mp_cuda_open, "cuda row");
  CHECK(!mp_executor_for(MP_CODE_CUBIN), "a row for a lone cubin (the PTX row loads it)");
  CHECK(!mp_executor_for(MP_WEIGHTS) && !mp_executor_for(NULL), "a row for no code");
}

static void test_host_detect(void) {
  mp_host h;
  mp_host_detect(&h);
  CHECK(!strcmp(h.os, "linux"), "os %s", h.os);
  CHECK(h.cuda_sm == 0, "cuda %d", h.cuda_sm);
#if defined(__x86_64__)
  CHECK(!strcmp(h.architecture, "amd64") && h.x86_level >= 1 && h.x86_level <= 4, "x86 level %d", h.x86_level);
  CHECK(mp_host_has_feature(&h, "sse2"), "sse2 in %s", h.features);
  if (h.x86_level >= 3) CHECK(mp_host_has_feature(&h, "avx2") && mp_host_has_feature(&h, "lzcnt"), "v3 features");
  if (h.x86_level >= 4) CHECK(mp_host_has_feature(&h, "avx512vl"), "v4 features");
#elif defined(__aarch64__)
  CHECK(!strcmp(h.architecture, "arm64") && mp_host_has_feature(&h, "neon"), "arm64 %s", h.features);
#endif
  CHECK(mp_host_has_feature(&avx512, "avx2") && !mp_host_has_feature(&avx512, "avx"), "token match");
  char d[160];
  mp_host_describe(&h, d, sizeof d);
  printf("host: %s [%s]\n", d, h.features);
}

static int64_t eval(const char *text, mlpack_status *st) {
  static const char *const names[] = {"batch", "seq"};
  static const int64_t values[] = {6, -7};
  mp_json_doc *doc;
  int64_t out = 0;
  *st = mp_json_parse(text, strlen(text), "expr", &doc, NULL);
  if (*st) return 0;
  mlpack_error *err = NULL;
  *st = mp_expr_eval(mp_json_root(doc), names, values, 2, &out, &err);
  mlpack_error_free(err);
  mp_json_free(doc);
  return out;
}

static void test_expr(void) {
  mlpack_status st;
  CHECK(eval("[\"add\", [\"mul\", \"$batch\", 4], 3]", &st) == 27 && !st, "add/mul");
  CHECK(eval("[\"floordiv\", \"$seq\", 2]", &st) == -4 && !st, "floordiv rounds down");
  CHECK(eval("[\"div\", \"$seq\", 2]", &st) == -3 && !st, "div truncates");
  CHECK(eval("[\"mod\", \"$seq\", 3]", &st) == 2 && !st, "mod is Python's");
  CHECK(eval("[\"max\", \"$seq\", [\"min\", 3, \"$batch\"]]", &st) == 3 && !st, "max/min");
  CHECK(eval("[\"select\", [\"lt\", \"$seq\", 0], 1, 2]", &st) == 1 && !st, "select");
  eval("[\"floordiv\", 1, 0]", &st);
  CHECK(st == MLPACK_ERR_RUNTIME, "division by zero: %d", st);
  eval("[\"mul\", 9223372036854775807, 2]", &st);
  CHECK(st == MLPACK_ERR_RUNTIME, "overflow: %d", st);
  eval("\"$nope\"", &st);
  CHECK(st == MLPACK_ERR_RUNTIME, "unknown symbol: %d", st);
  eval("[\"pow\", 2, 3]", &st);
  CHECK(st == MLPACK_ERR_FORMAT, "unknown op: %d", st);
}

int main(void) {
  make_artifacts();
  test_avx512_host();
  test_other_hosts();
  test_requests();
  test_pinned_artifact();
  test_budget();
  test_no_artifact();
  test_executor_table();
  test_host_detect();
  test_expr();
  return mp_check_report("test_select");
}
