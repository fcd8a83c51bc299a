"""``mlpack push`` and ``mlpack pull``: containers to and from OCI registries, and the
``oci://`` arguments of ``mlpack run``, ``inspect`` and ``validate``.

    mlpack push FILE.mlpack REGISTRY/REPO[:TAG] [--mount-from REPO]... [--quiet]
    mlpack pull REGISTRY/REPO[:TAG] -o FILE.mlpack [--all] [--platform OS/ARCH[/VARIANT]]
                [--device D] [--precision P] [--accuracy-budget X] [--quiet]
    mlpack run oci://REGISTRY/REPO:TAG --input x=x.npy -o out     # pulled for this host first

The work is the runtime's (runtime/registry/: a host that only loads models pulls with
``mlpack.load("oci://...")``); these parse arguments, print progress lines for large blobs on
stderr and a few lines of what moved. They register on packager/cli.py's app, with its error
handling: a registry failure is one ``error:`` line naming the registry, repository and
reference or digest, exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from mlpack.packager.cli import _existing, command

OCI_FOLDED = "oci:/"   # what pathlib makes of "oci://" (it folds the double slash)


def is_oci_arg(path) -> bool:
    """Whether a container argument is an ``oci://`` reference (as typed, or folded by Path)."""
    return str(path).startswith(OCI_FOLDED)


def pulled(path, device=None, precision=None) -> Path:
    """The local file of the ``oci://`` container argument ``path``: this host's artifact under
    the policy, pulled into the cache (MLPACK_OCI_CACHE) as ``mlpack.load`` pulls it."""
    from mlpack.runtime.registry import OCI_SCHEME, local_file

    text = str(path)
    ref = text if text.startswith(OCI_SCHEME) else OCI_SCHEME + text[len(OCI_FOLDED):]
    return Path(local_file(ref, device=device, precision=precision))


def _reporter(quiet: bool):
    return None if quiet else (lambda line: typer.echo(line, err=True))


@command("push")
def push_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    target: str = typer.Argument(..., metavar="REGISTRY/REPO[:TAG]",
                                 help="where to push it (default tag: the file's own)"),
    mount_from: list[str] = typer.Option(
        [], "--mount-from", metavar="REPO",
        help="another repository of the same registry that may hold the blobs: they are "
             "mounted from it, not uploaded (repeatable; repositories this cache has seen them "
             "in are tried too)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines"),
) -> None:
    """Push a container to an OCI registry: every blob (each checked first with HEAD, so nothing
    is uploaded twice), every artifact manifest, the nested index under the tag, and the
    signature under cosign's tag (and as an OCI 1.1 referrer where the registry has the API).
    Credentials: MLPACK_REGISTRY_USERNAME/PASSWORD, or docker's config.json."""
    from mlpack.runtime.registry import push
    from mlpack.runtime.registry.progress import size_text

    r = push(_existing(file, "container"), target, mount_from=mount_from,
             report=_reporter(quiet))
    typer.echo(f"pushed {file} to {r.ref}")
    typer.echo(f"blobs:      {r.uploaded} uploaded ({size_text(r.uploaded_bytes)}), {r.mounted} "
               f"mounted, {r.present} already there; {r.manifests} artifact manifests")
    if r.signatures:
        where = "and as a referrer" if r.referrers else \
            "(this registry has no referrers API: under the tag only)"
        typer.echo(f"signature:  {r.ref.digest.replace(':', '-')}.sig {where}")
    else:
        typer.echo("signature:  unsigned (mlpack sign FILE --key NAME.key, then push again)")


@command("pull")
def pull_cmd(
    source: str = typer.Argument(..., metavar="REGISTRY/REPO[:TAG]",
                                 help="the container (default tag: latest; or @sha256:DIGEST)"),
    output: Path = typer.Option(..., "--output", "-o", metavar="FILE.mlpack",
                                help="the container file to write"),
    everything: bool = typer.Option(False, "--all",
                                    help="every artifact: the file exactly as it was pushed"),
    platform: Optional[str] = typer.Option(
        None, "--platform", metavar="OS/ARCH[/VARIANT]",
        help="choose for that platform instead of this host (linux/amd64/v3, linux/arm64)"),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE",
                                         help="cpu, cuda or portable"),
    precision: Optional[str] = typer.Option(None, "--precision", metavar="PRECISION",
                                            help="fp32, fp16, bf16 or int8"),
    accuracy_budget: Optional[float] = typer.Option(
        None, "--accuracy-budget", metavar="X",
        help="the fastest artifact whose recorded max_error is within X"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines"),
) -> None:
    """Pull a container from an OCI registry into a file. Without --all, only the artifact this
    host (or --platform) runs, chosen as mlpack.load chooses, with the policy given: its
    manifest, config and layers, and the signatures (a partial container, which loads and
    verifies like the whole one). Blobs go through the cache (MLPACK_OCI_CACHE), verified."""
    from mlpack.runtime.registry import pull
    from mlpack.runtime.registry.choose import platform_host
    from mlpack.runtime.registry.progress import size_text
    from mlpack.runtime.select import check_policy

    check_policy(device, precision, accuracy_budget)
    host = platform_host(platform) if platform else None
    code_types = None   # another platform's host runs what its engine runs
    if host is None:
        from mlpack.runtime import engine
        from mlpack.spec import media

        # what load will run here: the engine's code where it is built, else the portable program
        code_types = None if engine.available() else {media.PROGRAM_PORTABLE}
    r = pull(source, output, everything=everything, host=host, device=device,
             precision=precision, accuracy_budget=accuracy_budget, code_types=code_types,
             report=_reporter(quiet))
    typer.echo(f"pulled {r.ref} to {output} ({size_text(os.path.getsize(output))})")
    if r.partial:
        typer.echo(f"artifact:   {r.artifacts[0]} of {r.total_artifacts}, "
                   f"{r.reason.removeprefix('chosen: ')}")
    else:
        typer.echo(f"artifacts:  all {r.total_artifacts}")
    typer.echo(f"fetched:    {r.fetched_blobs} documents and blobs, {size_text(r.fetched_bytes)}"
               f" ({r.cached_blobs} already in the cache)")
    typer.echo(f"signature:  {r.signatures} signature manifest(s)" if r.signatures
               else "signature:  unsigned")
