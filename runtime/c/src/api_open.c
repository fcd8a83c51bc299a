/* api_open.c: the model's life outside mlpack_run: options, open (container -> host -> selection
 * -> signature -> pool -> executor), close, signature and artifact queries, version.
 *
 * The signature is read from the chosen artifact's config "model" (every artifact of one
 * container has the same one); its strings point into the container's JSON documents, which
 * live as long as the model.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "executor.h"

#define MP_MAX_THREADS 1024

#define MP_STR2(x) #x
#define MP_STR(x) MP_STR2(x)

const char *mlpack_version_string(void) {
  return MP_STR(MLPACK_VERSION_MAJOR) "." MP_STR(MLPACK_VERSION_MINOR) "." MP_STR(MLPACK_VERSION_PATCH);
}

void mlpack_options_init(mlpack_options *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->accuracy_budget = -1;
  opts->verify = 1;
}

/* ---------------------------------------------------------------- signature */

static mlpack_status mp_sig_dim(const mp_json *d, const char *what, size_t k, mp_sig *s, mlpack_error **err) {
  const mp_json *size = mp_json_get(d, "size");
  s->dim_names[k] = mp_json_get_string(d, "name");
  s->dim_syms[k] = NULL;
  s->dim_is_expr[k] = 0;
  int is_expr = 0;
  const char *why;
  if (size && size->kind == MP_JSON_STRING && mp_size_check(size->string, &is_expr, &why) == MP_SIZE_OK &&
      (!is_expr || !strcmp(what, "output"))) {
    /* a symbol by its name; an expression (outputs only) by its text, evaluated per run */
    s->dims[k] = -1;
    s->dim_syms[k] = is_expr ? size->string : size->string + 1;
    s->dim_is_expr[k] = (unsigned char)is_expr;
  } else if (size && size->kind == MP_JSON_NUMBER && size->is_int && size->integer >= 0) {
    s->dims[k] = size->integer;
  } else {
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s '%s': dim %zu size is neither a count, a '$symbol' nor (an output's) "
                   "a size expression", what, s->name, k);
  }
  if (!s->dim_names[k]) return mp_fail(err, MLPACK_ERR_FORMAT, "%s '%s': dim %zu has no name", what, s->name, k);
  return MLPACK_OK;
}

static mlpack_status mp_sig_read(const mp_json *j, const char *what, mp_sig *s, mlpack_error **err) {
  memset(s, 0, sizeof *s);
  s->name = mp_json_get_string(j, "name");
  const mp_json *dims = mp_json_get(j, "dims");
  if (!s->name || !dims || dims->kind != MP_JSON_ARRAY)
    return mp_fail(err, MLPACK_ERR_FORMAT, "config model: malformed %s entry", what);
  const char *dtype = mp_json_get_string(j, "dtype");
  if (mp_dtype_from_name(dtype, &s->dtype))
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s '%s': dtype '%.40s' is not known to this engine", what, s->name,
                   dtype ? dtype : "");
  if (dims->length > 8)
    return mp_fail(err, MLPACK_ERR_FORMAT, "%s '%s' has rank %zu; this engine supports at most 8", what, s->name,
                   dims->length);
  s->rank = dims->length;
  for (size_t k = 0; k < s->rank; k++) {
    mlpack_status st = mp_sig_dim(dims->items[k], what, k, s, err);
    if (st) return st;
  }
  return MLPACK_OK;
}

static mlpack_status mp_sigs_read(const mp_json *model, const char *key, const char *what, mp_sig **out,
                                  size_t *count, mlpack_error **err) {
  const mp_json *list = mp_json_get(model, key);
  if (!list || list->kind != MP_JSON_ARRAY) return mp_fail(err, MLPACK_ERR_FORMAT, "config model has no '%s'", key);
  *out = calloc(list->length ? list->length : 1, sizeof **out);
  if (!*out) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  *count = list->length;
  for (size_t i = 0; i < list->length; i++) {
    mlpack_status st = mp_sig_read(list->items[i], what, &(*out)[i], err);
    if (st) return st;
  }
  return MLPACK_OK;
}

/* ---------------------------------------------------------------- open */

/* options.threads, else MLPACK_NUM_THREADS, else the online core count. */
static mlpack_status mp_thread_count(int requested, int *out, mlpack_error **err) {
  if (requested < 0) return mp_fail(err, MLPACK_ERR_ARGUMENT, "threads must be >= 0, got %d", requested);
  if (requested > 0) {
    *out = requested > MP_MAX_THREADS ? MP_MAX_THREADS : requested;
    return MLPACK_OK;
  }
  const char *env = getenv("MLPACK_NUM_THREADS");
  if (env && *env) {
    char *end;
    long n = strtol(env, &end, 10);
    if (*end || n < 1)
      return mp_fail(err, MLPACK_ERR_ARGUMENT, "MLPACK_NUM_THREADS='%.40s' is not a positive integer", env);
    *out = n > MP_MAX_THREADS ? MP_MAX_THREADS : (int)n;
    return MLPACK_OK;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  *out = cores < 1 ? 1 : cores > MP_MAX_THREADS ? MP_MAX_THREADS : (int)cores;
  return MLPACK_OK;
}

/* The row selection judged the artifact by (select.c) is the one that opens it. */
static mlpack_status mp_executor_open(mlpack_model *m, const mp_artifact *a, mlpack_error **err) {
  const mp_executor_kind *kind = mp_executor_for(a->code_media_type);
  if (!kind)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: artifact %zu: no executor for code '%s'", m->container->path,
                   a->index, a->code_media_type ? a->code_media_type : "(none)");
  m->executor_kind = kind;
  return kind->open(m, a, &m->executor, err);
}

/* The caller's strings may not outlive mlpack_open: keep our own copies of the vocabulary. */
static const char *mp_canonical(const char *s, const char *const *words) {
  for (int i = 0; s && words[i]; i++)
    if (!strcmp(s, words[i])) return words[i];
  return NULL;
}

/* The trust policy (options.trusted_keys, else MLPACK_TRUSTED_KEYS): with one, a container whose
 * signatures do not include one by a trusted key is refused here, before selection and before any
 * executor loads anything. Without one nothing is checked (mlpack_signer says NULL). */
static mlpack_status mp_apply_policy(mlpack_model *m, mlpack_error **err) {
  const char *spec = m->options.trusted_keys;
  if (!spec) spec = getenv("MLPACK_TRUSTED_KEYS");
  m->options.trusted_keys = NULL;   /* the caller's string may not outlive mlpack_open */
  if (!spec || !*spec) return MLPACK_OK;
  mlpack_status st = mp_keyring_load(spec, &m->trusted, err);
  if (st) return st;
  return mp_trust_check(m->container, &m->trusted, &m->signer, err);
}

static mlpack_status mp_model_open(mlpack_model *m, int fd, const char *path, mlpack_error **err) {
  mlpack_status st = mp_container_open_fd(fd, path, m->options.verify, &m->container, err);
  if (st) return st;
  if ((st = mp_apply_policy(m, err))) return st;
  mp_host_detect(&m->host);
  for (size_t i = 0; i < m->container->artifact_count; i++) {   /* (cuInit only when it may matter) */
    const mp_artifact *a = &m->container->artifacts[i];
    if (!a->absent && a->device && !strcmp(a->device, "cuda")) {
      const char *why = "";
      m->host.cuda_sm = mp_cuda_probe(&why);
      snprintf(m->host.cuda_why, sizeof m->host.cuda_why, "%s", why);
      break;
    }
  }
  m->verdicts = calloc(m->container->artifact_count, sizeof *m->verdicts);
  if (!m->verdicts) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  if ((st = mp_select(m->container, &m->host, &m->options, m->verdicts, &m->chosen, err))) return st;
  m->options.device = mp_canonical(m->options.device, mp_devices);
  m->options.precision = mp_canonical(m->options.precision, mp_precisions);
  const mp_artifact *a = &m->container->artifacts[m->chosen];
  const mp_json *model = mp_json_get(a->config, "model");
  if ((st = mp_sigs_read(model, "inputs", "input", &m->inputs, &m->input_count, err))) return st;
  if ((st = mp_sigs_read(model, "outputs", "output", &m->outputs, &m->output_count, err))) return st;
  int threads = 0;
  if ((st = mp_thread_count(m->options.threads, &threads, err))) return st;
  m->options.threads = threads;
  if (m->options.select_only) return MLPACK_OK;   /* no pool, no code: inspect --host */
  if (!(m->pool = mp_pool_create(threads)))
    return mp_fail(err, MLPACK_ERR_NOMEM, "cannot start a pool of %d threads", threads);
  return mp_executor_open(m, a, err);
}

/* Both entry points: fd is the engine's own (closed on failure). */
static mlpack_model *mp_open(int fd, const char *name, const mlpack_options *opts, mlpack_error **err) {
  mlpack_model *m = calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&m->run_mu, NULL);   /* (api_run.c's per-thread run contexts) */
  if (opts) m->options = *opts;
  else mlpack_options_init(&m->options);
  if (mp_model_open(m, fd, name, err)) {
    mlpack_close(m);
    return NULL;
  }
  return m;
}

mlpack_model *mlpack_open(const char *path, const mlpack_options *opts, mlpack_error **err) {
  if (err) *err = NULL;
  if (!path) {
    mp_fail(err, MLPACK_ERR_ARGUMENT, "mlpack_open: path is NULL");
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    mp_fail(err, MLPACK_ERR_IO, "cannot open container %s: %s", path, strerror(errno));
    return NULL;
  }
  return mp_open(fd, path, opts, err);
}

mlpack_model *mlpack_open_fd(int fd, const char *name, const mlpack_options *opts, mlpack_error **err) {
  if (err) *err = NULL;
  int own = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (own < 0) {
    mp_fail(err, MLPACK_ERR_IO, "mlpack_open_fd: %s: not an open file descriptor (%d): %s",
            name ? name : "container", fd, strerror(errno));
    return NULL;
  }
  return mp_open(own, name ? name : "<file descriptor>", opts, err);
}

const char *mlpack_signer(const mlpack_model *m) { return m ? m->signer : NULL; }

void mlpack_close(mlpack_model *m) {
  if (!m) return;
  if (m->executor) m->executor_kind->close(m->executor);
  if (m->pool) mp_pool_destroy(m->pool);
  mp_run_release(m);
  pthread_mutex_destroy(&m->run_mu);
  free(m->inputs);
  free(m->outputs);
  free(m->verdicts);
  mp_container_close(m->container);
  mp_keyring_free(&m->trusted);
  free(m);
}

/* ---------------------------------------------------------------- queries */

size_t mlpack_input_count(const mlpack_model *m) { return m ? m->input_count : 0; }
size_t mlpack_output_count(const mlpack_model *m) { return m ? m->output_count : 0; }

static void mp_sig_info(const mp_sig *s, mlpack_tensor_info *out) {
  out->name = s->name;
  out->dtype = s->dtype;
  out->rank = s->rank;
  out->dim_names = s->dim_names;
  out->dims = s->dims;
  out->dim_syms = s->dim_syms;
}

mlpack_status mlpack_input_info(const mlpack_model *m, size_t i, mlpack_tensor_info *out) {
  if (!m || !out || i >= m->input_count) return MLPACK_ERR_ARGUMENT;
  mp_sig_info(&m->inputs[i], out);
  return MLPACK_OK;
}

mlpack_status mlpack_output_info(const mlpack_model *m, size_t i, mlpack_tensor_info *out) {
  if (!m || !out || i >= m->output_count) return MLPACK_ERR_ARGUMENT;
  mp_sig_info(&m->outputs[i], out);
  return MLPACK_OK;
}

size_t mlpack_artifact_count(const mlpack_model *m) { return m ? m->container->artifact_count : 0; }

mlpack_status mlpack_artifact_info_get(const mlpack_model *m, size_t i, mlpack_artifact_info *out) {
  if (!m || !out || i >= m->container->artifact_count) return MLPACK_ERR_ARGUMENT;
  const mp_artifact *a = &m->container->artifacts[i];
  out->index = a->index;
  out->device = a->device;
  out->precision = a->precision;
  out->architecture = a->architecture;
  out->variant = a->variant;
  out->runnable = m->verdicts[i].runnable;
  out->chosen = m->verdicts[i].chosen;
  out->reason = m->verdicts[i].reason;
  return MLPACK_OK;
}
