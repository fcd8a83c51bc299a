/* tensors.c: the tensor archive (spec/tensorfile.py): magic, u64 header length, JSON header,
 * then each tensor 64-byte aligned. Entries point into the blob (the container's mmap): weights
 * are never copied. Every entry is checked against the blob's bounds before it is handed out. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MP_TENSOR_MAGIC "MLPKTNS1"

static const char *const mp_dtype_names[MLPACK_DTYPE_COUNT] = {
    "bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64"};
static const size_t mp_dtype_sizes[MLPACK_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};

int mp_dtype_from_name(const char *name, mlpack_dtype *out) {
  for (int i = 0; name && i < MLPACK_DTYPE_COUNT; i++) {
    if (strcmp(name, mp_dtype_names[i]) == 0) {
      *out = (mlpack_dtype)i;
      return 0;
    }
  }
  return -1;
}

const char *mlpack_dtype_name(mlpack_dtype dtype) {
  return (unsigned)dtype < MLPACK_DTYPE_COUNT ? mp_dtype_names[dtype] : "?";
}

size_t mlpack_dtype_size(mlpack_dtype dtype) {
  return (unsigned)dtype < MLPACK_DTYPE_COUNT ? mp_dtype_sizes[dtype] : 0;
}

static int mp_json_u64(const mp_json *v, uint64_t *out) {
  if (!v || v->kind != MP_JSON_NUMBER || !v->is_int || v->integer < 0) return -1;
  *out = (uint64_t)v->integer;
  return 0;
}

static mlpack_status mp_tensor_entry_read(const mp_blob *blob, const char *what, const char *name, const mp_json *e,
                                     mp_tensor_entry *out, mlpack_error **err) {
  const mp_json *shape = mp_json_get(e, "shape");
  uint64_t offset, nbytes;
  if (mp_dtype_from_name(mp_json_get_string(e, "dtype"), &out->dtype) || !shape ||
      shape->kind != MP_JSON_ARRAY || mp_json_u64(mp_json_get(e, "offset"), &offset) ||
      mp_json_u64(mp_json_get(e, "nbytes"), &nbytes))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor '%.100s': malformed entry", what, name);
  if (shape->length > 8)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor '%.100s' has rank %zu; at most 8 is supported", what, name,
                   shape->length);
  uint64_t count = 1;
  int overflow = 0;
  for (size_t i = 0; i < shape->length; i++) {
    uint64_t d;
    if (mp_json_u64(shape->items[i], &d))
      return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor '%.100s': shape entries must be counts", what, name);
    out->shape[i] = (int64_t)d;
    overflow |= __builtin_mul_overflow(count, d, &count);
  }
  uint64_t want;
  overflow |= __builtin_mul_overflow(count, (uint64_t)mlpack_dtype_size(out->dtype), &want);
  if (overflow || want != nbytes)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor '%.100s': %llu bytes do not hold its shape", what, name,
                   (unsigned long long)nbytes);
  if (offset > blob->size || nbytes > blob->size - offset)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor '%.100s': bytes %llu..%llu lie outside the blob (%zu bytes)",
                   what, name, (unsigned long long)offset, (unsigned long long)(offset + nbytes), blob->size);
  out->name = name;
  out->rank = shape->length;
  out->data = blob->data + offset;
  out->nbytes = (size_t)nbytes;
  return MLPACK_OK;
}

mlpack_status mp_tensors_open(const mp_blob *blob, const char *what, mp_tensor_archive *out, mlpack_error **err) {
  memset(out, 0, sizeof *out);
  if (!blob || !blob->data || blob->size < 16 || memcmp(blob->data, MP_TENSOR_MAGIC, 8) != 0)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: not a tensor archive (bad magic)", what);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | blob->data[8 + i];
  if (hlen > blob->size - 16)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor archive header length %llu exceeds the blob (%zu bytes)",
                   what, (unsigned long long)hlen, blob->size);
  mlpack_status st = mp_json_parse((const char *)blob->data + 16, (size_t)hlen, what, &out->header, err);
  if (st) return st;
  const mp_json *tensors = mp_json_get(mp_json_root(out->header), "tensors");
  if (!tensors || tensors->kind != MP_JSON_OBJECT) {
    mp_tensors_close(out);
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s: tensor archive header has no 'tensors' table", what);
  }
  out->entries = calloc(tensors->length ? tensors->length : 1, sizeof *out->entries);
  if (!out->entries) {
    mp_tensors_close(out);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", what);
  }
  for (size_t i = 0; i < tensors->length; i++) {
    st = mp_tensor_entry_read(blob, what, tensors->keys[i], tensors->items[i], &out->entries[i], err);
    if (st) {
      mp_tensors_close(out);
      return st;
    }
  }
  out->count = tensors->length;
  return MLPACK_OK;
}

const mp_tensor_entry *mp_tensors_find(const mp_tensor_archive *a, const char *name) {
  for (size_t i = 0; a && name && i < a->count; i++)
    if (strcmp(a->entries[i].name, name) == 0) return &a->entries[i];
  return NULL;
}

void mp_tensors_close(mp_tensor_archive *a) {
  if (!a) return;
  mp_json_free(a->header);
  free(a->entries);
  memset(a, 0, sizeof *a);
}
