"""``mlpack keygen``, ``mlpack sign`` and ``mlpack verify``: the signing commands of the CLI.

    mlpack keygen NAME                    # NAME.key (private, 0600) and NAME.pub
    mlpack sign FILE.mlpack --key NAME.key [--identity REF]
    mlpack verify FILE.mlpack --key NAME.pub [--key ...]

The work is spec/signing.py's (the same module the runtime's trust policy uses); these only
parse arguments and print one line. They register on packager/cli.py's app, with its error
handling: a bad key or a container that fails verification is one ``error:`` line, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mlpack.packager.cli import _existing, command


@command("keygen")
def keygen_cmd(
    name: Path = typer.Argument(..., metavar="NAME",
                                help="writes NAME.key (private) and NAME.pub (public)"),
) -> None:
    """Make an Ed25519 key pair for signing containers (encrypted with MLPACK_KEY_PASSWORD when
    it is set). Keep NAME.key secret; hand NAME.pub to whoever loads your containers."""
    from mlpack.spec import signing

    private, public = signing.keygen(name)
    kid = signing.key_id(signing.load_signing_key(private).public_key())
    typer.echo(f"wrote {private} (private: keep it secret) and {public} (public), key {kid}")


@command("sign")
def sign_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    key: Path = typer.Option(..., "--key", "-k", metavar="NAME.key", help="the private key"),
    identity: Optional[str] = typer.Option(None, "--identity", metavar="REF",
                                           help="the signed payload's docker-reference "
                                                "(default: the model's name)"),
) -> None:
    """Sign a container in place: every blob is verified, then a cosign signature of its root
    index (which covers every blob) is added inside the file. Re-signing with the same key
    replaces that key's signature; other keys' signatures stay."""
    from mlpack.spec import signing

    kid = signing.sign(_existing(file, "container"), _existing(key, "key"), identity)
    typer.echo(f"signed {file} with key {kid}")


@command("verify")
def verify_cmd(
    file: Path = typer.Argument(..., metavar="FILE.mlpack", help="the container (.mlpack)"),
    keys: list[Path] = typer.Option(..., "--key", "-k", metavar="PUB",
                                    help="a trusted public key (PEM) or a folder of them; "
                                         "repeat for several"),
) -> None:
    """Check that a container is intact (every digest) and signed by one of the given keys;
    exit 2 if not. The check the runtime's trust policy makes before loading any code."""
    from mlpack.spec import signing

    kid = signing.verify_file(_existing(file, "container"), [str(k) for k in keys])
    typer.echo(f"verified: {file} is signed by key {kid}")
