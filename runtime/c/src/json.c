/* json.c: a strict JSON parser into an arena (one allocation family per document).
 *
 * Strict as Python's json module is with the reader's hooks (spec/container.py parse_json):
 * UTF-8 input only, no duplicate keys, no NaN/Infinity, no trailing garbage, no BOM. Strings
 * with NUL (\u0000) and lone surrogates are refused too, because every consumer wants C strings.
 * Nesting is limited to 512 levels so recursion stays bounded on any input.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MP_JSON_MAX_DEPTH 512
#define MP_ARENA_CHUNK (64 * 1024)

typedef struct mp_chunk {
  struct mp_chunk *next;
  size_t used, cap;
  max_align_t data[];
} mp_chunk;

struct mp_json_doc {
  mp_chunk *chunks;
  mp_json *root;
};

typedef struct mp_parser {
  const char *p, *end, *start;
  const char *what;
  mp_json_doc *doc;
  /* scratch stacks for the items/keys of the containers being parsed */
  mp_json **items;
  const char **keys;
  size_t top, cap;
  mlpack_error **err;
} mp_parser;

/* ---------------------------------------------------------------- arena */

static void *mp_arena_alloc(mp_json_doc *doc, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  mp_chunk *c = doc->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > MP_ARENA_CHUNK ? n : MP_ARENA_CHUNK;
    c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->used = 0;
    c->cap = cap;
    c->next = doc->chunks;
    doc->chunks = c;
  }
  void *out = (char *)c->data + c->used;
  c->used += n;
  return out;
}

char *mp_json_strdup(mp_json_doc *doc, const char *s, size_t n) {
  char *out = mp_arena_alloc(doc, n + 1);
  if (!out) return NULL;
  memcpy(out, s, n);
  out[n] = 0;
  return out;
}

void mp_json_free(mp_json_doc *doc) {
  if (!doc) return;
  mp_chunk *c = doc->chunks;
  while (c) {
    mp_chunk *next = c->next;
    free(c);
    c = next;
  }
  free(doc);
}

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if it is not valid. */
static size_t mp_utf8_seq(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t min, cp;
  if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; cp = c & 0x07; }
  else return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

int mp_utf8_check(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t len = mp_utf8_seq(s + i, n - i);
    if (!len) return -1;
    i += len;
  }
  return 0;
}

/* ---------------------------------------------------------------- parser */

static mlpack_status mp_json_error(mp_parser *ps, const char *why) {
  size_t at = (size_t)(ps->p - ps->start);
  return mp_fail(ps->err, MLPACK_ERR_FORMAT, "%s is not valid JSON: %s at byte %zu", ps->what, why, at);
}

static mlpack_status mp_json_nomem(mp_parser *ps) {
  return mp_fail(ps->err, MLPACK_ERR_NOMEM, "%s: out of memory parsing JSON", ps->what);
}

static void mp_skip_ws(mp_parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static mlpack_status mp_scratch_push(mp_parser *ps, mp_json *item, const char *key) {
  if (ps->top == ps->cap) {
    size_t cap = ps->cap ? ps->cap * 2 : 64;
    mp_json **items = realloc(ps->items, cap * sizeof *items);
    if (!items) return mp_json_nomem(ps);
    ps->items = items;
    const char **keys = realloc(ps->keys, cap * sizeof *keys);
    if (!keys) return mp_json_nomem(ps);
    ps->keys = keys;
    ps->cap = cap;
  }
  ps->items[ps->top] = item;
  ps->keys[ps->top] = key;
  ps->top++;
  return MLPACK_OK;
}

static int mp_hex4(const char *p, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static size_t mp_utf8_put(char *out, uint32_t cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* A \uXXXX escape (with its low surrogate when it is a high one) at ps->p (after the 'u'). */
static mlpack_status mp_parse_u_escape(mp_parser *ps, uint32_t *cp) {
  if (ps->end - ps->p < 4 || mp_hex4(ps->p, cp)) return mp_json_error(ps, "bad \\u escape");
  ps->p += 4;
  if (*cp >= 0xDC00 && *cp <= 0xDFFF) return mp_json_error(ps, "lone low surrogate");
  if (*cp >= 0xD800 && *cp <= 0xDBFF) {
    uint32_t lo;
    if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' || mp_hex4(ps->p + 2, &lo) ||
        lo < 0xDC00 || lo > 0xDFFF)
      return mp_json_error(ps, "lone high surrogate");
    ps->p += 6;
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
  }
  if (*cp == 0) return mp_json_error(ps, "NUL character in a string");
  return MLPACK_OK;
}

/* A string at ps->p (on the opening quote), decoded into the arena. */
static mlpack_status mp_parse_string(mp_parser *ps, const char **out, size_t *out_len) {
  const char *q = ++ps->p;
  /* the decoded form is never longer than the source, so size the copy by the source */
  while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
  if (q >= ps->end) return mp_json_error(ps, "unterminated string");
  char *buf = mp_arena_alloc(ps->doc, (size_t)(q - ps->p) + 1);
  if (!buf) return mp_json_nomem(ps);
  size_t n = 0;
  while (*ps->p != '"') {
    unsigned char c = (unsigned char)*ps->p;
    if (c < 0x20) return mp_json_error(ps, "control character in a string");
    if (c != '\\') {
      size_t len = mp_utf8_seq((const uint8_t *)ps->p, (size_t)(ps->end - ps->p));
      if (!len) return mp_json_error(ps, "invalid UTF-8");
      memcpy(buf + n, ps->p, len);
      n += len;
      ps->p += len;
      continue;
    }
    ps->p++;
    char e = *ps->p++;
    uint32_t cp;
    switch (e) {
      case '"': buf[n++] = '"'; break;
      case '\\': buf[n++] = '\\'; break;
      case '/': buf[n++] = '/'; break;
      case 'b': buf[n++] = '\b'; break;
      case 'f': buf[n++] = '\f'; break;
      case 'n': buf[n++] = '\n'; break;
      case 'r': buf[n++] = '\r'; break;
      case 't': buf[n++] = '\t'; break;
      case 'u':
        if (mp_parse_u_escape(ps, &cp)) return MLPACK_ERR_FORMAT;
        n += mp_utf8_put(buf + n, cp);
        break;
      default: ps->p--; return mp_json_error(ps, "bad escape");
    }
  }
  ps->p++;
  buf[n] = 0;
  *out = buf;
  *out_len = n;
  return MLPACK_OK;
}

static mlpack_status mp_parse_number(mp_parser *ps, mp_json *v) {
  const char *s = ps->p, *q = s;
  if (q < ps->end && *q == '-') q++;
  if (q >= ps->end || *q < '0' || *q > '9') return mp_json_error(ps, "bad number");
  if (*q == '0') q++;
  else while (q < ps->end && *q >= '0' && *q <= '9') q++;
  int integral = 1;
  if (q < ps->end && *q == '.') {
    integral = 0;
    q++;
    if (q >= ps->end || *q < '0' || *q > '9') { ps->p = q; return mp_json_error(ps, "bad number"); }
    while (q < ps->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < ps->end && (*q == 'e' || *q == 'E')) {
    integral = 0;
    q++;
    if (q < ps->end && (*q == '+' || *q == '-')) q++;
    if (q >= ps->end || *q < '0' || *q > '9') { ps->p = q; return mp_json_error(ps, "bad number"); }
    while (q < ps->end && *q >= '0' && *q <= '9') q++;
  }
  /* strtod/strtoll need a NUL-terminated copy; numbers are short unless hostile */
  size_t len = (size_t)(q - s);
  char small[64];
  char *text = len < sizeof small ? small : malloc(len + 1);
  if (!text) return mp_json_nomem(ps);
  memcpy(text, s, len);
  text[len] = 0;
  v->kind = MP_JSON_NUMBER;
  v->is_integral = integral;
  v->number = strtod(text, NULL);
  if (integral) {
    errno = 0;
    long long i = strtoll(text, NULL, 10);
    if (errno == 0) { v->is_int = 1; v->integer = i; }
  }
  if (text != small) free(text);
  ps->p = q;
  return MLPACK_OK;
}

static mlpack_status mp_parse_value(mp_parser *ps, mp_json **out, int depth);

static int mp_key_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicate keys are found by sorting a copy: linear scans would be quadratic on hostile input. */
static mlpack_status mp_check_duplicates(mp_parser *ps, const char **keys, size_t n) {
  if (n < 2) return MLPACK_OK;
  const char **sorted = malloc(n * sizeof *sorted);
  if (!sorted) return mp_json_nomem(ps);
  memcpy(sorted, keys, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, mp_key_cmp);
  mlpack_status st = MLPACK_OK;
  for (size_t i = 1; i < n && !st; i++) {
    if (strcmp(sorted[i - 1], sorted[i]) == 0) {
      st = mp_fail(ps->err, MLPACK_ERR_FORMAT, "%s is not valid JSON: duplicate key '%.80s'",
                   ps->what, sorted[i]);
    }
  }
  free(sorted);
  return st;
}

/* Move the scratch entries above `base` into the node (arena copies). */
static mlpack_status mp_collect(mp_parser *ps, mp_json *v, size_t base, int with_keys) {
  size_t n = ps->top - base;
  v->length = n;
  if (n) {
    v->items = mp_arena_alloc(ps->doc, n * sizeof *v->items);
    if (!v->items) return mp_json_nomem(ps);
    memcpy(v->items, ps->items + base, n * sizeof *v->items);
    if (with_keys) {
      v->keys = mp_arena_alloc(ps->doc, n * sizeof *v->keys);
      if (!v->keys) return mp_json_nomem(ps);
      memcpy(v->keys, ps->keys + base, n * sizeof *v->keys);
    }
  }
  ps->top = base;
  return with_keys ? mp_check_duplicates(ps, v->keys, n) : MLPACK_OK;
}

static mlpack_status mp_parse_array(mp_parser *ps, mp_json *v, int depth) {
  size_t base = ps->top;
  v->kind = MP_JSON_ARRAY;
  ps->p++;
  mp_skip_ws(ps);
  if (ps->p < ps->end && *ps->p == ']') { ps->p++; return mp_collect(ps, v, base, 0); }
  for (;;) {
    mp_json *item;
    if (mp_parse_value(ps, &item, depth + 1)) return MLPACK_ERR_FORMAT;
    if (mp_scratch_push(ps, item, NULL)) return MLPACK_ERR_NOMEM;
    mp_skip_ws(ps);
    if (ps->p >= ps->end) return mp_json_error(ps, "unterminated array");
    if (*ps->p == ']') { ps->p++; return mp_collect(ps, v, base, 0); }
    if (*ps->p != ',') return mp_json_error(ps, "expected ',' or ']'");
    ps->p++;
  }
}

static mlpack_status mp_parse_object(mp_parser *ps, mp_json *v, int depth) {
  size_t base = ps->top;
  v->kind = MP_JSON_OBJECT;
  ps->p++;
  mp_skip_ws(ps);
  if (ps->p < ps->end && *ps->p == '}') { ps->p++; return mp_collect(ps, v, base, 1); }
  for (;;) {
    mp_skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return mp_json_error(ps, "expected a string key");
    const char *key;
    size_t key_len;
    if (mp_parse_string(ps, &key, &key_len)) return MLPACK_ERR_FORMAT;
    mp_skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') return mp_json_error(ps, "expected ':'");
    ps->p++;
    mp_json *item;
    if (mp_parse_value(ps, &item, depth + 1)) return MLPACK_ERR_FORMAT;
    if (mp_scratch_push(ps, item, key)) return MLPACK_ERR_NOMEM;
    mp_skip_ws(ps);
    if (ps->p >= ps->end) return mp_json_error(ps, "unterminated object");
    if (*ps->p == '}') { ps->p++; return mp_collect(ps, v, base, 1); }
    if (*ps->p != ',') return mp_json_error(ps, "expected ',' or '}'");
    ps->p++;
  }
}

static int mp_match_word(mp_parser *ps, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
  ps->p += n;
  return 1;
}

static mlpack_status mp_parse_value(mp_parser *ps, mp_json **out, int depth) {
  if (depth > MP_JSON_MAX_DEPTH) return mp_json_error(ps, "nested too deeply");
  mp_skip_ws(ps);
  if (ps->p >= ps->end) return mp_json_error(ps, "unexpected end");
  mp_json *v = mp_arena_alloc(ps->doc, sizeof *v);
  if (!v) return mp_json_nomem(ps);
  memset(v, 0, sizeof *v);
  *out = v;
  char c = *ps->p;
  if (c == '{') return mp_parse_object(ps, v, depth);
  if (c == '[') return mp_parse_array(ps, v, depth);
  if (c == '"') {
    v->kind = MP_JSON_STRING;
    return mp_parse_string(ps, &v->string, &v->length);
  }
  if (c == '-' || (c >= '0' && c <= '9')) return mp_parse_number(ps, v);
  if (mp_match_word(ps, "true")) { v->kind = MP_JSON_BOOL; v->boolean = 1; return MLPACK_OK; }
  if (mp_match_word(ps, "false")) { v->kind = MP_JSON_BOOL; return MLPACK_OK; }
  if (mp_match_word(ps, "null")) { v->kind = MP_JSON_NULL; return MLPACK_OK; }
  return mp_json_error(ps, "unexpected character");
}

mlpack_status mp_json_parse(const char *text, size_t len, const char *what, mp_json_doc **out,
                            mlpack_error **err) {
  *out = NULL;
  mp_json_doc *doc = calloc(1, sizeof *doc);
  if (!doc) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", what);
  mp_parser ps = {.p = text, .end = text + len, .start = text, .what = what, .doc = doc, .err = err};
  mlpack_status st = mp_parse_value(&ps, &doc->root, 0);
  if (!st) {
    mp_skip_ws(&ps);
    if (ps.p != ps.end) st = mp_json_error(&ps, "extra data after the document");
  }
  free(ps.items);
  free(ps.keys);
  if (st) {
    mp_json_free(doc);
    return st;
  }
  *out = doc;
  return MLPACK_OK;
}

const mp_json *mp_json_root(const mp_json_doc *doc) { return doc ? doc->root : NULL; }

const mp_json *mp_json_get(const mp_json *obj, const char *key) {
  if (!obj || obj->kind != MP_JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->length; i++)
    if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
  return NULL;
}

const char *mp_json_get_string(const mp_json *obj, const char *key) {
  const mp_json *v = mp_json_get(obj, key);
  return v && v->kind == MP_JSON_STRING ? v->string : NULL;
}
