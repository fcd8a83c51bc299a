/* mlpack.h: the C API of libmlpack, the engine that opens an mlpack container and runs it.
 *
 *   mlpack_options opts;
 *   mlpack_options_init(&opts);
 *   opts.threads = 2;
 *   mlpack_error *err = NULL;
 *   mlpack_model *m = mlpack_open("model.mlpack", &opts, &err);
 *   if (!m) { fprintf(stderr, "%s\n", mlpack_error_message(err)); mlpack_error_free(err); return 1; }
 *   mlpack_tensor in = {.name = "x", .dtype = MLPACK_F32, .rank = 2, .shape = shape, .data = buf};
 *   mlpack_tensor out[1];
 *   if (mlpack_run(m, &in, 1, out, 1, &err) != MLPACK_OK) { ... }
 *   // out[0].data is owned by the model, valid until this thread's next run of m or close
 *   mlpack_close(m);
 *
 * Every failure is a status code plus an mlpack_error carrying a message that names what is at
 * fault (file, blob, field, input, dim). Functions never abort or read out of bounds on bad input.
 * libmlpack needs libc, libdl and pthreads only.
 *
 * Threads: mlpack_run and mlpack_run_into may be called on one model from any number of threads
 * at once; each run gives what it would give alone, bit for bit. The outputs (and output shapes)
 * a run hands back belong to the calling thread's context in the model: valid until that
 * thread's next run of the model, or mlpack_close, whatever other threads run meanwhile. The
 * model's thread pool (opts.threads) serves one run at a time: while one run holds it, a run
 * from another thread executes on its own calling thread instead of waiting, so N callers at
 * once keep the pool and the other N-1 callers' threads busy, and none waits. The queries below
 * may be called during runs too; mlpack_close may not (no run may be inside the model).
 */
#ifndef MLPACK_H
#define MLPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLPACK_VERSION_MAJOR 0
#define MLPACK_VERSION_MINOR 1
#define MLPACK_VERSION_PATCH 0

typedef enum mlpack_status {
  MLPACK_OK = 0,
  MLPACK_ERR_ARGUMENT = 1,     /* a NULL or out-of-range argument */
  MLPACK_ERR_IO = 2,           /* the file cannot be opened or mapped */
  MLPACK_ERR_FORMAT = 3,       /* malformed container: tar, JSON, missing blob, bad field */
  MLPACK_ERR_DIGEST = 4,       /* a blob does not match its sha256 digest */
  MLPACK_ERR_VERSION = 5,      /* the container or artifact needs a newer runtime */
  MLPACK_ERR_NO_ARTIFACT = 6,  /* no artifact this host can run (message says why for each) */
  MLPACK_ERR_INPUT = 7,        /* inputs do not match the signature (name, dtype, dim) */
  MLPACK_ERR_LOAD = 8,         /* a kernel library cannot be loaded */
  MLPACK_ERR_RUNTIME = 9,      /* a kernel or the interpreter failed while running */
  MLPACK_ERR_NOMEM = 10,
  MLPACK_ERR_INDEX = 11,       /* an index taken from data (Gather, GatherND, ScatterND...) is out
                                  of range: the message names the ONNX node and the index */
  MLPACK_ERR_SIGNATURE = 12,   /* a trust policy is set and the container is not signed by a
                                  trusted key (unsigned, unknown key, bad signature) */
} mlpack_status;

typedef enum mlpack_dtype {
  MLPACK_BOOL = 0, MLPACK_I8, MLPACK_I16, MLPACK_I32, MLPACK_I64,
  MLPACK_U8, MLPACK_U16, MLPACK_U32, MLPACK_U64,
  MLPACK_F16, MLPACK_BF16, MLPACK_F32, MLPACK_F64,
  MLPACK_DTYPE_COUNT
} mlpack_dtype;

typedef struct mlpack_model mlpack_model;
typedef struct mlpack_error mlpack_error;

typedef struct mlpack_options {
  int threads;               /* worker threads; 0 = MLPACK_NUM_THREADS from the environment, else the core count */
  const char *device;        /* "cpu", "cuda", "portable" or NULL for any */
  const char *precision;     /* "fp32", "fp16", "bf16", "int8" or NULL for any */
  double accuracy_budget;    /* max recorded max_error accepted (of each output's scale); < 0 for
                                no budget. Budget or not, the fastest remaining artifact wins */
  int strict;                /* non-zero: refuse to fall back to the portable interpreter */
  int verify;                /* non-zero (default): also check the digest of every blob of the
                                container when opening; what an executor loads (code, weights)
                                is always hashed from the engine's own copy, whatever this says */
  int pin_artifact;          /* 0 (default): selection decides; i + 1: run artifact i, which the host
                                must be able to run (validating each artifact of a container) */
  const char *trusted_keys;  /* the trust policy: Ed25519 public keys (PEM files, or directories of
                                .pub and .pem files, separated by ':'). Set, a container loads only when a
                                trusted key signed it, checked before any code is loaded. NULL:
                                MLPACK_TRUSTED_KEYS from the environment; "" or both unset: none */
  int select_only;           /* non-zero: open, check and select, but load no code (mlpack_run
                                then fails): what `mlpack inspect --host` asks */
} mlpack_options;

typedef struct mlpack_tensor_info {
  const char *name;
  mlpack_dtype dtype;
  size_t rank;
  const char *const *dim_names;  /* rank entries */
  const int64_t *dims;           /* rank entries; -1 for a symbolic size */
  const char *const *dim_syms;   /* rank entries; the symbol's name ("batch"), for an output dim
                                    that is an expression of symbols its text ("2 * $batch",
                                    which has a '$'), or NULL for a fixed size */
} mlpack_tensor_info;

typedef struct mlpack_tensor {
  const char *name;      /* inputs: matched by name; outputs: filled in by mlpack_run */
  mlpack_dtype dtype;
  size_t rank;
  const int64_t *shape;  /* inputs: caller's; outputs: owned by the model */
  void *data;            /* inputs: caller's, row-major; outputs: owned by the model */
  size_t nbytes;
} mlpack_tensor;

typedef struct mlpack_artifact_info {
  size_t index;              /* position in the container's artifact list */
  const char *device;        /* "cpu", "cuda", "portable" */
  const char *precision;
  const char *architecture;  /* OCI architecture ("amd64", "arm64") or "" for portable */
  const char *variant;       /* OCI variant ("v3", "v8") or "" */
  int runnable;              /* the host can run it */
  int chosen;
  const char *reason;        /* why it was chosen or passed over */
} mlpack_artifact_info;

void mlpack_options_init(mlpack_options *opts);

mlpack_model *mlpack_open(const char *path, const mlpack_options *opts, mlpack_error **err);
/* mlpack_open over a file the caller opened (the engine dup()s fd; the caller keeps its own):
 * what the engine checks and loads is then that file, whatever later happens to the path.
 * `name` names it in messages. */
mlpack_model *mlpack_open_fd(int fd, const char *name, const mlpack_options *opts, mlpack_error **err);
/* The key id ("sha256:<hex>") whose signature the trust policy accepted, or NULL when the model
 * was opened without a policy. */
const char *mlpack_signer(const mlpack_model *model);
void mlpack_close(mlpack_model *model);

size_t mlpack_input_count(const mlpack_model *model);
size_t mlpack_output_count(const mlpack_model *model);
mlpack_status mlpack_input_info(const mlpack_model *model, size_t i, mlpack_tensor_info *out);
mlpack_status mlpack_output_info(const mlpack_model *model, size_t i, mlpack_tensor_info *out);

size_t mlpack_artifact_count(const mlpack_model *model);
mlpack_status mlpack_artifact_info_get(const mlpack_model *model, size_t i, mlpack_artifact_info *out);

/* Run the model on inputs (matched by name). On success outputs[0..n_outputs) are filled in, in
 * the model's output order, with memory owned by the model: valid until this thread's next run
 * of the model or mlpack_close (see Threads above). */
mlpack_status mlpack_run(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                         mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err);

/* mlpack_run, but output i is written straight into the caller's memory: outputs[i].data, of
 * outputs[i].nbytes bytes (at least the output's size), in the model's output order; a non-NULL
 * outputs[i].name must be that output's name. No copy is made. Every output's shape must follow
 * from the inputs' shapes (mlpack_output_info: fixed dims, or symbols an input binds), and the
 * memory must be aligned to the element size and overlap no input and no other output. On
 * success name, dtype, rank, shape (the model's, as mlpack_run's) and nbytes are filled in and data is
 * left as given; on failure the tensors are left as given (their memory may be partly written). */
mlpack_status mlpack_run_into(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                              mlpack_tensor *outputs, size_t n_outputs, mlpack_error **err);

/* mlpack_run_into for a model running on a CUDA GPU (its chosen artifact is a cuda one), with
 * every input's and output's data a CUDA device address (a CUdeviceptr, as void *) on the
 * model's GPU (device 0, its primary context): nothing is copied between host and GPU. Outputs
 * are given as to mlpack_run_into (their shapes must follow from the inputs'). `stream` is the
 * CUstream (or NULL, the default stream) on which the caller queued the work that writes the
 * inputs: the run waits for it first, and returns once the outputs are written. A model on
 * another device refuses it (MLPACK_ERR_ARGUMENT). */
mlpack_status mlpack_run_device(mlpack_model *model, const mlpack_tensor *inputs, size_t n_inputs,
                                mlpack_tensor *outputs, size_t n_outputs, void *stream, mlpack_error **err);

/* GPU memory for mlpack_run_device's inputs and outputs, on device 0 in CUDA's primary context
 * (the one the CUDA runtime, PyTorch and CuPy use too), for callers with no allocator of their
 * own. Each allocation keeps the context alive until it is freed, model or no model.
 * MLPACK_ERR_NO_ARTIFACT when no GPU is usable (the message says why). */
mlpack_status mlpack_device_alloc(size_t nbytes, void **out, mlpack_error **err);
void mlpack_device_free(void *ptr);
/* Copy nbytes between host and GPU memory: to_device non-zero copies host src to device dst. */
mlpack_status mlpack_device_copy(void *dst, const void *src, size_t nbytes, int to_device, mlpack_error **err);

mlpack_status mlpack_error_code(const mlpack_error *err);
const char *mlpack_error_message(const mlpack_error *err);
void mlpack_error_free(mlpack_error *err);

const char *mlpack_dtype_name(mlpack_dtype dtype);   /* "f32", ...: the IR's names */
size_t mlpack_dtype_size(mlpack_dtype dtype);
const char *mlpack_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* MLPACK_H */
