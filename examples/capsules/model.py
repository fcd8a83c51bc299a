"""A PyTorch model with a custom op (``torch.library``), exported to ONNX with its own node.

``capsules::caps_conv`` is defined with ``torch.library.custom_op`` (an eager implementation
for PyTorch, a fake one for shapes); a symbolic function tells the TorchScript exporter
(``dynamo=False``) to emit it as one node ``CapsConv`` of the domain ``capsules.example`` with
the attribute ``stride``. ONNX Runtime could run that node only with a hand-written C++ kernel;
mlpack builds it from the DSL function capsules.py registers for it.

    python examples/capsules/model.py caps.onnx     # writes the model
"""

from __future__ import annotations

import io
import sys
import warnings

import numpy as np
import torch

DOMAIN = "capsules.example"
OPSET = 17


@torch.library.custom_op("capsules::caps_conv", mutates_args=())
def caps_conv(P: torch.Tensor, W: torch.Tensor, stride: int) -> torch.Tensor:
    """V[n,x,y,co,i,j] = sum_{kx,ky,ci,k} P[n, s*x+kx, s*y+ky, ci, i, k] W[kx,ky,ci,co,k,j]."""
    kx, ky = W.shape[0], W.shape[1]
    X = (P.shape[1] - kx) // stride + 1
    Y = (P.shape[2] - ky) // stride + 1
    ix = stride * torch.arange(X)[:, None] + torch.arange(kx)[None, :]
    iy = stride * torch.arange(Y)[:, None] + torch.arange(ky)[None, :]
    return torch.einsum("nxaybcik,abcokj->nxyoij", P[:, ix][:, :, :, iy], W)


@caps_conv.register_fake
def _(P, W, stride):
    X = (P.shape[1] - W.shape[0]) // stride + 1
    Y = (P.shape[2] - W.shape[1]) // stride + 1
    return P.new_empty((P.shape[0], X, Y, W.shape[3], P.shape[4], W.shape[5]))


def _symbolic(g, P, W, stride):
    from torch.onnx import symbolic_helper

    stride = symbolic_helper._get_const(stride, "i", "stride")
    out = g.op(f"{DOMAIN}::CapsConv", P, W, stride_i=stride)
    # the exporter cannot infer a custom node's type: the element type and rank, sizes free
    out.setType(P.type().with_sizes([None] * 6))
    return out


torch.onnx.register_custom_op_symbolic("capsules::caps_conv", _symbolic, OPSET)


class CapsuleLayer(torch.nn.Module):
    """A capsule convolution (the custom op) followed by ordinary ops: the poses squashed by
    tanh and scaled per output type."""

    def __init__(self, caps_in: int = 8, caps_out: int = 8, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        fan_in = 9 * caps_in * 4
        self.W = torch.nn.Parameter(torch.randn(3, 3, caps_in, caps_out, 4, 4, generator=g)
                                    / fan_in ** 0.5)
        self.scale = torch.nn.Parameter(1 + 0.1 * torch.randn(caps_out, 1, 1, generator=g))

    def forward(self, P):
        return torch.tanh(caps_conv(P, self.W, 2)) * self.scale


def export(caps_in: int = 8, caps_out: int = 8, size: int = 9, seed: int = 0) -> bytes:
    """The ONNX model's bytes: input P [batch, size, size, caps_in, 4, 4] (batch symbolic)."""
    model = CapsuleLayer(caps_in, caps_out, seed).eval()
    example = torch.randn(2, size, size, caps_in, 4, 4)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (example,), f, dynamo=False, opset_version=OPSET,
                          input_names=["P"], output_names=["V"],
                          dynamic_axes={"P": {0: "batch"}, "V": {0: "batch"}},
                          custom_opsets={DOMAIN: 1})
    return f.getvalue()


def torch_outputs(P: np.ndarray, caps_in: int = 8, caps_out: int = 8, seed: int = 0) -> np.ndarray:
    """What PyTorch itself computes (the eager custom op), float64."""
    model = CapsuleLayer(caps_in, caps_out, seed).double().eval()
    with torch.no_grad():
        return model(torch.from_numpy(P.astype(np.float64))).numpy()


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "caps.onnx"
    with open(out, "wb") as fh:
        fh.write(export())
    print(f"wrote {out}")
