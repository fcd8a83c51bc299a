"""Kernel bodies that differ only in their sizes, compiled once with the sizes as arguments.

A network repeats a block at several sizes (GoogLeNet's inception modules, a ResNet's stages):
the 1x1 convolution of one module and of the next are the same loops, tiles and epilogue over
other channel counts and pixel counts, so their lowered bodies (a kernel's ``.impl``) differ only
in integer literals: strides, trip counts, tile counts. ``sharing.py`` and
``module._share_identical`` share bodies that are identical; here bodies equal up to those
literals become one function, the *generic* body, that takes each literal that differs among
them as an ``i64`` argument, and each kernel's body becomes a call of it with its own values.
LLVM then optimizes and emits the code once (GoogLeNet's x86_64-v4 library: 3.7 MB of IR, 2.8 MB
with its micro-kernels' sizes as arguments; LLVM's time 6.6 -> 4.6 CPU-s).

Only micro-kernels' bodies are given (module.py): their loops are vectorized as written (the
tile), so a size as an argument costs an address computation; a pooling's or a concatenation's
loops LLVM vectorizes and unrolls itself from their constant trip counts, and without them ran
2-5x slower (GoogLeNet's 3x3 max pools of 14x14 pixels).

Only literals where any value is valid LLVM are lifted out: the ``i64`` operands of scalar
integer arithmetic, compares, selects and single-index element addresses. Types, vector
lanes, alignments, intrinsic arguments, tile buffer sizes and loop hints stay in the key: bodies
that differ there are not grouped. A literal that is the same in every body of a group stays a
literal in the generic body (the unroll counts, the micro-kernel's tile), so what LLVM lost is
only what differed; literals that differ the same way at several places are one argument.
"""

from __future__ import annotations

import re

# the i64 operands of one scalar instruction (line) that may be any value
_INT = r"(-?\d+|%\"?[\w.]+\"?)"
_FORMS = (
    re.compile(r"^(\s*%\S+ = (?:add|sub|mul|udiv|sdiv|urem|srem|shl|lshr|ashr|and|or|xor)"
               r"(?: nuw| nsw| exact)* i64 )" + _INT + "(, )" + _INT + r"$"),
    re.compile(r"^(\s*%\S+ = icmp \w+ i64 )" + _INT + "(, )" + _INT + r"$"),
    re.compile(r"^(\s*%\S+ = select\s+i1 \S+, i64 )" + _INT + "(, i64 )" + _INT + r"$"),
    re.compile(r"^(\s*%\S+ = getelementptr (?:inbounds )?(?:float|double|half|bfloat|i8|i16|i32"
               r"|i64|ptr), ptr \S+, i64 )" + _INT + r"()()$"),
)
_LITERAL = re.compile(r"-?\d+")
MAX_ARGUMENTS = 64   # a group whose bodies differ in more places is left as it was
_DEFINE = re.compile(r'^define internal void @"?([^"(]+)"?\((.*)\) ([^\n{]*)$', re.M)


def _parse(text: str) -> tuple[list[str], list[str]]:
    """(the body's text cut at its liftable literals, the literals): the text is the pieces
    with the literals between them."""
    pieces, values, current = [], [], []
    for line in text.split("\n"):
        for form in _FORMS:
            m = form.match(line)
            if m is None:
                continue
            head, a, sep, b = m.groups()
            current.append(head)
            for operand, after in ((a, sep), (b, "")):
                if operand and _LITERAL.fullmatch(operand):
                    pieces.append("".join(current))
                    values.append(operand)
                    current = [after]
                else:
                    current.append((operand or "") + after)
            current.append("\n")
            break
        else:
            current.append(line + "\n")
    pieces.append("".join(current))
    return pieces, values


def share_bodies(bodies: dict[str, str], meta: dict[str, str]) -> list[list[str]]:
    """Group the kernel bodies ``bodies`` (an ``.impl``'s name -> its LLVM text) whose code is
    the same up to liftable literals, and rewrite ``bodies`` in place: the first body of each
    group becomes the generic body followed by a call of it, the others a call of it. Metadata
    references compare by their content (``meta``: a node's name -> its canonical text).
    Returns the groups (lists of body names) that now share a generic body."""
    keyed: dict[str, list[tuple]] = {}   # key -> (name, pieces, literals, define match)
    for name, text in bodies.items():
        m = _DEFINE.match(text)
        if m is None or "alwaysinline" not in m.group(3):
            continue
        pieces, values = _parse(text)
        pieces[0] = pieces[0].replace(name, "K", 1)
        key = re.sub(r"!(\d+)", lambda n: meta.get(n.group(1), n.group(0)), "\0".join(pieces))
        keyed.setdefault(key, []).append((name, pieces, values, m))
    groups = []
    for members in keyed.values():
        if len(members) < 2:
            continue
        columns = list(zip(*(values for _, _, values, _ in members)))
        lifted: dict[tuple, int] = {}
        for column in columns:
            if len(set(column)) > 1:
                lifted.setdefault(column, len(lifted))
        if not lifted or len(lifted) > MAX_ARGUMENTS:
            continue
        _rewrite(bodies, members, columns, lifted)
        groups.append([name for name, *_ in members])
    return groups


def _rewrite(bodies: dict[str, str], members: list, columns: list[tuple],
             lifted: dict[tuple, int]) -> None:
    """``bodies`` of one group rewritten: the generic body (the first member's, its differing
    literals made arguments ``%"size.J"``) and a call of it per member."""
    first, pieces, _, define = members[0]
    generic = f"{first}.generic"
    params, attributes = define.group(2), define.group(3)
    declared = [p.strip().split(" ") for p in params.split(",") if p.strip()]
    passed = [f"{p[0]} {p[-1]}" for p in declared]   # (type, name): noalias stays the callee's
    sizes = [f'i64 %"size.{j}"' for j in range(len(lifted))]
    text = [pieces[0].replace("K", generic, 1)
            .replace(f"({params})", f"({', '.join([params, *sizes])})", 1)
            .replace(attributes, attributes.replace("alwaysinline", "noinline"), 1)]
    for column, piece in zip(columns, pieces[1:]):
        text.append(f'%"size.{lifted[column]}"' if column in lifted else column[0])
        text.append(piece)
    for k, (name, *_) in enumerate(members):
        args = passed + [f"i64 {c[k]}" for c in sorted(lifted, key=lifted.get)]
        call = (f'define internal void @"{name}"({params}) {attributes}\n{{\nentry:\n'
                f'  call void @"{generic}"({", ".join(args)})\n  ret void\n}}\n')
        bodies[name] = "".join(text).rstrip("\n") + "\n\n" + call if k == 0 else call
