"""The capsule layer and its EM routing in NumPy, float64: what capsules.py must compute.

The same definitions as capsules.py, written with ``np.einsum`` over explicit axes
(``patches`` cuts the strided windows), so the two share no code.
"""

from __future__ import annotations

import math

import numpy as np


def patches(p: np.ndarray, kernel: int, stride: int) -> np.ndarray:
    """p[n, h, w, ...] cut into windows: [n, x, kx, y, ky, ...]."""
    out = (p.shape[1] - kernel) // stride + 1
    idx = stride * np.arange(out)[:, None] + np.arange(kernel)[None, :]
    return p[:, idx][:, :, :, idx]


def capsule_conv(P: np.ndarray, W: np.ndarray, stride: int = 2) -> np.ndarray:
    """V[n,x,y,co,i,j] = sum_{kx,ky,ci,k} P[n,2x+kx,2y+ky,ci,i,k] W[kx,ky,ci,co,k,j]."""
    pat = patches(P.astype(np.float64), W.shape[0], stride)
    return np.einsum("nxaybcik,abcokj->nxyoij", pat, W.astype(np.float64))


def em_routing(P, A, W, beta_v, beta_a, stride=2, iterations=3, inverse_temperature=1.0,
               eps=1e-6):
    """(mu [n,x,y,co,i,j], a [n,x,y,co]) after ``iterations`` rounds of EM routing."""
    f = np.float64
    K = W.shape[0]
    V = np.einsum("nxaybcik,abcokj->nxyabcoij", patches(P.astype(f), K, stride), W.astype(f))
    a_in = patches(A.astype(f), K, stride).transpose(0, 1, 3, 2, 4, 5)   # [n,x,y,kx,ky,ci]
    a_in = a_in[..., None]                                             # ... co
    n_out = W.shape[3]
    R = np.full(V.shape[:7], 1.0 / n_out)
    inputs = (3, 4, 5)
    for it in range(iterations):
        Ra = R * a_in
        mass = Ra.sum(axis=inputs)                                      # [n,x,y,co]
        w = Ra[..., None, None]
        mu = (w * V).sum(axis=inputs) / mass[..., None, None]
        d2 = (V - mu[:, :, :, None, None, None]) ** 2
        var = (w * d2).sum(axis=inputs) / mass[..., None, None] + eps
        cost = ((beta_v.astype(f)[:, None, None] + 0.5 * np.log(var)) * mass[..., None, None])
        a = 1 / (1 + np.exp(-inverse_temperature * (beta_a.astype(f) - cost.sum(axis=(-2, -1)))))
        if it == iterations - 1:
            return mu, a
        v6 = var[:, :, :, None, None, None]
        log_p = (-d2 / (2 * v6) - 0.5 * np.log(2 * math.pi * v6)).sum(axis=(-2, -1))
        logit = np.log(a)[:, :, :, None, None, None, :] + log_p
        e = np.exp(logit - logit.max(axis=-1, keepdims=True))
        R = e / e.sum(axis=-1, keepdims=True)
