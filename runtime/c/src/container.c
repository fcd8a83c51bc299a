/* container.c: the strict reader of an mlpack container (spec/SPEC.md sections 1-4).
 *
 * It gives the same verdict as spec/container.py on every file (spec/conformance tests both):
 * the same checks, in the same order, so a file with several faults reports the same one.
 * Status classes: FormatError subclasses -> MLPACK_ERR_FORMAT, DigestError -> MLPACK_ERR_DIGEST,
 * VersionError -> MLPACK_ERR_VERSION, a file that cannot be opened -> MLPACK_ERR_IO.
 *
 * Two sources share one parser: a file (headers and documents read with pread, digests checked
 * with read() so that mapped weight pages are never touched; blobs then point into an mmap) and
 * bytes in memory (the fuzzer). Every tar field and every JSON access is bounds-checked.
 *
 * It reads format 1.x, every minor: 1.1 (the format spec/media.py writes) added output dim
 * sizes that are expressions of symbols, whose grammar size.c checks here and evaluates per run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "media.h"

#define MP_BLOCK 512u
#define MP_MAX_JSON ((uint64_t)64 << 20)
#define MP_MAX_PAX ((uint64_t)1 << 20)
#define MP_WHERE 4608
#define MP_BLOB_DIR "blobs/sha256/"

#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
/* Fuzz builds only: when set, tar checksums and digests always match, so mutated documents
 * reach the JSON and config checks instead of stopping at the first checksum. */
int mp_fuzz_lax = 0;
#define MP_LAX mp_fuzz_lax
#else
#define MP_LAX 0
#endif

typedef struct mp_member {
  char *name;
  uint64_t offset, size;
  int is_dir;
} mp_member;

/* Parser state; lives only while a container is being opened. */
typedef struct mp_reader {
  mp_container *c;
  const char *path;
  int fd;               /* -1: read from mem */
  const uint8_t *mem;
  uint64_t size;
  int verify;
  mp_member *members;
  size_t member_count, member_cap;
  size_t *table;        /* open addressing: member index + 1, 0 = empty */
  size_t table_cap;
  char (*verified)[72];
  size_t verified_count, verified_cap;
  mlpack_error **err;
} mp_reader;

/* ================================================================ small helpers */

/* snprintf through a function: messages are cut at their buffer on purpose (a path of 4 KiB),
 * and this keeps -Wformat-truncation from flagging every such call. */
static void mp_snprintf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mp_snprintf(char *buf, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, size, fmt, ap);
  va_end(ap);
}

static mlpack_status mp_nomem(mp_reader *r) {
  return mp_fail(r->err, MLPACK_ERR_NOMEM, "%s: out of memory", r->path);
}

/* A printable rendering of untrusted text for messages: control bytes escaped, at most ~120. */
static const char *mp_printable(const char *s, char *buf, size_t size) {
  size_t n = 0;
  for (; *s && n + 5 < size && n < 120; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f || c == '\\') n += (size_t)snprintf(buf + n, size - n, "\\x%02x", c);
    else buf[n++] = (char)c;
  }
  buf[n] = 0;
  if (*s && n + 4 < size) memcpy(buf + n, "...", 4);
  return buf;
}

/* "sha256:0123456789ab..." as spec/container.py's _short. */
static const char *mp_short(const char *digest, char buf[32]) {
  mp_snprintf(buf, 32, "%.19s%s", digest, strlen(digest) > 19 ? "..." : "");
  return buf;
}

static const char *mp_type_name(const mp_json *v) {
  switch (v->kind) {
    case MP_JSON_NULL: return "NoneType";
    case MP_JSON_BOOL: return "bool";
    case MP_JSON_NUMBER: return v->is_integral ? "int" : "float";
    case MP_JSON_STRING: return "str";
    case MP_JSON_ARRAY: return "list";
    default: return "dict";
  }
}

/* Read n bytes at off from the source; a short read is a truncated file (it changed). */
static mlpack_status mp_read_at(mp_reader *r, uint64_t off, void *buf, size_t n) {
  if (off > r->size || n > r->size - off)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: truncated: read past the end of the file", r->path);
  if (r->fd < 0) {
    memcpy(buf, r->mem + off, n);
    return MLPACK_OK;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t got = pread(r->fd, (char *)buf + done, n - done, (off_t)(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return mp_fail(r->err, MLPACK_ERR_IO, "%s: read failed: %s", r->path, strerror(errno));
    if (got == 0)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: truncated: the file ends early (file changed?)", r->path);
    done += (size_t)got;
  }
  return MLPACK_OK;
}

/* ================================================================ member table */

static size_t mp_hash(const char *s) {
  size_t h = 1469598103934665603u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
  return h;
}

static const mp_member *mp_member_find(const mp_reader *r, const char *name) {
  if (!r->table_cap) return NULL;
  size_t mask = r->table_cap - 1;
  for (size_t i = mp_hash(name) & mask;; i = (i + 1) & mask) {
    size_t slot = r->table[i];
    if (!slot) return NULL;
    if (strcmp(r->members[slot - 1].name, name) == 0) return &r->members[slot - 1];
  }
}

static void mp_table_put(size_t *table, size_t cap, const char *name, size_t slot) {
  size_t mask = cap - 1;
  size_t i = mp_hash(name) & mask;
  while (table[i]) i = (i + 1) & mask;
  table[i] = slot;
}

static mlpack_status mp_table_grow(mp_reader *r) {
  size_t cap = r->table_cap ? r->table_cap * 2 : 64;
  size_t *table = calloc(cap, sizeof *table);
  if (!table) return mp_nomem(r);
  for (size_t i = 0; i < r->member_count; i++) mp_table_put(table, cap, r->members[i].name, i + 1);
  free(r->table);
  r->table = table;
  r->table_cap = cap;
  return MLPACK_OK;
}

static mlpack_status mp_member_add(mp_reader *r, const char *name, uint64_t offset, uint64_t size,
                                   int is_dir) {
  if (r->member_count == r->member_cap) {
    size_t cap = r->member_cap ? r->member_cap * 2 : 32;
    mp_member *m = realloc(r->members, cap * sizeof *m);
    if (!m) return mp_nomem(r);
    r->members = m;
    r->member_cap = cap;
  }
  if ((r->member_count + 1) * 2 > r->table_cap && mp_table_grow(r)) return MLPACK_ERR_NOMEM;
  char *copy = strdup(name);
  if (!copy) return mp_nomem(r);
  r->members[r->member_count] = (mp_member){copy, offset, size, is_dir};
  r->member_count++;
  mp_table_put(r->table, r->table_cap, copy, r->member_count);
  return MLPACK_OK;
}

/* ================================================================ the tar */

static int mp_is_zero_block(const uint8_t *b) {
  for (unsigned i = 0; i < MP_BLOCK; i++)
    if (b[i]) return 0;
  return 1;
}

/* An octal header field (spec: base-256 is refused). */
static mlpack_status mp_tar_number(mp_reader *r, const uint8_t *raw, size_t width, const char *what,
                                   const char *where, uint64_t *out) {
  if (raw[0] & 0x80)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: %s field uses base-256, which this format does not allow",
                   where, what);
  size_t end = 0;
  while (end < width && raw[end]) end++;
  size_t lo = 0, hi = end;
  while (lo < hi && raw[lo] == ' ') lo++;
  while (hi > lo && raw[hi - 1] == ' ') hi--;
  uint64_t v = 0;
  int ok = hi > lo;
  for (size_t i = lo; ok && i < hi; i++) {
    if (raw[i] < '0' || raw[i] > '7') ok = 0;
    else v = v * 8 + (uint64_t)(raw[i] - '0');  /* at most 12 digits: no overflow */
  }
  if (!ok) return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: %s field is not an octal number", where, what);
  *out = v;
  return MLPACK_OK;
}

static size_t mp_field_len(const uint8_t *p, size_t width) {
  size_t n = 0;
  while (n < width && p[n]) n++;
  return n;
}

/* prefix/name (POSIX magic only), checked to be UTF-8. buf holds 257 bytes. */
static mlpack_status mp_member_name(mp_reader *r, const uint8_t *block, const char *where, char *buf) {
  size_t n = mp_field_len(block, 100), len = 0;
  if (memcmp(block + 257, "ustar\0", 6) == 0) {
    size_t pn = mp_field_len(block + 345, 155);
    if (pn) {
      memcpy(buf, block + 345, pn);
      buf[pn] = '/';
      len = pn + 1;
    }
  }
  memcpy(buf + len, block, n);
  len += n;
  buf[len] = 0;
  if (mp_utf8_check((const uint8_t *)buf, len))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member name is not UTF-8", where);
  return MLPACK_OK;
}

static int mp_checksum_ok(const uint8_t *b, uint64_t stored) {
  uint64_t u = 0;
  int64_t s = 0;
  for (unsigned i = 0; i < MP_BLOCK; i++) {
    uint8_t c = (i >= 148 && i < 156) ? ' ' : b[i];
    u += c;
    s += (int8_t)c;
  }
  return MP_LAX || stored == u || (int64_t)stored == s;
}

typedef struct { char name[260]; char type; uint64_t size; } mp_header;

static mlpack_status mp_read_header(mp_reader *r, const uint8_t *b, uint64_t pos, mp_header *h) {
  char where[MP_WHERE], pbuf[160];
  mp_snprintf(where, sizeof where, "%s: tar header at byte %llu", r->path, (unsigned long long)pos);
  if (memcmp(b + 257, "ustar\0", 6) != 0 && memcmp(b + 257, "ustar ", 6) != 0) {
    if (pos == 0)
      return mp_fail(r->err, MLPACK_ERR_FORMAT,
                     "%s is not a tar archive (no ustar header at its start); an mlpack container is "
                     "an uncompressed ustar tar", r->path);
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s is not a ustar header", where);
  }
  uint64_t stored;
  if (mp_tar_number(r, b + 148, 8, "checksum", where, &stored)) return MLPACK_ERR_FORMAT;
  if (mp_member_name(r, b, where, h->name)) return MLPACK_ERR_FORMAT;
  if (!mp_checksum_ok(b, stored))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s (member '%s') has a bad tar header checksum", where,
                   mp_printable(h->name, pbuf, sizeof pbuf));
  char swhere[MP_WHERE];
  mp_snprintf(swhere, sizeof swhere, "%s (member '%s')", where, mp_printable(h->name, pbuf, sizeof pbuf));
  h->type = (char)b[156];
  return mp_tar_number(r, b + 124, 12, "size", swhere, &h->size);
}

/* Pax records are skipped, except those that would change how the next member is read. */
static mlpack_status mp_check_pax(mp_reader *r, const uint8_t *d, size_t n, const char *where) {
  size_t pos = 0;
  while (pos < n) {
    size_t lim = pos + 20 < n ? pos + 20 : n, sp = pos;
    while (sp < lim && d[sp] != ' ') sp++;
    uint64_t len = 0;
    int ok = sp < lim && sp > pos;
    for (size_t i = pos; ok && i < sp; i++) {
      if (d[i] < '0' || d[i] > '9') ok = 0;
      else len = len * 10 + (uint64_t)(d[i] - '0');  /* < 20 digits: fits */
    }
    if (!ok || len <= sp - pos + 1 || len > n - pos)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: malformed pax record at byte %zu of the pax header",
                     where, pos);
    size_t end = pos + (size_t)len;
    const uint8_t *rec = d + sp + 1;
    size_t rlen = end - sp - 1;
    const uint8_t *eq = memchr(rec, '=', rlen);
    if (rec[rlen - 1] != '\n' || !eq)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: malformed pax record at byte %zu of the pax header",
                     where, pos);
    size_t klen = (size_t)(eq - rec);
    if ((klen == 4 && !memcmp(rec, "path", 4)) || (klen == 8 && !memcmp(rec, "linkpath", 8)) ||
        (klen == 4 && !memcmp(rec, "size", 4)) || (klen >= 4 && !memcmp(rec, "GNU.", 4))) {
      char key[64];
      size_t k = klen < sizeof key - 1 ? klen : sizeof key - 1;
      for (size_t i = 0; i < k; i++) key[i] = (rec[i] >= 0x20 && rec[i] < 0x7f) ? (char)rec[i] : '?';
      key[k] = 0;
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: pax header sets '%s', which this format does not allow",
                     where, key);
    }
    pos = end;
  }
  return MLPACK_OK;
}

/* Normalize a member name (spec section 1); *root = 1 for the archive root ("./"). */
static mlpack_status mp_safe_name(mp_reader *r, const char *name, const char *where, char *out, int *root) {
  char pbuf[160];
  *root = 0;
  if (!*name) return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member name is empty", where);
  if (name[0] == '/')
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member name '%s' is an absolute path", where,
                   mp_printable(name, pbuf, sizeof pbuf));
  const char *part[260];
  size_t plen[260], np = 0;
  for (const char *s = name;; ) {
    const char *e = strchr(s, '/');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    part[np] = s;
    plen[np++] = len;
    if (!e) break;
    s = e + 1;
  }
  for (size_t i = 0; i < np; i++)
    if (plen[i] == 2 && !memcmp(part[i], "..", 2))
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member name '%s' contains '..'", where,
                     mp_printable(name, pbuf, sizeof pbuf));
  size_t first = 0;
  if (plen[0] == 1 && part[0][0] == '.') first = 1;
  if (np > first && plen[np - 1] == 0) np--;
  if (np <= first) {
    *root = 1;
    return MLPACK_OK;
  }
  size_t n = 0;
  for (size_t i = first; i < np; i++) {
    if (plen[i] == 0 || (plen[i] == 1 && part[i][0] == '.'))
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member name '%s' is not a normalized path", where,
                     mp_printable(name, pbuf, sizeof pbuf));
    if (i > first) out[n++] = '/';
    memcpy(out + n, part[i], plen[i]);
    n += plen[i];
  }
  out[n] = 0;
  return MLPACK_OK;
}

static const char *mp_link_kind(char type) {
  switch (type) {
    case '1': return "a hard link";
    case '2': return "a symbolic link";
    case '3': return "a character device";
    case '4': return "a block device";
    case '6': return "a FIFO";
    default: return NULL;
  }
}

static mlpack_status mp_pax_member(mp_reader *r, uint64_t data, uint64_t size, const char *where) {
  if (size > MP_MAX_PAX)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: pax header of %llu bytes is larger than allowed", where,
                   (unsigned long long)size);
  uint8_t *buf = malloc(size ? (size_t)size : 1);
  if (!buf) return mp_nomem(r);
  mlpack_status st = mp_read_at(r, data, buf, (size_t)size);
  if (!st) st = mp_check_pax(r, buf, (size_t)size, where);
  free(buf);
  return st;
}

static mlpack_status mp_add_member(mp_reader *r, const mp_header *h, uint64_t data, const char *where) {
  char pbuf[160], name[260];
  if (h->type == 'x' || h->type == 'g') return mp_pax_member(r, data, h->size, where);
  const char *link = mp_link_kind(h->type);
  if (link)
    return mp_fail(r->err, MLPACK_ERR_FORMAT,
                   "%s: member '%s' is %s; a container holds only regular files and directories", where,
                   mp_printable(h->name, pbuf, sizeof pbuf), link);
  if (h->type != '0' && h->type != 0 && h->type != '5')
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: member '%s' has unsupported tar type 0x%02x", where,
                   mp_printable(h->name, pbuf, sizeof pbuf), (unsigned char)h->type);
  int root;
  if (mp_safe_name(r, h->name, where, name, &root)) return MLPACK_ERR_FORMAT;
  if (root) return MLPACK_OK;
  if (mp_member_find(r, name))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: duplicate tar member '%s'", where,
                   mp_printable(name, pbuf, sizeof pbuf));
  return mp_member_add(r, name, data, h->size, h->type == '5');
}

static mlpack_status mp_check_end(mp_reader *r, uint64_t pos) {
  uint8_t block[MP_BLOCK];
  if (pos + 2 * MP_BLOCK > r->size)
    return mp_fail(r->err, MLPACK_ERR_FORMAT,
                   "%s: truncated tar: the end-of-archive marker at byte %llu is cut short", r->path,
                   (unsigned long long)pos);
  if (mp_read_at(r, pos + MP_BLOCK, block, MP_BLOCK)) return MLPACK_ERR_FORMAT;
  if (!mp_is_zero_block(block))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: tar has a lone zero block at byte %llu followed by data",
                   r->path, (unsigned long long)pos);
  return MLPACK_OK;
}

static mlpack_status mp_scan_tar(mp_reader *r) {
  uint8_t block[MP_BLOCK];
  char where[MP_WHERE], pbuf[160];
  for (uint64_t pos = 0;;) {
    if (pos + MP_BLOCK > r->size) {
      if (pos == 0)
        return mp_fail(r->err, MLPACK_ERR_FORMAT,
                       "%s (%llu bytes) is too short to be a tar archive; an mlpack container is an "
                       "uncompressed tar", r->path, (unsigned long long)r->size);
      return mp_fail(r->err, MLPACK_ERR_FORMAT,
                     "%s: truncated tar: the file ends at byte %llu, before the end-of-archive marker",
                     r->path, (unsigned long long)r->size);
    }
    if (mp_read_at(r, pos, block, MP_BLOCK)) return MLPACK_ERR_FORMAT;
    if (mp_is_zero_block(block)) return mp_check_end(r, pos);
    mp_header h;
    if (mp_read_header(r, block, pos, &h)) return MLPACK_ERR_FORMAT;
    uint64_t data = pos + MP_BLOCK;
    if (h.size > r->size - data)
      return mp_fail(r->err, MLPACK_ERR_FORMAT,
                     "%s: truncated tar: member '%s' declares %llu bytes but the file ends %llu bytes "
                     "after its header", r->path, mp_printable(h.name, pbuf, sizeof pbuf),
                     (unsigned long long)h.size, (unsigned long long)(r->size - data));
    mp_snprintf(where, sizeof where, "%s: tar header at byte %llu", r->path, (unsigned long long)pos);
    mlpack_status st = mp_add_member(r, &h, data, where);
    if (st) return st;
    pos = data + (h.size + MP_BLOCK - 1) / MP_BLOCK * MP_BLOCK;
  }
}

/* ================================================================ JSON fields */

typedef enum { MP_T_STR, MP_T_INT, MP_T_NUM, MP_T_OBJ, MP_T_LIST } mp_type;

static int mp_type_ok(const mp_json *v, mp_type t) {
  switch (t) {
    case MP_T_STR: return v->kind == MP_JSON_STRING;
    case MP_T_INT: return v->kind == MP_JSON_NUMBER && v->is_integral;
    case MP_T_NUM: return v->kind == MP_JSON_NUMBER || v->kind == MP_JSON_BOOL;  /* Python: bool is an int */
    case MP_T_OBJ: return v->kind == MP_JSON_OBJECT;
    default: return v->kind == MP_JSON_ARRAY;
  }
}

/* spec/container.py _field: *out = NULL when absent or null and not required. */
static mlpack_status mp_field(mp_reader *r, const mp_json *doc, const char *key, mp_type t, const char *where,
                              int required, const mp_json **out) {
  const mp_json *v = mp_json_get(doc, key);
  *out = NULL;
  if (!v || v->kind == MP_JSON_NULL) {
    if (required) return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: required field '%s' is missing", where, key);
    return MLPACK_OK;
  }
  if (!mp_type_ok(v, t))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: field '%s' has the wrong type (%s)", where, key,
                   mp_type_name(v));
  *out = v;
  return MLPACK_OK;
}

static mlpack_status mp_string_map(mp_reader *r, const mp_json *doc, const char *key, const char *where,
                                   const mp_json **out) {
  if (mp_field(r, doc, key, MP_T_OBJ, where, 0, out)) return MLPACK_ERR_FORMAT;
  for (size_t i = 0; *out && i < (*out)->length; i++)
    if ((*out)->items[i]->kind != MP_JSON_STRING)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: every value of '%s' must be a string", where, key);
  return MLPACK_OK;
}

static mlpack_status mp_parse_version(mp_reader *r, const char *text, const char *where, int *major,
                                      int *minor) {
  char pbuf[160];
  const char *p = text;
  long v[2] = {0, 0};
  int ok = 1;
  for (int k = 0; k < 2 && ok; k++) {
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 7) v[k] = v[k] * 10 + (*p++ - '0'), digits++;
    ok = digits >= 1 && digits <= 6 && (k == 0 ? *p == '.' : *p == 0);
    if (k == 0 && ok) p++;
  }
  if (!ok)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: format version '%s' is not MAJOR.MINOR", where,
                   mp_printable(text, pbuf, sizeof pbuf));
  if (v[0] > 1)
    return mp_fail(r->err, MLPACK_ERR_VERSION,
                   "%s: format %s is newer than this runtime reads (1.x); upgrade mlpack", where, text);
  if (v[0] < 1)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: format version %s does not exist (the first is 1.0)",
                   where, text);
  *major = (int)v[0];
  *minor = (int)v[1];
  return MLPACK_OK;
}

/* Parse a JSON document of n bytes at off; it must be an object; kept until close. */
static mlpack_status mp_parse_doc(mp_reader *r, uint64_t off, uint64_t n, const char *where,
                                  const mp_json **out, const uint8_t *bytes) {
  mp_container *c = r->c;
  if (n > MP_MAX_JSON)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s is %llu bytes, larger than a JSON document may be", where,
                   (unsigned long long)n);
  uint8_t *buf = NULL;
  if (!bytes) {
    buf = malloc(n ? (size_t)n : 1);
    if (!buf) return mp_nomem(r);
    if (mp_read_at(r, off, buf, (size_t)n)) { free(buf); return r->err && *r->err ? mlpack_error_code(*r->err) : MLPACK_ERR_FORMAT; }
    bytes = buf;
  }
  mp_json_doc **docs = realloc(c->docs, (c->doc_count + 1) * sizeof *docs);
  if (!docs) { free(buf); return mp_nomem(r); }
  c->docs = docs;
  mp_json_doc *doc;
  mlpack_status st = mp_json_parse((const char *)bytes, (size_t)n, where, &doc, r->err);
  free(buf);
  if (st) return st;
  c->docs[c->doc_count++] = doc;
  *out = mp_json_root(doc);
  if ((*out)->kind != MP_JSON_OBJECT)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s is not a JSON object", where);
  return MLPACK_OK;
}

static mlpack_status mp_json_member(mp_reader *r, const char *name, const char *where, const mp_json **out) {
  const mp_member *m = mp_member_find(r, name);
  if (!m || m->is_dir)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: the archive has no '%s'; not an mlpack container", r->path,
                   name);
  return mp_parse_doc(r, m->offset, m->size, where, out, NULL);
}

/* ================================================================ descriptors and blobs */

static int mp_digest_ok(const char *d) {
  if (strncmp(d, "sha256:", 7) != 0) return 0;
  for (int i = 0; i < 64; i++) {
    char c = d[7 + i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
  }
  return d[71] == 0;
}

static const mp_member *mp_blob_member(mp_reader *r, const char *digest, const char *where) {
  char name[sizeof MP_BLOB_DIR + 64], sbuf[32];
  mp_snprintf(name, sizeof name, MP_BLOB_DIR "%s", digest + 7);
  const mp_member *m = mp_member_find(r, name);
  if (!m || m->is_dir) {
    mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: blob %s is missing from the archive", where, mp_short(digest, sbuf));
    return NULL;
  }
  return m;
}

/* spec/container.py _descriptor: fields, media type (NULL: any), blob present with its size. */
static mlpack_status mp_descriptor(mp_reader *r, const mp_json *desc, const char *media_type, const char *where,
                                   const char **digest_out, const char **media_out) {
  char pbuf[160], sbuf[32];
  if (!desc || desc->kind != MP_JSON_OBJECT)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: a descriptor must be a JSON object", where);
  const mp_json *mt, *dg, *sz;
  if (mp_field(r, desc, "mediaType", MP_T_STR, where, 1, &mt)) return MLPACK_ERR_FORMAT;
  if (media_type && strcmp(mt->string, media_type) != 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: mediaType is '%s', expected '%s'", where,
                   mp_printable(mt->string, pbuf, sizeof pbuf), media_type);
  if (mp_field(r, desc, "digest", MP_T_STR, where, 1, &dg)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, desc, "size", MP_T_INT, where, 1, &sz)) return MLPACK_ERR_FORMAT;
  if (!mp_digest_ok(dg->string))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: digest '%s' is not 'sha256:' and 64 lowercase hex", where,
                   mp_printable(dg->string, pbuf, sizeof pbuf));
  if (sz->number < 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: size %.0f is negative", where, sz->number);
  if (!sz->is_int || (uint64_t)sz->integer > r->size)
    return mp_fail(r->err, MLPACK_ERR_DIGEST,
                   "%s: declares blob %s of %.0f bytes, larger than the whole file (%llu bytes)", where,
                   mp_short(dg->string, sbuf), sz->number, (unsigned long long)r->size);
  const mp_member *m = mp_blob_member(r, dg->string, where);
  if (!m) return MLPACK_ERR_FORMAT;
  if (m->size != (uint64_t)sz->integer)
    return mp_fail(r->err, MLPACK_ERR_DIGEST,
                   "%s: blob %s is %llu bytes in the archive but its descriptor declares %lld", where,
                   mp_short(dg->string, sbuf), (unsigned long long)m->size, (long long)sz->integer);
  *digest_out = dg->string;
  if (media_out) *media_out = mt->string;
  return MLPACK_OK;
}

static void mp_hex(const uint8_t *d, size_t n, char *out) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[d[i] >> 4];
    out[2 * i + 1] = hex[d[i] & 15];
  }
  out[2 * n] = 0;
}

static int mp_digest_matches(const uint8_t hash[32], const char *digest) {
  char hex[65];
  mp_hex(hash, 32, hex);
  return MP_LAX || strcmp(hex, digest + 7) == 0;
}

static int mp_was_verified(const mp_reader *r, const char *digest) {
  for (size_t i = 0; i < r->verified_count; i++)
    if (strcmp(r->verified[i], digest) == 0) return 1;
  return 0;
}

static mlpack_status mp_mark_verified(mp_reader *r, const char *digest) {
  if (mp_was_verified(r, digest)) return MLPACK_OK;
  if (r->verified_count == r->verified_cap) {
    size_t cap = r->verified_cap ? r->verified_cap * 2 : 16;
    char (*v)[72] = realloc(r->verified, cap * sizeof *v);
    if (!v) return mp_nomem(r);
    r->verified = v;
    r->verified_cap = cap;
  }
  mp_snprintf(r->verified[r->verified_count++], 72, "%s", digest);
  return MLPACK_OK;
}

/* Hash a blob with chunked read() calls: the mmap is never touched (it would make pages resident). */
static mlpack_status mp_hash_member(mp_reader *r, const mp_member *m, uint8_t out[32]) {
  mp_sha256 s;
  mp_sha256_init(&s);
  if (r->fd < 0) {
    mp_sha256_update(&s, r->mem + m->offset, (size_t)m->size);
    mp_sha256_final(&s, out);
    return MLPACK_OK;
  }
  size_t chunk = 1 << 20;
  uint8_t *buf = malloc(chunk);
  if (!buf) return mp_nomem(r);
  mlpack_status st = MLPACK_OK;
  for (uint64_t done = 0; done < m->size && !st; ) {
    size_t n = m->size - done < chunk ? (size_t)(m->size - done) : chunk;
    st = mp_read_at(r, m->offset + done, buf, n);
    if (!st) mp_sha256_update(&s, buf, n);
    done += n;
  }
  free(buf);
  mp_sha256_final(&s, out);
  return st;
}

static mlpack_status mp_verify(mp_reader *r, const char *digest, const char *where) {
  char sbuf[32];
  if (mp_was_verified(r, digest)) return MLPACK_OK;
  const mp_member *m = mp_blob_member(r, digest, where);
  if (!m) return MLPACK_ERR_FORMAT;
  uint8_t hash[32];
  mlpack_status st = mp_hash_member(r, m, hash);
  if (st) return st;
  if (!mp_digest_matches(hash, digest))
    return mp_fail(r->err, MLPACK_ERR_DIGEST, "%s: blob %s does not match its digest", where,
                   mp_short(digest, sbuf));
  return mp_mark_verified(r, digest);
}

/* n bytes at off read into buf and checked against digest: what a caller keeps is what was
 * hashed (never a second read, never the mapping). */
static mlpack_status mp_read_checked(mp_reader *r, uint64_t off, size_t n, const char *digest,
                                     const char *where, uint8_t *buf) {
  char sbuf[32];
  mlpack_status st = mp_read_at(r, off, buf, n);
  if (st) return st;
  mp_sha256 s;
  uint8_t hash[32];
  mp_sha256_init(&s);
  mp_sha256_update(&s, buf, n);
  mp_sha256_final(&s, hash);
  if (!mp_digest_matches(hash, digest))
    return mp_fail(r->err, MLPACK_ERR_DIGEST, "%s: blob %s does not match its digest", where,
                   mp_short(digest, sbuf));
  return MLPACK_OK;
}

/* A JSON blob: read once, always verified (it is read anyway), parsed. */
static mlpack_status mp_json_blob(mp_reader *r, const char *digest, const char *where, const mp_json **out) {
  const mp_member *m = mp_blob_member(r, digest, where);
  if (!m) return MLPACK_ERR_FORMAT;
  if (m->size > MP_MAX_JSON)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s is %llu bytes, larger than a JSON document may be", where,
                   (unsigned long long)m->size);
  uint8_t *buf = malloc(m->size ? (size_t)m->size : 1);
  if (!buf) return mp_nomem(r);
  mlpack_status st = mp_read_checked(r, m->offset, (size_t)m->size, digest, where, buf);
  if (!st) st = mp_mark_verified(r, digest);
  if (!st) st = mp_parse_doc(r, 0, m->size, where, out, buf);
  free(buf);
  return st;
}

static mlpack_status mp_check_doc_type(mp_reader *r, const mp_json *doc, const char *media_type,
                                       const char *where) {
  char pbuf[160];
  const mp_json *mt;
  if (mp_field(r, doc, "mediaType", MP_T_STR, where, 0, &mt)) return MLPACK_ERR_FORMAT;
  if (mt && strcmp(mt->string, media_type) != 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: mediaType is '%s', expected '%s'", where,
                   mp_printable(mt->string, pbuf, sizeof pbuf), media_type);
  return MLPACK_OK;
}

static mp_blob mp_blob_of(mp_reader *r, const char *digest) {
  mp_blob b = {0};
  char name[sizeof MP_BLOB_DIR + 64];
  mp_snprintf(name, sizeof name, MP_BLOB_DIR "%s", digest + 7);
  const mp_member *m = mp_member_find(r, name);
  if (!m) return b;
  b.data = r->c->map + m->offset;
  b.size = (size_t)m->size;
  b.offset = m->offset;
  mp_snprintf(b.digest, sizeof b.digest, "%s", digest);
  return b;
}

/* ================================================================ configs */

static mlpack_status mp_check_sig(mp_reader *r, const mp_json *sig, const char *where, int output) {
  const mp_json *v, *dims, *name;
  char pbuf[160];
  if (sig->kind != MP_JSON_OBJECT)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: a signature entry must be an object", where);
  if (mp_field(r, sig, "name", MP_T_STR, where, 1, &name)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, sig, "dtype", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, sig, "dims", MP_T_LIST, where, 1, &dims)) return MLPACK_ERR_FORMAT;
  for (size_t i = 0; i < dims->length; i++) {
    const mp_json *d = dims->items[i];
    if (d->kind != MP_JSON_OBJECT)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: a dim must be an object", where);
    if (mp_field(r, d, "name", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
    const mp_json *size = mp_json_get(d, "size");
    int is_expr = 0;
    const char *why = "a size is an integer or a string";
    int ok = size && ((size->kind == MP_JSON_NUMBER && size->is_integral && size->number >= 0) ||
                      (size->kind == MP_JSON_STRING && mp_size_check(size->string, &is_expr, &why) == MP_SIZE_OK));
    if (size && size->kind == MP_JSON_NUMBER && !ok) why = "a count must be >= 0";
    if (!ok) {
      const char *shown = !size ? "None" : size->kind == MP_JSON_STRING ? mp_printable(size->string, pbuf, sizeof pbuf)
                                                                        : mp_type_name(size);
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s '%.80s' dim '%.80s': size %s is neither a count, a '$symbol' nor a "
                     "size expression (%s)", where, name->string, v->string, shown, why);
    }
    if (is_expr && !output)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s '%.80s' dim '%.80s': size %s is an expression; an input dim is a "
                     "count or a '$symbol'", where, name->string, v->string,
                     mp_printable(size->string, pbuf, sizeof pbuf));
  }
  return MLPACK_OK;
}

/* spec/container.py check_config, in its order. */
static mlpack_status mp_check_config(mp_reader *r, const mp_json *cfg, const char *where, int *major, int *minor) {
  char w[MP_WHERE], vw[MP_WHERE];
  const mp_json *v, *model, *list, *art, *acc;
  if (mp_field(r, cfg, "mlpack_format", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  mp_snprintf(vw, sizeof vw, "%s mlpack_format", where);
  mlpack_status st = mp_parse_version(r, v->string, vw, major, minor);
  if (st) return st;
  if (mp_field(r, cfg, "model", MP_T_OBJ, where, 1, &model)) return MLPACK_ERR_FORMAT;
  mp_snprintf(w, sizeof w, "%s model", where);
  if (mp_field(r, model, "name", MP_T_STR, w, 1, &v)) return MLPACK_ERR_FORMAT;
  static const char *const keys[2] = {"inputs", "outputs"};
  for (int k = 0; k < 2; k++) {
    if (mp_field(r, model, keys[k], MP_T_LIST, w, 1, &list)) return MLPACK_ERR_FORMAT;
    mp_snprintf(vw, sizeof vw, "%s model.%s", where, keys[k]);
    for (size_t i = 0; i < list->length; i++)
      if (mp_check_sig(r, list->items[i], vw, k == 1)) return MLPACK_ERR_FORMAT;
  }
  if (mp_field(r, cfg, "artifact", MP_T_OBJ, where, 1, &art)) return MLPACK_ERR_FORMAT;
  mp_snprintf(w, sizeof w, "%s artifact", where);
  static const char *const art_keys[3] = {"device", "precision", "target"};
  for (int k = 0; k < 3; k++)
    if (mp_field(r, art, art_keys[k], MP_T_STR, w, 1, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, art, "cpu_features", MP_T_LIST, w, 0, &list)) return MLPACK_ERR_FORMAT;
  for (size_t i = 0; list && i < list->length; i++)
    if (list->items[i]->kind != MP_JSON_STRING)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: cpu_features must be strings", w);
  if (mp_field(r, cfg, "accuracy", MP_T_OBJ, where, 1, &acc)) return MLPACK_ERR_FORMAT;
  mp_snprintf(w, sizeof w, "%s accuracy", where);
  /* 1.0's rtol/atol and max_rel_error; 1.1's errors against the float64 reference */
  static const char *const acc_keys[] = {"max_abs_error", "max_rel_error", "rtol", "atol",
                                         "max_error", "rel_l2", "baseline_max_error", "top1"};
  for (size_t k = 0; k < sizeof acc_keys / sizeof *acc_keys; k++)
    if (mp_field(r, acc, acc_keys[k], MP_T_NUM, w, 0, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, acc, "tolerance", MP_T_OBJ, w, 0, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, acc, "outputs", MP_T_OBJ, w, 0, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, cfg, "min_runtime", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, cfg, "plan", MP_T_OBJ, where, 0, &v)) return MLPACK_ERR_FORMAT;
  return MLPACK_OK;
}

/* ================================================================ artifacts */

static const char *mp_platform_string(const mp_json *platform, const char *key) {
  const mp_json *v = mp_json_get(platform, key);
  if (!v) return "";
  return v->kind == MP_JSON_STRING ? v->string : "(not a string)";
}

static int mp_is_code_type(const char *t) {
  static const char *const codes[] = {MP_CODE_MEDIA_TYPES};
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
    if (!strcmp(t, codes[i])) return 1;
  return 0;
}

/* "MAJOR[.MINOR[.PATCH]]" (runtime/select.py _version_tuple); -1 in v[0] when unparsable. */
static void mp_parse_runtime_version(const char *s, int v[3]) {
  v[0] = v[1] = v[2] = 0;
  for (int k = 0; k < 3; k++) {
    if (*s < '0' || *s > '9') { v[0] = -1; return; }
    long x = 0;
    while (*s >= '0' && *s <= '9') { x = x < 100000000 ? x * 10 + (*s - '0') : x; s++; }
    v[k] = (int)x;
    if (*s == 0) return;
    if (*s != '.' || k == 2) { v[0] = -1; return; }
    s++;
  }
}

/* Selection fields: annotations first (made for this), the config otherwise (runtime/select.py). */
/* A non-negative number the annotation `key` holds as JSON text, else field `field` of the config
 * object `obj` (NULL: none); -1 when neither records one. */
static double mp_recorded_number(const mp_json *ann, const char *key, const mp_json *obj, const char *field) {
  double out = -1;
  const char *text = mp_json_get_string(ann, key);
  if (text) {
    mp_json_doc *d;
    if (mp_json_parse(text, strlen(text), "annotation", &d, NULL) == MLPACK_OK) {
      const mp_json *v = mp_json_root(d);
      if (v->kind == MP_JSON_NUMBER && v->number >= 0) out = v->number;
      mp_json_free(d);
    }
  } else if (obj && obj->kind == MP_JSON_OBJECT) {
    const mp_json *v = mp_json_get(obj, field);
    if (v && v->kind == MP_JSON_NUMBER && v->number >= 0) out = v->number;
  }
  return out;
}

static mlpack_status mp_artifact_fields(mp_reader *r, mp_artifact *a, const mp_json *ann, mp_json_doc *doc) {
  const mp_json *art = mp_json_get(a->config, "artifact"), *acc = mp_json_get(a->config, "accuracy");
  a->device = mp_json_get_string(art, "device");
  a->precision = mp_json_get_string(art, "precision");
  const mp_json *platform = mp_json_get(a->descriptor, "platform");
  a->has_platform = platform && platform->kind == MP_JSON_OBJECT;
  a->os = a->has_platform ? mp_platform_string(platform, "os") : "";
  a->architecture = a->has_platform ? mp_platform_string(platform, "architecture") : "";
  a->variant = a->has_platform ? mp_platform_string(platform, "variant") : "";
  const char *features = mp_json_get_string(ann, MP_ANN_CPU_FEATURES);
  if (!features) {
    const mp_json *list = mp_json_get(art, "cpu_features");
    size_t n = 0, count = list && list->kind == MP_JSON_ARRAY ? list->length : 0;
    for (size_t i = 0; i < count; i++) n += list->items[i]->length + 1;
    char *joined = malloc(n + 1);
    if (!joined) return mp_nomem(r);
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
      if (i) joined[at++] = ',';
      memcpy(joined + at, list->items[i]->string, list->items[i]->length);
      at += list->items[i]->length;
    }
    features = mp_json_strdup(doc, joined, at);
    free(joined);
    if (!features) return mp_nomem(r);
  }
  a->cpu_features = features;
  const char *sm = mp_json_get_string(ann, MP_ANN_CUDA_SM);
  const mp_json *smv = mp_json_get(art, "cuda_sm");
  a->cuda_sm = 0;
  if (sm) {
    char *end;
    long x = strtol(sm, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\n') end++;
    if (end != sm && !*end && x > 0 && x < 100000) a->cuda_sm = (int)x;
  } else if (smv && smv->kind == MP_JSON_NUMBER && smv->number > 0 && smv->number < 100000) {
    a->cuda_sm = (int)smv->number;
  }
  const char *mr = mp_json_get_string(ann, MP_ANN_MIN_RUNTIME);
  if (!mr || !*mr) mr = mp_json_get_string(a->config, "min_runtime");
  if (!mr || !*mr) mr = "0";
  a->min_runtime_text = mr;
  mp_parse_runtime_version(mr, a->min_runtime);
  a->max_error = mp_recorded_number(ann, MP_ANN_MAX_ERROR, acc, "max_error");
  a->latency = mp_recorded_number(ann, MP_ANN_LATENCY, mp_json_get(a->config, "latency"), "seconds");
  return MLPACK_OK;
}

static mlpack_status mp_read_layers(mp_reader *r, mp_artifact *a, const mp_json *layers, const char *where) {
  char w[MP_WHERE];
  for (size_t j = 0; j < layers->length; j++) {
    mp_snprintf(w, sizeof w, "%s layers[%zu]", where, j);
    const char *digest, *media;
    const mp_json *ann;
    mlpack_status st = mp_descriptor(r, layers->items[j], NULL, w, &digest, &media);
    if (st) return st;
    if (r->verify && (st = mp_verify(r, digest, w))) return st;
    if (mp_string_map(r, layers->items[j], "annotations", w, &ann)) return MLPACK_ERR_FORMAT;
    if (!a->cubin.data && !strcmp(media, MP_CODE_CUBIN) && a->code_media_type &&
        !strcmp(a->code_media_type, MP_CODE_PTX)) {
      a->cubin = mp_blob_of(r, digest);   /* (the PTX's companion: cuda.c loads it where it fits) */
    } else if (!a->code_media_type && mp_is_code_type(media)) {
      a->code_media_type = media;
      a->code = mp_blob_of(r, digest);
    } else if (!a->weights.data && !strcmp(media, MP_WEIGHTS)) {
      a->weights = mp_blob_of(r, digest);
    } else if (!a->vectors.data && !strcmp(media, MP_TESTVECTORS)) {
      a->vectors = mp_blob_of(r, digest);
    }
  }
  return MLPACK_OK;
}

static mlpack_status mp_check_agreement(mp_reader *r, const mp_json *ann, const mp_json *config, const char *where) {
  char pbuf[160], qbuf[160];
  const mp_json *art = mp_json_get(config, "artifact");
  static const char *const keys[2][2] = {{MP_ANN_DEVICE, "device"}, {MP_ANN_PRECISION, "precision"}};
  for (int k = 0; k < 2; k++) {
    const char *want = mp_json_get_string(art, keys[k][1]);
    const char *have = mp_json_get_string(ann, keys[k][0]);
    if (have && strcmp(have, want) != 0)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation %s='%s' disagrees with its config ('%s')", where,
                     keys[k][0], mp_printable(have, pbuf, sizeof pbuf), mp_printable(want, qbuf, sizeof qbuf));
  }
  return MLPACK_OK;
}

/* A manifest blob: verified, JSON, an image manifest whose artifactType is `type`. */
static mlpack_status mp_manifest_doc(mp_reader *r, const char *digest, const char *type, const char *where,
                                     const mp_json **manifest) {
  char pbuf[160];
  const mp_json *v;
  mlpack_status st;
  if ((st = mp_json_blob(r, digest, where, manifest))) return st;
  if (mp_check_doc_type(r, *manifest, MP_OCI_MANIFEST, where)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, *manifest, "artifactType", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  if (strcmp(v->string, type) != 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: artifactType is '%s', expected '%s'", where,
                   mp_printable(v->string, pbuf, sizeof pbuf), type);
  return MLPACK_OK;
}

/* In a partial container: a descriptor whose manifest is not in the file. */
static int mp_is_absent(mp_reader *r, const mp_json *desc) {
  const char *d = r->c->partial && desc && desc->kind == MP_JSON_OBJECT ? mp_json_get_string(desc, "digest") : NULL;
  if (!d || !mp_digest_ok(d)) return 0;
  char name[sizeof MP_BLOB_DIR + 64];
  mp_snprintf(name, sizeof name, MP_BLOB_DIR "%s", d + 7);
  return mp_member_find(r, name) == NULL;
}

/* An artifact a partial pull left out: known by its descriptor alone (spec/container.py
 * _absent_artifact): selection reads the annotations, which copy the config's fields. */
static mlpack_status mp_read_absent(mp_reader *r, size_t i, const mp_json *desc, const char *where,
                                    mp_artifact *a) {
  char pbuf[160];
  const mp_json *v, *ann;
  if (mp_field(r, desc, "mediaType", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  if (strcmp(v->string, MP_OCI_MANIFEST) != 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: mediaType is '%s', expected '%s'", where,
                   mp_printable(v->string, pbuf, sizeof pbuf), MP_OCI_MANIFEST);
  if (mp_field(r, desc, "platform", MP_T_OBJ, where, 0, &v)) return MLPACK_ERR_FORMAT;
  if (mp_string_map(r, desc, "annotations", where, &ann)) return MLPACK_ERR_FORMAT;
  const char *keys[2] = {MP_ANN_DEVICE, MP_ANN_PRECISION};
  for (int k = 0; k < 2; k++)
    if (!mp_json_get_string(ann, keys[k]))
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: not in this partial container and without the "
                     "annotation '%s'", where, keys[k]);
  a->index = i;
  a->descriptor = desc;
  a->absent = 1;
  mlpack_status st = mp_artifact_fields(r, a, ann, r->c->docs[r->c->doc_count - 1]);
  a->device = mp_json_get_string(ann, MP_ANN_DEVICE);
  a->precision = mp_json_get_string(ann, MP_ANN_PRECISION);
  return st;
}

static mlpack_status mp_read_artifact(mp_reader *r, size_t i, const mp_json *desc, const char *nested_where,
                                      mp_artifact *a) {
  char where[MP_WHERE], cwhere[MP_WHERE], w[MP_WHERE], sbuf[32];
  const mp_json *v, *ann, *manifest, *cdesc, *config, *layers;
  const char *digest, *cdigest;
  mlpack_status st;
  mp_snprintf(where, sizeof where, "%s manifests[%zu]", nested_where, i);
  if (mp_is_absent(r, desc)) return mp_read_absent(r, i, desc, where, a);
  if ((st = mp_descriptor(r, desc, MP_OCI_MANIFEST, where, &digest, NULL))) return st;
  if (mp_field(r, desc, "platform", MP_T_OBJ, where, 0, &v)) return MLPACK_ERR_FORMAT;
  if (mp_string_map(r, desc, "annotations", where, &ann)) return MLPACK_ERR_FORMAT;
  mp_snprintf(where, sizeof where, "%s: manifest %s (artifact %zu)", r->path, mp_short(digest, sbuf), i);
  if ((st = mp_manifest_doc(r, digest, MP_ARTIFACT_TYPE, where, &manifest))) return st;
  if (mp_field(r, manifest, "config", MP_T_OBJ, where, 1, &cdesc)) return MLPACK_ERR_FORMAT;
  mp_snprintf(w, sizeof w, "%s config", where);
  if ((st = mp_descriptor(r, cdesc, MP_CONFIG, w, &cdigest, NULL))) return st;
  mp_snprintf(cwhere, sizeof cwhere, "%s: config %s (artifact %zu)", r->path, mp_short(cdigest, sbuf), i);
  if ((st = mp_json_blob(r, cdigest, cwhere, &config))) return st;
  int major, minor;
  if ((st = mp_check_config(r, config, cwhere, &major, &minor))) return st;
  if (mp_field(r, manifest, "layers", MP_T_LIST, where, 1, &layers)) return MLPACK_ERR_FORMAT;
  a->index = i;
  a->descriptor = desc;
  a->manifest = manifest;
  a->config = config;
  if ((st = mp_read_layers(r, a, layers, where))) return st;
  if ((st = mp_check_agreement(r, ann, config, where))) return st;
  return mp_artifact_fields(r, a, ann, r->c->docs[r->c->doc_count - 1]);
}

/* ================================================================ documents */

static mlpack_status mp_read_nested(mp_reader *r, const char *digest) {
  mp_container *c = r->c;
  char where[MP_WHERE], vw[MP_WHERE], sbuf[32];
  const mp_json *nested, *ann, *descs;
  const char *version;
  int major, minor;
  mlpack_status st;
  mp_snprintf(where, sizeof where, "%s: nested index %s", r->path, mp_short(digest, sbuf));
  if ((st = mp_json_blob(r, digest, where, &nested))) return st;
  if (mp_string_map(r, nested, "annotations", where, &ann)) return MLPACK_ERR_FORMAT;
  if (!(version = mp_json_get_string(ann, MP_ANN_FORMAT_VERSION)))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation '%s' is missing", where, MP_ANN_FORMAT_VERSION);
  mp_snprintf(vw, sizeof vw, "%s %s", where, MP_ANN_FORMAT_VERSION);
  if ((st = mp_parse_version(r, version, vw, &major, &minor))) return st;
  if (mp_check_doc_type(r, nested, MP_OCI_INDEX, where)) return MLPACK_ERR_FORMAT;
  if (!(c->name = mp_json_get_string(ann, MP_ANN_MODEL_NAME)))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation '%s' is missing", where, MP_ANN_MODEL_NAME);
  if (mp_field(r, nested, "manifests", MP_T_LIST, where, 1, &descs)) return MLPACK_ERR_FORMAT;
  if (!descs->length)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: lists zero artifacts; a container needs at least one", where);
  c->artifacts = calloc(descs->length, sizeof *c->artifacts);
  if (!c->artifacts) return mp_nomem(r);
  size_t present = 0;
  for (size_t i = 0; i < descs->length; i++) {
    if ((st = mp_read_artifact(r, i, descs->items[i], where, &c->artifacts[i]))) return st;
    c->artifact_count = i + 1;
    present += !c->artifacts[i].absent;
  }
  if (!present)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: a partial container holding none of its %zu artifacts",
                   where, descs->length);
  return MLPACK_OK;
}

/* A private copy of a blob of at most `limit` bytes, read once and checked against its digest. */
static mlpack_status mp_read_verified(mp_reader *r, const char *digest, uint64_t limit, const char *where,
                                      uint8_t **out, size_t *size) {
  char sbuf[32];
  const mp_member *m = mp_blob_member(r, digest, where);
  if (!m) return MLPACK_ERR_FORMAT;
  if (m->size > limit)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: blob %s is %llu bytes, more than %llu", where,
                   mp_short(digest, sbuf), (unsigned long long)m->size, (unsigned long long)limit);
  uint8_t *buf = malloc(m->size ? (size_t)m->size : 1);
  if (!buf) return mp_nomem(r);
  mlpack_status st = mp_read_checked(r, m->offset, (size_t)m->size, digest, where, buf);
  if (st) { free(buf); return st; }
  *out = buf;
  *size = (size_t)m->size;
  return MLPACK_OK;
}

/* A signature manifest (format 1.2, spec/SPEC.md section 9): it refers to the nested index and
 * carries cosign simple-signing payload layers. Structure is checked here; whether a signature
 * verifies, and under which key, is trust.c's (only a trust policy asks). */
static mlpack_status mp_read_signature(mp_reader *r, const mp_json *entry, const char *w) {
  mp_container *c = r->c;
  char where[MP_WHERE], lw[MP_WHERE], sbuf[32], pbuf[160];
  const mp_json *manifest, *v, *subject, *layers, *ann;
  const char *digest, *sdigest, *ldigest, *media;
  mlpack_status st;
  if ((st = mp_descriptor(r, entry, MP_OCI_MANIFEST, w, &digest, NULL))) return st;
  mp_snprintf(where, sizeof where, "%s: signature manifest %s", r->path, mp_short(digest, sbuf));
  if ((st = mp_manifest_doc(r, digest, MP_SIGNATURE_ARTIFACT_TYPE, where, &manifest))) return st;
  if (mp_field(r, manifest, "config", MP_T_OBJ, where, 1, &v)) return MLPACK_ERR_FORMAT;
  mp_snprintf(lw, sizeof lw, "%s config", where);
  if ((st = mp_descriptor(r, v, NULL, lw, &ldigest, NULL))) return st;
  if (mp_field(r, manifest, "subject", MP_T_OBJ, where, 1, &subject)) return MLPACK_ERR_FORMAT;
  mp_snprintf(lw, sizeof lw, "%s subject", where);
  if ((st = mp_descriptor(r, subject, MP_OCI_INDEX, lw, &sdigest, NULL))) return st;
  if (strcmp(sdigest, c->nested_digest) != 0)
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: refers to %s, not this container's nested index %s",
                   where, mp_short(sdigest, sbuf), c->nested_digest);
  if (mp_field(r, manifest, "layers", MP_T_LIST, where, 1, &layers)) return MLPACK_ERR_FORMAT;
  if (!layers->length) return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: has no signature layer", where);
  mp_signature *more = realloc(c->signatures, (c->signature_count + layers->length) * sizeof *more);
  if (!more) return mp_nomem(r);
  c->signatures = more;
  for (size_t j = 0; j < layers->length; j++) {
    mp_snprintf(lw, sizeof lw, "%s layers[%zu]", where, j);
    if ((st = mp_descriptor(r, layers->items[j], NULL, lw, &ldigest, &media))) return st;
    if (strcmp(media, MP_SIGNATURE_PAYLOAD) != 0)
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: mediaType is '%s', expected '%s'", lw,
                     mp_printable(media, pbuf, sizeof pbuf), MP_SIGNATURE_PAYLOAD);
    if (mp_string_map(r, layers->items[j], "annotations", lw, &ann)) return MLPACK_ERR_FORMAT;
    mp_signature *s = &c->signatures[c->signature_count];
    memset(s, 0, sizeof *s);
    if (!ann || !(s->signature = mp_json_get_string(ann, MP_ANN_SIGNATURE)))
      return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation '%s' (the signature) is missing", lw,
                     MP_ANN_SIGNATURE);
    s->key_hint = mp_json_get_string(ann, MP_ANN_SIGNATURE_KEY);
    s->manifest_digest = digest;
    if ((st = mp_read_verified(r, ldigest, MP_MAX_JSON, lw, &s->payload, &s->payload_size))) return st;
    c->signature_count++;
  }
  return MLPACK_OK;
}

static mlpack_status mp_read_documents(mp_reader *r) {
  mp_container *c = r->c;
  char where[MP_WHERE], w[MP_WHERE];
  const mp_json *layout, *index, *ann, *entries, *v;
  const char *version, *digest;
  mlpack_status st;
  mp_snprintf(where, sizeof where, "%s: oci-layout", r->path);
  if ((st = mp_json_member(r, "oci-layout", where, &layout))) return st;
  if (mp_field(r, layout, "imageLayoutVersion", MP_T_STR, where, 1, &v)) return MLPACK_ERR_FORMAT;
  mp_snprintf(where, sizeof where, "%s: index.json", r->path);
  if ((st = mp_json_member(r, "index.json", where, &index))) return st;
  if (mp_string_map(r, index, "annotations", where, &ann)) return MLPACK_ERR_FORMAT;
  if (!(version = mp_json_get_string(ann, MP_ANN_FORMAT_VERSION)))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation '%s' is missing; not an mlpack container", where,
                   MP_ANN_FORMAT_VERSION);
  mp_snprintf(w, sizeof w, "%s %s", where, MP_ANN_FORMAT_VERSION);
  if ((st = mp_parse_version(r, version, w, &c->format_major, &c->format_minor))) return st;
  const char *partial = mp_json_get_string(ann, MP_ANN_PARTIAL);
  c->partial = partial && !strcmp(partial, "true");
  if (mp_check_doc_type(r, index, MP_OCI_INDEX, where)) return MLPACK_ERR_FORMAT;
  if (mp_field(r, index, "manifests", MP_T_LIST, where, 1, &entries)) return MLPACK_ERR_FORMAT;
  /* one nested index, then (1.2) signature manifests: what each entry is, before reading any */
  size_t nested = entries->length, count = 0, signatures = 0;
  for (size_t i = 0; i < entries->length; i++) {
    const mp_json *e = entries->items[i];
    const char *mt = e && e->kind == MP_JSON_OBJECT ? mp_json_get_string(e, "mediaType") : NULL;
    const char *at = e && e->kind == MP_JSON_OBJECT ? mp_json_get_string(e, "artifactType") : NULL;
    if (mt && !strcmp(mt, MP_OCI_MANIFEST) && at && !strcmp(at, MP_SIGNATURE_ARTIFACT_TYPE)) {
      signatures++;
    } else {
      if (nested == entries->length) nested = i;
      count++;
    }
  }
  if (count != 1)
    return mp_fail(r->err, MLPACK_ERR_FORMAT,
                   "%s: lists %zu entries besides signatures; an mlpack container has exactly one (the "
                   "nested index)", where, count);
  mp_snprintf(w, sizeof w, "%s manifests[%zu]", where, nested);
  if ((st = mp_descriptor(r, entries->items[nested], MP_OCI_INDEX, w, &digest, NULL))) return st;
  if (mp_string_map(r, entries->items[nested], "annotations", w, &ann)) return MLPACK_ERR_FORMAT;
  /* index.json is covered by no digest: what it must say is checked, not assumed */
  if (!ann || !(c->tag = mp_json_get_string(ann, MP_REF_NAME)))
    return mp_fail(r->err, MLPACK_ERR_FORMAT, "%s: annotation '%s' (the tag) is missing", w, MP_REF_NAME);
  mp_snprintf(c->nested_digest, sizeof c->nested_digest, "%s", digest);
  if ((st = mp_read_nested(r, digest))) return st;
  if (signatures && !(c->signatures = calloc(signatures, sizeof *c->signatures))) return mp_nomem(r);
  for (size_t i = 0; i < entries->length; i++) {
    if (i == nested) continue;
    mp_snprintf(w, sizeof w, "%s manifests[%zu]", where, i);
    if ((st = mp_read_signature(r, entries->items[i], w))) return st;
  }
  return MLPACK_OK;
}

/* ================================================================ open / close */

static void mp_reader_free(mp_reader *r) {
  for (size_t i = 0; i < r->member_count; i++) free(r->members[i].name);
  free(r->members);
  free(r->table);
  free(r->verified);
}

static mlpack_status mp_container_parse(mp_reader *r) {
  mlpack_status st = mp_scan_tar(r);
  if (!st) st = mp_read_documents(r);
  /* a nested failure may have reported a more specific class than its caller returns */
  if (st && r->err && *r->err) st = mlpack_error_code(*r->err);
  mp_reader_free(r);
  return st;
}

static mp_container *mp_container_new(const char *path) {
  mp_container *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = -1;
  c->path = strdup(path);
  if (!c->path) {
    free(c);
    return NULL;
  }
  return c;
}

mlpack_status mp_container_open_memory(const void *data, size_t size, const char *what, int verify,
                                       mp_container **out, mlpack_error **err) {
  *out = NULL;
  if (!what) what = "<memory>";
  if (!data && size) return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: NULL data", what);
  if (size == 0)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s is empty (0 bytes), not an mlpack container", what);
  mp_container *c = mp_container_new(what);
  if (!c) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", what);
  c->map = data;  /* borrowed: fd stays -1, so close leaves it alone */
  c->size = size;
  mp_reader r = {.c = c, .path = c->path, .fd = -1, .mem = data, .size = size, .verify = verify, .err = err};
  mlpack_status st = mp_container_parse(&r);
  if (st) {
    mp_container_close(c);
    return st;
  }
  *out = c;
  return MLPACK_OK;
}

mlpack_status mp_container_open(const char *path, int verify, mp_container **out, mlpack_error **err) {
  *out = NULL;
  if (!path) return mp_fail(err, MLPACK_ERR_ARGUMENT, "path is NULL");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mp_fail(err, MLPACK_ERR_IO, "cannot open container %s: %s", path, strerror(errno));
  return mp_container_open_fd(fd, path, verify, out, err);
}

mlpack_status mp_container_open_fd(int fd, const char *path, int verify, mp_container **out,
                                   mlpack_error **err) {
  *out = NULL;
  if (!path) path = "<file descriptor>";
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return mp_fail(err, MLPACK_ERR_IO, "cannot open container %s: not a regular file", path);
  }
  if (sb.st_size == 0) {
    close(fd);
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s is empty (0 bytes), not an mlpack container", path);
  }
  mp_container *c = mp_container_new(path);
  if (!c) {
    close(fd);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", path);
  }
  c->fd = fd;
  c->size = (size_t)sb.st_size;
  void *map = mmap(NULL, c->size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    mlpack_status st = mp_fail(err, MLPACK_ERR_IO, "cannot map container %s: %s", path, strerror(errno));
    mp_container_close(c);
    return st;
  }
  c->map = map;
  mp_reader r = {.c = c, .path = c->path, .fd = fd, .size = c->size, .verify = verify, .err = err};
  mlpack_status st = mp_container_parse(&r);
  if (st) {
    mp_container_close(c);
    return st;
  }
  *out = c;
  return MLPACK_OK;
}

mlpack_status mp_blob_copy(const mp_container *c, const mp_blob *b, const char *what, uint8_t **out,
                           mlpack_error **err) {
  *out = NULL;
  void *buf = NULL;
  /* page-aligned, as the blob is in the file: a tensor archive's alignment carries over */
  if (posix_memalign(&buf, 4096, b->size ? b->size : 1) != 0)
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate %zu bytes for blob %.19s", what, b->size,
                   b->digest);
  mp_reader r = {.c = (mp_container *)c, .path = c->path, .fd = c->fd, .mem = c->map, .size = c->size,
                 .err = err};
  mlpack_status st = mp_read_checked(&r, b->offset, b->size, b->digest, what, buf);
  if (st) { free(buf); return st; }
  *out = buf;
  return MLPACK_OK;
}

void mp_container_close(mp_container *c) {
  if (!c) return;
  for (size_t i = 0; i < c->signature_count; i++) free(c->signatures[i].payload);
  free(c->signatures);
  if (c->map && c->fd >= 0) munmap((void *)c->map, c->size);
  if (c->fd >= 0) close(c->fd);
  for (size_t i = 0; i < c->doc_count; i++) mp_json_free(c->docs[i]);
  free(c->docs);
  free(c->artifacts);
  free(c->path);
  free(c);
}
