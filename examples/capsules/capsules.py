"""The convolutional capsule layer of Hinton et al. (2018), written in mlpack's DSL.

    V[n, x, y, co, i, j] = sum over kx, ky, ci, k of P[n, 2x+kx, 2y+ky, ci, i, k] * W[kx, ky, ci, co, k, j]

P holds a 4x4 pose matrix (i, k) per capsule type ci at each position of the input grid; W one
4x4 transformation per kernel tap (kx, ky), input type ci and output type co. ``capsule_conv``
is that line; ``votes`` keeps the input capsule (kx, ky, ci) instead of summing it, which is
what EM routing weighs (``em_routing``: three iterations of the M-step and the E-step, written
as plain DSL ops). The votes are written as one tensor, and every step of the routing is
per output position (n, x, y): the cpu target runs the whole routing one position at a time
as one kernel (codegen/targets/cpu/tiles.py), so each position's votes (590 KB at 32 capsule
types) are computed once and re-read while in cache, and the 231 MB of votes at batch 8 never
exist; where no such tile applies, the ``recompute`` pass (codegen/passes/recompute.py)
recomputes each vote (four multiply-adds) where a routing reduction reads it.
``mlpack build --memory-budget`` caps what it keeps, ``MLPACK_DEBUG=1`` prints its choices.

Importing this module registers ``CapsConv`` and ``EMRouting`` of the ONNX domain
``capsules.example`` (their attributes, ``stride``, ``iterations``, ``inverse_temperature``,
are the functions' parameters), so ``mlpack build model.onnx --ops
examples/capsules/capsules.py`` builds a model that uses the op (model.py exports one from
PyTorch). reference.py is the same maths in NumPy.
"""

from __future__ import annotations

import math

from mlpack.codegen import dsl

DOMAIN = "capsules.example"


def capsule_conv(P, W, stride=2):
    """The capsule convolution: every vote summed into its output capsule."""
    x, y, kx, ky, ci, k = dsl.dims("x y kx ky ci k")
    return dsl.sum[kx, ky, ci, k](P(x=stride * x + kx, y=stride * y + ky) * W)


dsl.register(DOMAIN, "CapsConv", capsule_conv,
             inputs={"P": "n x y ci i k", "W": "kx ky ci co k j"},
             outputs={"V": "n x y co i j"})


def votes(P, W, stride=2):
    """Each input capsule's vote for each output capsule's pose: V[n,x,y,kx,ky,ci,co,i,j]."""
    x, y, kx, ky, k = dsl.dims("x y kx ky k")
    return dsl.sum[k](P(x=stride * x + kx, y=stride * y + ky) * W)


def em_routing(P, A, W, beta_v, beta_a, stride=2, iterations=3, inverse_temperature=1.0,
               eps=1e-6):
    """Capsule conv plus EM routing: the output poses ``mu`` [n,x,y,co,i,j] and activations
    ``a`` [n,x,y,co]. A[n,x,y,ci] are the input activations; beta_v and beta_a [co] are learned.
    Each step is one DSL reduction or map. The operands are written votes first: a value's dims
    are ordered as they first appear, and that order is the layout of each intermediate, so the
    reductions' outputs end in ``co``, which W (registered as ``kx ky ci k j co``) holds at unit
    stride: their kernels run along ``co`` in vectors."""
    V = votes(P, W, stride).materialize("votes")
    x, y, kx, ky, ci, co, i, j = dsl.dims("x y kx ky ci co i j", like=V)
    a_in = A(x=stride * x + kx, y=stride * y + ky)      # the activation of each voting capsule
    n_out = V.size("co").value
    R = None                                            # assignment of votes to outputs
    for it in range(iterations):
        # M-step: each output capsule's Gaussian, fitted to the votes weighted by R * a_in
        Ra = a_in / n_out if R is None else R * a_in
        mass = dsl.sum[kx, ky, ci](Ra).materialize(f"mass{it}")
        mu = (dsl.sum[kx, ky, ci](V * Ra) / mass).materialize(f"mu{it}")
        var = (dsl.sum[kx, ky, ci](dsl.square(V - mu) * Ra) / mass + eps).materialize(f"var{it}")
        cost = dsl.sum[i, j]((0.5 * dsl.log(var) + beta_v) * mass)
        a = dsl.sigmoid((cost - beta_a) * -inverse_temperature).materialize(f"a{it}")
        if it == iterations - 1:
            return {"mu": mu, "a": a}
        # E-step: how well each output explains each vote, normalized over the outputs
        # the Gaussian's log-normalizer does not depend on the vote: summed once per output
        norm = dsl.sum[i, j](0.5 * dsl.log(2 * math.pi * var))
        precision = (0.5 / var).materialize(f"precision{it}")
        log_p = -dsl.sum[i, j](dsl.square(V - mu) * precision) - norm
        logit = (log_p + dsl.log(a).materialize(f"log_a{it}")).materialize(f"logit{it}")
        top = dsl.max[co](logit)
        e = dsl.exp(logit - top).materialize(f"e{it}")
        R = (e / dsl.sum[co](e)).materialize(f"R{it}")


dsl.register(DOMAIN, "EMRouting", em_routing,
             inputs={"P": "n x y ci i k", "A": "n x y ci", "W": "kx ky ci k j co",
                     "beta_v": "co", "beta_a": "co"},
             outputs={"mu": "n x y i j co", "a": "n x y co"})
