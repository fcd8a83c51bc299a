"""mlpack.runtime: open a container, pick the artifact this host runs best, run it.

    import mlpack
    m = mlpack.load("model.mlpack")     # FormatError for a broken file; NoRunnableArtifactError
    y = m(x=x)                          # InputError names the input and dim at fault
    m.artifact.reason, m.verdicts       # why this artifact, why not the others

It imports only ``mlpack.spec``, NumPy and the standard library (tests/test_layering.py checks),
so a deployment host installs the runtime without the compiler. Modules: host.py (what this
machine can run), select.py (the selection algorithm of spec/SPEC.md section 5), portable.py
(the portable program on the reference interpreter), native.py (libmlpack through ctypes),
engine.py (the engine's selection and native executor behind load), model.py (load, input
checks, validation). ``load`` lets libmlpack select and run native code; Python runs the portable
program itself, and selects on its own only where libmlpack is not built.
"""

from mlpack.spec.errors import (NoRunnableArtifactError, PortableFallbackError,
                                PortableFallbackWarning)

from mlpack.runtime.host import Host, detect_host
from mlpack.runtime.model import (ArtifactInfo, Model, OutputCheck, TensorInfo, ValidationResult,
                                  load)
from mlpack.runtime.portable import PortableExecutor
from mlpack.runtime.select import Verdict, describe, explain, select_artifact

__all__ = ["load", "Model", "TensorInfo", "ArtifactInfo", "ValidationResult", "OutputCheck",
           "Host", "detect_host", "Verdict", "select_artifact", "describe", "explain",
           "PortableExecutor", "NoRunnableArtifactError", "PortableFallbackError",
           "PortableFallbackWarning"]
