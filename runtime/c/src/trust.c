/* trust.c: the trust policy: which Ed25519 keys an operator trusts, and whether one of them
 * signed a container (spec/SPEC.md section 9; spec/signing.py is the same in Python).
 *
 * A signature is cosign's "simple signing" (container.c reads it): a JSON payload naming the
 * signed digest (critical.image.docker-manifest-digest) and the base64 Ed25519 signature of the
 * payload's exact bytes. A container passes when one of its signatures verifies under a trusted
 * key AND its payload names the container's nested index, whose digest covers every manifest,
 * config and layer: container.c has checked the nested index's bytes against that digest, and
 * every blob an executor loads is hashed again from its own copy (mp_blob_copy). api_open.c runs
 * the check before any code is loaded.
 *
 * Keys are PEM "PUBLIC KEY" blocks (DER SubjectPublicKeyInfo), what `openssl pkey -pubout`,
 * Python's cryptography, cosign and `mlpack keygen` write. An Ed25519 SubjectPublicKeyInfo is
 * 44 bytes with a fixed 12-byte prefix (RFC 8410), so reading one needs no ASN.1 parser.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "media.h"

#define MP_MAX_KEY_FILE (1u << 20)
#define MP_MAX_KEYS 4096

/* RFC 8410: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (33 bytes: 0 + key) } */
static const uint8_t mp_ed25519_spki_prefix[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03,
                                                   0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};

/* ---------------------------------------------------------------- base64 (RFC 4648) */

static int mp_b64_value(int ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

/* Decode text[0..n) (whitespace skipped, '=' padding at the end) into out (cap bytes).
 * Returns the decoded length, or -1 when it is not base64 or does not fit. */
static long mp_b64_decode(const char *text, size_t n, uint8_t *out, size_t cap) {
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    int ch = (unsigned char)text[i];
    if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') continue;
    if (ch == '=') { pad++; continue; }
    int v = mp_b64_value(ch);
    if (v < 0 || pad) return -1;   /* a stray byte, or data after padding */
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (len == cap) return -1;
      out[len++] = (uint8_t)(acc >> bits);
    }
  }
  if (pad > 2 || bits >= 6) return -1;
  return (long)len;
}

static void mp_key_id(const uint8_t key[32], char out[72]) {
  static const char hex[] = "0123456789abcdef";
  uint8_t der[44], h[32];
  memcpy(der, mp_ed25519_spki_prefix, 12);
  memcpy(der + 12, key, 32);
  mp_sha256 s;
  mp_sha256_init(&s);
  mp_sha256_update(&s, der, sizeof der);
  mp_sha256_final(&s, h);
  memcpy(out, "sha256:", 7);
  for (int i = 0; i < 32; i++) out[7 + 2 * i] = hex[h[i] >> 4], out[8 + 2 * i] = hex[h[i] & 15];
  out[71] = 0;
}

/* ---------------------------------------------------------------- keys */

static mlpack_status mp_keyring_add(mp_keyring *k, const uint8_t key[32], const char *file,
                                    mlpack_error **err) {
  if (k->count == MP_MAX_KEYS)
    return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: more than %d trusted keys", file, MP_MAX_KEYS);
  uint8_t (*keys)[32] = realloc(k->keys, (k->count + 1) * sizeof *keys);
  if (!keys) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  k->keys = keys;
  char (*ids)[72] = realloc(k->ids, (k->count + 1) * sizeof *ids);
  if (!ids) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  k->ids = ids;
  memcpy(k->keys[k->count], key, 32);
  mp_key_id(key, k->ids[k->count]);
  k->count++;
  return MLPACK_OK;
}

/* Every PEM block of text: PUBLIC KEY blocks must be Ed25519; other blocks (a certificate, say)
 * are not keys we take, and a private key here is refused: it does not belong in a policy. */
static mlpack_status mp_pem_keys(const char *text, size_t n, const char *file, mp_keyring *k,
                                 size_t *found, mlpack_error **err) {
  static const char begin[] = "-----BEGIN ", end[] = "-----END ";
  const char *p = text, *stop = text + n;
  while ((p = memmem(p, (size_t)(stop - p), begin, sizeof begin - 1)) != NULL) {
    const char *label = p + sizeof begin - 1;
    const char *eol = memchr(label, '\n', (size_t)(stop - label));
    const char *close = memmem(label, (size_t)(stop - label), end, sizeof end - 1);
    if (!eol || !close || close < eol)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: a PEM block has no END line", file);
    if (memmem(label, (size_t)(eol - label), "PRIVATE KEY", 11))
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s holds a private key; a trust policy takes public "
                     "keys only (mlpack keygen writes NAME.pub)", file);
    int is_public = (size_t)(eol - label) >= 15 && !strncmp(label, "PUBLIC KEY-----", 15);
    if (is_public) {
      uint8_t der[64];
      long len = mp_b64_decode(eol + 1, (size_t)(close - eol - 1), der, sizeof der);
      if (len != 44 || memcmp(der, mp_ed25519_spki_prefix, 12) != 0)
        return mp_fail(err, MLPACK_ERR_ARGUMENT, "%s: a public key that is not Ed25519 (mlpack signs "
                       "with Ed25519 keys: mlpack keygen)", file);
      mlpack_status st = mp_keyring_add(k, der + 12, file, err);
      if (st) return st;
      (*found)++;
    }
    p = close + sizeof end - 1;
  }
  return MLPACK_OK;
}

static mlpack_status mp_key_file(const char *file, mp_keyring *k, mlpack_error **err) {
  FILE *f = fopen(file, "rb");
  if (!f) return mp_fail(err, MLPACK_ERR_IO, "trusted key %s: %s", file, strerror(errno));
  char *text = malloc(MP_MAX_KEY_FILE);
  if (!text) { fclose(f); return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory"); }
  size_t n = fread(text, 1, MP_MAX_KEY_FILE, f);
  int too_big = n == MP_MAX_KEY_FILE, bad = ferror(f);
  fclose(f);
  mlpack_status st = MLPACK_OK;
  size_t found = 0;
  if (bad) st = mp_fail(err, MLPACK_ERR_IO, "trusted key %s: cannot read it", file);
  else if (too_big) st = mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted key %s: larger than 1 MiB", file);
  else st = mp_pem_keys(text, n, file, k, &found, err);
  if (!st && !found)
    st = mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted key %s holds no PEM public key", file);
  free(text);
  return st;
}

static int mp_key_name(const char *name) {
  size_t n = strlen(name);
  return name[0] != '.' && n > 4 && (!strcmp(name + n - 4, ".pub") || !strcmp(name + n - 4, ".pem"));
}

static int mp_name_order(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.pub and *.pem file of a directory, in name order (messages are then reproducible). */
static mlpack_status mp_key_dir(const char *dir, mp_keyring *k, mlpack_error **err) {
  DIR *d = opendir(dir);
  if (!d) return mp_fail(err, MLPACK_ERR_IO, "trusted keys %s: %s", dir, strerror(errno));
  char **names = NULL;
  size_t count = 0;
  mlpack_status st = MLPACK_OK;
  struct dirent *e;
  while (!st && (e = readdir(d)) != NULL) {
    if (!mp_key_name(e->d_name)) continue;
    char **more = realloc(names, (count + 1) * sizeof *names);
    if (!more || !(more[count] = strdup(e->d_name))) {
      if (more) names = more;
      st = mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
      break;
    }
    names = more;
    count++;
  }
  closedir(d);
  if (!st && names) qsort(names, count, sizeof *names, mp_name_order);
  for (size_t i = 0; !st && i < count; i++) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= sizeof path)
      st = mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted keys %s: a path is too long", dir);
    else
      st = mp_key_file(path, k, err);
  }
  for (size_t i = 0; i < count; i++) free(names[i]);
  free(names);
  if (!st && count == 0)
    st = mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted keys %s: the directory has no .pub or .pem file", dir);
  return st;
}

mlpack_status mp_keyring_load(const char *spec, mp_keyring *out, mlpack_error **err) {
  memset(out, 0, sizeof *out);
  snprintf(out->source, sizeof out->source, "%s", spec);
  const char *p = spec;
  mlpack_status st = MLPACK_OK;
  while (!st && *p) {
    const char *colon = strchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    if (n > 0) {
      char path[4096];
      if (n >= sizeof path) return mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted keys: a path is too long");
      memcpy(path, p, n);
      path[n] = 0;
      struct stat sb;
      if (stat(path, &sb) != 0) st = mp_fail(err, MLPACK_ERR_IO, "trusted key %s: %s", path, strerror(errno));
      else st = S_ISDIR(sb.st_mode) ? mp_key_dir(path, out, err) : mp_key_file(path, out, err);
    }
    p += n + (colon ? 1 : 0);
  }
  if (!st && out->count == 0) st = mp_fail(err, MLPACK_ERR_ARGUMENT, "trusted keys '%s': no key", spec);
  if (st) mp_keyring_free(out);
  return st;
}

void mp_keyring_free(mp_keyring *k) {
  if (!k) return;
  free(k->keys);
  free(k->ids);
  k->keys = NULL;
  k->ids = NULL;
  k->count = 0;
}

/* ---------------------------------------------------------------- the check */

/* The payload's claim: its type is cosign's and it signs `digest`. */
static int mp_payload_names(const mp_signature *s, const char *digest) {
  mp_json_doc *doc = NULL;
  if (mp_json_parse((const char *)s->payload, s->payload_size, "signature payload", &doc, NULL)) return 0;
  const mp_json *critical = mp_json_get(mp_json_root(doc), "critical");
  const char *type = mp_json_get_string(critical, "type");
  const char *named = mp_json_get_string(mp_json_get(critical, "image"), "docker-manifest-digest");
  int ok = type && named && !strcmp(type, MP_SIGNATURE_PAYLOAD_TYPE) && !strcmp(named, digest);
  mp_json_free(doc);
  return ok;
}

mlpack_status mp_trust_check(const mp_container *c, const mp_keyring *k, const char **signer,
                             mlpack_error **err) {
  *signer = NULL;
  if (c->signature_count == 0)
    return mp_fail(err, MLPACK_ERR_SIGNATURE, "%s is not signed, and the trust policy (keys from %s) "
                   "requires a signature by a trusted key (mlpack sign)", c->path, k->source);
  int bad = 0, unknown = 0, other = 0;
  for (size_t i = 0; i < c->signature_count; i++) {
    const mp_signature *s = &c->signatures[i];
    uint8_t sig[64];
    if (mp_b64_decode(s->signature, strlen(s->signature), sig, sizeof sig) != 64) { bad++; continue; }
    int verified = 0;
    for (size_t j = 0; j < k->count && !verified; j++) {
      if (!mp_ed25519_verify(sig, k->keys[j], s->payload, s->payload_size)) continue;
      verified = 1;
      if (!mp_payload_names(s, c->nested_digest)) { other++; continue; }
      *signer = k->ids[j];
      return MLPACK_OK;
    }
    if (verified) continue;
    /* told apart by the key hint only for the message; the check above tried every key */
    int known = 0;
    for (size_t j = 0; j < k->count && s->key_hint; j++) known |= !strcmp(s->key_hint, k->ids[j]);
    if (known) bad++;
    else unknown++;
  }
  return mp_fail(err, MLPACK_ERR_SIGNATURE,
                 "%s: no signature by a trusted key (keys from %s): %zu signature(s), %d by keys not "
                 "trusted, %d that do not verify (the signed bytes were changed), %d signing another "
                 "container", c->path, k->source, c->signature_count, unknown, bad, other);
}
