/* select.c: which artifact to run (spec/SPEC.md section 5), a line-for-line port of
 * runtime/select.py so both give the same verdicts and reasons.
 *
 *   1. drop what the host cannot run (platform, x86 level, CPU features, CUDA, min_runtime, code
 *      this engine has no executor for: executors.c's table, which mlpack_open loads with), then
 *      what the caller excluded (device, precision, accuracy budget);
 *   2. rank the rest, fastest first, budget or not: the device (native before portable), the
 *      build-time latency where measured, then the most specific target and the narrowest
 *      precision;
 *   3. give every artifact a reason a user can act on.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "executor.h"
#include "media.h"

const char *const mp_devices[] = {MP_DEVICES, NULL};
const char *const mp_precisions[] = {MP_PRECISIONS, NULL};

static int mp_in_list(const char *s, const char *const *list) {
  for (int i = 0; list[i]; i++)
    if (!strcmp(s, list[i])) return i;
  return -1;
}

/* "a, b, c" */
static const char *mp_join(const char *const *list, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; list[i] && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", list[i]);
  return buf;
}

/* the speed order of artifacts the build did not time: narrower is faster */
static int mp_precision_speed(const char *p) {
  if (!strcmp(p, "int8")) return 3;
  if (!strcmp(p, "fp16") || !strcmp(p, "bf16")) return 2;
  if (!strcmp(p, "fp32")) return 1;
  return 0;
}

/* 1..4 for an amd64 artifact (no variant means v1; an unknown one 99); 0 for other platforms. */
static int mp_x86_variant_level(const mp_artifact *a) {
  if (strcmp(a->architecture, "amd64") != 0) return 0;
  const char *v = *a->variant ? a->variant : "v1";
  if (v[0] == 'v' && v[1] >= '1' && v[1] <= '9' && v[2] == 0) return v[1] - '0';
  return 99;
}

void mp_artifact_describe(const mp_artifact *a, char *buf, size_t size) {
  char where[128];
  if (!strcmp(a->device, "portable")) snprintf(where, sizeof where, "portable");
  else if (!strcmp(a->device, "cuda") && a->cuda_sm) snprintf(where, sizeof where, "cuda sm_%d", a->cuda_sm);
  else if (!strcmp(a->device, "cuda")) snprintf(where, sizeof where, "cuda");
  else if (!strcmp(a->architecture, "amd64"))  /* "+amx", "+bf16", "+vnni": no OCI variant of their own */
    snprintf(where, sizeof where, "x86-64 v%d%s%s%s %.40s", mp_x86_variant_level(a),
             mp_list_has(a->cpu_features, "amx_tile") ? "+amx" : "",
             mp_list_has(a->cpu_features, "avx512_bf16") ? "+bf16" : "",
             mp_list_has(a->cpu_features, "avx512_vnni") ? "+vnni" : "", a->device);
  else snprintf(where, sizeof where, "%.40s %.40s", *a->architecture ? a->architecture : "?", a->device);
  snprintf(buf, size, "%s %.40s (artifact %zu)", where, a->precision, a->index);
}

static size_t mp_feature_count(const char *list) {
  size_t n = 0;
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    for (size_t i = 0; i < len; i++)
      if (p[i] != ' ') { n++; break; }
    if (!e) break;
    p = e + 1;
  }
  return n;
}

/* Higher is more specific (and faster): cuda > CPU by level and features > portable. */
static void mp_specificity(const mp_artifact *a, long out[3]) {
  out[0] = out[1] = out[2] = 0;
  if (!strcmp(a->device, "cuda")) {
    out[0] = 3;
    out[1] = a->cuda_sm;
  } else if (!strcmp(a->device, "cpu")) {
    int level = mp_x86_variant_level(a);
    out[0] = 2;
    out[1] = level ? level : 1;
    out[2] = (long)mp_feature_count(a->cpu_features);
  }
}

/* ---------------------------------------------------------------- step 1 */

static int mp_platform_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  if (!a->has_platform) {
    if (!strcmp(a->device, "portable") || !strcmp(a->device, "cuda")) return 0;   /* (GPU code runs on any CPU) */
    snprintf(why, n, "%s artifact has no OCI platform", a->device);
    return 1;
  }
  if (*a->os && strcmp(a->os, h->os) != 0) {
    snprintf(why, n, "%s, this host is %s", a->os, h->os);
    return 1;
  }
  const char *arch = *a->architecture ? a->architecture : h->architecture;
  if (strcmp(arch, h->architecture) != 0) {
    snprintf(why, n, "%s, this host is %s", arch, h->architecture);
    return 1;
  }
  int level = mp_x86_variant_level(a);
  if (level && level > h->x86_level) {
    char have[32];
    if (h->x86_level) snprintf(have, sizeof have, "x86-64 v%d", h->x86_level);
    else snprintf(have, sizeof have, "not x86-64 leveled");
    snprintf(why, n, "needs x86-64 %s, this host is %s", *a->variant ? a->variant : "v1", have);
    return 1;
  }
  if (!strcmp(arch, "arm64") && *a->variant && strcmp(a->variant, "v8") != 0) {
    snprintf(why, n, "arm64 variant '%s' is unknown to this runtime", a->variant);
    return 1;
  }
  return 0;
}

static int mp_device_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  if (mp_in_list(a->device, mp_devices) < 0) {
    snprintf(why, n, "device '%s' is unknown to this runtime", a->device);
    return 1;
  }
  if (strcmp(a->device, "cuda") != 0) return 0;
  if (!h->cuda_sm) {
    snprintf(why, n, "needs a CUDA GPU: %.200s", *h->cuda_why ? h->cuda_why : "this host has none");
    return 1;
  }
  if (a->cuda_sm > h->cuda_sm) {
    snprintf(why, n, "needs sm_%d, this host's GPU is sm_%d", a->cuda_sm, h->cuda_sm);
    return 1;
  }
  return 0;
}

static int mp_feature_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  char missing[160] = "";
  size_t count = 0, used = 0;
  for (const char *p = a->cpu_features; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    while (len && *p == ' ') p++, len--;
    while (len && p[len - 1] == ' ') len--;
    char name[64];
    if (len && len < sizeof name) {
      memcpy(name, p, len);
      name[len] = 0;
      if (!mp_host_has_feature(h, name)) {
        used += (size_t)snprintf(missing + used, used < sizeof missing ? sizeof missing - used : 0, "%s%s",
                                 count ? ", " : "", name);
        if (used >= sizeof missing) used = sizeof missing - 1;
        count++;
      }
    } else if (len) {
      count++;  /* an absurdly long name matches nothing */
    }
    if (!e) break;
    p = e + 1;
  }
  if (!count) return 0;
  snprintf(why, n, "needs %.150s, this host lacks %s", missing, count == 1 ? "it" : "them");
  return 1;
}

/* min_runtime, then the executor table: is there a row for the code, and does its host check pass */
static int mp_runtime_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  const int have[3] = {MLPACK_VERSION_MAJOR, MLPACK_VERSION_MINOR, MLPACK_VERSION_PATCH};
  int newer = a->min_runtime[0] < 0;
  for (int i = 0; i < 3 && !newer; i++) {
    if (a->min_runtime[i] != have[i]) {
      newer = a->min_runtime[i] > have[i];
      break;
    }
  }
  if (newer) {
    snprintf(why, n, "needs mlpack runtime %.60s, this is %s", a->min_runtime_text, mlpack_version_string());
    return 1;
  }
  if (!a->code_media_type) {
    snprintf(why, n, "has no code layer this runtime knows");
    return 1;
  }
  const mp_executor_kind *x = mp_executor_for(a->code_media_type);
  if (!x) {  /* a code format with no row: a cubin without its PTX */
    snprintf(why, n, "cubin code without PTX, which this runtime does not load");
    return 1;
  }
  return x->host_fault && x->host_fault(a, h, why, n);
}

static int mp_host_fault(const mp_artifact *a, const mp_host *h, char *why, size_t n) {
  if (a->absent) {   /* runtime/select.py NOT_PULLED */
    snprintf(why, n, "not in this partial container (mlpack pull --all fetches every artifact)");
    return 1;
  }
  return mp_platform_fault(a, h, why, n) || mp_device_fault(a, h, why, n) || mp_feature_fault(a, h, why, n) ||
         mp_runtime_fault(a, h, why, n);
}

static int mp_policy_fault(const mp_artifact *a, const mlpack_options *o, int has_budget, char *why, size_t n) {
  if (o->pin_artifact > 0 && a->index + 1 != (size_t)o->pin_artifact) {
    snprintf(why, n, "artifact %d was requested", o->pin_artifact - 1);
    return 1;
  }
  if (o->device && strcmp(a->device, o->device) != 0) {
    snprintf(why, n, "device '%s' was requested", o->device);
    return 1;
  }
  if (o->precision && strcmp(a->precision, o->precision) != 0) {
    snprintf(why, n, "precision '%s' was requested", o->precision);
    return 1;
  }
  if (has_budget && a->max_error < 0) {
    snprintf(why, n, "records no measured error, so it cannot meet the accuracy budget %g", o->accuracy_budget);
    return 1;
  }
  if (has_budget && a->max_error > o->accuracy_budget) {
    snprintf(why, n, "max_error %g exceeds the accuracy budget %g", a->max_error, o->accuracy_budget);
    return 1;
  }
  return 0;
}

static mlpack_status mp_check_policy(const mlpack_options *o, mlpack_error **err) {
  char words[128];
  if (o->device && mp_in_list(o->device, mp_devices) < 0)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "device '%.60s' is not one of %s", o->device,
                   mp_join(mp_devices, words, sizeof words));
  if (o->precision && mp_in_list(o->precision, mp_precisions) < 0)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "precision '%.60s' is not one of %s", o->precision,
                   mp_join(mp_precisions, words, sizeof words));
  if (isnan(o->accuracy_budget))
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "accuracy budget nan is not a non-negative number");
  return MLPACK_OK;
}

/* ---------------------------------------------------------------- step 2 */

/* Whether every CPU feature b requires is among a's (comma lists, spaces ignored). */
static int mp_features_within(const char *b, const char *a) {
  for (const char *p = b; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    while (len && *p == ' ') p++, len--;
    while (len && p[len - 1] == ' ') len--;
    char name[64];
    if (len >= sizeof name) return 0;
    memcpy(name, p, len);
    name[len] = 0;
    if (len && !mp_list_has(a, name)) return 0;
    if (!e) break;
    p = e + 1;
  }
  return 1;
}

/* The timing that stands for an artifact the build did not time (its host could not run it):
 * the fastest measured artifact of the same device, architecture and precision whose target a
 * extends (a CPU level no higher, every required feature among a's), as more instructions never
 * make the same computation slower; a itself when measured; NULL when there is none. */
static const mp_artifact *mp_timed_as(const mp_container *c, const mp_artifact *a) {
  if (a->latency >= 0) return a;
  const mp_artifact *best = NULL;
  for (size_t i = 0; i < c->artifact_count; i++) {
    const mp_artifact *b = &c->artifacts[i];
    if (b->latency < 0 || strcmp(b->device, a->device) || strcmp(b->precision, a->precision) ||
        strcmp(b->architecture, a->architecture) || mp_x86_variant_level(b) > mp_x86_variant_level(a) ||
        !mp_features_within(b->cpu_features, a->cpu_features))
      continue;
    if (!best || b->latency < best->latency) best = b;
  }
  return best;
}

/* Larger is better, with or without a budget (a budget only drops artifacts): the device (cuda,
 * cpu, portable), then a measured artifact before an unmeasured one, the measured by their
 * build-time latency (ns, lower first: the build timed them on one host; an artifact that host
 * could not run by the timing of the one it extends, mp_timed_as), then target specificity and
 * their precision (narrower first). */
#define MP_KEY 7
static void mp_rank_key(const mp_container *c, const mp_artifact *a, long long key[MP_KEY]) {
  long s[3];
  const mp_artifact *t = mp_timed_as(c, a);
  mp_specificity(a, s);
  key[0] = s[0];   /* native code before the interpreter, whatever its precision */
  key[1] = t != NULL;
  key[2] = t ? -(long long)(t->latency * 1e9) : 0;
  key[3] = s[1]; key[4] = s[2];
  key[5] = mp_precision_speed(a->precision);
  key[6] = -(long long)a->index;
}

static int mp_ranks_above(const mp_container *c, const mp_artifact *a, const mp_artifact *b) {
  long long ka[MP_KEY], kb[MP_KEY];
  mp_rank_key(c, a, ka);
  mp_rank_key(c, b, kb);
  for (int i = 0; i < MP_KEY; i++)
    if (ka[i] != kb[i]) return ka[i] > kb[i];
  return 0;
}

/* ---------------------------------------------------------------- step 3 */

static void mp_chosen_reason(const mp_container *c, const mp_artifact *a, const mlpack_options *o,
                             int has_budget, size_t others, char *out, size_t n) {
  char d[200], td[200];
  const mp_artifact *t = mp_timed_as(c, a);
  mp_artifact_describe(a, d, sizeof d);
  if (o->device && !strcmp(o->device, "portable"))
    snprintf(out, n, "chosen: the portable artifact was requested");
  else if (has_budget)
    snprintf(out, n, "chosen: %.150s is the fastest artifact within the accuracy budget %g (max_error %g)", d,
             o->accuracy_budget, a->max_error);
  else if (!strcmp(a->device, "portable"))
    snprintf(out, n, "chosen: portable: runs anywhere; slower (no native artifact fits)");
  else if (others == 0)
    snprintf(out, n, "chosen: %s is the only artifact this host runs", d);
  else if (t == a)
    snprintf(out, n, "chosen: %.150s is the fastest artifact this host runs (timed at build)", d);
  else if (t) {
    mp_artifact_describe(t, td, sizeof td);
    snprintf(out, n, "chosen: %.75s is the fastest artifact this host runs (as %.75s timed at build, "
             "whose instructions it extends)", d, td);
  } else
    snprintf(out, n, "chosen: %s is the most specific artifact this host runs", d);
}

static void mp_loser_reason(const mp_artifact *a, const mp_artifact *winner, char *out, size_t n) {
  char d[200];
  if (!strcmp(a->device, "portable")) {
    snprintf(out, n, "portable: runs anywhere; slower");
    return;
  }
  mp_artifact_describe(winner, d, sizeof d);
  if (!strcmp(a->device, winner->device) && strcmp(a->precision, winner->precision) != 0)
    snprintf(out, n, "passed over: %.150s ranks higher (ask for precision='%.40s')", d, a->precision);
  else
    snprintf(out, n, "passed over: %s ranks higher", d);
}

/* "  <describe>: <reason>" lines (runtime/select.py explain); only_native skips portable ones
 * and strips "passed over: " (runtime/model.py _fallback_reason). Caller frees. */
static char *mp_explain(const mp_container *c, const mp_verdict *v, int only_native) {
  size_t cap = 64 + c->artifact_count * 512, used = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  out[0] = 0;
  for (size_t i = 0; i < c->artifact_count; i++) {
    const mp_artifact *a = &c->artifacts[i];
    if (only_native && !strcmp(a->device, "portable")) continue;
    char d[200];
    mp_artifact_describe(a, d, sizeof d);
    const char *reason = v[i].reason;
    if (only_native && !strncmp(reason, "passed over: ", 13)) reason += 13;
    used += (size_t)snprintf(out + used, cap - used, only_native ? "%s%s: %s" : "%s  %s: %s",
                             only_native ? (used ? "; " : "") : (i ? "\n" : ""), d, reason);
    if (used >= cap) used = cap - 1;
  }
  return out;
}

static mlpack_status mp_fail_explained(const mp_container *c, const mp_host *h, const mp_verdict *v,
                                       mlpack_error **err) {
  char host[160];
  mp_host_describe(h, host, sizeof host);
  char *lines = mp_explain(c, v, 0);
  mlpack_status st = mp_fail(err, MLPACK_ERR_NO_ARTIFACT, "%s: no artifact runs on this host (%s) as requested:\n%s",
                             c->path, host, lines ? lines : "(out of memory)");
  free(lines);
  return st;
}

static mlpack_status mp_fail_strict(const mp_container *c, const mp_verdict *v, mlpack_error **err) {
  int native = 0;
  for (size_t i = 0; i < c->artifact_count; i++) native |= strcmp(c->artifacts[i].device, "portable") != 0;
  if (!native)
    return mp_fail(err, MLPACK_ERR_NO_ARTIFACT,
                   "%s: running the portable interpreter (slow): this container has no native artifact "
                   "(strict forbids falling back)", c->path);
  char *why = mp_explain(c, v, 1);
  mlpack_status st = mp_fail(err, MLPACK_ERR_NO_ARTIFACT,
                             "%s: running the portable interpreter (slow): no native artifact fits: %s "
                             "(strict forbids falling back)", c->path, why ? why : "");
  free(why);
  return st;
}

mlpack_status mp_select(const mp_container *c, const mp_host *h, const mlpack_options *opts,
                        mp_verdict *verdicts, size_t *chosen, mlpack_error **err) {
  mlpack_status st = mp_check_policy(opts, err);
  if (st) return st;
  if (opts->pin_artifact < 0 || (size_t)opts->pin_artifact > c->artifact_count)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: there is no artifact %d (it has %zu)", c->path,
                   opts->pin_artifact - 1, c->artifact_count);
  int has_budget = opts->accuracy_budget >= 0;
  const mp_artifact *winner = NULL;
  size_t runnable = 0;
  for (size_t i = 0; i < c->artifact_count; i++) {
    const mp_artifact *a = &c->artifacts[i];
    mp_verdict *v = &verdicts[i];
    char why[224];
    memset(v, 0, sizeof *v);
    if (mp_host_fault(a, h, why, sizeof why)) {
      snprintf(v->reason, sizeof v->reason, "passed over: %s", why);
      continue;
    }
    v->runnable = 1;
    runnable++;
    if (mp_policy_fault(a, opts, has_budget, why, sizeof why)) {
      snprintf(v->reason, sizeof v->reason, "passed over: %s", why);
      continue;
    }
    if (!winner || mp_ranks_above(c, a, winner)) winner = a;
  }
  if (!winner) return mp_fail_explained(c, h, verdicts, err);
  for (size_t i = 0; i < c->artifact_count; i++) {
    mp_verdict *v = &verdicts[i];
    if (&c->artifacts[i] == winner) {
      v->chosen = 1;
      mp_chosen_reason(c, winner, opts, has_budget, runnable - 1, v->reason, sizeof v->reason);
    } else if (!v->reason[0]) {
      mp_loser_reason(&c->artifacts[i], winner, v->reason, sizeof v->reason);
    }
  }
  *chosen = winner->index;
  /* asking for the portable artifact (by device or by index) is no fallback */
  int fallback = !strcmp(winner->device, "portable") && !(opts->device && !strcmp(opts->device, "portable")) &&
                 !opts->pin_artifact;
  if (opts->strict && fallback) return mp_fail_strict(c, verdicts, err);
  return MLPACK_OK;
}
