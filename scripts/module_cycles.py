#!/usr/bin/env python3
"""Report import circles between the modules of each crate under crates/*/src.

A module is a file: `src/lib.rs` (or `src/main.rs`) is the crate's root, `src/a/b.rs` and
`src/a/b/mod.rs` are `a::b`. Module `a` uses module `b` when `a`'s code names a path that
resolves to `b`: `crate::b::...`, `super::...`, `self::...`, or a child module by its bare name
(`params::X` in the file that declares `mod params;`). A path resolves to the longest module it
starts with; a name that module re-exports with `pub use` is followed to where it comes from, so
`crate::Gpt` (re-exported by the root) is a use of `gpt`, not of the root. Declaring a child
(`mod child;`) is not a use.

Left out on purpose: comments, string literals, and a file module's own `tests` module (its
`#[cfg(test)] mod tests`, inline or in a file), which may use its parent freely. Each file in
`src/bin` is a crate of its own, as cargo builds it.

Usage: scripts/module_cycles.py [CRATES_DIR]  (default: crates). Exits 1 if there is a circle,
printing each
group of modules that reach one another, with the uses between them.
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A path rooted where this checker can resolve it: `crate::`, `super::`, `self::`, `a::`.
PATH = re.compile(rf"\b{IDENT}(?:\s*::\s*{IDENT})+")
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
MOD_DECL = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;", re.M)
INLINE_TESTS = re.compile(r"^\s*mod\s+tests\s*\{", re.M)
STRIP = re.compile(
    r"//[^\n]*"  # line comments, doc comments included
    r"|/\*.*?\*/"  # block comments (not nested)
    r'|r(#*)".*?"\1'  # raw strings
    r'|b?"(?:\\.|[^"\\])*"'  # strings
    r"|'(?:\\.|[^'\\])'",  # characters (a lifetime `'a` has no closing quote)
    re.S,
)


def strip(code):
    """`code` without comments and literals, newlines kept."""
    return STRIP.sub(lambda m: "\n" * m.group(0).count("\n"), code)


def module_of(path, src):
    """The module path of a file under `src`, as a tuple (the root is `()`)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def expand_use(tree):
    """The paths a use tree names: `a::{self, b as c, d::{e, f}}` -> a, a::b, a::d::e, a::d::f."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    brace = tree.find("{")
    if brace < 0:
        return [tree.removesuffix("::self")]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner + ","):
        if ch in "{}":
            depth += 1 if ch == "{" else -1
        elif ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    return [path for item in items if item for path in expand_use(prefix + item)]


class Crate:
    def __init__(self, name, files):
        """`files`: module path -> source file."""
        self.name = name
        self.code = {m: strip(f.read_text()) for m, f in files.items()}
        self.children = {m: set(MOD_DECL.findall(c)) for m, c in self.code.items()}
        # Each module's re-exports: name -> the path it stands for, from the crate root.
        self.reexports = {}
        for module, code in self.code.items():
            self.reexports[module] = {
                path.split("::")[-1]: full
                for vis, tree in USE.findall(code)
                if vis
                for path in expand_use(tree)
                if not path.endswith("*")
                and (full := self.absolute(module, path.split("::"))) is not None
            }

    def absolute(self, module, segs):
        """`segs`, a path named in `module`, from the crate root; None for another crate's."""
        if segs[0] == "crate":
            return tuple(segs[1:])
        if segs[0] in ("self", "super"):
            base = list(module)
            while segs and segs[0] in ("self", "super"):
                if segs.pop(0) == "super":
                    if not base:
                        return None
                    base.pop()
            return tuple(base + segs)
        if segs[0] in self.children.get(module, ()):
            return module + tuple(segs)
        return None

    def resolve(self, segs, depth=0):
        """The module a path from the root lands in: the longest one, re-exports followed."""
        for n in range(len(segs), -1, -1):
            if segs[:n] in self.code:
                module = segs[:n]
                break
        if n < len(segs) and depth < 8:
            target = self.reexports[module].get(segs[n])
            if target and target != segs[: n + 1]:
                return self.resolve(target + segs[n + 1 :], depth + 1)
        return module

    def uses(self, module):
        """The other modules `module` uses (not itself, its `tests`, or what it declares)."""
        code = self.code[module]
        inline_tests = INLINE_TESTS.search(code)
        body = code[: inline_tests.start()] if inline_tests else code
        named = [(False, path) for path in PATH.findall(USE.sub("", body))]
        for vis, tree in USE.findall(body):
            named += [(bool(vis), path) for path in expand_use(tree)]
        found = set()
        for reexport, path in named:
            full = self.absolute(module, re.sub(r"\s+", "", path).split("::"))
            if full is None:
                continue
            target = self.resolve(full)
            # A module re-exporting what is inside it is declaring it, not using it.
            if not (reexport and target[: len(module)] == module):
                found.add(target)
        return {m for m in found if m != module and not is_tests_of(m, module)}


def is_tests_of(a, b):
    """Whether one of `a`, `b` is the other's `tests` module."""
    return (a[-1:] == ("tests",) and a[:-1] == b) or (b[-1:] == ("tests",) and b[:-1] == a)


def crates(root):
    """Each crate under `root`: the library or binary, and each `src/bin` file."""
    for src in sorted(root.glob("*/src")):
        bin_dir = src / "bin"
        main = {
            module_of(f, src): f
            for f in src.rglob("*.rs")
            if bin_dir not in f.parents
        }
        if main:
            yield Crate(src.parent.name, main)
        for f in sorted(bin_dir.glob("*.rs")):
            yield Crate(f"{src.parent.name} (bin {f.stem})", {(): f})


def circles(crate):
    """The circles of `crate`'s uses: each group of modules that reach one another (a strongly
    connected component of more than one module), with the uses inside it."""
    graph = {m: crate.uses(m) for m in crate.code}
    reaches = {m: reachable(graph, m) for m in graph}
    groups = []
    for m in sorted(graph):
        group = sorted(n for n in reaches[m] if m in reaches[n])
        if len(group) > 1 and group not in groups:
            groups.append(group)
    return [{m: sorted(graph[m] & set(group)) for m in group} for group in groups]


def reachable(graph, start):
    """The modules `start` reaches through one use or more."""
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def name(module):
    return "::".join(module) or "crate"


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "crates")
    total = 0
    for crate in crates(root):
        for circle in circles(crate):
            total += 1
            print(f"{crate.name}: a circle through {', '.join(map(name, circle))}")
            for module, uses in circle.items():
                print(f"  {name(module)} -> {', '.join(map(name, uses))}")
    print(f"{total} circle(s)" if total else "no circles")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
