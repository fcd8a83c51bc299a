/* mlpack_abi.h: the ABI between a native artifact's kernel library and the engine that runs it.
 *
 * A cpu artifact's code layer is an ELF shared object built for one target (x86-64 v2/v3/v4,
 * aarch64). It needs nothing at load time: no libc, no libm, no other symbol. It exports ONE
 * symbol, MLPACK_KERNEL_TABLE_SYMBOL, a function returning its kernel table. The engine maps the
 * library from memory (memfd), reads the table, checks abi_version, and then runs the artifact's
 * plan (the config's "plan" object, spec/SPEC.md "Native artifacts"): an ordered list of
 * dispatches, each naming a kernel, how many workgroups it has, and which buffers it binds.
 *
 * A kernel computes one comprehension (or a fused group) for the workgroups it is handed; the
 * engine spreads workgroups 0..workgroup_count-1 over its threads, so kernels must not depend on
 * the order workgroups run in, and two workgroups of one dispatch never write the same element.
 * Dispatches run in plan order with a barrier between them.
 *
 * Versioning: MLPACK_ABI_VERSION (the plan's "abi") changes when any type below changes
 * incompatibly. The table's first field, abi_version, says which table layout the library
 * exports: 1 (ABI 1.0 to 1.2: kernels and names) or MLPACK_KERNEL_TABLE_VERSION, 2 (ABI 1.3:
 * and each kernel's bindings); both run plans of ABI 1. An engine refuses a table version it
 * does not know, with a message naming both. MLPACK_ABI_MINOR counts compatible additions to the
 * ABI; those a plan may ask of the engine it names in its "abi_minor" (an engine refuses a plan
 * whose minor is newer than its own):
 *   1.1  computed symbols: a plan symbol may be computed by one dispatch (one workgroup), whose
 *        kernel writes the symbol's value into its push slot; later dispatches read it. Outputs
 *        whose shape needs such a symbol carry a "shape" and are allocated at run time.
 *   1.2  index checks: mlpack_dispatch ends with `error`, the dispatch's mlpack_kernel_error. A
 *        kernel that meets an index taken from data outside the dim it indexes (a Gather's token
 *        id past the table) claims the record, fills it in and returns MLPACK_KERNEL_INDEX_ERROR;
 *        the dispatch's "checks" list (plan) says what each check number indexes, so the engine
 *        names the ONNX node and the index (MLPACK_ERR_INDEX). Kernels of older plans never read
 *        `error`, so an engine that knows 1.2 runs them unchanged.
 *   1.3  bindings in the table (table version 2): per kernel, how many buffers it binds and which
 *        of them it writes (`bindings`). The engine refuses a plan whose dispatch binds another
 *        number of buffers than its kernel takes, or binds a buffer the kernel writes to a weight
 *        (the file's mapping) or an input (the caller's array), naming the dispatch and kernel.
 *        Nothing in a plan changed, so no plan says "abi_minor": 3; an engine older than 1.3
 *        refuses a version-2 table when it loads the library. A version-1 table (an older
 *        compiler's library, or a hand-written one) still runs, unchecked.
 *   1.4  packed weights: a plan's "prepare" dispatches run once, when the engine opens the
 *        artifact, binding only weights and "packed" buffers (slices of a region of the plan's
 *        "packed_size" bytes the engine allocates) and writing only packed buffers: the
 *        weights a target reads in another form (a GEMM's packed panels) are computed from the
 *        weights layer, which then holds each weight once, as the model has it, for every
 *        target. The run's dispatches read packed buffers and never write them.
 */
#ifndef MLPACK_ABI_H
#define MLPACK_ABI_H

#include <stdint.h>

#define MLPACK_ABI_VERSION 1u
#define MLPACK_ABI_MINOR 4u
#define MLPACK_KERNEL_TABLE_VERSION 2u   /* the newest table layout (ABI 1.3); an engine reads 1 and 2 */
#define MLPACK_KERNEL_TABLE_SYMBOL "mlpack_kernel_table_v1"

/* Where a kernel reports an index out of range (ABI 1.2). The engine zeroes it before the
 * dispatch; workgroups run concurrently, so a kernel claims it with an atomic compare-exchange of
 * `claimed` from 0 to 1 and writes the other fields only when that succeeds: the first report
 * wins. The engine reads it after the dispatch's last workgroup. */
typedef struct mlpack_kernel_error {
  int32_t claimed;
  uint32_t check;             /* which of the dispatch's plan "checks" failed */
  int64_t index;              /* the index, as the kernel computed it (wrapped: see spec/SPEC.md) */
  int64_t size;               /* the size of the dim it indexes */
} mlpack_kernel_error;

#define MLPACK_KERNEL_INDEX_ERROR 1   /* a kernel's return value: it filled in d->error */

/* What one dispatch hands its kernel. */
typedef struct mlpack_dispatch {
  void *const *bindings;      /* base pointers of the bound buffers, in the dispatch's "bindings" order */
  int64_t *push;              /* push constants: the values of the plan's "symbols", in order; a
                               * kernel writes only the slots of the symbols its dispatch computes
                               * (ABI 1.1) and reads every other one */
  uint32_t workgroup_count;   /* the dispatch's workgroup count (evaluated from the plan) */
  uint32_t reserved;
  mlpack_kernel_error *error; /* ABI 1.2: where an index out of range is reported */
} mlpack_dispatch;

/* Run workgroup `workgroup` of dispatch `d`. Returns 0; MLPACK_KERNEL_INDEX_ERROR when an index
 * was out of range (d->error says which; ABI 1.2); any other non-zero means a bug in the artifact. */
typedef int32_t (*mlpack_kernel_fn)(const mlpack_dispatch *d, uint32_t workgroup);

/* What a kernel does with one binding (ABI 1.3): a character of its `bindings` string. */
#define MLPACK_BINDING_READ 'r'    /* only reads the buffer: it may be any buffer of the plan */
#define MLPACK_BINDING_WRITE 'w'   /* writes it (and may read it): an output or an arena slice */

typedef struct mlpack_kernel_table {
  uint32_t abi_version;             /* the table's layout: 1, or MLPACK_KERNEL_TABLE_VERSION (2) */
  uint32_t kernel_count;
  const mlpack_kernel_fn *kernels;  /* kernel_count entries; plan dispatches index this */
  const char *const *names;         /* kernel_count NUL-terminated names, for messages and profiles */
  /* table version 2 (ABI 1.3) only: a version-1 table ends above, so an engine reads this field
   * only when abi_version >= 2. kernel_count NUL-terminated strings, one MLPACK_BINDING_*
   * character per buffer the kernel binds, in the order of its dispatches' "bindings": "wrr" is
   * a kernel that writes binding 0 and reads bindings 1 and 2. */
  const char *const *bindings;
} mlpack_kernel_table;

/* The exported symbol's type: `const mlpack_kernel_table *mlpack_kernel_table_v1(void);` */
typedef const mlpack_kernel_table *(*mlpack_kernel_table_fn)(void);

#endif /* MLPACK_ABI_H */
