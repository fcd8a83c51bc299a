"""Export the two torch models the conformance tests load (run by hand; CI has no torch).

    python tests/models/export_torch.py

writes, next to this file, ``mlp.onnx`` (784-256-128-10 with ReLU, dynamic batch) and
``bert_block.onnx`` (token + position embedding, LayerNorm, 4-head self-attention with
Softmax, erf GELU, FFN 256, residuals; dynamic batch and sequence), and copies the MLP to
``examples/models/mlp_torch.onnx`` (``examples/models/mlp.onnx`` is the small hand-built
perceptron ``make_mlp.py`` writes, which the README and its tests describe). Weights are
seeded, so a re-export gives the same bytes. Uses the legacy TorchScript exporter
(``dynamo=False``) at opset 17.
"""

from __future__ import annotations

import math
import os
import shutil

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "models")
OPSET = 17

VOCAB, MAX_LEN, HIDDEN, HEADS, FFN = 1000, 64, 64, 4, 256


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


class SelfAttention(nn.Module):
    """Multi-head self-attention written out: projections, scaled scores, Softmax."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)

    def split(self, x: torch.Tensor) -> torch.Tensor:  # (b, s, h*d) -> (b, h, s, d)
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        ctx = torch.softmax(scores, dim=-1) @ v
        return self.out(ctx.transpose(1, 2).flatten(2))


class EncoderBlock(nn.Module):
    """A BERT-style encoder layer over token ids, post-LayerNorm as in BERT."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Parameter(torch.randn(MAX_LEN, HIDDEN) * 0.1)
        self.ln_emb = nn.LayerNorm(HIDDEN)
        self.attn = SelfAttention(HIDDEN, HEADS)
        self.ln_attn = nn.LayerNorm(HIDDEN)
        self.ffn = nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN))
        self.ln_ffn = nn.LayerNorm(HIDDEN)
        with torch.no_grad():  # LayerNorm affine params away from (1, 0), so they matter
            for ln in (self.ln_emb, self.ln_attn, self.ln_ffn):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.normal_(0.0, 0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.ln_emb(self.tok(ids) + self.pos[: ids.shape[1]])
        x = self.ln_attn(x + self.attn(x))
        return self.ln_ffn(x + self.ffn(x))


def bert_block() -> nn.Module:
    torch.manual_seed(0)
    return EncoderBlock()


def export(model: nn.Module, example: torch.Tensor, path: str, in_name: str,
           dynamic: dict[int, str]) -> None:
    model.eval()
    torch.onnx.export(model, (example,), path, dynamo=False, opset_version=OPSET,
                      input_names=[in_name], output_names=["y"],
                      dynamic_axes={in_name: dynamic, "y": dynamic})


def main() -> None:
    mlp_path = os.path.join(HERE, "mlp.onnx")
    export(mlp(), torch.randn(2, 784), mlp_path, "x", {0: "batch"})
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    export(bert_block(), ids, os.path.join(HERE, "bert_block.onnx"), "ids",
           {0: "batch", 1: "seq"})
    os.makedirs(EXAMPLES, exist_ok=True)
    shutil.copyfile(mlp_path, os.path.join(EXAMPLES, "mlp_torch.onnx"))


if __name__ == "__main__":
    main()
