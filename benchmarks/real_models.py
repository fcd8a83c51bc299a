"""Real architectures from transformers and torchvision, exported offline to ONNX files in a cache
folder.

    path = materialize("bert_tiny")              # benchmarks/.models/real/bert_tiny.onnx, made once
    spec = MODELS["bert_tiny"]                   # its inputs: names, dtypes, which dims are dynamic

Every model is built from a config object (transformers) or a constructor with ``weights=None``
(torchvision) with seeded random weights, so nothing is downloaded. Each is exported with the
TorchScript exporter (``dynamo=False``) at opset 17 with a dynamic batch, and a dynamic sequence
for text models; its one output is the last hidden state (or the logits). Before export,
BatchNorm layers get the scales, shifts and running statistics training would leave them, and
zero-initialized layers random weights, so outputs are O(1) and a comparison means something.
``SMALL`` names the few models a default test run builds (each a few MB, exported in seconds);
``FULL`` adds the real sizes (DistilBERT, ViT-B/16, ...) that the slow tests build. ``BENCH`` is
issue 20's real-model benchmark set, each entry a model of ``MODELS`` at the fixed sizes it is
timed at (``python -m benchmarks.run --set real``).

A cached file is exported again when its recipe changes: a ``NAME.onnx.recipe`` next to it holds the
digest of this file, the seed and the torch, transformers and torchvision versions.

torch and transformers come from the ``models`` extra, torchvision from ``models-torchvision``.
The torchvision wheel on PyPI is a CUDA build whose C++ ops (nms, roi_align) cannot load next to a
CPU torch; the classification models are plain Python and never call them, so when the ops do
not load, the module that registers their fake kernels is stubbed out before the import (see
``_let_torchvision_import``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

DEFAULT_FOLDER = Path(__file__).resolve().parent / ".models" / "real"
SEED = 0
OPSET = 17
VOCAB = 1000  # the small text models' vocabulary; the tests draw token ids across it


@dataclass(frozen=True)
class Input:
    """A model input: name, numpy dtype name, and its dims (an int, or a symbol name)."""

    name: str
    dtype: str
    dims: tuple


@dataclass(frozen=True)
class RealModel:
    """How to build one model: its library, a builder of the torch module, its inputs."""

    name: str
    library: str                      # "transformers" or "torchvision"
    build: Callable = field(repr=False)
    inputs: tuple[Input, ...]

    def example_shape(self, inp: Input, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in inp.dims)


# ---------------------------------------------------------------- the wrappers


def _torch():
    import torch

    return torch


def _first(model, mask: bool = False, **kwargs):
    """``model`` wrapped so the export has one tensor output, its first (the last hidden state,
    or the logits), not a ModelOutput with optional fields. ``mask``: pass an all-ones attention
    mask, so a causal model does not look for packed sequences (``torch.diff``, which the
    TorchScript exporter cannot export) as it does when given none."""
    torch = _torch()

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            if mask:
                return self.model(x, attention_mask=torch.ones_like(x), **kwargs)[0]
            return self.model(x, **kwargs)[0]

    return First()


def _seeded():
    torch = _torch()
    torch.manual_seed(SEED)


# ---------------------------------------------------------------- transformers builders


def _hf(name: str, config_kwargs: dict, **call):
    """A transformers model class ``name`` (e.g. "BertModel") from its config, seeded, eval."""
    _let_torchvision_import()
    import transformers

    config = getattr(transformers, name.replace("Model", "Config"))(**config_kwargs)
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"  # plain MatMul/Softmax; sdpa traces less portably
    _seeded()
    model = getattr(transformers, name)(config).eval()
    return _first(model, **call)


def bert(layers=2, hidden=128, heads=2, ffn=512, vocab=VOCAB):
    return _hf("BertModel", dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=ffn,
                                 max_position_embeddings=128), return_dict=False)


def distilbert():  # the real DistilBERT-base size: 6 layers, hidden 768, 12 heads, vocab 30522
    return _hf("DistilBertModel", dict(), return_dict=False)


def gpt2(layers=2, hidden=128, heads=2, vocab=VOCAB):
    return _hf("GPT2Model", dict(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                 n_positions=128, bos_token_id=0, eos_token_id=0),
               mask=True, use_cache=False, return_dict=False)


def gpt2_small():
    """GPT-2 small's decoder at its real size: 12 layers, hidden 768, 12 heads, vocabulary 50257,
    1024 positions (the config's defaults); the last hidden state, no LM head (as DistilBERT)."""
    return _hf("GPT2Model", dict(), mask=True, use_cache=False, return_dict=False)


def hf_vit(hidden=64, layers=2, heads=4, ffn=128, image=32, patch=8):
    return _hf("ViTModel", dict(hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=ffn,
                                image_size=image, patch_size=patch), return_dict=False)


def whisper_tiny_encoder():
    """Whisper-tiny's audio encoder (d_model 384, 4 layers, 6 heads) over 80 x 3000 log-mels."""
    _let_torchvision_import()
    import transformers

    config = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                                        decoder_layers=4, decoder_attention_heads=6,
                                        encoder_ffn_dim=1536, decoder_ffn_dim=1536)
    config._attn_implementation = "eager"
    _seeded()
    return _first(transformers.WhisperModel(config).get_encoder().eval(), return_dict=False)


def hf_resnet(small=True):
    kw = dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
              layer_type="basic") if small else dict()  # else ResNet-50
    return _hf("ResNetModel", kw, return_dict=False)


def hf_convnext(small=True):
    kw = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]) if small else dict()
    return _hf("ConvNextModel", kw, return_dict=False)


def hf_mobilenet_v2():
    return _hf("MobileNetV2Model", dict(), return_dict=False)


def hf_swin():  # Swin-T: window attention with shifted windows
    return _hf("SwinModel", dict(), return_dict=False)


def hf_efficientnet():  # EfficientNet-B0 (the config's default is B7)
    return _hf("EfficientNetModel", dict(width_coefficient=1.0, depth_coefficient=1.0,
                                         image_size=224, hidden_dim=1280), return_dict=False)


# ---------------------------------------------------------------- torchvision builders


def _let_torchvision_import() -> None:
    """Make an installed torchvision importable next to a CPU torch even when its C++ ops cannot
    load. transformers imports torchvision too whenever it is installed, so this runs before
    either is imported."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or "torchvision" in sys.modules:
        return
    torch = _torch()
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
    except (OSError, ImportError):
        # the CUDA build's ops need libtorch_cuda; torchvision would still register fake
        # kernels for them and fail, so that module is replaced by an empty one
        stub = "torchvision._meta_registrations"
        sys.modules.setdefault(stub, types.ModuleType(stub))


def _import_torchvision():
    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("torchvision is not installed (pip install 'mlpack[models-torchvision]')")
    _let_torchvision_import()
    import torchvision.models

    return torchvision.models


def torchvision_model(name: str, **kwargs):
    models = _import_torchvision()
    _seeded()
    return getattr(models, name)(weights=None, **kwargs).eval()


# ---------------------------------------------------------------- the set


def _image(size=224, channels=3):
    return (Input("pixel_values", "float32", ("batch", channels, size, size)),)


def _tokens(name="input_ids"):
    return (Input(name, "int64", ("batch", "sequence")),)


def _tv(name, **kw):
    return RealModel(f"tv_{name}", "torchvision", lambda: torchvision_model(name, **kw), _image())


MODELS: dict[str, RealModel] = {m.name: m for m in (
    # small: the default test run
    RealModel("bert_tiny", "transformers", bert, _tokens()),
    RealModel("gpt2_tiny", "transformers", gpt2, _tokens()),
    RealModel("vit_tiny", "transformers", hf_vit, _image(32)),
    RealModel("resnet_tiny", "transformers", hf_resnet, _image(64)),
    RealModel("convnext_tiny_cfg", "transformers", hf_convnext, _image(64)),
    # full size: the slow run
    RealModel("distilbert", "transformers", distilbert, _tokens()),
    RealModel("whisper_tiny_encoder", "transformers", whisper_tiny_encoder,
              (Input("input_features", "float32", ("batch", 80, 3000)),)),
    RealModel("hf_resnet50", "transformers", lambda: hf_resnet(small=False), _image()),
    RealModel("hf_mobilenet_v2", "transformers", hf_mobilenet_v2, _image()),
    RealModel("hf_swin_tiny", "transformers", hf_swin, _image()),
    RealModel("hf_efficientnet_b0", "transformers", hf_efficientnet, _image()),
    _tv("vit_b_16"),
    _tv("mobilenet_v3_small"),
    _tv("mobilenet_v3_large"),
    _tv("resnet18"),
    _tv("efficientnet_b0"),
    _tv("shufflenet_v2_x1_0"),
    _tv("regnet_y_400mf"),
    _tv("convnext_tiny"),
    _tv("squeezenet1_1"),
    _tv("mobilenet_v2"),
    _tv("mnasnet1_0"),
    _tv("resnext50_32x4d"),
    # no auxiliary classifiers (eval mode returns the main logits alone either way; without them
    # the export carries no unused branches); init_weights=True is what weights=None does anyway,
    # said here so torchvision does not warn that its default will change
    _tv("googlenet", aux_logits=False, init_weights=True),
    _tv("swin_t"),
    RealModel("gpt2_small", "transformers", gpt2_small, _tokens()),
)}
SMALL = ("bert_tiny", "gpt2_tiny", "vit_tiny", "resnet_tiny", "convnext_tiny_cfg")
FULL = tuple(MODELS)


# ---------------------------------------------------------------- the benchmark set


@dataclass(frozen=True)
class BenchEntry:
    """One entry of the real-model benchmark set: a model of ``MODELS`` and the size of each of
    its dynamic dims it is timed at (batch 1; the sequence of a text model)."""

    name: str                         # the model's name, "@SEQUENCE" added where it fixes one
    model: str
    dims: dict = field(hash=False)    # {"batch": 1} or {"batch": 1, "sequence": 128}


def _entry(model: str, sequence: int | None = None) -> BenchEntry:
    if sequence is None:
        return BenchEntry(model, model, {"batch": 1})
    return BenchEntry(f"{model}@{sequence}", model, {"batch": 1, "sequence": sequence})


# issue 20's set: ten torchvision classifiers, a DistilBERT-size encoder and Whisper-tiny's
# encoder, and a GPT-2-small-size decoder at two sequence lengths (one export, both entries)
BENCH: dict[str, BenchEntry] = {e.name: e for e in (
    _entry("tv_mobilenet_v2"),
    _entry("tv_mobilenet_v3_large"),
    _entry("tv_mnasnet1_0"),
    _entry("tv_shufflenet_v2_x1_0"),
    _entry("tv_regnet_y_400mf"),
    _entry("tv_resnext50_32x4d"),
    _entry("tv_googlenet"),
    _entry("tv_convnext_tiny"),
    _entry("tv_swin_t"),
    _entry("tv_vit_b_16"),
    _entry("distilbert", 128),
    _entry("whisper_tiny_encoder"),         # 80 x 3000 log-mels: only the batch is dynamic
    _entry("gpt2_small", 128),
    _entry("gpt2_small", 512),
)}

# the models of MODELS outside that set, which no schedule was tuned on (torchvision's and
# Hugging Face's exports of the same kinds: Hugging Face's pad every Conv explicitly, TF style):
# a check that the schedules are general, as the real models mlpack is measured on elsewhere are
HELD_OUT: dict[str, BenchEntry] = {e.name: e for e in map(_entry, (
    "tv_mobilenet_v3_small", "tv_resnet18", "tv_efficientnet_b0", "tv_squeezenet1_1",
    "hf_resnet50", "hf_mobilenet_v2", "hf_efficientnet_b0", "hf_swin_tiny"))}
SETS = {"real": BENCH, "heldout": HELD_OUT}


# ---------------------------------------------------------------- export and cache


def available(name: str) -> bool:
    """Whether the library model ``name`` comes from is installed (torch included)."""
    need = ("torch", MODELS[name].library)
    return all(importlib.util.find_spec(m) is not None for m in need)


def _versions(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("torch", library):
        try:
            out.append(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist}=?")
    return " ".join(out)


def recipe(name: str, seed: int = SEED) -> str:
    """A digest of what makes the model: this file, the seed and the library versions."""
    h = hashlib.sha256(f"{name} seed={seed} opset={OPSET} {_versions(MODELS[name].library)}\n"
                       .encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def _no_zero_weights(module, gen) -> None:
    """Draw N(0, 1/fan_in) weights for any layer initialized to zeros (torchvision's ViT head):
    an output that is zero whatever the input would pass every comparison."""
    torch = _torch()
    with torch.no_grad():
        for m in module.modules():
            w = getattr(m, "weight", None)
            if isinstance(w, torch.Tensor) and w.dim() >= 2 and not w.any():
                fan_in = w[0].numel()
                w.copy_(torch.randn(w.shape, generator=gen) / fan_in ** 0.5)


def _calibrate(module, spec: RealModel, gen) -> None:
    """Give every BatchNorm the parameters and statistics training would leave it: scale
    U(0.5, 1.5), shift N(0, 0.1) (as tests/models/light.py), and the running statistics of a
    seeded batch. Fresh ones (statistics 0 and 1; transformers draws scales N(0, 0.02)) let
    activations shrink or grow layer by layer in a random network, until its output is ~1e-27
    and any comparison passes."""
    torch = _torch()
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    with torch.no_grad():
        for m in norms:
            if m.affine:
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: after one batch, that batch's statistics
    shape = spec.example_shape(spec.inputs[0], {"batch": 8, "sequence": 8})
    module.train()
    with torch.no_grad():
        module(torch.randn(shape, generator=gen))
    module.eval()


def export(name: str, path) -> None:
    """Export model ``name`` to ``path`` (an ONNX file with its weights inside)."""
    import warnings

    torch = _torch()
    spec = MODELS[name]
    module = spec.build()
    example_sizes = {"batch": 2, "sequence": 8}  # > 1, so the tracer cannot specialize them
    gen = torch.Generator().manual_seed(SEED)
    args = []
    for inp in spec.inputs:
        shape = spec.example_shape(inp, example_sizes)
        if inp.dtype == "int64":
            args.append(torch.randint(0, 10, shape, generator=gen))
        else:
            args.append(torch.randn(shape, generator=gen))
    _no_zero_weights(module, gen)
    _calibrate(module, spec, gen)
    dynamic = {inp.name: {i: d for i, d in enumerate(inp.dims) if isinstance(d, str)}
               for inp in spec.inputs}
    # the output keeps the first input's dynamic dims where they lead (batch, then sequence)
    first = spec.inputs[0].dims
    dynamic["output"] = {i: d for i, d in enumerate(first[:2]) if isinstance(d, str)}
    fastpath = torch.backends.mha.get_fastpath_enabled()
    # nn.MultiheadAttention (torchvision's ViT) in eval mode would take its fused fast path,
    # an op the exporter has no symbolic for; the plain path exports as MatMul and Softmax
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow
            torch.onnx.export(module, tuple(args), os.fspath(path), dynamo=False,
                              opset_version=OPSET, input_names=[i.name for i in spec.inputs],
                              output_names=["output"], dynamic_axes=dynamic)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def materialize(name: str, folder=None, seed: int = SEED) -> Path:
    """The ONNX file of model ``name`` in ``folder`` (default benchmarks/.models/real/), exported
    if it is missing or its recipe changed."""
    if name not in MODELS:
        raise KeyError(f"unknown real model {name!r}; the models are: {', '.join(MODELS)}")
    if seed != SEED:
        raise ValueError("the real models are exported with the module's SEED only")
    from benchmarks.models import cached

    folder = Path(folder) if folder is not None else DEFAULT_FOLDER
    return cached(folder, name, recipe(name, seed), lambda tmp: export(name, tmp))


if __name__ == "__main__":  # python -m benchmarks.real_models [NAME...]: export, print paths
    import time

    for n in sys.argv[1:] or SMALL:
        t0 = time.perf_counter()
        p = materialize(n)
        print(f"{p}  {p.stat().st_size / 2**20:.1f} MiB  {time.perf_counter() - t0:.1f}s")
