"""mlpack.packager: the command line and, later, ``mlpack build``.

It drives the compiler (``mlpack.codegen``) and writes containers (``mlpack.spec``); it may
import spec, codegen and runtime. ``cli.py`` is the typer app behind the ``mlpack`` command;
``reference.py`` runs a model on the NumPy reference interpreter.
"""
