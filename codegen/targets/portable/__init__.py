"""The portable target: the IR itself, serialized (spec/ir/program.py), for the interpreters of
the runtime (the C engine's and NumPy's). It runs anywhere and is in every container."""
