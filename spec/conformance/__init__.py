"""The container conformance corpus: valid and broken containers with their expected verdicts.

``generate.py`` writes them (deterministically) next to this file with ``expected.json``; both
readers, the Python one (spec/container.py) and the C engine, must give every verdict.
"""
