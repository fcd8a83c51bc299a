/* check.h: the few helpers the C tests share (no framework: a failing CHECK prints and counts). */
#ifndef MP_CHECK_H
#define MP_CHECK_H
#include <stdio.h>
#include <string.h>

static int mp_failures = 0, mp_checks = 0;

#define CHECK(cond, ...)                                             \
  do {                                                               \
    mp_checks++;                                                     \
    if (!(cond)) {                                                   \
      mp_failures++;                                                 \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fputc('\n', stderr);                                           \
    }                                                                \
  } while (0)

#define CHECK_CONTAINS(text, part) \
  CHECK((text) && strstr((text), (part)) != NULL, "'%s' does not contain '%s'", (text) ? (text) : "(null)", (part))

static int mp_check_report(const char *name) {
  printf("%s: %d checks, %d failures\n", name, mp_checks, mp_failures);
  return mp_failures ? 1 : 0;
}
#endif
