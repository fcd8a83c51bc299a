"""mlpack's benchmark suite: a fixed model set (models.py) timed against ONNX Runtime (run.py).

Not part of the installed package: run it from a checkout, ``python -m benchmarks.run``.
"""
