/* media.h: the media types, annotation keys, devices and precisions the engine matches on: its
 * one copy of spec/media.py's strings.
 *
 * Each MP_<NAME> here is spec/media.py's <NAME>, spelled the same; tests/runtime/
 * test_c_media_types.py checks every one against it (and MP_CODE_MEDIA_TYPES against
 * CODE_MEDIA_TYPES), and that no other engine source spells a media type or key itself.
 */
#ifndef MLPACK_MEDIA_H
#define MLPACK_MEDIA_H

/* the OCI layout's own documents */
#define MP_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define MP_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"

/* what only mlpack understands */
#define MP_ARTIFACT_TYPE "application/vnd.mlpack.artifact.v1"
#define MP_CONFIG "application/vnd.mlpack.config.v1+json"
#define MP_PROGRAM_PORTABLE "application/vnd.mlpack.program.portable.v1+json"
#define MP_CODE_ELF "application/vnd.mlpack.code.elf.v1"
#define MP_CODE_PTX "application/vnd.mlpack.code.ptx.v1"
#define MP_CODE_CUBIN "application/vnd.mlpack.code.cubin.v1"
#define MP_WEIGHTS "application/vnd.mlpack.weights.v1"
#define MP_TESTVECTORS "application/vnd.mlpack.testvectors.v1"

/* The layers that are an artifact's code, whether or not this engine can run them: an artifact
 * whose code it cannot run is then passed over with a reason (select.c), as runtime/select.py
 * does, rather than looking as if it had no code at all. The executor table (executors.c) says
 * which of these run here. */
#define MP_CODE_MEDIA_TYPES MP_PROGRAM_PORTABLE, MP_CODE_ELF, MP_CODE_PTX, MP_CODE_CUBIN

/* signatures (format 1.2): cosign's signature manifest, payload and annotation (trust.c) */
#define MP_SIGNATURE_ARTIFACT_TYPE "application/vnd.dev.cosign.artifact.sig.v1+json"
#define MP_SIGNATURE_PAYLOAD "application/vnd.dev.cosign.simplesigning.v1+json"
#define MP_SIGNATURE_PAYLOAD_TYPE "cosign container image signature"
#define MP_ANN_SIGNATURE "dev.cosignproject.cosign/signature"
#define MP_ANN_SIGNATURE_KEY "org.mlpack.signature.key"
#define MP_REF_NAME "org.opencontainers.image.ref.name"
#define MP_ANN_PARTIAL "org.mlpack.partial"

/* annotation keys: on the indexes (the format version on both, the model name on the nested one) */
#define MP_ANN_FORMAT_VERSION "org.mlpack.format.version"
#define MP_ANN_MODEL_NAME "org.mlpack.model.name"
/* on each manifest descriptor of the nested index: what selection needs without the configs */
#define MP_ANN_DEVICE "org.mlpack.device"
#define MP_ANN_PRECISION "org.mlpack.precision"
#define MP_ANN_CPU_FEATURES "org.mlpack.cpu.features"
#define MP_ANN_CUDA_SM "org.mlpack.cuda.sm"
#define MP_ANN_MAX_ABS_ERROR "org.mlpack.accuracy.max_abs_error"
#define MP_ANN_MAX_ERROR "org.mlpack.accuracy.max_error"
#define MP_ANN_LATENCY "org.mlpack.latency.seconds"
#define MP_ANN_MIN_RUNTIME "org.mlpack.min_runtime"

/* the words of the selection options and the configs' artifact fields: spec/media.py's
 * DEVICES and PRECISIONS, in its order (select.c's mp_devices and mp_precisions) */
#define MP_DEVICES "cpu", "cuda", "portable"
#define MP_PRECISIONS "fp32", "fp16", "bf16", "int8"

#endif /* MLPACK_MEDIA_H */
