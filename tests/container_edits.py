"""Broken containers whose digests are right: edit a document or a layer, rewrite the file.

``rewrite(src, dst, config=..., layer=...)`` reads ``src`` with spec/container.py and writes it
again through the writer, so every size and sha256 around an edit is recomputed: a reader must
find the fault itself, not a digest mismatch. The test helpers for the plan checks
(test_plan_bindings.py, test_packed_weights.py: ``with_plan``) and for broken files through the
CLI and ``mlpack.load`` (test_broken_files.py) share it. ``nested(text, depth)`` wraps a JSON
value in arrays.
"""

from __future__ import annotations

import copy
from typing import Callable

from mlpack.spec import container as c
from mlpack.spec import media

# what the writer derives from a config (spec/container.py _derived_annotations): not copied,
# so an edited config gives its own
_DERIVED = {media.ANN_DEVICE, media.ANN_PRECISION, media.ANN_CPU_FEATURES, media.ANN_CUDA_SM,
            media.ANN_MAX_ABS_ERROR, media.ANN_MAX_ERROR, media.ANN_LATENCY, media.ANN_MIN_RUNTIME}


def rewrite(src, dst, *, config: Callable[[int, dict], None] | None = None,
            layer: Callable[[int, str, bytes], bytes] | None = None) -> None:
    """Copy container ``src`` to ``dst`` through the writer. ``config(i, doc)`` may change
    artifact i's config in place; ``layer(i, media_type, data)`` returns the bytes of each of its
    layers (``data`` unchanged, or the edit)."""
    with c.open_container(src) as box:
        specs = []
        for art in box.artifacts:
            doc = copy.deepcopy(art.config)
            if config:
                config(art.index, doc)
            layers = []
            for ref in art.layers:
                data = bytes(box.blob(ref.digest))
                if layer:
                    data = layer(art.index, ref.media_type, data)
                layers.append(c.Layer(ref.media_type, data, dict(ref.annotations)))
            extra = {k: v for k, v in art.annotations.items() if k not in _DERIVED}
            specs.append(c.ArtifactSpec(doc, layers, art.platform, extra))
        extra = {k: v for k, v in box.annotations.items()
                 if k not in (media.ANN_FORMAT_VERSION, media.ANN_MODEL_NAME)}
        name, tag = box.name, box.tag or "latest"
    c.write_container(dst, name, specs, extra, tag=tag)


def with_plan(src, dst, index: int, edit: Callable[[dict], None]):
    """``dst``: ``src`` with artifact ``index``'s plan changed by ``edit(plan)``, digests
    recomputed."""
    def config(i, doc):
        if i == index:
            edit(doc["plan"])
    rewrite(src, dst, config=config)
    return dst


def nested(text: bytes, depth: int) -> bytes:
    """The JSON value ``text`` inside ``depth`` arrays: ``[[...[text]...]]``."""
    return b"[" * depth + text + b"]" * depth
