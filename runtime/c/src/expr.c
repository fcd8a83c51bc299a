/* expr.c: integer expressions of the plan and the portable program (spec/SPEC.md section 7):
 * an integer, "$sym", ["c", v, dtype], [op, a, b] with the IR's integer semantics (floordiv and
 * mod round toward -inf as in Python, div truncates), comparisons and logic giving 0/1, and
 * ["select", c, a, b]. Overflow, division by zero and unknown symbols are errors, never UB. */
#include <stdint.h>
#include <string.h>

#include "engine.h"

#define MP_EXPR_MAX_DEPTH 256

typedef struct mp_expr_env {
  const char *const *names;
  const int64_t *values;
  size_t count;
  mlpack_error **err;
} mp_expr_env;

static mlpack_status mp_expr_bad(const mp_expr_env *env, const char *why) {
  return mp_fail(env->err, MLPACK_ERR_FORMAT, "plan expression: %s", why);
}

static mlpack_status mp_expr_overflow(const mp_expr_env *env, const char *op) {
  return mp_fail(env->err, MLPACK_ERR_RUNTIME, "plan expression: '%s' overflows int64", op);
}

static mlpack_status mp_expr_symbol(const mp_expr_env *env, const char *name, int64_t *out) {
  for (size_t i = 0; i < env->count; i++) {
    if (env->names[i] && strcmp(env->names[i], name) == 0) {
      *out = env->values[i];
      return MLPACK_OK;
    }
  }
  return mp_fail(env->err, MLPACK_ERR_RUNTIME, "plan expression: unknown symbol '$%.80s'", name);
}

static mlpack_status mp_expr_rec(const mp_expr_env *env, const mp_json *e, int depth, int64_t *out);

static int64_t mp_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int64_t mp_floormod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

static mlpack_status mp_expr_binary(const mp_expr_env *env, const char *op, int64_t a, int64_t b, int64_t *out) {
  int ovf = 0;
  if (!strcmp(op, "add")) ovf = __builtin_add_overflow(a, b, out);
  else if (!strcmp(op, "sub")) ovf = __builtin_sub_overflow(a, b, out);
  else if (!strcmp(op, "mul")) ovf = __builtin_mul_overflow(a, b, out);
  else if (!strcmp(op, "max")) *out = a > b ? a : b;
  else if (!strcmp(op, "min")) *out = a < b ? a : b;
  else if (!strcmp(op, "eq")) *out = a == b;
  else if (!strcmp(op, "ne")) *out = a != b;
  else if (!strcmp(op, "lt")) *out = a < b;
  else if (!strcmp(op, "le")) *out = a <= b;
  else if (!strcmp(op, "gt")) *out = a > b;
  else if (!strcmp(op, "ge")) *out = a >= b;
  else if (!strcmp(op, "and")) *out = a && b;
  else if (!strcmp(op, "or")) *out = a || b;
  else if (!strcmp(op, "floordiv") || !strcmp(op, "div") || !strcmp(op, "mod")) {
    if (b == 0) return mp_fail(env->err, MLPACK_ERR_RUNTIME, "plan expression: '%s' by zero", op);
    if (a == INT64_MIN && b == -1) return mp_expr_overflow(env, op);
    *out = !strcmp(op, "div") ? a / b : !strcmp(op, "mod") ? mp_floormod(a, b) : mp_floordiv(a, b);
  } else {
    return mp_fail(env->err, MLPACK_ERR_FORMAT, "plan expression: unknown operator '%.40s'", op);
  }
  return ovf ? mp_expr_overflow(env, op) : MLPACK_OK;
}

static mlpack_status mp_expr_unary(const mp_expr_env *env, const char *op, int64_t a, int64_t *out) {
  if (!strcmp(op, "neg") || !strcmp(op, "abs")) {
    if (a == INT64_MIN) return mp_expr_overflow(env, op);
    *out = !strcmp(op, "neg") ? -a : (a < 0 ? -a : a);
  } else if (!strcmp(op, "not")) {
    *out = !a;
  } else {
    return mp_fail(env->err, MLPACK_ERR_FORMAT, "plan expression: unknown operator '%.40s'", op);
  }
  return MLPACK_OK;
}

static mlpack_status mp_expr_list(const mp_expr_env *env, const mp_json *e, int depth, int64_t *out) {
  if (!e->length || e->items[0]->kind != MP_JSON_STRING) return mp_expr_bad(env, "a list must start with an operator");
  const char *op = e->items[0]->string;
  size_t argc = e->length - 1;
  if (!strcmp(op, "c")) {  /* ["c", v, dtype]: an integer constant */
    const mp_json *v = argc >= 1 ? e->items[1] : NULL;
    if (!v || v->kind != MP_JSON_NUMBER || !v->is_int) return mp_expr_bad(env, "'c' needs an integer value");
    *out = v->integer;
    return MLPACK_OK;
  }
  int64_t args[3];
  if (argc < 1 || argc > 3) return mp_expr_bad(env, "wrong operand count");
  for (size_t i = 0; i < argc; i++) {
    mlpack_status st = mp_expr_rec(env, e->items[i + 1], depth + 1, &args[i]);
    if (st) return st;
  }
  if (!strcmp(op, "select")) {
    if (argc != 3) return mp_expr_bad(env, "'select' takes 3 operands");
    *out = args[0] ? args[1] : args[2];
    return MLPACK_OK;
  }
  if (argc == 1) return mp_expr_unary(env, op, args[0], out);
  if (argc != 2) return mp_expr_bad(env, "wrong operand count");
  return mp_expr_binary(env, op, args[0], args[1], out);
}

static mlpack_status mp_expr_rec(const mp_expr_env *env, const mp_json *e, int depth, int64_t *out) {
  if (!e) return mp_expr_bad(env, "missing expression");
  if (depth > MP_EXPR_MAX_DEPTH) return mp_expr_bad(env, "nested too deeply");
  switch (e->kind) {
    case MP_JSON_NUMBER:
      if (!e->is_int) return mp_expr_bad(env, "a number must be an int64 integer");
      *out = e->integer;
      return MLPACK_OK;
    case MP_JSON_STRING:
      if (e->string[0] != '$') return mp_expr_bad(env, "a string must be a '$symbol'");
      return mp_expr_symbol(env, e->string + 1, out);
    case MP_JSON_ARRAY:
      return mp_expr_list(env, e, depth, out);
    default:
      return mp_expr_bad(env, "not an integer expression");
  }
}

mlpack_status mp_expr_eval(const mp_json *e, const char *const *sym_names, const int64_t *sym_values,
                           size_t sym_count, int64_t *out, mlpack_error **err) {
  mp_expr_env env = {sym_names, sym_values, sym_count, err};
  return mp_expr_rec(&env, e, 0, out);
}
