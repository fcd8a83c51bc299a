# cross.mk: libmlpack for another CPU with zig's C compiler (the `ziglang` wheel), no sysroot needed.
#   make -f cross.mk                 build/aarch64/libmlpack.a and build/aarch64/libmlpack.so
#   make -f cross.mk ARCH=x86_64     the same for another zig arch (build/x86_64/...)
#   make -f cross.mk clean-cross
# The target and its glibc are runtime/zig_target.py's, as for the runtime wheel (glibc 2.17;
# riscv64 2.27): the result links dynamically against glibc and runs on any newer one, e.g. under
# `qemu-aarch64 -L /usr/aarch64-linux-gnu` (Debian's libc6-arm64-cross). Objects go to build/$(ARCH)/obj, apart from the host build.
PYTHON ?= python3
ARCH ?= aarch64
ZIG_TARGET ?= $(shell $(PYTHON) ../zig_target.py $(ARCH))
XCC ?= $(PYTHON) -m ziglang cc -target $(ZIG_TARGET)
XAR ?= $(PYTHON) -m ziglang ar
CFLAGS ?= -O2
BASE = -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -Iinclude -Isrc
LIBS = -ldl -lpthread -lm
XDIR = build/$(ARCH)
XSRCS = $(wildcard src/*.c)
XHDRS = $(wildcard src/*.h include/*.h)
XOBJS = $(patsubst src/%.c,$(XDIR)/obj/%.o,$(XSRCS))

.PHONY: cross clean-cross
cross: $(XDIR)/libmlpack.a $(XDIR)/libmlpack.so

$(XDIR)/obj:
	mkdir -p $@

$(XDIR)/obj/%.o: src/%.c $(XHDRS) | $(XDIR)/obj
	$(XCC) $(BASE) $(CFLAGS) -c $< -o $@

$(XDIR)/libmlpack.a: $(XOBJS)
	rm -f $@ && $(XAR) rcs $@ $(XOBJS)

$(XDIR)/libmlpack.so: $(XOBJS)
	$(XCC) -shared -o $@ $(XOBJS) $(LIBS)

clean-cross:
	rm -rf $(XDIR)
