/* portable.c: the portable program interpreter (spec/ir/program.py; meaning: spec/ir/interp.py).
 *
 * Every container carries a portable program, so this is what runs when no native artifact fits.
 * At open, the program JSON is compiled into flat arrays: expression nodes (children before
 * parents, referenced by index), tensors (inputs, constants mapped from the weights layer in
 * place, op results) and ops (comprehensions and procedures, whose statements form small trees).
 * A run evaluates each comprehension element by element (the output index space times the
 * reduction index space) and each procedure statement by statement.
 *
 * Values are a union of double and int64, tagged by the node's dtype, and normalized to that
 * dtype after every op (integers wrap to their width, floats round to f32/f16/bf16), so results
 * match the NumPy interpreter's dtype rules: integer `div` truncates, `floordiv`/`mod` are
 * Python-style, `fmod` C-style, `round` half-to-even, float->int casts truncate with
 * non-finite -> 0. Float sums accumulate in double (more exact than NumPy's pairwise f32, which
 * the tests' tolerances cover). libm is fine here; kernels cannot use it, this interpreter can.
 *
 * Tensors keep their own storage order: inputs are read in the caller's (signature) order,
 * results in their declaration order; every read maps its named dims to storage axes at compile
 * time, so no transposition ever happens except the final copy into the caller's outputs.
 *
 * An unguarded read or a store out of range fails the run; when the program's "origins" name the
 * ONNX node that indexes that dim, the message names it and the caller's index
 * (MLPACK_ERR_INDEX, as the NumPy interpreter and native kernels say it: spec/ir/origins.py).
 *
 * Runs may overlap. What a run writes (the tensors' shapes, strides and data, the symbols'
 * values, the variables, the error) sits in the mp_portable struct beside the compiled program,
 * so a run works on a run copy: a shallow copy of the compiled struct with its own tensor table
 * and state arrays, pointing to the program's nodes, ops and constants, which no run writes.
 * Copies are made on demand and kept in the executor's idle list (under its mutex, and one spare
 * copy swapped with an atomic exchange) for the next run, so a lone caller reuses one copy and
 * N overlapping runs use N.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "executor.h"

/* an op's tensors may have more dims than a model's inputs and outputs (8: api_open.c): the
   capsule layer's routing reads its votes over 9 (n, x, y, kx, ky, ci, co, i, j) */
#define MP_RANK 16
#define MP_LOOP (2 * MP_RANK)   /* a comprehension's loops: its output's dims, then its reduction's */

typedef union mp_val { double f; int64_t i; } mp_val;

/* ---------------------------------------------------------------- ops */

enum {
  OP_CONST, OP_VAR, OP_SYM, OP_READ, OP_CAST, OP_SELECT,
  /* unary */
  OP_NEG, OP_ABS, OP_EXP, OP_LOG, OP_SQRT, OP_SIN, OP_COS, OP_TAN, OP_ASIN, OP_ACOS, OP_ATAN,
  OP_SINH, OP_COSH, OP_TANH, OP_ASINH, OP_ACOSH, OP_ATANH, OP_ERF, OP_FLOOR, OP_CEIL, OP_ROUND,
  OP_SIGN, OP_NOT, OP_BITNOT, OP_ISNAN, OP_ISINF, OP_RECIP, OP_SIGMOID,
  /* binary */
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_FMOD, OP_POW, OP_MAX, OP_MIN,
  OP_AND, OP_OR, OP_XOR, OP_BITAND, OP_BITOR, OP_BITXOR, OP_SHL, OP_SHR,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_ATAN2,
  OP_COUNT
};

static const char *const mp_op_names[OP_COUNT] = {
  "c", "v", "$", "r", "cast", "select",
  "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
  "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "round",
  "sign", "not", "bitnot", "isnan", "isinf", "recip", "sigmoid",
  "add", "sub", "mul", "div", "floordiv", "mod", "fmod", "pow", "max", "min",
  "and", "or", "xor", "bitand", "bitor", "bitxor", "shl", "shr",
  "eq", "ne", "lt", "le", "gt", "ge", "atan2",
};

#define MP_IS_UNARY(op) ((op) >= OP_NEG && (op) <= OP_SIGMOID)
#define MP_IS_BINARY(op) ((op) >= OP_ADD && (op) <= OP_ATAN2)
#define MP_IS_CMP(op) ((op) >= OP_EQ && (op) <= OP_GE)
#define MP_IS_LOGICAL(op) ((op) >= OP_AND && (op) <= OP_XOR)

typedef struct mp_node {
  uint8_t op, dtype, cdt, has_pad;  /* cdt: the dtype operands are brought to (binary ops) */
  int32_t a[3];                     /* operands */
  int32_t slot;                     /* var slot, symbol, or tensor */
  int32_t first, count;             /* reads: index nodes p->rix[first..], storage axes p->rax[first..] */
  mp_val k;                         /* constant, or a read's pad */
} mp_node;

enum { T_INPUT, T_CONST, T_OP, T_LOCAL };

typedef struct mp_ptensor {
  const char *name;
  uint8_t dtype;
  int kind;
  size_t rank;
  const char *dims[MP_RANK];        /* storage order */
  int32_t size[MP_RANK];            /* size node per storage axis */
  int64_t shape[MP_RANK], stride[MP_RANK];
  uint8_t *data;
  int owned;
  int is_output;
  long last_use;                    /* last op that reads it; -1 none */
} mp_ptensor;

enum { S_LET, S_STORE, S_FOR, S_WHILE, S_IF, S_SIZE };

typedef struct mp_stmt {
  int kind;
  int32_t slot;                     /* let/for var; store tensor; size symbol */
  int32_t expr;                     /* let/store value, for extent, while/if condition, size */
  int32_t idx[MP_RANK];             /* store: index node per storage axis */
  struct mp_stmt *body, *orelse;
  size_t nbody, nelse;
} mp_stmt;

enum { R_NONE, R_SUM, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN, R_ARGMAX_LAST, R_ARGMIN_LAST };

typedef struct mp_pop {
  int is_proc;
  /* comprehension */
  int32_t out;
  int reduce;
  size_t nred;
  int32_t rsize[MP_RANK];
  int32_t body;
  /* procedure */
  int32_t *tensors;                 /* results then locals */
  size_t nresults, nlocals;
  int32_t *bound_sym, *bound_node;
  size_t nbounds;
  mp_stmt *stmts;
  size_t nstmts;
} mp_pop;

typedef struct mp_port { int32_t tensor; int8_t axis[MP_RANK]; } mp_port;  /* sig axis -> storage axis */

typedef struct mp_portable {
  mlpack_model *model;
  char what[64];
  mp_json_doc *doc;
  mp_tensor_archive weights;
  int have_weights;
  uint8_t *weights_copy;     /* the constants: the engine's verified copy of the weights blob */
  mp_node *nodes;
  size_t nn, ncap;
  int32_t *rix;
  int8_t *rax;
  size_t nr, rcap;
  mp_ptensor *tensors;
  size_t nt, tcap;
  const char **syms;
  int64_t *symv;
  uint8_t *symset;
  size_t nsym, scap;
  mp_pop *ops;
  size_t nops;
  mp_port *inputs, *outputs;        /* per signature input / output */
  mp_val *vars;
  size_t nvars;
  const mp_json *origins;           /* the program's "origins" list, or NULL */
  /* run state (a run copy's own: tensors, symv, symset and vars above are too) */
  int failed;
  mlpack_status code;               /* of the failure: MLPACK_ERR_RUNTIME or MLPACK_ERR_INDEX */
  char msg[256];
  struct mp_idle *idle;             /* the program's run copies no run holds (shared by the copies) */
  struct mp_portable *next;         /* a run copy's link in idle->copies */
} mp_portable;

typedef struct mp_idle {
  pthread_mutex_t mu;
  mp_portable *copies;
  _Atomic(mp_portable *) spare;     /* one more, taken and given back without the lock */
} mp_idle;

typedef struct mp_scope {           /* variable names -> slots, while compiling one op */
  const char *names[256];
  size_t n;
  int dynamic;                      /* procedures: a let or for declares */
} mp_scope;

/* ---------------------------------------------------------------- dtypes and values */

static int mp_is_float(int dt) { return dt == MLPACK_F16 || dt == MLPACK_BF16 || dt == MLPACK_F32 || dt == MLPACK_F64; }
static int mp_is_unsigned(int dt) { return dt == MLPACK_U8 || dt == MLPACK_U16 || dt == MLPACK_U32 || dt == MLPACK_U64 || dt == MLPACK_BOOL; }
static int mp_bits(int dt) { return (int)mlpack_dtype_size((mlpack_dtype)dt) * 8; }

/* Round x to a binary float format with `mant` fraction bits and normal exponents [emin, emax],
 * half to even, with subnormals and overflow to infinity (f16 and bf16 from double). */
static double mp_round_fmt(double x, int mant, int emin, int emax) {
  if (!isfinite(x) || x == 0) return x;
  int e = ilogb(x);
  if (e < emin) e = emin;
  double q = ldexp(1.0, e - mant);
  double r = nearbyint(x / q) * q;
  if (fabs(r) >= ldexp(1.0, emax + 1)) return copysign(INFINITY, x);
  return r;
}

static int64_t mp_wrap(int dt, int64_t v) {
  switch (dt) {
  case MLPACK_BOOL: return v != 0;
  case MLPACK_I8: return (int8_t)v;
  case MLPACK_I16: return (int16_t)v;
  case MLPACK_I32: return (int32_t)v;
  case MLPACK_U8: return (uint8_t)v;
  case MLPACK_U16: return (uint16_t)v;
  case MLPACK_U32: return (uint32_t)v;
  default: return v;  /* i64, u64 (u64 is kept as its bit pattern) */
  }
}

static double mp_round_float(int dt, double x) {
  switch (dt) {
  case MLPACK_F32: return (double)(float)x;
  case MLPACK_F16: return mp_round_fmt(x, 10, -14, 15);
  case MLPACK_BF16: return isnan(x) ? x : mp_round_fmt(x, 7, -126, 127);
  default: return x;
  }
}

static double mp_to_f(mp_val v, int dt) {
  if (mp_is_float(dt)) return v.f;
  if (dt == MLPACK_U64) return (double)(uint64_t)v.i;
  return (double)v.i;
}

/* float -> int as the interpreter casts: truncate, non-finite -> 0 */
static int64_t mp_f_to_i(double x, int dt) {
  if (!isfinite(x)) return 0;
  double t = trunc(x);
  if (dt == MLPACK_BOOL) return t != 0;
  if (dt == MLPACK_U64 && t >= 0) return t >= 18446744073709551616.0 ? 0 : (int64_t)(uint64_t)t;
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return INT64_MIN;  /* as x86 does */
  return mp_wrap(dt, (int64_t)t);
}

static mp_val mp_convert(mp_val v, int from, int to) {
  mp_val r;
  if (to == MLPACK_BOOL) r.i = mp_is_float(from) ? v.f != 0 : v.i != 0;
  else if (mp_is_float(to)) r.f = mp_round_float(to, mp_to_f(v, from));
  else if (mp_is_float(from)) r.i = mp_f_to_i(v.f, to);
  else r.i = mp_wrap(to, v.i);
  return r;
}

static int mp_truth(mp_val v, int dt) { return mp_is_float(dt) ? v.f != 0 : v.i != 0; }

static int64_t mp_to_index(mp_val v, int dt) { return mp_is_float(dt) ? mp_f_to_i(v.f, MLPACK_I64) : v.i; }

/* numpy's promote_types over the dtypes the C engine knows */
static int mp_promote(int a, int b) {
  if (a == b) return a;
  if (a == MLPACK_BOOL) return b;
  if (b == MLPACK_BOOL) return a;
  int fa = mp_is_float(a), fb = mp_is_float(b);
  if (fa && fb) {
    if (a == MLPACK_F64 || b == MLPACK_F64) return MLPACK_F64;
    return MLPACK_F32;  /* f16 with bf16, or either with f32 */
  }
  if (fa || fb) {
    int f = fa ? a : b, i = fa ? b : a, ib = mp_bits(i);
    if (f == MLPACK_F64) return MLPACK_F64;
    if (f == MLPACK_F32) return ib <= 16 ? MLPACK_F32 : MLPACK_F64;
    return ib <= 8 ? f : ib <= 16 ? MLPACK_F32 : MLPACK_F64;  /* f16 / bf16 */
  }
  int ua = mp_is_unsigned(a), ub = mp_is_unsigned(b), wa = mp_bits(a), wb = mp_bits(b);
  if (ua == ub) return wa >= wb ? a : b;
  int s = ua ? b : a, u = ua ? a : b, ws = mp_bits(s), wu = mp_bits(u);
  if (ws > wu) return s;
  switch (wu) {
  case 8: return MLPACK_I16;
  case 16: return MLPACK_I32;
  case 32: return MLPACK_I64;
  default: return MLPACK_F64;
  }
}

/* ---------------------------------------------------------------- loads and stores */

static double mp_f16_to_f(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return s ? -v : v;
}

static uint16_t mp_f_to_f16(double x) {
  x = mp_round_fmt(x, 10, -14, 15);
  uint16_t s = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  if (isnan(x)) return s | 0x7e00;
  if (isinf(x)) return s | 0x7c00;
  if (a < ldexp(1.0, -14)) return s | (uint16_t)(a * ldexp(1.0, 24));
  int e = ilogb(a);
  return s | (uint16_t)((e + 15) << 10) | (uint16_t)((a / ldexp(1.0, e) - 1.0) * 1024.0);
}

static double mp_bf16_to_f(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t mp_f_to_bf16(double x) {
  float f = (float)mp_round_fmt(x, 7, -126, 127);
  if (isnan(x)) return 0x7fc0;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(bits >> 16);
}

static mp_val mp_load(const uint8_t *p, int dt) {
  mp_val v;
  switch (dt) {
  case MLPACK_BOOL: v.i = *p != 0; break;
  case MLPACK_I8: v.i = *(const int8_t *)p; break;
  case MLPACK_U8: v.i = *p; break;
  case MLPACK_I16: { int16_t x; memcpy(&x, p, 2); v.i = x; break; }
  case MLPACK_U16: { uint16_t x; memcpy(&x, p, 2); v.i = x; break; }
  case MLPACK_I32: { int32_t x; memcpy(&x, p, 4); v.i = x; break; }
  case MLPACK_U32: { uint32_t x; memcpy(&x, p, 4); v.i = x; break; }
  case MLPACK_I64: case MLPACK_U64: memcpy(&v.i, p, 8); break;
  case MLPACK_F16: { uint16_t x; memcpy(&x, p, 2); v.f = mp_f16_to_f(x); break; }
  case MLPACK_BF16: { uint16_t x; memcpy(&x, p, 2); v.f = mp_bf16_to_f(x); break; }
  case MLPACK_F32: { float x; memcpy(&x, p, 4); v.f = x; break; }
  default: memcpy(&v.f, p, 8); break;
  }
  return v;
}

static void mp_store(uint8_t *p, int dt, mp_val v) {
  switch (dt) {
  case MLPACK_BOOL: *p = v.i != 0; break;
  case MLPACK_I8: case MLPACK_U8: *p = (uint8_t)v.i; break;
  case MLPACK_I16: case MLPACK_U16: { uint16_t x = (uint16_t)v.i; memcpy(p, &x, 2); break; }
  case MLPACK_I32: case MLPACK_U32: { uint32_t x = (uint32_t)v.i; memcpy(p, &x, 4); break; }
  case MLPACK_I64: case MLPACK_U64: memcpy(p, &v.i, 8); break;
  case MLPACK_F16: { uint16_t x = mp_f_to_f16(v.f); memcpy(p, &x, 2); break; }
  case MLPACK_BF16: { uint16_t x = mp_f_to_bf16(v.f); memcpy(p, &x, 2); break; }
  case MLPACK_F32: { float x = (float)v.f; memcpy(p, &x, 4); break; }
  default: memcpy(p, &v.f, 8); break;
  }
}

/* ---------------------------------------------------------------- scalar arithmetic */

static void mp_runtime_error(mp_portable *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mp_runtime_error(mp_portable *p, const char *fmt, ...) {
  if (p->failed) return;  /* the first error is the one worth reporting */
  p->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->msg, sizeof p->msg, fmt, ap);
  va_end(ap);
}

/* Index i out of range for axis `axis` of tensor t: the message names the ONNX node indexing it
 * when the program's origins know one. */
static void mp_index_error(mp_portable *p, const mp_ptensor *t, int axis, int64_t i, const char *what) {
  if (p->failed) return;
  const char *node = NULL;
  int wraps = 0;
  for (size_t k = 0; p->origins && k < p->origins->length; k++) {
    const mp_json *o = p->origins->items[k];
    if (o->kind != MP_JSON_ARRAY || o->length != 4 || o->items[0]->kind != MP_JSON_STRING ||
        o->items[1]->kind != MP_JSON_STRING || o->items[2]->kind != MP_JSON_STRING ||
        strcmp(o->items[0]->string, t->name) != 0 || strcmp(o->items[1]->string, t->dims[axis]) != 0)
      continue;
    node = o->items[2]->string;
    wraps = o->items[3]->kind == MP_JSON_BOOL && o->items[3]->boolean;
    break;
  }
  p->failed = 1;
  p->code = MLPACK_ERR_INDEX;
  mp_index_message(p->msg, sizeof p->msg, node, wraps, what, t->name, t->dims[axis], i, t->shape[axis]);
}

static double mp_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

static double mp_float_unary(int op, double x) {
  switch (op) {
  case OP_NEG: return -x;
  case OP_ABS: return fabs(x);
  case OP_EXP: return exp(x);
  case OP_LOG: return log(x);
  case OP_SQRT: return sqrt(x);
  case OP_SIN: return sin(x);
  case OP_COS: return cos(x);
  case OP_TAN: return tan(x);
  case OP_ASIN: return asin(x);
  case OP_ACOS: return acos(x);
  case OP_ATAN: return atan(x);
  case OP_SINH: return sinh(x);
  case OP_COSH: return cosh(x);
  case OP_TANH: return tanh(x);
  case OP_ASINH: return asinh(x);
  case OP_ACOSH: return acosh(x);
  case OP_ATANH: return atanh(x);
  case OP_ERF: return erf(x);
  case OP_FLOOR: return floor(x);
  case OP_CEIL: return ceil(x);
  case OP_ROUND: return nearbyint(x);  /* default rounding mode: half to even */
  case OP_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : x;
  case OP_RECIP: return 1.0 / x;
  case OP_SIGMOID: return mp_sigmoid(x);
  default: return NAN;
  }
}

static int64_t mp_int_unary(int op, int64_t x, int dt) {
  int u = mp_is_unsigned(dt);
  switch (op) {
  case OP_NEG: return (int64_t)(0 - (uint64_t)x);
  case OP_ABS: return (u || x >= 0) ? x : (int64_t)(0 - (uint64_t)x);
  case OP_FLOOR: case OP_CEIL: case OP_ROUND: return x;
  case OP_SIGN: return u ? x != 0 : (x > 0) - (x < 0);
  case OP_BITNOT: return dt == MLPACK_BOOL ? !x : ~x;
  case OP_RECIP: return x == 1 ? 1 : (x == -1 && !u) ? -1 : 0;  /* 1 // x truncated; 0 for 0 */
  default: return mp_f_to_i(mp_float_unary(op, mp_to_f((mp_val){.i = x}, dt)), dt);
  }
}

static mp_val mp_unary(int op, mp_val x, int xdt, int dt) {
  mp_val r;
  switch (op) {
  case OP_NOT: r.i = !mp_truth(x, xdt); return r;
  case OP_ISNAN: r.i = mp_is_float(xdt) && isnan(x.f); return r;
  case OP_ISINF: r.i = mp_is_float(xdt) && isinf(x.f); return r;
  default: break;
  }
  if (mp_is_float(dt)) r.f = mp_round_float(dt, mp_float_unary(op, x.f));
  else r.i = mp_wrap(dt, mp_int_unary(op, x.i, dt));
  return r;
}

/* numpy's npy_divmod: floor division and Python-style modulo on doubles */
static void mp_divmod(double a, double b, double *fdiv, double *fmodv) {
  double mod = fmod(a, b);
  if (b == 0) { *fdiv = a / b; *fmodv = mod; return; }
  double div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) { mod += b; div -= 1.0; }
  } else {
    mod = copysign(0.0, b);
  }
  double fl;
  if (div != 0) {
    fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
  } else {
    fl = copysign(0.0, a / b);
  }
  *fdiv = fl;
  *fmodv = mod;
}

static double mp_float_binary(int op, double a, double b) {
  double d, m;
  switch (op) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return a / b;
  case OP_FLOORDIV: mp_divmod(a, b, &d, &m); return d;
  case OP_MOD: mp_divmod(a, b, &d, &m); return m;
  case OP_FMOD: return fmod(a, b);
  case OP_POW: return pow(a, b);
  case OP_MAX: return (isnan(a) || isnan(b)) ? NAN : a > b ? a : b;
  case OP_MIN: return (isnan(a) || isnan(b)) ? NAN : a < b ? a : b;
  case OP_ATAN2: return atan2(a, b);
  case OP_EQ: return a == b;
  case OP_NE: return a != b;
  case OP_LT: return a < b;
  case OP_LE: return a <= b;
  case OP_GT: return a > b;
  case OP_GE: return a >= b;
  default: return NAN;
  }
}

static int64_t mp_int_div(int op, int64_t a, int64_t b, int u) {
  if (b == 0) return 0;
  if (u) {
    uint64_t x = (uint64_t)a, y = (uint64_t)b;
    return (int64_t)(op == OP_DIV || op == OP_FLOORDIV ? x / y : x % y);
  }
  if (b == -1) return (op == OP_DIV || op == OP_FLOORDIV) ? (int64_t)(0 - (uint64_t)a) : 0;
  int64_t q = a / b, r = a % b;
  if (op == OP_DIV) return q;
  if (op == OP_FMOD) return r;
  int adjust = r != 0 && ((r < 0) != (b < 0));
  if (op == OP_FLOORDIV) return adjust ? q - 1 : q;
  return adjust ? r + b : r;  /* mod */
}

static int64_t mp_int_shift(int op, int64_t a, int64_t b, int dt) {
  int w = mp_bits(dt);
  if (op == OP_SHL) return (b < 0 || b >= w) ? 0 : (int64_t)((uint64_t)a << b);
  if (b >= 0 && b < w) return mp_is_unsigned(dt) ? (int64_t)((uint64_t)a >> b) : a >> b;
  return (b < 0 && !mp_is_unsigned(dt) && a < 0) ? -1 : 0;  /* numpy's npy_rshift */
}

static int mp_int_less(int64_t a, int64_t b, int u) { return u ? (uint64_t)a < (uint64_t)b : a < b; }

static int64_t mp_int_binary(int op, int64_t a, int64_t b, int dt) {
  int u = mp_is_unsigned(dt);
  switch (op) {
  case OP_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case OP_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case OP_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case OP_DIV: case OP_FLOORDIV: case OP_MOD: case OP_FMOD: return mp_int_div(op, a, b, u);
  case OP_MAX: return mp_int_less(a, b, u) ? b : a;
  case OP_MIN: return mp_int_less(b, a, u) ? b : a;
  case OP_BITAND: return a & b;
  case OP_BITOR: return a | b;
  case OP_BITXOR: return a ^ b;
  case OP_SHL: case OP_SHR: return mp_int_shift(op, a, b, dt);
  case OP_EQ: return a == b;
  case OP_NE: return a != b;
  case OP_LT: return mp_int_less(a, b, u);
  case OP_LE: return !mp_int_less(b, a, u);
  case OP_GT: return mp_int_less(b, a, u);
  case OP_GE: return !mp_int_less(a, b, u);
  default: {  /* pow, atan2 on integers: computed in double (as NumPy's float64 detour) */
    mp_val x = {.i = a}, y = {.i = b};
    return mp_f_to_i(mp_float_binary(op, mp_to_f(x, dt), mp_to_f(y, dt)), dt);
  }
  }
}

static mp_val mp_binary(const mp_node *n, mp_val a, int adt, mp_val b, int bdt) {
  mp_val r;
  int op = n->op;
  switch (op) {
  case OP_AND: r.i = mp_truth(a, adt) && mp_truth(b, bdt); return r;
  case OP_OR: r.i = mp_truth(a, adt) || mp_truth(b, bdt); return r;
  case OP_XOR: r.i = mp_truth(a, adt) != mp_truth(b, bdt); return r;
  default: break;
  }
  int c = n->cdt;
  a = mp_convert(a, adt, c);
  b = mp_convert(b, bdt, c);
  if (mp_is_float(c) && !(op >= OP_BITAND && op <= OP_SHR)) {
    double v = mp_float_binary(op, a.f, b.f);
    if (MP_IS_CMP(op)) r.i = v != 0;
    else r.f = mp_round_float(n->dtype, v);
    return r;
  }
  r.i = mp_int_binary(op, a.i, b.i, c);
  if (!MP_IS_CMP(op)) r.i = mp_wrap(n->dtype, r.i);
  return r;
}

/* ---------------------------------------------------------------- evaluation */

static mp_val mp_eval(mp_portable *p, int32_t id);

static mp_val mp_read(mp_portable *p, const mp_node *n) {
  const mp_ptensor *t = &p->tensors[n->slot];
  int64_t off = 0;
  for (int32_t j = 0; j < n->count; j++) {
    int32_t ix = p->rix[n->first + j];
    int axis = p->rax[n->first + j];
    int64_t i = mp_to_index(mp_eval(p, ix), p->nodes[ix].dtype);
    if (i < 0 || i >= t->shape[axis]) {
      if (n->has_pad) return n->k;
      mp_index_error(p, t, axis, i, "read of");
      return (mp_val){.i = 0};
    }
    off += i * t->stride[axis];
  }
  if (!t->data) {
    mp_runtime_error(p, "read of %%%s, which has no value", t->name);
    return (mp_val){.i = 0};
  }
  return mp_load(t->data + off * (int64_t)mlpack_dtype_size((mlpack_dtype)t->dtype), t->dtype);
}

static mp_val mp_eval(mp_portable *p, int32_t id) {
  const mp_node *n = &p->nodes[id];
  switch (n->op) {
  case OP_CONST: return n->k;
  case OP_VAR: return p->vars[n->slot];
  case OP_SYM:
    if (!p->symset[n->slot]) mp_runtime_error(p, "unbound symbol $%s", p->syms[n->slot]);
    return (mp_val){.i = p->symv[n->slot]};
  case OP_READ: return mp_read(p, n);
  case OP_CAST: return mp_convert(mp_eval(p, n->a[0]), p->nodes[n->a[0]].dtype, n->dtype);
  case OP_SELECT: {
    int32_t pick = mp_truth(mp_eval(p, n->a[0]), p->nodes[n->a[0]].dtype) ? n->a[1] : n->a[2];
    return mp_convert(mp_eval(p, pick), p->nodes[pick].dtype, n->dtype);
  }
  default: break;
  }
  if (MP_IS_UNARY(n->op)) return mp_unary(n->op, mp_eval(p, n->a[0]), p->nodes[n->a[0]].dtype, n->dtype);
  mp_val a = mp_eval(p, n->a[0]), b = mp_eval(p, n->a[1]);
  return mp_binary(n, a, p->nodes[n->a[0]].dtype, b, p->nodes[n->a[1]].dtype);
}

/* ---------------------------------------------------------------- compiling */

typedef struct mp_cc {               /* compile context */
  mp_portable *p;
  mlpack_error **err;
  mlpack_status st;
  mp_scope *scope;
} mp_cc;

static int32_t mp_cfail(mp_cc *c, const char *fmt, const char *a) {
  if (c->st == MLPACK_OK) c->st = mp_fail(c->err, MLPACK_ERR_FORMAT, fmt, c->p->what, a);
  return -1;
}

static int32_t mp_new_node(mp_cc *c, int op, int dtype) {
  mp_portable *p = c->p;
  if (p->nn == p->ncap) {
    size_t cap = p->ncap ? p->ncap * 2 : 256;
    mp_node *nodes = realloc(p->nodes, cap * sizeof *nodes);
    if (!nodes) { if (c->st == MLPACK_OK) c->st = mp_fail(c->err, MLPACK_ERR_NOMEM, "out of memory"); return -1; }
    p->nodes = nodes;
    p->ncap = cap;
  }
  mp_node *n = &p->nodes[p->nn];
  memset(n, 0, sizeof *n);
  n->op = (uint8_t)op;
  n->dtype = (uint8_t)dtype;
  n->cdt = (uint8_t)dtype;
  return (int32_t)p->nn++;
}

static int mp_dtype_of(mp_cc *c, const mp_json *j, int *out) {
  mlpack_dtype dt;
  if (!j || j->kind != MP_JSON_STRING || mp_dtype_from_name(j->string, &dt) != 0) {
    mp_cfail(c, "%s: dtype %s is not supported by the C interpreter",
             j && j->kind == MP_JSON_STRING ? j->string : "(missing)");
    return -1;
  }
  *out = (int)dt;
  return 0;
}

static const char *mp_strip(const char *s) { return s[0] == '$' ? s + 1 : s; }

static int32_t mp_sym_slot(mp_cc *c, const char *name) {
  mp_portable *p = c->p;
  name = mp_strip(name);
  for (size_t i = 0; i < p->nsym; i++)
    if (strcmp(p->syms[i], name) == 0) return (int32_t)i;
  if (p->nsym == p->scap) {
    size_t cap = p->scap ? p->scap * 2 : 16;
    const char **s = realloc(p->syms, cap * sizeof *s);
    if (!s) return mp_cfail(c, "%s: out of memory%s", "");
    p->syms = s;
    p->scap = cap;
  }
  p->syms[p->nsym] = name;
  return (int32_t)p->nsym++;
}

static int32_t mp_tensor_find(const mp_portable *p, const char *name) {
  for (size_t i = 0; i < p->nt; i++)
    if (strcmp(p->tensors[i].name, name) == 0) return (int32_t)i;
  return -1;
}

static int mp_axis_of(const mp_ptensor *t, const char *dim) {
  for (size_t a = 0; a < t->rank; a++)
    if (strcmp(t->dims[a], dim) == 0) return (int)a;
  return -1;
}

static int32_t mp_var_slot(mp_cc *c, const char *name, int declare) {
  mp_scope *s = c->scope;
  for (size_t i = 0; s && i < s->n; i++)
    if (strcmp(s->names[i], name) == 0) return (int32_t)i;
  if (!s || !(declare || s->dynamic)) return mp_cfail(c, "%s: unbound variable %s", name);
  if (s->n == sizeof s->names / sizeof s->names[0]) return mp_cfail(c, "%s: too many variables (at %s)", name);
  s->names[s->n] = name;
  return (int32_t)s->n++;
}

static int32_t mp_cx(mp_cc *c, const mp_json *j);

static int mp_const_value(mp_cc *c, const mp_json *v, int dt, mp_val *out) {
  double f;
  if (v->kind == MP_JSON_BOOL) { out->i = v->boolean; *out = mp_convert(*out, MLPACK_BOOL, dt); return 0; }
  if (v->kind == MP_JSON_NUMBER && v->is_int && !mp_is_float(dt)) { out->i = mp_wrap(dt, v->integer); return 0; }
  if (v->kind == MP_JSON_NUMBER) f = v->number;
  else if (v->kind == MP_JSON_STRING && strcmp(v->string, "inf") == 0) f = INFINITY;
  else if (v->kind == MP_JSON_STRING && strcmp(v->string, "-inf") == 0) f = -INFINITY;
  else if (v->kind == MP_JSON_STRING && strcmp(v->string, "nan") == 0) f = NAN;
  else { mp_cfail(c, "%s: bad constant%s", ""); return -1; }
  out->f = f;
  *out = mp_convert(*out, MLPACK_F64, dt);
  return 0;
}

static int32_t mp_cx_const(mp_cc *c, const mp_json *j) {
  int dt;
  if (j->length != 3 || mp_dtype_of(c, j->items[2], &dt)) return mp_cfail(c, "%s: malformed constant%s", "");
  int32_t id = mp_new_node(c, OP_CONST, dt);
  if (id < 0 || mp_const_value(c, j->items[1], dt, &c->p->nodes[id].k)) return -1;
  return id;
}

static int32_t mp_cx_var(mp_cc *c, const mp_json *j) {
  int dt = MLPACK_I64;
  if (j->length < 2 || j->items[1]->kind != MP_JSON_STRING) return mp_cfail(c, "%s: malformed variable%s", "");
  if (j->length > 2 && mp_dtype_of(c, j->items[2], &dt)) return -1;
  int32_t slot = mp_var_slot(c, j->items[1]->string, 0);
  if (slot < 0) return -1;
  int32_t id = mp_new_node(c, OP_VAR, dt);
  if (id >= 0) c->p->nodes[id].slot = slot;
  return id;
}

static int mp_push_index(mp_cc *c, int32_t node, int axis) {
  mp_portable *p = c->p;
  if (p->nr == p->rcap) {
    size_t cap = p->rcap ? p->rcap * 2 : 64;
    int32_t *rix = realloc(p->rix, cap * sizeof *rix);
    if (rix) p->rix = rix;
    int8_t *rax = realloc(p->rax, cap * sizeof *rax);
    if (rax) p->rax = rax;
    if (!rix || !rax) { mp_cfail(c, "%s: out of memory%s", ""); return -1; }
    p->rcap = cap;
  }
  p->rix[p->nr] = node;
  p->rax[p->nr] = (int8_t)axis;
  p->nr++;
  return 0;
}

/* ["r", tensor, [dims], [index EXPRs], pad] */
static int32_t mp_cx_read(mp_cc *c, const mp_json *j) {
  mp_portable *p = c->p;
  if (j->length != 5 || j->items[1]->kind != MP_JSON_STRING || j->items[2]->kind != MP_JSON_ARRAY ||
      j->items[3]->kind != MP_JSON_ARRAY || j->items[2]->length != j->items[3]->length)
    return mp_cfail(c, "%s: malformed read%s", "");
  int32_t t = mp_tensor_find(p, j->items[1]->string);
  if (t < 0) return mp_cfail(c, "%s: read of undeclared tensor %%%s", j->items[1]->string);
  const mp_json *dims = j->items[2], *ix = j->items[3];
  if (dims->length != p->tensors[t].rank)
    return mp_cfail(c, "%s: read of %%%s with the wrong number of dims", p->tensors[t].name);
  int32_t args[MP_RANK];
  int axes[MP_RANK];
  for (size_t k = 0; k < dims->length; k++) {
    if (dims->items[k]->kind != MP_JSON_STRING ||
        (axes[k] = mp_axis_of(&p->tensors[t], dims->items[k]->string)) < 0)
      return mp_cfail(c, "%s: read of %%%s names a dim it does not have", p->tensors[t].name);
    if ((args[k] = mp_cx(c, ix->items[k])) < 0) return -1;
  }
  int32_t first = (int32_t)p->nr;
  for (size_t k = 0; k < dims->length; k++)
    if (mp_push_index(c, args[k], axes[k])) return -1;
  int dt = p->tensors[t].dtype;
  int32_t id = mp_new_node(c, OP_READ, dt);
  if (id < 0) return -1;
  mp_node *n = &p->nodes[id];
  n->slot = t;
  n->first = first;
  n->count = (int32_t)dims->length;
  if (j->items[4]->kind != MP_JSON_NULL) {
    n->has_pad = 1;
    if (mp_const_value(c, j->items[4], dt, &p->nodes[id].k)) return -1;
  }
  return id;
}

static int mp_op_lookup(const char *name) {
  for (int op = OP_CAST; op < OP_COUNT; op++)
    if (strcmp(mp_op_names[op], name) == 0) return op;
  return -1;
}

static int32_t mp_cx_op(mp_cc *c, const mp_json *j, int op) {
  int32_t args[3];
  size_t want = op == OP_SELECT ? 3 : MP_IS_UNARY(op) ? 1 : 2;
  if (op == OP_CAST) {
    int dt;
    if (j->length != 3 || mp_dtype_of(c, j->items[1], &dt)) return mp_cfail(c, "%s: malformed cast%s", "");
    if ((args[0] = mp_cx(c, j->items[2])) < 0) return -1;
    int32_t id = mp_new_node(c, OP_CAST, dt);
    if (id >= 0) c->p->nodes[id].a[0] = args[0];
    return id;
  }
  if (j->length != want + 1) return mp_cfail(c, "%s: wrong operand count for %s", mp_op_names[op]);
  for (size_t k = 0; k < want; k++)
    if ((args[k] = mp_cx(c, j->items[k + 1])) < 0) return -1;
  const mp_node *nodes = c->p->nodes;
  int dt, cdt;
  if (op == OP_SELECT) dt = cdt = mp_promote(nodes[args[1]].dtype, nodes[args[2]].dtype);
  else if (MP_IS_UNARY(op)) dt = cdt = (op == OP_NOT || op == OP_ISNAN || op == OP_ISINF) ? MLPACK_BOOL : nodes[args[0]].dtype;
  else {
    cdt = mp_promote(nodes[args[0]].dtype, nodes[args[1]].dtype);
    dt = (MP_IS_CMP(op) || MP_IS_LOGICAL(op)) ? MLPACK_BOOL : cdt;
  }
  int32_t id = mp_new_node(c, op, dt);
  if (id < 0) return -1;
  c->p->nodes[id].cdt = (uint8_t)cdt;
  memcpy(c->p->nodes[id].a, args, sizeof args);
  return id;
}

static int32_t mp_cx(mp_cc *c, const mp_json *j) {
  if (c->st != MLPACK_OK || !j) return mp_cfail(c, "%s: missing expression%s", "");
  if (j->kind == MP_JSON_NUMBER && j->is_int) {
    int32_t id = mp_new_node(c, OP_CONST, MLPACK_I64);
    if (id >= 0) c->p->nodes[id].k.i = j->integer;
    return id;
  }
  if (j->kind == MP_JSON_STRING && j->string[0] == '$') {
    int32_t s = mp_sym_slot(c, j->string), id = s < 0 ? -1 : mp_new_node(c, OP_SYM, MLPACK_I64);
    if (id >= 0) c->p->nodes[id].slot = s;
    return id;
  }
  if (j->kind != MP_JSON_ARRAY || j->length == 0 || j->items[0]->kind != MP_JSON_STRING)
    return mp_cfail(c, "%s: bad expression%s", "");
  const char *name = j->items[0]->string;
  if (strcmp(name, "c") == 0) return mp_cx_const(c, j);
  if (strcmp(name, "v") == 0) return mp_cx_var(c, j);
  if (strcmp(name, "r") == 0) return mp_cx_read(c, j);
  int op = mp_op_lookup(name);
  if (op < 0) return mp_cfail(c, "%s: unknown operation '%s'", name);
  return mp_cx_op(c, j, op);
}

/* ---------------------------------------------------------------- tensors */

static int32_t mp_add_tensor(mp_cc *c, const char *name, int dtype, int kind) {
  mp_portable *p = c->p;
  if (mp_tensor_find(p, name) >= 0) return mp_cfail(c, "%s: tensor %%%s is defined twice", name);
  if (p->nt == p->tcap) {
    size_t cap = p->tcap ? p->tcap * 2 : 64;
    mp_ptensor *t = realloc(p->tensors, cap * sizeof *t);
    if (!t) return mp_cfail(c, "%s: out of memory%s", "");
    p->tensors = t;
    p->tcap = cap;
  }
  mp_ptensor *t = &p->tensors[p->nt];
  memset(t, 0, sizeof *t);
  t->name = name;
  t->dtype = (uint8_t)dtype;
  t->kind = kind;
  t->last_use = -1;
  return (int32_t)p->nt++;
}

/* {"name", "dtype", "dims": [[name, EXPR]...]}: a tensor with its dims in the listed order */
static int32_t mp_declare(mp_cc *c, const mp_json *j, int kind, const char *name) {
  int dt;
  const mp_json *dims = mp_json_get(j, "dims");
  if (!name) name = mp_json_get_string(j, "name");
  if (!name || !dims || dims->kind != MP_JSON_ARRAY || mp_dtype_of(c, mp_json_get(j, "dtype"), &dt))
    return mp_cfail(c, "%s: malformed tensor declaration %s", name ? name : "");
  if (dims->length > MP_RANK) return mp_cfail(c, "%s: tensor %%%s has more than 16 dims", name);
  int32_t t = mp_add_tensor(c, name, dt, kind);
  for (size_t k = 0; t >= 0 && k < dims->length; k++) {
    const mp_json *d = dims->items[k];
    if (d->kind != MP_JSON_ARRAY || d->length != 2 || d->items[0]->kind != MP_JSON_STRING)
      return mp_cfail(c, "%s: malformed dims of %%%s", name);
    int32_t size = mp_cx(c, d->items[1]);
    if (size < 0) return -1;
    mp_ptensor *tt = &c->p->tensors[t];
    tt->dims[k] = d->items[0]->string;
    tt->size[k] = size;
    tt->rank = k + 1;
  }
  return t;
}

static size_t mp_sig_index(const mp_sig *sigs, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(sigs[i].name, name) == 0) return i;
  return n;
}

/* Whether the signature's dim names are the tensor's, in any order (then map by name). */
static int mp_same_names(const mp_sig *s, const mp_ptensor *t) {
  if (s->rank != t->rank) return 0;
  for (size_t d = 0; d < s->rank; d++)
    if (!s->dim_names[d] || mp_axis_of(t, s->dim_names[d]) < 0) return 0;
  return 1;
}

/* A program input: stored in the signature's order, which names the same dims (or, when the
 * names differ, is the program's layout positionally). */
static mlpack_status mp_compile_input(mp_cc *c, const mp_json *j) {
  mp_portable *p = c->p;
  int32_t t = mp_declare(c, j, T_INPUT, NULL);
  if (t < 0) return c->st;
  mp_ptensor *tt = &p->tensors[t];
  size_t k = mp_sig_index(p->model->inputs, p->model->input_count, tt->name);
  if (k == p->model->input_count)
    return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: program input '%s' is not in the signature", p->what, tt->name);
  const mp_sig *s = &p->model->inputs[k];
  if (s->dtype != tt->dtype || s->rank != tt->rank)
    return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: program input '%s' does not match the signature's dtype and rank",
                   p->what, tt->name);
  if (mp_same_names(s, tt)) {
    const char *dims[MP_RANK];
    int32_t size[MP_RANK];
    for (size_t d = 0; d < s->rank; d++) {
      int a = mp_axis_of(tt, s->dim_names[d]);
      dims[d] = tt->dims[a];
      size[d] = tt->size[a];
    }
    memcpy(tt->dims, dims, sizeof dims);
    memcpy(tt->size, size, sizeof size);
  }
  p->inputs[k].tensor = t;
  return MLPACK_OK;
}

static mlpack_status mp_compile_constant(mp_cc *c, const mp_json *j) {
  mp_portable *p = c->p;
  int32_t t = mp_declare(c, j, T_CONST, NULL);
  if (t < 0) return c->st;
  mp_ptensor *tt = &p->tensors[t];
  const mp_tensor_entry *e = p->have_weights ? mp_tensors_find(&p->weights, tt->name) : NULL;
  if (!e) return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: constant '%s' is missing from the weights", p->what, tt->name);
  int ok = e->dtype == tt->dtype && e->rank == tt->rank;
  int64_t stride = 1;
  for (size_t d = tt->rank; ok && d-- > 0;) {
    const mp_node *n = &p->nodes[tt->size[d]];
    ok = n->op == OP_CONST && n->k.i == e->shape[d];
    tt->shape[d] = e->shape[d];
    tt->stride[d] = stride;
    stride *= e->shape[d];
  }
  if (!ok)
    return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: constant '%s': the weights hold a different dtype or shape",
                   p->what, tt->name);
  tt->data = (uint8_t *)e->data;  /* in the mapping; never written (stores go to procedure tensors) */
  return MLPACK_OK;
}

static const char *const mp_reduce_names[] = {"", "sum", "prod", "max", "min", "argmax", "argmin",
                                              "argmax_last", "argmin_last"};

static mlpack_status mp_compile_comprehension(mp_cc *c, const mp_json *j, mp_pop *op) {
  mp_portable *p = c->p;
  const mp_json *rd = mp_json_get(j, "rdims"), *red = mp_json_get(j, "reduce");
  int32_t t = mp_declare(c, j, T_OP, mp_json_get_string(j, "out"));
  if (t < 0) return c->st;
  op->out = t;
  op->reduce = R_NONE;
  if (red && red->kind == MP_JSON_STRING) {
    for (int r = R_SUM; r <= R_ARGMIN_LAST; r++)
      if (strcmp(red->string, mp_reduce_names[r]) == 0) op->reduce = r;
    if (op->reduce == R_NONE) return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: unknown reduction '%s'", p->what, red->string);
  }
  mp_scope *scope = c->scope;
  scope->n = 0;
  scope->dynamic = 0;
  for (size_t k = 0; k < p->tensors[t].rank; k++) scope->names[scope->n++] = p->tensors[t].dims[k];
  size_t nred = rd && rd->kind == MP_JSON_ARRAY ? rd->length : 0;
  if (nred > MP_RANK) return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: %%%s has more than 16 reduction dims", p->what, p->tensors[t].name);
  if (op->reduce >= R_ARGMAX && nred != 1)
    return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: %%%s: %s needs exactly one reduction dim", p->what,
                   p->tensors[t].name, mp_reduce_names[op->reduce]);
  for (size_t k = 0; k < nred; k++) {
    const mp_json *d = rd->items[k];
    if (d->kind != MP_JSON_ARRAY || d->length != 2 || d->items[0]->kind != MP_JSON_STRING)
      return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: malformed rdims of %%%s", p->what, p->tensors[t].name);
    if ((op->rsize[k] = mp_cx(c, d->items[1])) < 0) return c->st;
    scope->names[scope->n++] = d->items[0]->string;
  }
  op->nred = nred;
  op->body = mp_cx(c, mp_json_get(j, "body"));
  return c->st;
}

static mlpack_status mp_compile_stmts(mp_cc *c, const mp_json *list, mp_stmt **out, size_t *n);

static int32_t mp_store_target(mp_cc *c, const mp_json *s, mp_stmt *st) {
  mp_portable *p = c->p;
  const mp_json *ix = s->items[2];
  int32_t t = s->items[1]->kind == MP_JSON_STRING ? mp_tensor_find(p, s->items[1]->string) : -1;
  if (t < 0 || (p->tensors[t].kind != T_OP && p->tensors[t].kind != T_LOCAL))
    return mp_cfail(c, "%s: store to %s, which is not a procedure's tensor",
                    s->items[1]->kind == MP_JSON_STRING ? s->items[1]->string : "?");
  if (ix->kind != MP_JSON_ARRAY || ix->length != p->tensors[t].rank)
    return mp_cfail(c, "%s: store to %%%s with the wrong number of dims", p->tensors[t].name);
  for (size_t k = 0; k < ix->length; k++) {
    const mp_json *d = ix->items[k];
    int axis = d->kind == MP_JSON_ARRAY && d->length == 2 && d->items[0]->kind == MP_JSON_STRING
                   ? mp_axis_of(&p->tensors[t], d->items[0]->string) : -1;
    if (axis < 0) return mp_cfail(c, "%s: store to %%%s names a dim it does not have", p->tensors[t].name);
    if ((st->idx[axis] = mp_cx(c, d->items[1])) < 0) return -1;
  }
  return t;
}

static mlpack_status mp_compile_stmt(mp_cc *c, const mp_json *s, mp_stmt *st) {
  const char *kind = s->kind == MP_JSON_ARRAY && s->length > 1 && s->items[0]->kind == MP_JSON_STRING ? s->items[0]->string : "";
  int named = s->length > 1 && s->items[1]->kind == MP_JSON_STRING;
  if (strcmp(kind, "let") == 0 && s->length == 3 && named) {
    st->kind = S_LET;
    st->expr = mp_cx(c, s->items[2]);
    st->slot = mp_var_slot(c, s->items[1]->string, 1);
  } else if (strcmp(kind, "store") == 0 && s->length == 4) {
    st->kind = S_STORE;
    st->slot = mp_store_target(c, s, st);
    if (st->slot >= 0) st->expr = mp_cx(c, s->items[3]);
  } else if (strcmp(kind, "for") == 0 && s->length == 4 && named) {
    st->kind = S_FOR;
    st->expr = mp_cx(c, s->items[2]);
    st->slot = mp_var_slot(c, s->items[1]->string, 1);
    if (c->st == MLPACK_OK) mp_compile_stmts(c, s->items[3], &st->body, &st->nbody);
  } else if (strcmp(kind, "while") == 0 && s->length == 3) {
    st->kind = S_WHILE;
    st->expr = mp_cx(c, s->items[1]);
    if (c->st == MLPACK_OK) mp_compile_stmts(c, s->items[2], &st->body, &st->nbody);
  } else if (strcmp(kind, "if") == 0 && s->length == 4) {
    st->kind = S_IF;
    st->expr = mp_cx(c, s->items[1]);
    if (c->st == MLPACK_OK) mp_compile_stmts(c, s->items[2], &st->body, &st->nbody);
    if (c->st == MLPACK_OK) mp_compile_stmts(c, s->items[3], &st->orelse, &st->nelse);
  } else if (strcmp(kind, "size") == 0 && s->length == 3 && named) {
    st->kind = S_SIZE;
    st->slot = mp_sym_slot(c, s->items[1]->string);
    st->expr = mp_cx(c, s->items[2]);
  } else {
    mp_cfail(c, "%s: unknown or malformed statement '%s'", kind);
  }
  return c->st;
}

static mlpack_status mp_compile_stmts(mp_cc *c, const mp_json *list, mp_stmt **out, size_t *n) {
  if (!list || list->kind != MP_JSON_ARRAY) { mp_cfail(c, "%s: a statement list is not a list%s", ""); return c->st; }
  *out = calloc(list->length + 1, sizeof **out);
  if (!*out) return mp_fail(c->err, MLPACK_ERR_NOMEM, "out of memory");
  *n = list->length;
  for (size_t i = 0; i < list->length && c->st == MLPACK_OK; i++) mp_compile_stmt(c, list->items[i], &(*out)[i]);
  return c->st;
}

static mlpack_status mp_compile_proc_tensors(mp_cc *c, const mp_json *list, int kind, mp_pop *op) {
  for (size_t i = 0; list && list->kind == MP_JSON_ARRAY && i < list->length; i++) {
    int32_t t = mp_declare(c, list->items[i], kind, NULL);
    if (t < 0) return c->st;
    if (kind == T_LOCAL) op->tensors[op->nresults + op->nlocals++] = t;
    else op->tensors[op->nresults++] = t;
  }
  return c->st;
}

static mlpack_status mp_compile_procedure(mp_cc *c, const mp_json *j, mp_pop *op) {
  const mp_json *res = mp_json_get(j, "results"), *loc = mp_json_get(j, "locals"), *bounds = mp_json_get(j, "bounds");
  size_t n = (res && res->kind == MP_JSON_ARRAY ? res->length : 0) + (loc && loc->kind == MP_JSON_ARRAY ? loc->length : 0);
  size_t nb = bounds && bounds->kind == MP_JSON_ARRAY ? bounds->length : 0;
  op->is_proc = 1;
  op->tensors = calloc(n + 1, sizeof *op->tensors);
  op->bound_sym = calloc(nb + 1, sizeof *op->bound_sym);
  op->bound_node = calloc(nb + 1, sizeof *op->bound_node);
  if (!op->tensors || !op->bound_sym || !op->bound_node) return mp_fail(c->err, MLPACK_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < nb && c->st == MLPACK_OK; i++) {
    const mp_json *b = bounds->items[i];
    if (b->kind != MP_JSON_ARRAY || b->length != 2 || b->items[0]->kind != MP_JSON_STRING) {
      mp_cfail(c, "%s: malformed procedure bounds%s", "");
      break;
    }
    op->bound_sym[i] = mp_sym_slot(c, b->items[0]->string);
    op->bound_node[i] = mp_cx(c, b->items[1]);
    op->nbounds = i + 1;
  }
  c->scope->n = 0;
  c->scope->dynamic = 1;
  if (c->st == MLPACK_OK) mp_compile_proc_tensors(c, res, T_OP, op);
  if (c->st == MLPACK_OK) mp_compile_proc_tensors(c, loc, T_LOCAL, op);
  if (c->st == MLPACK_OK) mp_compile_stmts(c, mp_json_get(j, "body"), &op->stmts, &op->nstmts);
  return c->st;
}

/* Which op reads each tensor last (nodes of op i are [begin[i], begin[i+1])). */
static void mp_last_uses(mp_portable *p, const size_t *begin) {
  for (size_t i = 0; i < p->nops; i++)
    for (size_t k = begin[i]; k < begin[i + 1]; k++)
      if (p->nodes[k].op == OP_READ) p->tensors[p->nodes[k].slot].last_use = (long)i;
}

static mlpack_status mp_compile_ops(mp_cc *c, const mp_json *ops) {
  mp_portable *p = c->p;
  p->ops = calloc(ops->length + 1, sizeof *p->ops);
  size_t *begin = calloc(ops->length + 2, sizeof *begin);
  if (!p->ops || !begin) { free(begin); return mp_fail(c->err, MLPACK_ERR_NOMEM, "out of memory"); }
  for (size_t i = 0; i < ops->length && c->st == MLPACK_OK; i++) {
    const mp_json *o = ops->items[i], *proc = mp_json_get(o, "proc");
    begin[i] = p->nn;
    p->nops = i + 1;
    if (proc) mp_compile_procedure(c, proc, &p->ops[i]);
    else mp_compile_comprehension(c, o, &p->ops[i]);
    if (c->scope->n > p->nvars) p->nvars = c->scope->n;
  }
  begin[p->nops] = p->nn;
  if (c->st == MLPACK_OK) mp_last_uses(p, begin);
  free(begin);
  return c->st;
}

/* The signature's outputs: each is a program output (a tensor), read in the signature's order. */
static mlpack_status mp_compile_outputs(mp_cc *c, const mp_json *outs) {
  mp_portable *p = c->p;
  for (size_t i = 0; i < p->model->output_count; i++) {
    const mp_sig *s = &p->model->outputs[i];
    const mp_json *port = NULL;
    for (size_t k = 0; k < outs->length && !port; k++)
      if (mp_json_get_string(outs->items[k], "name") && strcmp(mp_json_get_string(outs->items[k], "name"), s->name) == 0)
        port = outs->items[k];
    int32_t t = port ? mp_tensor_find(p, s->name) : -1;
    if (t < 0) return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: signature output '%s' is not a program output", p->what, s->name);
    mp_ptensor *tt = &p->tensors[t];
    const mp_json *layout = mp_json_get(port, "layout");
    if (tt->dtype != s->dtype || tt->rank != s->rank || !layout || layout->kind != MP_JSON_ARRAY || layout->length != s->rank)
      return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: output '%s' does not match the signature's dtype and rank", p->what, s->name);
    int same = mp_same_names(s, tt);
    for (size_t d = 0; d < s->rank; d++) {
      const char *name = same ? s->dim_names[d] : layout->items[d]->kind == MP_JSON_STRING ? layout->items[d]->string : "";
      int a = mp_axis_of(tt, name);
      if (a < 0) return mp_fail(c->err, MLPACK_ERR_FORMAT, "%s: output '%s' layout names an unknown dim", p->what, s->name);
      p->outputs[i].axis[d] = (int8_t)a;
    }
    p->outputs[i].tensor = t;
    tt->is_output = 1;
  }
  return MLPACK_OK;
}

static mlpack_status mp_compile_program(mp_portable *p, const mp_json *root, mlpack_error **err) {
  mp_scope *scope = calloc(1, sizeof *scope);
  mp_cc c = {.p = p, .err = err, .st = MLPACK_OK, .scope = scope};
  if (!scope) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  const mp_json *version = mp_json_get(root, "version");
  const char *format = mp_json_get_string(root, "program");
  const mp_json *ins = mp_json_get(root, "inputs"), *consts = mp_json_get(root, "constants"),
                *ops = mp_json_get(root, "ops"), *outs = mp_json_get(root, "outputs");
  if (!format || strcmp(format, "mlpack.portable") != 0)
    c.st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: not a portable program (missing 'program': 'mlpack.portable')", p->what);
  else if (!version || version->kind != MP_JSON_ARRAY || version->length < 1 || !version->items[0]->is_int)
    c.st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: portable program has no version", p->what);
  else if (version->items[0]->integer > 1)
    c.st = mp_fail(err, MLPACK_ERR_VERSION, "%s: portable program version %lld is newer than this runtime reads (1.x)",
                   p->what, (long long)version->items[0]->integer);
  else if (!ins || ins->kind != MP_JSON_ARRAY || !consts || consts->kind != MP_JSON_ARRAY || !ops ||
           ops->kind != MP_JSON_ARRAY || !outs || outs->kind != MP_JSON_ARRAY)
    c.st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: portable program lacks inputs, constants, ops or outputs", p->what);
  for (size_t i = 0; c.st == MLPACK_OK && i < ins->length; i++) c.st = mp_compile_input(&c, ins->items[i]);
  for (size_t i = 0; c.st == MLPACK_OK && i < p->model->input_count; i++)
    if (p->inputs[i].tensor < 0)
      c.st = mp_fail(err, MLPACK_ERR_FORMAT, "%s: signature input '%s' is not a program input", p->what, p->model->inputs[i].name);
  for (size_t i = 0; c.st == MLPACK_OK && i < consts->length; i++) c.st = mp_compile_constant(&c, consts->items[i]);
  const mp_json *origins = c.st == MLPACK_OK ? mp_json_get(root, "origins") : NULL;
  p->origins = origins && origins->kind == MP_JSON_ARRAY ? origins : NULL;
  if (c.st == MLPACK_OK) mp_compile_ops(&c, ops);
  if (c.st == MLPACK_OK) c.st = mp_compile_outputs(&c, outs);
  free(scope);
  return c.st;
}

/* ---------------------------------------------------------------- running */

static mlpack_status mp_rt_fail(mp_portable *p, mlpack_error **err) {
  return mp_fail(err, p->code ? p->code : MLPACK_ERR_RUNTIME, "%s: %s", p->what, p->msg);
}

static int64_t mp_eval_size(mp_portable *p, int32_t node) {
  int64_t v = mp_to_index(mp_eval(p, node), p->nodes[node].dtype);
  if (v < 0) mp_runtime_error(p, "a size is negative (%lld)", (long long)v);
  return v;
}

static void mp_free_data(mp_ptensor *t) {
  if (t->owned) free(t->data);
  t->data = NULL;
  t->owned = 0;
}

/* Allocate t contiguous in its storage order with the given shape (zeroed: procedures rely on it). */
static mlpack_status mp_alloc_tensor(mp_portable *p, mp_ptensor *t, const int64_t *shape, mlpack_error **err) {
  size_t es = mlpack_dtype_size((mlpack_dtype)t->dtype), n = 1;
  for (size_t d = t->rank; d-- > 0;) {
    t->shape[d] = shape[d];
    t->stride[d] = (int64_t)n;
    if (shape[d] != 0 && n > SIZE_MAX / 2 / es / (uint64_t)shape[d])
      return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: tensor %%%s is too large", p->what, t->name);
    n *= (size_t)shape[d];
  }
  mp_free_data(t);
  t->data = calloc(n ? n : 1, es);
  if (!t->data) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: cannot allocate %%%s (%zu bytes)", p->what, t->name, n * es);
  t->owned = 1;
  return MLPACK_OK;
}

static mlpack_status mp_bind_inputs(mp_portable *p, const mp_run *run, mlpack_error **err) {
  memset(p->symset, 0, p->nsym);
  for (size_t i = 0; i < p->nsym; i++)
    for (size_t k = 0; k < run->sym_count; k++)
      if (strcmp(p->syms[i], mp_strip(run->sym_names[k])) == 0) { p->symv[i] = run->sym_values[k]; p->symset[i] = 1; }
  for (size_t i = 0; i < p->model->input_count; i++) {
    mp_ptensor *t = &p->tensors[p->inputs[i].tensor];
    int64_t stride = 1;
    for (size_t d = t->rank; d-- > 0;) {
      t->shape[d] = run->in_shapes[i * 8 + d];
      t->stride[d] = stride;
      stride *= t->shape[d];
      const mp_node *n = &p->nodes[t->size[d]];
      if (n->op == OP_SYM && !p->symset[n->slot]) { p->symv[n->slot] = t->shape[d]; p->symset[n->slot] = 1; }
    }
    t->data = (uint8_t *)run->inputs[i];
  }
  for (size_t i = 0; i < p->model->input_count; i++) {  /* the rest must agree */
    const mp_ptensor *t = &p->tensors[p->inputs[i].tensor];
    for (size_t d = 0; d < t->rank; d++) {
      int64_t want = mp_eval_size(p, t->size[d]);
      if (p->failed) return mp_rt_fail(p, err);
      if (want != t->shape[d])
        return mp_fail(err, MLPACK_ERR_INPUT, "input '%s' dim '%s' is %lld, expected %lld", t->name, t->dims[d],
                       (long long)t->shape[d], (long long)want);
    }
  }
  return MLPACK_OK;
}

/* advance a row-major counter over vars[lo..hi) with extents ext; 0 when it wraps around */
static int mp_next(mp_val *vars, const int64_t *ext, size_t lo, size_t hi) {
  for (size_t k = hi; k-- > lo;) {
    if (++vars[k].i < ext[k]) return 1;
    vars[k].i = 0;
  }
  return 0;
}

static int mp_empty(const int64_t *ext, size_t lo, size_t hi) {
  for (size_t k = lo; k < hi; k++)
    if (ext[k] == 0) return 1;
  return 0;
}

static mp_val mp_reduce_sum(mp_portable *p, const mp_pop *op, const int64_t *ext, size_t lo, size_t hi, int dt) {
  int bdt = p->nodes[op->body].dtype, prod = op->reduce == R_PROD;
  double f = prod ? 1.0 : 0.0;
  uint64_t i = prod ? 1 : 0;
  if (!mp_empty(ext, lo, hi)) do {
    mp_val v = mp_eval(p, op->body);
    if (mp_is_float(dt)) f = prod ? f * mp_to_f(v, bdt) : f + mp_to_f(v, bdt);
    else i = prod ? i * (uint64_t)mp_convert(v, bdt, MLPACK_I64).i : i + (uint64_t)mp_convert(v, bdt, MLPACK_I64).i;
  } while (mp_next(p->vars, ext, lo, hi));
  mp_val r;
  if (mp_is_float(dt)) r.f = mp_round_float(dt, f);
  else r.i = mp_wrap(dt, (int64_t)i);
  return r;
}

/* a > b (max) or a < b (min) in dtype dt; NaN wins (NumPy propagates it) */
static int mp_better(mp_val a, mp_val b, int dt, int max) {
  if (mp_is_float(dt)) {
    if (isnan(b.f)) return 0;
    if (isnan(a.f)) return 1;
    return max ? a.f > b.f : a.f < b.f;
  }
  int u = mp_is_unsigned(dt);
  return max ? mp_int_less(b.i, a.i, u) : mp_int_less(a.i, b.i, u);
}

static mp_val mp_reduce_minmax(mp_portable *p, const mp_pop *op, const int64_t *ext, size_t lo, size_t hi) {
  int dt = p->nodes[op->body].dtype, max = op->reduce == R_MAX;
  mp_val acc;  /* the identity: lowest (max) or highest (min) value of the dtype */
  if (mp_is_float(dt)) acc.f = max ? -INFINITY : INFINITY;
  else if (mp_is_unsigned(dt)) acc.i = max ? 0 : mp_wrap(dt, -1);  /* bool: 1; u64: all ones */
  else if (mp_bits(dt) == 64) acc.i = max ? INT64_MIN : INT64_MAX;
  else acc.i = max ? -((int64_t)1 << (mp_bits(dt) - 1)) : ((int64_t)1 << (mp_bits(dt) - 1)) - 1;
  if (mp_empty(ext, lo, hi)) return acc;
  do {
    mp_val v = mp_eval(p, op->body);
    if (mp_better(v, acc, dt, max)) acc = v;
  } while (mp_next(p->vars, ext, lo, hi));
  return acc;
}

static mp_val mp_reduce_arg(mp_portable *p, const mp_pop *op, const int64_t *ext, size_t k) {
  int dt = p->nodes[op->body].dtype;
  int max = op->reduce == R_ARGMAX || op->reduce == R_ARGMAX_LAST;
  int last = op->reduce == R_ARGMAX_LAST || op->reduce == R_ARGMIN_LAST;
  mp_val best = {.i = 0}, r = {.i = 0};
  if (ext[k] == 0) {
    mp_runtime_error(p, "%%%s: %s over an empty dim", p->tensors[op->out].name, mp_reduce_names[op->reduce]);
    return r;
  }
  for (int64_t i = 0; i < ext[k]; i++) {
    p->vars[k].i = i;
    mp_val v = mp_eval(p, op->body);
    int nan_best = mp_is_float(dt) && isnan(best.f);
    int take = i == 0 || mp_better(v, best, dt, max) ||
               (last && (nan_best ? isnan(v.f) : !mp_better(best, v, dt, max)));
    if (take) { best = v; r.i = i; }
  }
  return r;
}

static mlpack_status mp_run_comprehension(mp_portable *p, const mp_pop *op, mlpack_error **err) {
  mp_ptensor *t = &p->tensors[op->out];
  int64_t ext[MP_LOOP];
  size_t nout = t->rank, nall = nout + op->nred;
  int64_t total = 1;
  for (size_t k = 0; k < nout; k++) { ext[k] = mp_eval_size(p, t->size[k]); total *= ext[k]; }
  for (size_t k = 0; k < op->nred; k++) ext[nout + k] = mp_eval_size(p, op->rsize[k]);
  if (p->failed) return mp_rt_fail(p, err);
  mlpack_status st = mp_alloc_tensor(p, t, ext, err);
  if (st != MLPACK_OK || total == 0) return st;
  size_t es = mlpack_dtype_size((mlpack_dtype)t->dtype);
  int bdt = p->nodes[op->body].dtype;
  for (size_t k = 0; k < nall; k++) p->vars[k].i = 0;
  uint8_t *dst = t->data;
  do {
    mp_val v;
    for (size_t k = nout; k < nall; k++) p->vars[k].i = 0;
    switch (op->reduce) {
    case R_NONE: v = mp_convert(mp_eval(p, op->body), bdt, t->dtype); break;
    case R_SUM: case R_PROD: v = mp_reduce_sum(p, op, ext, nout, nall, t->dtype); break;
    case R_MAX: case R_MIN: v = mp_convert(mp_reduce_minmax(p, op, ext, nout, nall), bdt, t->dtype); break;
    default: v = mp_convert(mp_reduce_arg(p, op, ext, nout), MLPACK_I64, t->dtype); break;
    }
    mp_store(dst, t->dtype, v);
    dst += es;
    if (p->failed) return mp_rt_fail(p, err);
  } while (mp_next(p->vars, ext, 0, nout));
  return MLPACK_OK;
}

static void mp_exec(mp_portable *p, const mp_stmt *s, size_t n);

static void mp_exec_store(mp_portable *p, const mp_stmt *s) {
  mp_ptensor *t = &p->tensors[s->slot];
  int64_t off = 0;
  for (size_t a = 0; a < t->rank; a++) {
    int64_t i = mp_to_index(mp_eval(p, s->idx[a]), p->nodes[s->idx[a]].dtype);
    if (i < 0 || i >= t->shape[a]) {
      mp_index_error(p, t, (int)a, i, "store to");
      return;
    }
    off += i * t->stride[a];
  }
  mp_val v = mp_convert(mp_eval(p, s->expr), p->nodes[s->expr].dtype, t->dtype);
  mp_store(t->data + off * (int64_t)mlpack_dtype_size((mlpack_dtype)t->dtype), t->dtype, v);
}

static void mp_exec_one(mp_portable *p, const mp_stmt *s) {
  int dt = s->expr >= 0 ? p->nodes[s->expr].dtype : MLPACK_I64;
  switch (s->kind) {
  case S_LET: p->vars[s->slot] = mp_eval(p, s->expr); break;
  case S_STORE: mp_exec_store(p, s); break;
  case S_FOR: {
    int64_t n = mp_to_index(mp_eval(p, s->expr), dt);
    for (int64_t i = 0; i < n && !p->failed; i++) {
      p->vars[s->slot].i = i;
      mp_exec(p, s->body, s->nbody);
    }
    break;
  }
  case S_WHILE:
    while (!p->failed && mp_truth(mp_eval(p, s->expr), dt)) mp_exec(p, s->body, s->nbody);
    break;
  case S_IF:
    if (mp_truth(mp_eval(p, s->expr), dt)) mp_exec(p, s->body, s->nbody);
    else mp_exec(p, s->orelse, s->nelse);
    break;
  default:
    p->symv[s->slot] = mp_to_index(mp_eval(p, s->expr), dt);
    p->symset[s->slot] = 1;
    break;
  }
}

static void mp_exec(mp_portable *p, const mp_stmt *s, size_t n) {
  for (size_t i = 0; i < n && !p->failed; i++) mp_exec_one(p, &s[i]);
}

/* Results and locals are allocated at the bounds of the symbols the body defines; afterwards
 * results take their actual sizes (strides keep the allocation's: a trim without a copy). */
static mlpack_status mp_run_procedure(mp_portable *p, const mp_pop *op, mlpack_error **err) {
  int64_t bound[MP_LOOP];
  size_t nb = op->nbounds < MP_LOOP ? op->nbounds : MP_LOOP;
  for (size_t i = 0; i < nb; i++) bound[i] = mp_eval_size(p, op->bound_node[i]);
  for (size_t i = 0; i < nb; i++) { p->symv[op->bound_sym[i]] = bound[i]; p->symset[op->bound_sym[i]] = 1; }
  mlpack_status st = MLPACK_OK;
  for (size_t i = 0; st == MLPACK_OK && i < op->nresults + op->nlocals; i++) {
    mp_ptensor *t = &p->tensors[op->tensors[i]];
    int64_t shape[MP_RANK];
    for (size_t d = 0; d < t->rank; d++) shape[d] = mp_eval_size(p, t->size[d]);
    if (p->failed) return mp_rt_fail(p, err);
    st = mp_alloc_tensor(p, t, shape, err);
  }
  for (size_t i = 0; i < nb; i++) p->symset[op->bound_sym[i]] = 0;  /* the body defines them */
  if (st != MLPACK_OK) return st;
  mp_exec(p, op->stmts, op->nstmts);
  for (size_t i = 0; !p->failed && i < op->nresults; i++) {
    mp_ptensor *t = &p->tensors[op->tensors[i]];
    for (size_t d = 0; d < t->rank; d++) {
      int64_t n = mp_eval_size(p, t->size[d]);
      if (!p->failed && n > t->shape[d])
        mp_runtime_error(p, "%%%s: size %lld exceeds its bound %lld", t->name, (long long)n, (long long)t->shape[d]);
      else t->shape[d] = n;
    }
  }
  for (size_t i = op->nresults; i < op->nresults + op->nlocals; i++) mp_free_data(&p->tensors[op->tensors[i]]);
  return p->failed ? mp_rt_fail(p, err) : MLPACK_OK;
}

/* copy tensor t into a contiguous buffer in signature order (axis[k]: storage axis of sig axis k) */
static void mp_copy_out(const mp_ptensor *t, const int8_t *axis, uint8_t *dst) {
  size_t es = mlpack_dtype_size((mlpack_dtype)t->dtype), rank = t->rank;
  int64_t shape[MP_RANK], stride[MP_RANK], at[MP_RANK] = {0};
  int64_t total = 1;
  for (size_t k = 0; k < rank; k++) { shape[k] = t->shape[axis[k]]; stride[k] = t->stride[axis[k]]; total *= shape[k]; }
  if (total == 0) return;
  for (;;) {
    int64_t off = 0;
    for (size_t k = 0; k < rank; k++) off += at[k] * stride[k];
    memcpy(dst, t->data + off * (int64_t)es, es);
    dst += es;
    size_t k = rank;
    while (k-- > 0) {
      if (++at[k] < shape[k]) break;
      at[k] = 0;
    }
    if (k == (size_t)-1) return;
  }
}

static mlpack_status mp_write_outputs(mp_portable *p, const mp_run *run, mlpack_error **err) {
  for (size_t i = 0; i < p->model->output_count; i++) {
    const mp_ptensor *t = &p->tensors[p->outputs[i].tensor];
    int64_t shape[MP_RANK];
    for (size_t k = 0; k < t->rank; k++) shape[k] = t->shape[p->outputs[i].axis[k]];
    if (!t->data) return mp_fail(err, MLPACK_ERR_RUNTIME, "%s: output '%s' was never computed", p->what, t->name);
    void *dst;
    mlpack_status st = mp_run_output(run, i, shape, &dst, err);
    if (st != MLPACK_OK) return st;
    mp_copy_out(t, p->outputs[i].axis, dst);
  }
  return MLPACK_OK;
}

static void mp_release_tensors(mp_portable *p) {
  for (size_t i = 0; i < p->nt; i++)
    if (p->tensors[i].kind != T_CONST) mp_free_data(&p->tensors[i]);
}

static void mp_copy_free(mp_portable *c) {
  if (!c) return;
  free(c->tensors);   /* (their data was released at the end of the copy's last run) */
  free(c->symv);
  free(c->symset);
  free(c->vars);
  free(c);
}

/* A run copy of program `prog`: its tensor table as compiled (no data but the constants') and
 * zeroed symbols and variables; everything else is the program's, shared. */
static mlpack_status mp_copy_new(const mp_portable *prog, mp_portable **out, mlpack_error **err) {
  mp_portable *c = malloc(sizeof *c);
  if (!c) return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for a run", prog->what);
  *c = *prog;
  c->tensors = malloc((prog->nt + 1) * sizeof *c->tensors);
  c->symv = calloc(prog->nsym + 1, sizeof *c->symv);
  c->symset = calloc(prog->nsym + 1, 1);
  c->vars = calloc(prog->nvars + MP_LOOP + 1, sizeof *c->vars);
  c->next = NULL;
  if (!c->tensors || !c->symv || !c->symset || !c->vars) {
    mp_copy_free(c);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory for a run", prog->what);
  }
  if (prog->nt) memcpy(c->tensors, prog->tensors, prog->nt * sizeof *c->tensors);
  *out = c;
  return MLPACK_OK;
}

mlpack_status mp_portable_run(mp_executor *x, const mp_run *run, mlpack_error **err) {
  mp_portable *prog = (mp_portable *)x;
  mp_portable *p = atomic_exchange_explicit(&prog->idle->spare, NULL, memory_order_acquire);
  if (!p) {
    pthread_mutex_lock(&prog->idle->mu);
    p = prog->idle->copies;
    if (p) prog->idle->copies = p->next;
    pthread_mutex_unlock(&prog->idle->mu);
  }
  if (!p) {   /* every copy is in a run: one more */
    mlpack_status st = mp_copy_new(prog, &p, err);
    if (st != MLPACK_OK) return st;
  }
  p->failed = 0;
  p->code = MLPACK_OK;
  p->msg[0] = 0;
  mlpack_status st = mp_bind_inputs(p, run, err);
  for (size_t i = 0; st == MLPACK_OK && i < p->nops; i++) {
    const mp_pop *op = &p->ops[i];
    st = op->is_proc ? mp_run_procedure(p, op, err) : mp_run_comprehension(p, op, err);
    for (size_t t = 0; st == MLPACK_OK && t < p->nt; t++) {  /* free what no later op reads */
      mp_ptensor *tt = &p->tensors[t];
      if (tt->owned && !tt->is_output && tt->kind == T_OP && tt->last_use <= (long)i) mp_free_data(tt);
    }
  }
  if (st == MLPACK_OK) st = mp_write_outputs(p, run, err);
  mp_release_tensors(p);
  mp_portable *none = NULL;
  if (!atomic_compare_exchange_strong_explicit(&prog->idle->spare, &none, p, memory_order_release,
                                               memory_order_relaxed)) {
    pthread_mutex_lock(&prog->idle->mu);
    p->next = prog->idle->copies;
    prog->idle->copies = p;
    pthread_mutex_unlock(&prog->idle->mu);
  }
  return st;
}

/* ---------------------------------------------------------------- lifetime */

static void mp_free_stmts(mp_stmt *s, size_t n) {
  for (size_t i = 0; s && i < n; i++) {
    mp_free_stmts(s[i].body, s[i].nbody);
    mp_free_stmts(s[i].orelse, s[i].nelse);
  }
  free(s);
}

void mp_portable_close(mp_executor *x) {
  mp_portable *p = (mp_portable *)x;
  if (!p) return;
  if (p->tensors) mp_release_tensors(p);
  for (size_t i = 0; p->ops && i < p->nops; i++) {
    free(p->ops[i].tensors);
    free(p->ops[i].bound_sym);
    free(p->ops[i].bound_node);
    mp_free_stmts(p->ops[i].stmts, p->ops[i].nstmts);
  }
  free(p->ops);
  free(p->nodes);
  free(p->rix);
  free(p->rax);
  free(p->tensors);
  free(p->syms);
  free(p->symv);
  free(p->symset);
  free(p->inputs);
  free(p->outputs);
  free(p->vars);
  if (p->have_weights) mp_tensors_close(&p->weights);
  free(p->weights_copy);
  mp_json_free(p->doc);
  if (p->idle) {   /* (no run is inside: every copy is idle) */
    mp_copy_free(atomic_load(&p->idle->spare));
    while (p->idle->copies) {
      mp_portable *c = p->idle->copies;
      p->idle->copies = c->next;
      mp_copy_free(c);
    }
    pthread_mutex_destroy(&p->idle->mu);
    free(p->idle);
  }
  free(p);
}

/* The idle list, with the first run's copy made now (a lone caller never makes another). */
static mlpack_status mp_portable_alloc_state(mp_portable *p, mlpack_error **err) {
  p->idle = calloc(1, sizeof *p->idle);
  if (!p->idle) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&p->idle->mu, NULL);
  atomic_init(&p->idle->spare, NULL);
  return mp_copy_new(p, &p->idle->copies, err);
}

mlpack_status mp_portable_open(mlpack_model *m, const mp_artifact *a, mp_executor **out, mlpack_error **err) {
  *out = NULL;
  mp_portable *p = calloc(1, sizeof *p);
  if (!p) return mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  p->model = m;
  snprintf(p->what, sizeof p->what, "artifact %zu (portable program)", a->index);
  p->inputs = calloc(m->input_count + 1, sizeof *p->inputs);
  p->outputs = calloc(m->output_count + 1, sizeof *p->outputs);
  mlpack_status st = (p->inputs && p->outputs) ? MLPACK_OK : mp_fail(err, MLPACK_ERR_NOMEM, "out of memory");
  for (size_t i = 0; p->inputs && i < m->input_count; i++) p->inputs[i].tensor = -1;
  if (st == MLPACK_OK && a->code.size == 0)
    st = mp_fail(err, MLPACK_ERR_FORMAT, "%s has no portable program layer", p->what);
  /* parsed and bound from the engine's verified copies, never from the file's mapping */
  uint8_t *code = NULL;
  if (st == MLPACK_OK) st = mp_blob_copy(m->container, &a->code, p->what, &code, err);
  if (st == MLPACK_OK) st = mp_json_parse((const char *)code, a->code.size, p->what, &p->doc, err);
  free(code);
  if (st == MLPACK_OK && a->weights.size > 0) {
    char what[96];
    snprintf(what, sizeof what, "%s weights", p->what);
    st = mp_blob_copy(m->container, &a->weights, what, &p->weights_copy, err);
    mp_blob weights = a->weights;
    weights.data = p->weights_copy;
    if (st == MLPACK_OK) st = mp_tensors_open(&weights, what, &p->weights, err);
    p->have_weights = st == MLPACK_OK;
  }
  if (st == MLPACK_OK) st = mp_compile_program(p, mp_json_root(p->doc), err);
  if (st == MLPACK_OK) st = mp_portable_alloc_state(p, err);
  if (st != MLPACK_OK) { mp_portable_close((mp_executor *)p); return st; }
  *out = (mp_executor *)p;
  return MLPACK_OK;
}
