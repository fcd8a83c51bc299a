"""Classical-ML ops: TfIdfVectorizer (ai.onnx), LabelEncoder and TreeEnsemble (ai.onnx.ml).

Their attributes are lookup tables (n-gram pools, key/value maps, tree nodes). Each table
becomes a constant tensor at import time, and the data-dependent part is comprehensions:

* TfIdfVectorizer counts, for every pool n-gram, the (skip, start) positions where the input
  matches it: one ``sum`` comprehension with the n-gram's tokens unrolled, then a small
  contraction maps n-grams to output columns and the weighting applies.
* LabelEncoder finds the matching key with an ``argmax`` over the key table, then selects
  the value or the default.
* TreeEnsemble walks every tree one level per comprehension: a state holds the current node
  (or, negative, the leaf reached), for as many levels as the deepest tree; the leaves'
  weights are then aggregated per target with a reduction over the trees.

String pools, keys and values are refused: mlpack has no string tensors.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from mlpack.spec.ir import dtypes as dt
from mlpack.spec.ir import expr as ex
from mlpack.codegen.onnx.registry import op
from mlpack.codegen.onnx.ops.linalg import tmp_hint

_ML = "ai.onnx.ml"


def _array(v):
    """An attribute value (list or TensorProto) as a NumPy array, or None."""
    if v is None:
        return None
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return np.asarray(v)


def _is_eq(a, b):
    return ex.binary("eq", a, b)


# ---------------------------------------------------------------- TfIdfVectorizer


def _ngrams(n):
    """The pool's n-grams counted by this node: [(tokens, pool n-gram id)]; n-grams whose
    length is outside [min_gram_length, max_gram_length] are never counted."""
    pool = n.attr("pool_int64s", None)
    if pool is None:
        if n.attr("pool_strings", None):
            raise n.fail("string pools (pool_strings) are not supported: mlpack has no strings")
        pool = []
    pool = [int(p) for p in pool]
    starts = [int(s) for s in n.attr("ngram_counts")]
    lo, hi = int(n.attr("min_gram_length")), int(n.attr("max_gram_length"))
    grams, gid = [], 0
    for size, start in enumerate(starts, 1):
        end = starts[size] if size < len(starts) else len(pool)
        for k in range((end - start) // size):
            if lo <= size <= hi:
                grams.append((pool[start + k * size:start + (k + 1) * size], gid))
            gid += 1
    return grams


@op("TfIdfVectorizer")
def tfidf_vectorizer(b, n):
    x = n.inputs[0]
    if x.rank not in (1, 2):
        raise n.shape_error(f"input must be [C] or [N, C], it is rank {x.rank}")
    if not dt.is_int(x.dtype):
        raise n.fail(f"input of type {x.dtype} is not supported (int32/int64 only)")
    mode = n.attr("mode")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise n.fail(f"mode {mode!r} is not supported")
    indexes = [int(i) for i in n.attr("ngram_indexes")]
    width = max(indexes) + 1
    weights = n.attr("weights", None)
    grams = _ngrams(n)
    rows = (x.shape[0],) if x.rank == 2 else ()
    out_shape = rows + (ex.const(width),)
    names = ("n", "ngram") if x.rank == 2 else ("ngram",)
    if not grams:
        return [b.map("f32", out_shape, lambda i: ex.const(0.0), names)]
    counts = _count_ngrams(b, n, x, grams)
    # pool n-gram -> output column, as a 0/1 matrix (several n-grams may share a column)
    onehot = np.zeros((len(grams), width), np.float32)
    for k, (_, gid) in enumerate(grams):
        onehot[k, indexes[gid]] = 1
    table = b.constant(onehot, name=tmp_hint(n, "columns"))
    tf = b.reduce("sum", "f32", out_shape, (ex.const(len(grams)),),
                  lambda o, r: counts.at(o[:-1] + [r[0]]) * table.at([r[0], o[-1]]),
                  names, ("g",), tmp_hint(n, "tf") if mode != "TF" else None)
    if mode == "TF":
        return [tf]
    w = None
    if weights:
        # the i-th weight belongs to the i-th pool n-gram (the spec, and ORT); ONNX's
        # reference indexes it by output column, which agrees when ngram_indexes is 0..n-1
        per_column = np.zeros(width, np.float32)
        for _, gid in grams:
            per_column[indexes[gid]] = weights[gid]
        w = b.constant(per_column, name=tmp_hint(n, "weights"))

    def weigh(i):
        f = tf.at(i)
        scale = w.at([i[-1]]) if w is not None else ex.const(1.0)
        if mode == "IDF":
            return ex.select(ex.binary("gt", f, ex.const(0.0)), scale, ex.const(0.0))
        return scale * f
    return [b.map("f32", out_shape, weigh, names)]


def _count_ngrams(b, n, x, grams):
    """counts[row, g]: how often n-gram g occurs, over skip distances and start positions."""
    longest = max(len(t) for t, _ in grams)
    tokens = np.zeros((len(grams), longest), np.int64)
    lengths = np.zeros(len(grams), np.int64)
    for k, (t, _) in enumerate(grams):
        tokens[k, :len(t)] = t
        lengths[k] = len(t)
    tok = b.constant(tokens, name=tmp_hint(n, "tokens"))
    lens = b.constant(lengths, name=tmp_hint(n, "lengths"))
    skips = int(n.attr("max_skip_count")) + 1
    length = x.shape[-1]
    if x.tensor is None:
        x = b.materialize(x)

    def match(o, r):
        k, d, s = o[-1], r[0] + 1, r[1]
        row = o[:-1]
        size = lens.at([k])
        # unigrams are counted once (skip distance 1), longer n-grams at every distance
        ok = ex.binary("and", ex.binary("lt", s + (size - 1) * d, length),
                       ex.binary("or", ex.binary("gt", size, ex.const(1)), _is_eq(d, ex.const(1))))
        for j in range(longest):
            xj = ex.cast(ex.read(x.tensor, dict(zip(x.names, row + [s + j * d])), x.dtype, pad=0), "i64")
            hit = ex.binary("or", ex.binary("le", size, ex.const(j)), _is_eq(xj, tok.at([k, ex.const(j)])))
            ok = ex.binary("and", ok, hit)
        return ex.select(ok, ex.const(1.0), ex.const(0.0))

    rows = (x.shape[0],) if x.rank == 2 else ()
    names = ("n", "g") if x.rank == 2 else ("g",)
    return b.reduce("sum", "f32", rows + (ex.const(len(grams)),), (ex.const(skips), length), match,
                    names, ("skip", "start"), tmp_hint(n, "counts"))


# ---------------------------------------------------------------- LabelEncoder


def _label_table(n):
    """(keys, values, default) as NumPy arrays/scalar; the later of duplicate keys wins."""
    if n.attr("keys_strings", None) or n.attr("values_strings", None):
        raise n.fail("string keys or values are not supported: mlpack has no string tensors")
    keys = next((_array(n.attr(a, None)) for a in ("keys_int64s", "keys_floats", "keys_tensor")
                 if n.attr(a, None) is not None), None)
    if keys is None:
        raise n.fail("no keys (keys_int64s, keys_floats or keys_tensor)")
    if n.attr("values_int64s", None) is not None:
        values, default = np.asarray(n.attr("values_int64s"), np.int64), n.attr("default_int64")
    elif n.attr("values_floats", None) is not None:
        values, default = np.asarray(n.attr("values_floats"), np.float32), n.attr("default_float")
    elif n.attr("values_tensor", None) is not None:
        values = _array(n.attr("values_tensor"))
        if values.dtype.kind in "OSU":
            raise n.fail("string values are not supported: mlpack has no string tensors")
        dflt = _array(n.attr("default_tensor", None))
        default = dflt.reshape(-1)[0].item() if dflt is not None else \
            (-1 if values.dtype.kind in "iu" else -0.0)
    else:
        raise n.fail("no values (values_int64s, values_floats or values_tensor)")
    if keys.dtype.kind in "OSU":
        raise n.fail("string keys are not supported: mlpack has no string tensors")
    if len(keys) != len(values):
        raise n.fail(f"{len(keys)} keys but {len(values)} values")
    last: dict = {}
    for i, k in enumerate(keys.reshape(-1).tolist()):
        last["nan" if isinstance(k, float) and math.isnan(k) else k] = i
    order = sorted(last.values())
    return keys.reshape(-1)[order], values.reshape(-1)[order], default


@op("LabelEncoder", domain=_ML)
def label_encoder(b, n):
    x = n.inputs[0]
    keys, values, default = _label_table(n)
    out_dtype = dt.from_numpy(values.dtype)
    dflt = ex.const(default, out_dtype)
    if len(keys) == 0:
        return [b.map(out_dtype, x.shape, lambda i: dflt, x.names)]
    kt = b.constant(keys, name=tmp_hint(n, "keys"))
    vt = b.constant(values, name=tmp_hint(n, "values"))

    def matches(v, key):  # plain equality: a NaN key matches nothing, as in ORT and the reference
        return _is_eq(ex.cast(v, kt.dtype), key)

    k = ex.const(len(keys))
    pos = b.reduce("argmax", "i64", x.shape, (k,),
                   lambda o, r: ex.select(matches(x.at(o), kt.at([r[0]])), ex.const(1), ex.const(0)),
                   x.names, ("key",), tmp_hint(n, "pos"))
    return [b.map(out_dtype, x.shape, lambda i: ex.select(
        matches(x.at(i), kt.at([pos.at(i)])), vt.at([pos.at(i)]), dflt), x.names)]


# ---------------------------------------------------------------- TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


class _Forest:
    """The node and leaf tables, with branch targets encoded: a node index i >= 0, or leaf l
    as -(l + 1)."""

    def __init__(self, n):
        def get(a):
            return _array(n.attr(a))

        self.modes = get("nodes_modes").astype(np.int64).reshape(-1)
        self.splits = get("nodes_splits").astype(np.float64).reshape(-1)
        self.features = get("nodes_featureids").astype(np.int64)
        m = len(self.modes)
        mvt = n.attr("nodes_missing_value_tracks_true", None)
        self.missing_true = np.asarray(mvt if mvt else [0] * m, np.int64)

        def enc(ids, leafs):
            ids, leafs = np.asarray(ids, np.int64), np.asarray(leafs, np.int64)
            return np.where(leafs != 0, -(ids + 1), ids)

        self.true_next = enc(n.attr("nodes_truenodeids"), n.attr("nodes_trueleafs"))
        self.false_next = enc(n.attr("nodes_falsenodeids"), n.attr("nodes_falseleafs"))
        self.roots = []
        for r in n.attr("tree_roots"):
            single = self.true_next[r] < 0 and self.true_next[r] == self.false_next[r]
            self.roots.append(int(self.true_next[r]) if single else int(r))
        self.leaf_targets = np.asarray(n.attr("leaf_targetids"), np.int64)
        self.leaf_weights = get("leaf_weights").reshape(-1)
        self.members = self._member_sets(n)
        self.depth = max((self._depth(r, 0) for r in self.roots), default=0)

    def _member_sets(self, n):
        """[nodes, widest set] of set-membership values, NaN padded (NaN never matches);
        the sets, separated by NaN, belong to the MEMBER nodes in node order."""
        count = int((self.modes == _MEMBER).sum())
        if not count:
            return None
        vals = _array(n.attr("membership_values", None))
        if vals is None:
            raise n.fail("set-membership nodes need membership_values")
        sets, cur = [], []
        for v in vals.astype(np.float64).reshape(-1).tolist():
            if math.isnan(v):
                sets.append(cur)
                cur = []
            else:
                cur.append(v)
        if cur:
            sets.append(cur)
        if len(sets) < count:
            raise n.fail(f"{count} set-membership nodes but {len(sets)} sets")
        table = np.full((len(self.modes), max(1, max(len(s) for s in sets))), np.nan)
        it = iter(sets)
        for i in np.nonzero(self.modes == _MEMBER)[0]:
            s = next(it)
            table[i, :len(s)] = s
        return table

    def _depth(self, node, seen):
        if node < 0:
            return 0
        if seen > len(self.modes):
            raise ValueError("the tree has a cycle")
        return 1 + max(self._depth(int(self.true_next[node]), seen + 1),
                       self._depth(int(self.false_next[node]), seen + 1))


def _goes_true(forest: _Forest, tabs, v, node):
    """Whether feature value v (f64) takes node's true branch."""
    split = tabs["splits"].at([node])
    mode = tabs["modes"].at([node])
    tests = {_LEQ: lambda: ex.binary("le", v, split), _LT: lambda: ex.binary("lt", v, split),
             _GTE: lambda: ex.binary("ge", v, split), _GT: lambda: ex.binary("gt", v, split),
             _EQ: lambda: _is_eq(v, split), _NEQ: lambda: ex.binary("ne", v, split)}
    used = sorted(set(forest.modes.tolist()))
    out = None
    for m in used:
        if m == _MEMBER:
            hit = None
            for j in range(forest.members.shape[1]):
                e = _is_eq(v, tabs["members"].at([node, ex.const(j)]))
                hit = e if hit is None else ex.binary("or", hit, e)
        else:
            hit = tests[m]()
        out = hit if out is None else ex.select(_is_eq(mode, ex.const(m)), hit, out)
    if forest.missing_true.any():
        out = ex.binary("or", out, ex.binary("and", ex.unary("isnan", v),
                                             ex.binary("ne", tabs["missing"].at([node]), ex.const(0))))
    return out


@op("TreeEnsemble", domain=_ML)
def tree_ensemble(b, n):
    x = n.inputs[0]
    if x.rank != 2:
        raise n.shape_error(f"input must be [N, F], it is rank {x.rank}")
    if int(n.attr("post_transform")) != 0:
        raise n.fail("post_transform other than NONE is not supported")
    agg = int(n.attr("aggregate_function"))
    if agg not in (0, 1, 2, 3):
        raise n.fail(f"aggregate_function {agg} is not supported")
    if not dt.is_float(x.dtype):
        raise n.fail(f"input of type {x.dtype} is not supported")
    forest = _Forest(n)
    ntrees = len(forest.roots)
    tabs = {k: b.constant(getattr(forest, a), name=tmp_hint(n, k)) for k, a in (
        ("splits", "splits"), ("modes", "modes"), ("features", "features"),
        ("missing", "missing_true"), ("tnext", "true_next"), ("fnext", "false_next"))}
    if forest.members is not None:
        tabs["members"] = b.constant(forest.members, name=tmp_hint(n, "members"))
    shape = (x.shape[0], ex.const(ntrees))
    names = ("n", "tree")
    roots = b.constant(np.asarray(forest.roots, np.int64), name=tmp_hint(n, "roots"))
    state = b.map("i64", shape, lambda i: roots.at([i[1]]), names, tmp_hint(n, "level0"))
    for level in range(forest.depth):
        def step(i, state=state):
            s = state.at(i)
            node = ex.maximum(s, ex.const(0))  # leaves read node 0's entries, then keep s
            v = ex.cast(x.at([i[0], tabs["features"].at([node])]), "f64")
            nxt = ex.select(_goes_true(forest, tabs, v, node), tabs["tnext"].at([node]),
                            tabs["fnext"].at([node]))
            return ex.select(ex.binary("lt", s, ex.const(0)), s, nxt)
        state = b.map("i64", shape, step, names, tmp_hint(n, f"level{level + 1}"))
    return [_aggregate(b, n, x, forest, state, agg)]


def _aggregate(b, n, x, forest, state, agg):
    """Y[row, target] over trees: sum, average, min or max of the leaf weights that go to
    that target (min/max start from the dtype's extreme, as the reference does)."""
    targets = int(n.attr("n_targets") or (int(forest.leaf_targets.max()) + 1))
    ltgt = b.constant(forest.leaf_targets, name=tmp_hint(n, "leaf_targets"))
    lw = b.constant(forest.leaf_weights.astype(dt.to_numpy(x.dtype)), name=tmp_hint(n, "leaf_weights"))
    info = np.finfo(dt.to_numpy(x.dtype))
    empty = {0: 0.0, 1: 0.0, 2: float(info.max), 3: float(info.min)}[agg]
    kind = {0: "sum", 1: "sum", 2: "min", 3: "max"}[agg]
    ntrees = len(forest.roots)

    def body(o, r):
        leaf = ex.const(-1) - state.at([o[0], r[0]])
        w = lw.at([leaf])
        if agg == 0:
            w = ex.binary("div", w, ex.const(float(ntrees), x.dtype))
        return ex.select(_is_eq(ltgt.at([leaf]), o[1]), w, ex.const(empty, x.dtype))

    return b.reduce(kind, x.dtype, (x.shape[0], ex.const(targets)), (ex.const(ntrees),), body,
                    ("n", "target"), ("tree",))
