/* loader.c: load a native artifact's kernel library straight from the container's bytes.
 *
 * The ELF (the engine's verified copy of the code blob) is copied into an anonymous memfd, sealed
 * against every change, and dlopen()ed through /proc/self/fd/N: no file is ever written to disk
 * (nothing to clean up, nothing another user could swap under us). The fd
 * stays open as long as the library is loaded: the dynamic loader matches a new dlopen() against
 * loaded objects by path name, so if the fd number were freed, the next model's memfd could get
 * the same number and dlopen() would hand back the earlier model's library. The library exports
 * one symbol,
 * MLPACK_KERNEL_TABLE_SYMBOL; its table's abi_version must be one we know (1 or 2) and, in a
 * version-2 table, every kernel's bindings one 'r' or 'w' per buffer.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine.h"

#ifndef F_ADD_SEALS   /* Linux 3.17's values; older libc headers (glibc 2.17, the wheel's) lack them */
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_SEAL_WRITE 0x0008
#endif

struct mp_library {
  void *handle;
  int fd; /* the memfd the library was loaded from, open until unload (see above) */
};

static int mp_memfd(const char *name) {
#ifdef SYS_memfd_create
  /* the raw syscall: works with a libc older than memfd_create's wrapper (glibc 2.27) */
  return (int)syscall(SYS_memfd_create, name, 3u /* MFD_CLOEXEC | MFD_ALLOW_SEALING */);
#else
  (void)name;
  errno = ENOSYS;
  return -1;
#endif
}

static mlpack_status mp_write_all(int fd, const void *data, size_t size, const char *what,
                                  mlpack_error **err) {
  const uint8_t *p = data;
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return mp_fail(err, MLPACK_ERR_LOAD, "%s: cannot write the kernel library to a memfd: %s",
                     what, strerror(n < 0 ? errno : EIO));
    p += n;
    size -= (size_t)n;
  }
  return MLPACK_OK;
}

static mlpack_status mp_check_table(const mlpack_kernel_table *t, const char *what,
                                    mlpack_error **err) {
  if (!t)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: %s() returned no kernel table", what,
                   MLPACK_KERNEL_TABLE_SYMBOL);
  /* table versions: 1 (ABI 1.0-1.2), 2 (ABI 1.3: adds `bindings`, which plan.c checks plans against) */
  if (t->abi_version < 1 || t->abi_version > MLPACK_KERNEL_TABLE_VERSION)
    return mp_fail(err, MLPACK_ERR_VERSION,
                   "%s: kernel library's table is version %u, this runtime reads versions 1 to %u "
                   "(kernel ABI %u.%u)", what, t->abi_version, MLPACK_KERNEL_TABLE_VERSION,
                   MLPACK_ABI_VERSION, MLPACK_ABI_MINOR);
  if (t->kernel_count > 0 && !t->kernels)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: kernel table lists %u kernels but no functions",
                   what, t->kernel_count);
  if (t->abi_version >= 2 && t->kernel_count > 0 && !t->bindings)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: kernel table (version %u) lists %u kernels but no "
                   "bindings", what, t->abi_version, t->kernel_count);
  for (uint32_t i = 0; i < t->kernel_count; i++) {
    if (!t->kernels[i])
      return mp_fail(err, MLPACK_ERR_LOAD, "%s: kernel %u of the table is NULL", what, i);
    static const char kinds[] = {MLPACK_BINDING_READ, MLPACK_BINDING_WRITE, '\0'};
    const char *b = t->abi_version >= 2 ? t->bindings[i] : "";
    if (!b || b[strspn(b, kinds)] != '\0')
      return mp_fail(err, MLPACK_ERR_LOAD, "%s: kernel %u of the table has %s bindings (one 'r' "
                     "or 'w' per buffer)", what, i, b ? "malformed" : "no");
  }
  return MLPACK_OK;
}

static mlpack_status mp_dlopen_fd(int fd, const char *what, void **handle, mlpack_error **err) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  dlerror();
  *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!*handle) {
    const char *why = dlerror();
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: cannot load the kernel library: %s", what,
                   why ? why : "dlopen failed");
  }
  return MLPACK_OK;
}

mlpack_status mp_library_load(const void *elf, size_t size, const char *what, mp_library **out,
                              const mlpack_kernel_table **table, mlpack_error **err) {
  *out = NULL;
  *table = NULL;
  if (!elf || size < 64)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: the code layer (%zu bytes) is not an ELF library",
                   what, size);
  if (memcmp(elf, "\177ELF", 4) != 0)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: the code layer is not an ELF file (bad magic)", what);
  int fd = mp_memfd("mlpack-kernels");
  if (fd < 0)
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: memfd_create failed: %s", what, strerror(errno));
  void *handle = NULL;
  mlpack_status st = mp_write_all(fd, elf, size, what, err);
  /* sealed: from here on nobody (another thread, anyone with /proc/PID/fd) can change the bytes
   * the dynamic loader maps; they are the engine's verified copy (mp_blob_copy) */
  if (st == MLPACK_OK && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    st = mp_fail(err, MLPACK_ERR_LOAD, "%s: cannot seal the kernel library's memfd: %s", what, strerror(errno));
  if (st == MLPACK_OK) st = mp_dlopen_fd(fd, what, &handle, err);
  if (st != MLPACK_OK) { close(fd); return st; }
  dlerror();
  void *sym = dlsym(handle, MLPACK_KERNEL_TABLE_SYMBOL);
  if (!sym) {
    dlclose(handle);
    close(fd);
    return mp_fail(err, MLPACK_ERR_LOAD, "%s: the kernel library does not export %s", what,
                   MLPACK_KERNEL_TABLE_SYMBOL);
  }
  mlpack_kernel_table_fn fn;
  memcpy(&fn, &sym, sizeof fn);  /* object pointer -> function pointer without a pedantic cast */
  const mlpack_kernel_table *t = fn();
  st = mp_check_table(t, what, err);
  if (st != MLPACK_OK) { dlclose(handle); close(fd); return st; }
  mp_library *lib = calloc(1, sizeof *lib);
  if (!lib) {
    dlclose(handle);
    close(fd);
    return mp_fail(err, MLPACK_ERR_NOMEM, "%s: out of memory", what);
  }
  lib->handle = handle;
  lib->fd = fd;
  *out = lib;
  *table = t;
  return MLPACK_OK;
}

void mp_library_unload(mp_library *lib) {
  if (!lib) return;
  if (lib->handle) dlclose(lib->handle);
  close(lib->fd);
  free(lib);
}
