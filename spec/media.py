"""The container's vocabulary: format version, media types, annotation keys, devices, precisions.

Every string that appears in a container and that a reader matches on lives here, once, so the
writer (packager), the readers (Python runtime, C engine) and spec/SPEC.md cannot drift apart.
Media types follow OCI (https://github.com/opencontainers/image-spec): ``application/vnd.oci.*``
for the layout's own documents, ``application/vnd.mlpack.*`` for what only mlpack understands.
A reader ignores layer media types it does not know (OCI's rule), so a later minor version can add
layers (a new code format, say) without breaking older runtimes.
"""

from __future__ import annotations

import platform as _platform

# ---------------------------------------------------------------- versions

# the container format this module writes; readers read any 1.x. 1.1: output dim sizes may be
# expressions of symbols (spec/sizes.py)
FORMAT_VERSION = (1, 1)
FORMAT_VERSION_STR = f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}"
OCI_LAYOUT_VERSION = "1.0.0"  # the `oci-layout` file's imageLayoutVersion
MIN_RUNTIME = "0.1.0"  # default for the config's `min_runtime`

# ---------------------------------------------------------------- OCI media types

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

# ---------------------------------------------------------------- mlpack media types

ARTIFACT_TYPE = "application/vnd.mlpack.artifact.v1"  # every manifest's artifactType
CONFIG = "application/vnd.mlpack.config.v1+json"  # the config blob (signature, precision, plan)

PROGRAM_PORTABLE = "application/vnd.mlpack.program.portable.v1+json"  # spec/ir/program.py
CODE_ELF = "application/vnd.mlpack.code.elf.v1"  # a position-independent ELF shared object
CODE_PTX = "application/vnd.mlpack.code.ptx.v1"  # PTX text, JIT-compiled by the CUDA driver
CODE_CUBIN = "application/vnd.mlpack.code.cubin.v1"  # a cubin for one exact SM (optional)
CODE_MEDIA_TYPES = (PROGRAM_PORTABLE, CODE_ELF, CODE_PTX, CODE_CUBIN)

WEIGHTS = "application/vnd.mlpack.weights.v1"  # a tensor archive (spec/tensorfile.py)
TESTVECTORS = "application/vnd.mlpack.testvectors.v1"  # a tensor archive of inputs and outputs

# ---------------------------------------------------------------- signatures (format 1.2)

# A signature is cosign's: a manifest that refers (``subject``) to the nested index, with one
# "simple signing" payload layer per signature whose annotation holds the base64 Ed25519
# signature of the payload's bytes (spec/signing.py; spec/SPEC.md section 9). index.json lists
# it beside the nested index, tagged as cosign tags it (sha256-<hex>.sig).
SIGNATURE_ARTIFACT_TYPE = "application/vnd.dev.cosign.artifact.sig.v1+json"
SIGNATURE_PAYLOAD = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_PAYLOAD_TYPE = "cosign container image signature"  # the payload's critical.type
OCI_EMPTY = "application/vnd.oci.empty.v1+json"  # the signature manifest's config: b"{}"
ANN_SIGNATURE = "dev.cosignproject.cosign/signature"  # on a payload layer: base64 signature
# on index.json: "true" in a container pulled for one host (mlpack pull without --all): the
# nested index lists every artifact, but only the pulled ones' manifests, configs and layers are
# in the file; readers treat the others as absent (not runnable) instead of missing blobs
ANN_PARTIAL = "org.mlpack.partial"
# on a payload layer: "sha256:<hex>" of the signing key's DER SubjectPublicKeyInfo, so a
# verifier can say which key signed (it still tries every trusted key)
ANN_SIGNATURE_KEY = "org.mlpack.signature.key"

# ---------------------------------------------------------------- annotation keys

REF_NAME = "org.opencontainers.image.ref.name"  # the tag on index.json's single entry
ANN_FORMAT_VERSION = "org.mlpack.format.version"  # on index.json and on the nested index
ANN_MODEL_NAME = "org.mlpack.model.name"  # on the nested index

# on each manifest descriptor of the nested index: what selection needs without reading configs
ANN_DEVICE = "org.mlpack.device"  # cpu | cuda | portable
ANN_PRECISION = "org.mlpack.precision"  # fp32 | fp16 | bf16 | int8
ANN_CPU_FEATURES = "org.mlpack.cpu.features"  # comma-separated, e.g. "avx2,fma"
ANN_CUDA_SM = "org.mlpack.cuda.sm"  # minimum compute capability as digits, e.g. "80"
ANN_MAX_ABS_ERROR = "org.mlpack.accuracy.max_abs_error"  # vs. the fp32 reference, a JSON number
# the worst max |y - ref| / max |ref| over the outputs (spec/accuracy.py), a JSON number: what an
# accuracy budget is compared with
ANN_MAX_ERROR = "org.mlpack.accuracy.max_error"
# median seconds of a run, one thread, on the build host (config "latency"), a JSON number: how
# selection ranks a target's precisions under an accuracy budget
ANN_LATENCY = "org.mlpack.latency.seconds"
# on a cuda artifact: the PTX ISA version its PTX declares ("7.0") and the oldest driver whose
# JIT reads it ("450.36.06"); a cubin layer carries ANN_CUDA_SM of the one SM it is for
ANN_CUDA_PTX_ISA = "org.mlpack.cuda.ptx_isa"
ANN_CUDA_DRIVER = "org.mlpack.cuda.driver"
ANN_MIN_RUNTIME = "org.mlpack.min_runtime"  # oldest runtime version that runs it, e.g. "0.1.0"

# ---------------------------------------------------------------- vocabulary

DEVICES = ("cpu", "cuda", "portable")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")

# OCI platforms for the targets the compiler emits; the portable artifact has none (runs anywhere)
PLATFORMS = {
    "x86_64-v2": {"os": "linux", "architecture": "amd64", "variant": "v2"},
    "x86_64-v3": {"os": "linux", "architecture": "amd64", "variant": "v3"},
    "x86_64-v4": {"os": "linux", "architecture": "amd64", "variant": "v4"},
    # v4 plus AMX: OCI has no variant for it; the artifact's cpu features tell it apart
    "x86_64-v4-amx": {"os": "linux", "architecture": "amd64", "variant": "v4"},
    "x86_64-v4-bf16": {"os": "linux", "architecture": "amd64", "variant": "v4"},
    "x86_64-v4-vnni": {"os": "linux", "architecture": "amd64", "variant": "v4"},
    "aarch64": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    "aarch64-bf16": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    "aarch64-dotprod": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    "aarch64-i8mm": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    "riscv64": {"os": "linux", "architecture": "riscv64"},
}
# the cuda kernels compiled for the build host's baseline cpu level (a test target: the CUDA
# lowering run on a CPU), so its platform is the build host's
PLATFORMS["cuda-emulated"] = dict(PLATFORMS[
    "aarch64" if _platform.machine().lower() in ("aarch64", "arm64") else "x86_64-v2"])


def platform_for(target: str) -> dict | None:
    """The OCI platform object for a compiler target name; None where none applies (portable)."""
    p = PLATFORMS.get(target)
    return dict(p) if p else None


# ---------------------------------------------------------------- CPU feature names

# A config's ``cpu_features`` (and the manifest annotation) use the Linux /proc/cpuinfo names.
# Hosts also answer to the LLVM spelling of each (this table: cpuinfo name -> LLVM name, where
# they differ), so the compiler's feature lists and the runtime's detection meet in one place.
# runtime/c/src/host.c spells the same aliases in its cpuid table ("bmi1|bmi").
CPU_FEATURE_SPELLINGS = {
    "amd64": {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "abm": "lzcnt",
              "lahf_lm": "sahf", "bmi1": "bmi", "avx512_bf16": "avx512bf16",
              "avx512_vnni": "avx512vnni", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16"},
    "arm64": {"asimd": "neon", "asimdhp": "fp16", "fphp": "fullfp16", "asimddp": "dotprod",
              "asimdfhm": "fp16fml"},
}
# LLVM features with no cpuinfo flag: every host of the architecture has them
CPU_BASELINE_FEATURES = {"arm64": ("fp-armv8",)}


def config_cpu_features(llvm_features, arch: str) -> list[str]:
    """The config's ``cpu_features`` for code compiled with ``llvm_features`` (LLVM names, no
    "+") for the OCI architecture ``arch``: cpuinfo names, baseline features left out."""
    to_cpuinfo = {llvm: name for name, llvm in CPU_FEATURE_SPELLINGS.get(arch, {}).items()}
    baseline = CPU_BASELINE_FEATURES.get(arch, ())
    out: list[str] = []
    for f in llvm_features:
        name = to_cpuinfo.get(f, f)
        if f not in baseline and name not in out:
            out.append(name)
    return out
