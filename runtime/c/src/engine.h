/* engine.h: libmlpack's internal interfaces, one section per source file.
 *
 * The engine is small and flat: a container is parsed once into plain structs that point into
 * the file's mmap; selection picks an artifact; an executor (native plan or portable
 * interpreter), found by the code layer's media type in the executor table, runs it. Everything
 * that can fail returns an mlpack_status and, through `mlpack_error **err`, a message naming
 * what is at fault. All names are mp_ (private).
 *
 * Runs of one model may overlap (any number of calling threads): what was opened is only read
 * while running; what a run writes is its own (api_run.c's per-thread output contexts, each
 * executor's scratch taken from a free list), and the pool is leased by one run at a time.
 *
 * Ownership of files (so they can be written in parallel):
 *   error.c      errors and messages                 json.c       JSON parser (arena, depth limit)
 *   sha256.c     SHA-256                             container.c  strict ustar + OCI layout + configs
 *   tensors.c    tensor archive (weights, vectors)   host.c       host detection (cpuid, HWCAP)
 *   select.c     the selection algorithm (SPEC.md)   api_open.c   mlpack_open/close/info/options
 *   expr.c       integer expressions (plan sizes)    api_run.c    mlpack_run: inputs, symbols, outputs
 *   plan.c       native plan: JSON -> mp_plan        native.c     native executor: plan on the pool
 *   loader.c     kernel library from memory (memfd)  pool.c       thread pool
 *   portable.c   the portable program interpreter    executors.c  the executor table
 *   trust.c      trusted keys, signature checks      ed25519.c    Ed25519 (vendored Monocypher)
 * Their own headers: media.h (media types, annotation keys), executor.h (the table's row and the
 * executors), plan.h (the parsed plan).
 */
#ifndef MLPACK_ENGINE_H
#define MLPACK_ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* The public functions are declared with default visibility here, so a definition in any file
 * that includes engine.h is exported even under -fvisibility=hidden (and nothing else is). */
#pragma GCC visibility push(default)
#include "mlpack.h"
#pragma GCC visibility pop
#include "mlpack_abi.h"

/* ---------------------------------------------------------------- error.c */
/* Fill *err (if err != NULL) with a new error; returns code. printf-style message. */
mlpack_status mp_fail(mlpack_error **err, mlpack_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The message of an index out of range (spec/ir/origins.py `message` says the same) into buf:
 * `node` is the ONNX node that indexes the dim ("Gather node 'emb'") or NULL (then `what`
 * "read of"/"store to", tensor and dim are named); with `wraps` the index v is ONNX's wrapped
 * one, and v < 0 stands for the caller's v - n. */
void mp_index_message(char *buf, size_t cap, const char *node, int wraps, const char *what,
                      const char *tensor, const char *dim, int64_t v, int64_t n);

/* ---------------------------------------------------------------- json.c */
typedef enum { MP_JSON_NULL, MP_JSON_BOOL, MP_JSON_NUMBER, MP_JSON_STRING, MP_JSON_ARRAY, MP_JSON_OBJECT } mp_json_kind;

typedef struct mp_json {
  mp_json_kind kind;
  int boolean;
  double number;
  int is_int;                 /* the number was written as an integer that fits int64 */
  int is_integral;            /* written as an integer (no fraction or exponent), any size */
  int64_t integer;
  const char *string;         /* NUL-terminated (strings with NUL bytes are refused) */
  size_t length;              /* array/object entry count, or string length */
  struct mp_json **items;     /* array items, or object values */
  const char **keys;          /* object keys (duplicates are refused at parse time) */
} mp_json;

typedef struct mp_json_doc mp_json_doc;   /* owns every node of one parsed document */
/* Parse `len` bytes. Depth limit 512; refuses trailing garbage, duplicate keys, invalid UTF-8
 * escapes, NaN/Infinity. `what` names the document in messages ("index.json"). */
mlpack_status mp_json_parse(const char *text, size_t len, const char *what, mp_json_doc **out,
                            mlpack_error **err);
const mp_json *mp_json_root(const mp_json_doc *doc);
void mp_json_free(mp_json_doc *doc);
const mp_json *mp_json_get(const mp_json *obj, const char *key);        /* NULL if absent / not an object */
const char *mp_json_get_string(const mp_json *obj, const char *key);    /* NULL if absent / not a string */
/* A copy of s[0..n) (NUL-terminated) owned by doc; NULL when out of memory. */
char *mp_json_strdup(mp_json_doc *doc, const char *s, size_t n);
/* 0 when s[0..n) is valid UTF-8 (as Python's strict decoder: no overlong forms, no surrogates). */
int mp_utf8_check(const uint8_t *s, size_t n);

/* ---------------------------------------------------------------- sha256.c */
typedef struct { uint32_t h[8]; uint64_t len; uint8_t buf[64]; size_t fill; } mp_sha256;
void mp_sha256_init(mp_sha256 *s);
void mp_sha256_update(mp_sha256 *s, const void *data, size_t n);
void mp_sha256_final(mp_sha256 *s, uint8_t out[32]);

/* ---------------------------------------------------------------- container.c */
typedef struct mp_blob {
  const uint8_t *data;   /* into the mmap */
  size_t size;
  uint64_t offset;       /* in the file; a multiple of 512 */
  char digest[72];       /* "sha256:<64 hex>" */
} mp_blob;

typedef struct mp_artifact {
  size_t index;
  const mp_json *descriptor, *manifest, *config;  /* owned by the container's JSON documents */
  const char *device, *precision;                 /* "cpu"/"cuda"/"portable", "fp32"/... */
  const char *os, *architecture, *variant;        /* OCI platform; "" when absent */
  const char *cpu_features;                       /* comma list from annotations; "" if none */
  int cuda_sm;                                    /* 0 when not cuda */
  int min_runtime[3];                             /* MAJOR.MINOR.PATCH */
  double max_error;                               /* recorded max |y-r|/max |r|; -1 if absent */
  double latency;                                 /* seconds per run measured at build; -1 if absent */
  const char *code_media_type;                    /* NULL when no layer is code we know */
  const char *min_runtime_text;                   /* as written; min_runtime[0] = -1 if unparsable */
  int has_platform;                               /* the descriptor has an OCI platform */
  int absent;                                     /* a partial container left it out: known by
                                                     its descriptor alone (manifest, config NULL) */
  mp_blob code, weights, vectors;                 /* size 0 when the layer is absent */
  mp_blob cubin;                                  /* a cuda artifact's cubin layer (size 0: none) */
} mp_artifact;

typedef struct mp_signature {   /* one signature layer of a signature manifest (format 1.2) */
  const char *manifest_digest;     /* the signature manifest's digest */
  const char *signature;           /* the annotation: base64 of the Ed25519 signature */
  const char *key_hint;            /* org.mlpack.signature.key ("sha256:<hex>") or NULL */
  uint8_t *payload;                /* the simple-signing payload: a verified private copy (owned) */
  size_t payload_size;
} mp_signature;

typedef struct mp_container {
  char *path;
  int fd;
  const uint8_t *map;
  size_t size;
  int format_major, format_minor;
  const char *name;
  mp_artifact *artifacts;
  size_t artifact_count;
  mp_json_doc **docs;   /* every parsed JSON document, freed with the container */
  size_t doc_count;
  char nested_digest[72];   /* the nested index's digest: what a signature signs */
  const char *tag;          /* index.json's org.opencontainers.image.ref.name */
  int partial;              /* index.json says org.mlpack.partial: artifacts may be absent */
  mp_signature *signatures;
  size_t signature_count;
} mp_container;

/* Strict: every check of spec/container.py (the same corpus, spec/conformance, tests both).
 * With verify, every blob's digest is checked with read(), not through the mapping. */
mlpack_status mp_container_open(const char *path, int verify, mp_container **out, mlpack_error **err);
/* The same parser over bytes in memory (the fuzzer's entry point; `what` names them). The
 * bytes must outlive the container; blobs point into them. */
mlpack_status mp_container_open_memory(const void *data, size_t size, const char *what, int verify,
                                       mp_container **out, mlpack_error **err);
/* The same over an open file descriptor (taken: closed with the container, or on failure);
 * `path` names it in messages. */
mlpack_status mp_container_open_fd(int fd, const char *path, int verify, mp_container **out,
                                   mlpack_error **err);
void mp_container_close(mp_container *c);
/* What executors load: a private copy of blob b (page-aligned; free() it), read from the file
 * with pread (or copied from memory), hashed, and compared with b's digest. The bytes loaded
 * are exactly the bytes hashed, whatever happens to the file meanwhile. */
mlpack_status mp_blob_copy(const mp_container *c, const mp_blob *b, const char *what, uint8_t **out,
                           mlpack_error **err);

/* ---------------------------------------------------------------- trust.c */
/* Ed25519 public keys an operator trusts (the trust policy), and the check of a container's
 * signatures against them (spec/SPEC.md section 9). */
typedef struct mp_keyring {
  uint8_t (*keys)[32];
  char (*ids)[72];          /* "sha256:<hex>" of each key's DER SubjectPublicKeyInfo */
  size_t count;
  char source[256];         /* where they came from, for messages */
} mp_keyring;

/* `spec`: PEM files ("-----BEGIN PUBLIC KEY-----", one or more Ed25519 keys each) or
 * directories of *.pub / *.pem files, separated by ':'. An unreadable file, a key that is not
 * Ed25519, or no key at all is an error naming the file. */
mlpack_status mp_keyring_load(const char *spec, mp_keyring *out, mlpack_error **err);
void mp_keyring_free(mp_keyring *k);
/* MLPACK_OK when one of c's signatures is by a key of k, verifies, and names c's nested index;
 * else MLPACK_ERR_SIGNATURE saying why (unsigned, unknown key, bad signature, other subject).
 * *signer (when the check passes) is the key id that signed. */
mlpack_status mp_trust_check(const mp_container *c, const mp_keyring *k, const char **signer,
                             mlpack_error **err);

/* ---------------------------------------------------------------- ed25519.c */
/* 1 when sig is a valid Ed25519 signature (RFC 8032) of msg by key (vendored Monocypher). */
int mp_ed25519_verify(const uint8_t sig[64], const uint8_t key[32], const uint8_t *msg, size_t n);

/* ---------------------------------------------------------------- tensors.c */
typedef struct mp_tensor_entry {
  const char *name;
  mlpack_dtype dtype;
  size_t rank;
  int64_t shape[8];
  const void *data;     /* into the blob */
  size_t nbytes;
} mp_tensor_entry;

typedef struct mp_tensor_archive {
  mp_json_doc *header;
  mp_tensor_entry *entries;
  size_t count;
} mp_tensor_archive;

mlpack_status mp_tensors_open(const mp_blob *blob, const char *what, mp_tensor_archive *out,
                              mlpack_error **err);
const mp_tensor_entry *mp_tensors_find(const mp_tensor_archive *a, const char *name);
void mp_tensors_close(mp_tensor_archive *a);
int mp_dtype_from_name(const char *name, mlpack_dtype *out);   /* 0 on success */

/* ---------------------------------------------------------------- host.c */
typedef struct mp_host {
  const char *os;            /* "linux" */
  const char *architecture;  /* "amd64", "arm64", "riscv64" */
  int x86_level;             /* 1..4, 0 off x86 */
  char features[1024];       /* comma list, lower case: "avx2,fma,avx512f,..." or "neon,dotprod,..." */
  int cuda_sm;               /* 0: no usable CUDA driver (probed only for a container with cuda
                              * artifacts: api_open.c) */
  char cuda_why[256];        /* why none is usable, when cuda_sm is 0 and it was probed */
} mp_host;

void mp_host_detect(mp_host *out);
/* cuda.c: device 0's compute capability as digits (80), probing the driver once per process
 * (dlopen of libcuda.so.1 or MLPACK_LIBCUDA, cuInit); 0 when none is usable, *why saying why. */
int mp_cuda_probe(const char **why);
/* "linux/amd64 x86-64 v4, no CUDA GPU": for messages (as runtime/host.py's Host.describe). */
void mp_host_describe(const mp_host *h, char *buf, size_t size);
int mp_host_has_feature(const mp_host *h, const char *feature);
/* Whether the comma-separated ``list`` holds ``name`` (an artifact's cpu_features, say). */
int mp_list_has(const char *list, const char *name);

/* ---------------------------------------------------------------- select.c */
typedef struct mp_verdict {
  int runnable;
  int chosen;
  char reason[256];
} mp_verdict;

/* the devices and precisions this engine knows (media.h), NULL-terminated */
extern const char *const mp_devices[];
extern const char *const mp_precisions[];

/* "x86-64 v3 cpu fp32 (artifact 2)": what an artifact is, in select.py's words. */
void mp_artifact_describe(const mp_artifact *a, char *buf, size_t size);
/* Fill verdicts[artifact_count]; *chosen is the index picked. MLPACK_ERR_NO_ARTIFACT with a
 * message listing each artifact's reason (one line per artifact, "  <describe>: <reason>\n", as
 * runtime/select.py's explain) when none is runnable. */
mlpack_status mp_select(const mp_container *c, const mp_host *h, const mlpack_options *opts,
                        mp_verdict *verdicts, size_t *chosen, mlpack_error **err);

/* ---------------------------------------------------------------- expr.c */
/* Evaluate an integer expression in the portable program's JSON encoding (spec/ir/program.py):
 * ints, "$sym", and ["add"|"sub"|"mul"|"floordiv"|"mod"|"max"|"min"|"div", a, b],
 * ["select", c, a, b], comparisons. Division by zero and unknown symbols are errors. */
mlpack_status mp_expr_eval(const mp_json *e, const char *const *sym_names, const int64_t *sym_values,
                           size_t sym_count, int64_t *out, mlpack_error **err);

/* ---------------------------------------------------------------- size.c */
/* A signature dim size given as a string (spec/sizes.py): "$symbol" or a size expression.
 * mp_size_check: MP_SIZE_OK when `text` is one, *is_expr saying which; else MP_SIZE_SYNTAX
 * and *why. mp_size_eval: its value with the symbols given (names without '$');
 * MP_SIZE_UNBOUND when it names another, MP_SIZE_BAD_VALUE on overflow, division by zero or a
 * negative value, each with *why. */
enum { MP_SIZE_OK, MP_SIZE_UNBOUND, MP_SIZE_BAD_VALUE, MP_SIZE_SYNTAX };
int mp_size_check(const char *text, int *is_expr, const char **why);
int mp_size_eval(const char *text, const char *const *names, const int64_t *values, size_t count,
                 int64_t *out, const char **why);

/* ---------------------------------------------------------------- the model (api_open.c) */
typedef struct mp_sig {          /* one input or output of the signature (config "model") */
  const char *name;
  mlpack_dtype dtype;
  size_t rank;
  const char *dim_names[8];
  int64_t dims[8];               /* -1 when symbolic */
  const char *dim_syms[8];       /* symbol name, the text of a size expression, or NULL */
  unsigned char dim_is_expr[8];  /* dim_syms[d] is a size expression (outputs only, format 1.1) */
} mp_sig;

typedef struct mp_executor mp_executor;            /* an open artifact: each executor's own */
typedef struct mp_executor_kind mp_executor_kind;  /* a row of the executor table (executor.h) */
typedef struct mp_pool mp_pool;

typedef struct mp_run_ctx mp_run_ctx;  /* api_run.c: a calling thread's outputs */

typedef struct mp_run {          /* one call of mlpack_run, after inputs are checked */
  const void *const *inputs;     /* in signature order */
  void **outputs;                /* in signature order, allocated to their shapes; NULL for an
                                  * output whose shape depends on data (see mp_run_output) */
  const char *const *sym_names;  /* every symbol of the signature (names without '$') */
  const int64_t *sym_values;
  size_t sym_count;
  /* added by api_run.c (additive): */
  mlpack_model *model;
  const int64_t *in_shapes;      /* input_count x 8: the caller's input shapes */
  const int64_t *out_shapes;     /* output_count x 8: known output shapes; -1 in a dim that a
                                  * symbol no input binds (data-dependent: the executor sets it) */
  mp_pool *pool;                 /* the model's pool while this run holds it, else NULL: other runs
                                  * hold it, so this one runs on its calling thread alone */
  mp_run_ctx *ctx;               /* where this run's outputs live (mp_run_output) */
  int on_device;                 /* inputs and outputs are CUDA device addresses (mlpack_run_device):
                                  * only the cuda executor takes such a run */
  void *stream;                  /* on_device: the caller's CUstream to wait for (NULL: default) */
} mp_run;

/* api_run.c: for an output whose shape depends on data (run->outputs[i] == NULL), the executor
 * calls this once it knows the shape; it allocates the output (owned by the run's context),
 * records the shape, sets run->outputs[i] and *data. Also valid for an already allocated output
 * when the shape is the same (it then just returns the buffer). */
mlpack_status mp_run_output(const mp_run *run, size_t i, const int64_t *shape, void **data,
                            mlpack_error **err);
/* api_run.c: free every thread's run context (the outputs of its last run); mlpack_close calls
 * it, before destroying run_mu. */
void mp_run_release(mlpack_model *m);

struct mlpack_model {
  mp_container *container;
  mp_host host;
  mlpack_options options;
  size_t chosen;
  mp_verdict *verdicts;
  mp_sig *inputs, *outputs;
  size_t input_count, output_count;
  mp_pool *pool;
  const mp_executor_kind *executor_kind;  /* the row that opened executor, and runs and closes it */
  mp_executor *executor;
  const char *signer;            /* the trusted key id that signed it (api_open.c), or NULL */
  mp_keyring trusted;            /* the trust policy's keys, while open */
  /* runs may overlap (any number of threads): each calling thread's outputs live in its own
   * context (api_run.c), found in this list under run_mu (initialized by mlpack_open) */
  pthread_mutex_t run_mu;
  mp_run_ctx *runs;
  _Atomic uint64_t run_serial;   /* the model's number in the process, given with its first context */
};

/* ---------------------------------------------------------------- loader.c, pool.c */
/* (the executors themselves: executor.h) */
/* loader.c: load a shared object from memory (memfd_create, dlopen of /proc/self/fd/N; no file
 * is left behind), return its kernel table after checking abi_version. */
typedef struct mp_library mp_library;
mlpack_status mp_library_load(const void *elf, size_t size, const char *what, mp_library **out,
                              const mlpack_kernel_table **table, mlpack_error **err);
void mp_library_unload(mp_library *lib);

/* pool.c: run fn(ctx, i) for i in [0, count) on the pool's threads (the caller's included).
 * A pool has one caller at a time: a run leases it with mp_pool_acquire (NULL when another run
 * holds it: that run then passes NULL to mp_pool_run, which runs on the calling thread) and
 * gives it back with mp_pool_release. */
mp_pool *mp_pool_create(int threads);
mp_pool *mp_pool_acquire(mp_pool *p);
void mp_pool_release(mp_pool *p);
int mp_pool_threads(const mp_pool *p);
void mp_pool_run(mp_pool *p, uint32_t count, void (*fn)(void *ctx, uint32_t i), void *ctx);
void mp_pool_destroy(mp_pool *p);

#endif /* MLPACK_ENGINE_H */
