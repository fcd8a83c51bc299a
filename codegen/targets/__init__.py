"""Code generation targets: each folder turns an optimized IR graph into native artifacts.

A target is a description (triple, CPU, features) plus the lowering that emits its code; adding
one touches one folder. ``cpu`` emits an ELF shared object and a plan (spec/SPEC.md section 7).
"""
