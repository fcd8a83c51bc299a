/* replay.c: run the fuzz target over files, without libFuzzer.
 *
 * CI has gcc but not necessarily clang's libFuzzer, so `make fuzz-replay` links the same
 * LLVMFuzzerTestOneInput with this driver under ASan and UBSan and feeds it every file of
 * fuzz/corpus: a regression in container parsing that a kept input once exercised fails CI.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) { perror(path); return 1; }
  if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return 1; }
  long n = ftell(f);
  rewind(f);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (!buf || got != (size_t)(n > 0 ? n : 0)) { free(buf); fprintf(stderr, "%s: short read\n", path); return 1; }
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int bad = 0;
  for (int i = 1; i < argc; i++) bad |= replay_file(argv[i]);
  printf("replayed %d inputs\n", argc - 1);
  return bad;
}
