"""mlpack.codegen.dsl: operators written over named dimensions, compiled as any ONNX op is.

    from mlpack.codegen import dsl

    def capsule_conv(P, W):        # V[n,x,y,co,i,j] = sum_{kx,ky,ci,k} P[n,2x+kx,2y+ky,ci,i,k] W[kx,ky,ci,co,k,j]
        x, y, kx, ky, ci, k = dsl.dims("x y kx ky ci k")
        return dsl.sum[kx, ky, ci, k](P(x=2*x + kx, y=2*y + ky) * W)

    g = dsl.to_graph(capsule_conv, inputs={"P": dsl.f32(n="batch", x=16, y=16, ci=32, i=4, k=4),
                                           "W": dsl.f32(kx=3, ky=3, ci=32, co=32, k=4, j=4)})

The DSL produces the existing IR (spec/ir): a reduction or a materialized value is one
comprehension, a procedure (``with dsl.procedure() as p``) one procedure op. Dims are matched
by name only, so an operator written for the dims it is about runs lifted over any others its
inputs have (lift.py). ``register`` makes a DSL function the importer of an ONNX node in a
custom domain (registry.py, onnx_bridge.py). docs/dsl.md is the guide.

Modules: values.py (named-dim values), sizes.py (size inference), trace.py (the graph being
built), reduce.py, scalar.py, proc.py (procedures), lift.py (declared operators),
tensors.py (input types), tograph.py (``to_graph``), registry.py and onnx_bridge.py (custom
ONNX ops), errors.py.
"""

from mlpack.codegen.dsl.errors import DimError, DslError
from mlpack.codegen.dsl.lift import op
from mlpack.codegen.dsl.proc import procedure
from mlpack.codegen.dsl.reduce import Reducer, argmax, argmin, mean, prod
from mlpack.codegen.dsl.reduce import max_ as max  # noqa: A004 (the maths' names, as dsl.max)
from mlpack.codegen.dsl.reduce import min_ as min  # noqa: A004
from mlpack.codegen.dsl.reduce import sum_ as sum  # noqa: A004
from mlpack.codegen.dsl.registry import load_ops, register, registered
from mlpack.codegen.dsl.scalar import *  # noqa: F401,F403 (exp, log, sqrt, sigmoid, where, ...)
from mlpack.codegen.dsl.tensors import TensorSpec, f16, f32, f64, i32, i64, tensor
from mlpack.codegen.dsl.tograph import to_graph
from mlpack.codegen.dsl.trace import Trace, constant, dim, dims
from mlpack.codegen.dsl.values import Dim, Value
