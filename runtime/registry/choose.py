"""Which artifact a host pulls: load's selection, made from the nested index alone.

The nested index's descriptors carry what selection reads (spec/SPEC.md section 2: platform,
device, precision, CPU features, CUDA SM, max_error, latency, min_runtime, copied from each
config for exactly this), so a host picks its artifact before fetching any manifest, config or
layer: each descriptor becomes an ``Artifact`` holding those fields and a stand-in code layer of
the device's code format (portable program, ELF, PTX), and runtime/select.py's
``select_artifact``, the Python mirror of the C engine's selection, ranks them with the caller's
policy. Only the chosen artifact is pulled: a partial container holds no fallback, so a native
artifact the engine then fails to load leaves nothing to fall back to (``--all`` keeps them all).

``platform_host("linux/arm64")`` is the host ``mlpack pull --platform`` selects for: that
platform's baseline features (an x86-64 variant's level, arm64's asimd, riscv64's rv64gcv), no
GPU.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from mlpack.spec import media
from mlpack.spec.container import Artifact, LayerRef, descriptor_config, is_digest
from mlpack.spec.errors import RegistryError

from mlpack.runtime.host import X86_LEVELS, Host, with_aliases
from mlpack.runtime.select import Verdict, select_artifact

# the code format each device's artifacts carry (what select.py checks a runtime can execute)
CODE_FOR_DEVICE = {"portable": media.PROGRAM_PORTABLE, "cpu": media.CODE_ELF,
                   "cuda": media.CODE_PTX}


def descriptor_artifacts(index: dict, where: str) -> list[Artifact]:
    """The nested index's artifacts as selection sees them, from their descriptors alone."""
    out = []
    version = index["annotations"][media.ANN_FORMAT_VERSION]
    for i, desc in enumerate(index["manifests"]):
        w = f"{where}: nested index manifests[{i}]"
        if not isinstance(desc, dict) or desc.get("mediaType") != media.OCI_MANIFEST:
            raise RegistryError(f"{w} is not an OCI image manifest descriptor")
        if not is_digest(desc.get("digest")) or not isinstance(desc.get("size"), int):
            raise RegistryError(f"{w}: digest or size missing or malformed")
        ann = desc.get("annotations") or {}
        device, precision = ann.get(media.ANN_DEVICE), ann.get(media.ANN_PRECISION)
        if not isinstance(device, str) or not isinstance(precision, str):
            raise RegistryError(f"{w}: without the annotations {media.ANN_DEVICE} and "
                                f"{media.ANN_PRECISION}, a host cannot choose it without "
                                "pulling it (mlpack pull --all)")
        config = descriptor_config(ann, version)
        code = CODE_FOR_DEVICE.get(device)
        layers = [LayerRef(code, desc["digest"], 0, 0)] if code else []
        out.append(Artifact(i, desc, {}, config, layers))
    return out


def choose(index: dict, where: str, host: Host, *, device=None, precision=None,
           accuracy_budget=None, code_types=None) -> tuple[Artifact, list[Verdict]]:
    """The artifact ``host`` runs under the policy, and every artifact's verdict
    (NoRunnableArtifactError, naming each and why, when none fits)."""
    box = SimpleNamespace(path=where, artifacts=descriptor_artifacts(index, where))
    return select_artifact(box, host, device=device, precision=precision,
                           accuracy_budget=accuracy_budget, code_types=code_types)


# baseline features of a platform without a level (what the compiler's baseline target uses)
_BASELINE = {"arm64": ("fp", "asimd"), "riscv64": tuple("imafdcv")}


def platform_host(text: str) -> Host:
    """The host an ``OS/ARCH[/VARIANT]`` platform stands for (``linux/amd64/v3``,
    ``linux/arm64``, ``linux/riscv64``): its baseline CPU features, no GPU."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise RegistryError(f"platform {text!r} is not OS/ARCH[/VARIANT] (linux/amd64/v3, "
                            "linux/arm64, ...)")
    os_name, arch = parts[0], parts[1]
    variant = parts[2] if len(parts) == 3 else None
    if arch == "amd64":
        m = re.fullmatch(r"v([1-4])", variant or "v1")
        if not m:
            raise RegistryError(f"platform {text!r}: amd64's variants are v1 to v4")
        level = int(m.group(1))
        flags = set().union(*(f for n, f in X86_LEVELS if n <= level))
        return Host(os_name, arch, with_aliases(flags, media.CPU_FEATURE_SPELLINGS["amd64"]),
                    level)
    if arch == "arm64" and variant not in (None, "v8"):
        raise RegistryError(f"platform {text!r}: arm64's variant is v8")
    flags = _BASELINE.get(arch, ())
    return Host(os_name, arch, with_aliases(flags, media.CPU_FEATURE_SPELLINGS.get(arch, {})))


__all__ = ["choose", "descriptor_artifacts", "platform_host", "CODE_FOR_DEVICE"]
