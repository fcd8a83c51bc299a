"""What a partial pull saves: a container with every default target and precision, pushed to a
loopback registry (Debian's docker-registry, as tests/registry/ runs it), then pulled for this
host through a counting proxy: the bytes the registry served against the file's size.

    python -m benchmarks.partial_pull squeezenet            # builds it (minutes), then measures
    python -m benchmarks.partial_pull --file model.mlpack   # measures a container you have

The model is tests/models/light.py's (random weights), built with every default target and
every precision (fp32, fp16, bf16, int8), other architectures unvalidated (MLPACK_QEMU=0).
Prints one line per pull, each into a cold cache: this host's (fp32, load's default), this
host's with --precision int8, and --platform linux/arm64's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(name: str, out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import support

    from mlpack.codegen import precisions
    from mlpack.packager.build import SkippedTargetWarning, build

    # validating other architectures under qemu takes many minutes and changes no byte
    os.environ.setdefault("MLPACK_QEMU", "0")
    model = support.load_light().random_weight_model(name, 0).SerializeToString()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedTargetWarning)
        build(model, out, precisions=precisions.implemented(), name=name)


def measure(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "registry"))
    from oci_registry import CountingProxy, RegistryServer, registry_binary

    from mlpack.runtime.registry import pull, push
    from mlpack.runtime.registry.choose import platform_host
    from mlpack.spec.container import open_container

    if registry_binary() is None:
        sys.exit("docker-registry is not installed (apt-get install -y docker-registry)")
    with open_container(path) as c:
        count = len(c.artifacts)
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**20:.2f} MiB, {count} artifacts")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLPACK_OCI_CACHE"] = os.path.join(tmp, "push-cache")
        server = RegistryServer(Path(tmp) / "registry").start()
        proxy = CountingProxy(server.host).start()
        try:
            push(path, f"{proxy.host}/bench/model:v1")
            for n, (label, host, precision) in enumerate((
                    ("this host", None, None), ("this host, --precision int8", None, "int8"),
                    ("linux/arm64", platform_host("linux/arm64"), None))):
                os.environ["MLPACK_OCI_CACHE"] = os.path.join(tmp, f"cache-{n}")   # each cold
                proxy.reset()
                r = pull(f"{proxy.host}/bench/model:v1", Path(tmp) / "out.mlpack", host=host,
                         precision=precision)
                served = proxy.served_bytes()
                art = r.reason.removeprefix("chosen: ").split(" is ")[0]
                print(f"  pull for {label}: {art}: {served / 2**20:.2f} MiB transferred, "
                      f"{100 * served / size:.1f}% of the file")
        finally:
            proxy.stop()
            server.stop()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--file"]:
        measure(Path(argv[1]))
        return
    name = argv[0] if argv else "squeezenet"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.mlpack"
        _build(name, out)
        measure(out)


if __name__ == "__main__":   # the build's compile workers are spawned: they import this module
    main(sys.argv[1:])
