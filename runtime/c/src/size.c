/* size.c: a signature dim size (spec/SPEC.md "Sizes", spec/sizes.py): "$symbol" or, in an
 * output dim (format 1.1), a size expression over symbols, as text:
 *
 *   size := term (("+" | "-") term)*
 *   term := atom (("*" | "//" | "%") atom)*
 *   atom := INT | "$" NAME | "(" size ")" | ("max" | "min") "(" size "," size ")"
 *
 * One recursive-descent parser both checks the text (at open) and evaluates it (per run) with
 * the symbols the inputs bound; the text is a few bytes, so nothing is kept parsed. int64
 * arithmetic; "//" and "%" round toward minus infinity; overflow and division by zero are errors. */
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"

#define MP_SIZE_MAX_DEPTH 64

typedef struct mp_size_parser {
  const char *p;
  int eval;                      /* 0: check the syntax only */
  const char *const *names;
  const int64_t *values;
  size_t count;
  int status;                    /* MP_SIZE_OK, MP_SIZE_UNBOUND, MP_SIZE_BAD_VALUE, MP_SIZE_SYNTAX */
  const char *why;
  int depth;
  int ops;                       /* operations met: none means a bare number or symbol */
} mp_size_parser;

static int mp_size_stop(mp_size_parser *s, int status, const char *why) {
  if (s->status == MP_SIZE_OK) {
    s->status = status;
    s->why = why;
  }
  return -1;
}

static void mp_size_space(mp_size_parser *s) {
  while (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r') s->p++;
}

static int mp_size_accept(mp_size_parser *s, const char *tok) {
  mp_size_space(s);
  size_t n = strlen(tok);
  if (strncmp(s->p, tok, n) != 0) return 0;
  s->p += n;
  return 1;
}

static int mp_is_name_start(char c) { return isalpha((unsigned char)c) || c == '_'; }
static int mp_is_name_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

static int mp_size_sum(mp_size_parser *s, int64_t *out);

static int mp_size_symbol(mp_size_parser *s, int64_t *out) {
  const char *start = s->p;
  if (!mp_is_name_start(*s->p)) return mp_size_stop(s, MP_SIZE_SYNTAX, "'$' must start a symbol name");
  while (mp_is_name_char(*s->p)) s->p++;
  size_t n = (size_t)(s->p - start);
  *out = 0;
  if (!s->eval) return 0;
  for (size_t i = 0; i < s->count; i++)
    if (s->names[i] && strlen(s->names[i]) == n && strncmp(s->names[i], start, n) == 0) {
      *out = s->values[i];
      return 0;
    }
  return mp_size_stop(s, MP_SIZE_UNBOUND, "a symbol is not bound");
}

static int mp_size_int(mp_size_parser *s, int64_t *out) {
  int neg = *s->p == '-';
  if (neg) s->p++;
  if (!isdigit((unsigned char)*s->p)) return mp_size_stop(s, MP_SIZE_SYNTAX, "expected a number");
  uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  while (isdigit((unsigned char)*s->p)) {
    v = v * 10 + (uint64_t)(*s->p++ - '0');
    if (v > limit) return mp_size_stop(s, MP_SIZE_SYNTAX, "a number does not fit in int64");
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

static int mp_size_apply(mp_size_parser *s, char op, int64_t a, int64_t b, int64_t *out) {
  s->ops++;
  if (!s->eval) { *out = 0; return 0; }
  int ovf = 0;
  switch (op) {
    case '+': ovf = __builtin_add_overflow(a, b, out); break;
    case '-': ovf = __builtin_sub_overflow(a, b, out); break;
    case '*': ovf = __builtin_mul_overflow(a, b, out); break;
    case 'M': *out = a > b ? a : b; break;
    case 'm': *out = a < b ? a : b; break;
    default: {   /* '/' floordiv, '%' mod */
      if (b == 0) return mp_size_stop(s, MP_SIZE_BAD_VALUE, "division by zero");
      if (a == INT64_MIN && b == -1) return mp_size_stop(s, MP_SIZE_BAD_VALUE, "overflows int64");
      int64_t q = a / b, r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) q -= 1, r += b;
      *out = op == '/' ? q : r;
    }
  }
  return ovf ? mp_size_stop(s, MP_SIZE_BAD_VALUE, "overflows int64") : 0;
}

static int mp_size_atom(mp_size_parser *s, int64_t *out) {
  mp_size_space(s);
  if (++s->depth > MP_SIZE_MAX_DEPTH) return mp_size_stop(s, MP_SIZE_SYNTAX, "nested too deeply");
  int rc;
  if (*s->p == '$') {
    s->p++;
    rc = mp_size_symbol(s, out);
  } else if (*s->p == '-' || isdigit((unsigned char)*s->p)) {
    rc = mp_size_int(s, out);
  } else if (mp_size_accept(s, "(")) {
    rc = mp_size_sum(s, out);
    if (!rc && !mp_size_accept(s, ")")) rc = mp_size_stop(s, MP_SIZE_SYNTAX, "expected ')'");
  } else if (!strncmp(s->p, "max", 3) || !strncmp(s->p, "min", 3)) {
    char op = s->p[1] == 'a' ? 'M' : 'm';
    int64_t a = 0, b = 0;
    s->p += 3;
    rc = mp_size_accept(s, "(") ? 0 : mp_size_stop(s, MP_SIZE_SYNTAX, "expected '(' after max/min");
    if (!rc) rc = mp_size_sum(s, &a);
    if (!rc && !mp_size_accept(s, ",")) rc = mp_size_stop(s, MP_SIZE_SYNTAX, "expected ','");
    if (!rc) rc = mp_size_sum(s, &b);
    if (!rc && !mp_size_accept(s, ")")) rc = mp_size_stop(s, MP_SIZE_SYNTAX, "expected ')'");
    if (!rc) rc = mp_size_apply(s, op, a, b, out);
  } else {
    rc = mp_size_stop(s, MP_SIZE_SYNTAX, "expected a number, a $symbol, '(', max or min");
  }
  s->depth--;
  return rc;
}

static int mp_size_term(mp_size_parser *s, int64_t *out) {
  if (mp_size_atom(s, out)) return -1;
  for (;;) {
    char op = mp_size_accept(s, "*") ? '*' : mp_size_accept(s, "//") ? '/' : mp_size_accept(s, "%") ? '%' : 0;
    if (!op) return 0;
    int64_t b;
    if (mp_size_atom(s, &b) || mp_size_apply(s, op, *out, b, out)) return -1;
  }
}

static int mp_size_sum(mp_size_parser *s, int64_t *out) {
  if (mp_size_term(s, out)) return -1;
  for (;;) {
    char op = mp_size_accept(s, "+") ? '+' : mp_size_accept(s, "-") ? '-' : 0;
    if (!op) return 0;
    int64_t b;
    if (mp_size_term(s, &b) || mp_size_apply(s, op, *out, b, out)) return -1;
  }
}

static int mp_size_run(mp_size_parser *s, int64_t *out) {
  int64_t v = 0;
  if (!mp_size_sum(s, &v)) {
    mp_size_space(s);
    if (*s->p) mp_size_stop(s, MP_SIZE_SYNTAX, "unexpected text after the size");
  }
  *out = v;
  return s->status;
}

int mp_size_check(const char *text, int *is_expr, const char **why) {
  mp_size_parser s = {.p = text, .why = ""};
  *is_expr = 0;
  if (text[0] == '$' && mp_is_name_start(text[1])) {   /* a plain "$symbol"? */
    const char *q = text + 2;
    while (mp_is_name_char(*q)) q++;
    if (!*q) return MP_SIZE_OK;
  }
  int64_t v;
  int st = mp_size_run(&s, &v);
  if (st == MP_SIZE_OK && !strchr(text, '$')) st = MP_SIZE_SYNTAX, s.why = "a constant size is written as a JSON integer";
  else if (st == MP_SIZE_OK && !s.ops) st = MP_SIZE_SYNTAX, s.why = "a symbol size is written exactly '$name'";
  *why = s.why;
  *is_expr = st == MP_SIZE_OK;
  return st;
}

int mp_size_eval(const char *text, const char *const *names, const int64_t *values, size_t count,
                 int64_t *out, const char **why) {
  mp_size_parser s = {.p = text, .eval = 1, .names = names, .values = values, .count = count, .why = ""};
  int st = mp_size_run(&s, out);
  if (st == MP_SIZE_OK && *out < 0) st = MP_SIZE_BAD_VALUE, s.why = "comes out negative";
  *why = s.why;
  return st;
}
