#!/usr/bin/env python3
"""Checks the structure of every workspace crate: no import circles between
source files, no shipped function longer than 150 lines.

    hack/check-structure.py [--root DIR] [--allow FILE] [--include-tests]
    hack/check-structure.py --self-test

For each member of the root Cargo.toml's [workspace] it reads the crate's
src/ tree from its roots (src/lib.rs, src/main.rs, src/bin/*.rs), following
`mod x;` declarations to files (x.rs, x/mod.rs; a.rs with an a/ folder).

Import circles: a file-level graph with an edge A -> B when A names an item
of B through a path that starts at `crate::`, `super::` or `self::`, in a
`use` (including `pub use`: a re-export is a dependency) or anywhere in code,
and when A's `use` / `pub use` starts at one of A's own child modules. Each
path goes to the file of its longest prefix that is a module. A parent's
`mod child;` is not an edge, and neither is a parent calling into its child
as `child::f()` in code: a child's `super::` back to its parent is how a
module is split into files, and counting both would flag every split.
Every strongly connected component of more than one file is reported.

Long functions: from the `fn` line to its closing brace, over 150 lines.

The crate map: every module a crate root (src/lib.rs, else src/main.rs)
declares outside test code is named in that root's `//!` doc, as `name`,
[`name`] or `name::...`, so a newcomer finds each module in one place.

Test code is skipped by both checks: `#[cfg(test)]` modules, files that
are only test modules (`#[cfg(test)] mod tests;`), and tests/, benches/,
examples/ (not under src/). --include-tests keeps cfg(test) code in the
import graph, to look at it.

One line per violation. hack/structure-allow.txt lists known violations,
one per line as `<violation key>  # reason`; each is printed as a warning at
every run. Exits 1 on a violation not in the list, and on a listed one that
no longer occurs (so the list only shrinks); 2 on a usage or parse error.
Standard library only.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MAX_FN_LINES = 150

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|::|->|=>|\S")


class ParseError(Exception):
    pass


def strip(text):
    """The source with comments and the insides of string and char literals
    blanked (newlines kept, so line numbers hold): braces in them must not
    count, paths in doc comments are not imports."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 260])) and (i == 0 or not is_ident(text[i - 1])):
            end = text.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not is_ident(text[i - 1]))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('""' + re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '" + " " * (m.end() - 3))
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_ident(c):
    return c.isalnum() or c == "_"


def tokens(text):
    line = 1
    pos = 0
    for m in TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        yield m.group(0), line


def is_cfg_test(attr):
    """Whether an attribute's tokens (between the brackets) are cfg(test) or
    a cfg that needs test, such as cfg(all(test, feature = "x"))."""
    return bool(attr) and attr[0] == "cfg" and "test" in attr and "not" not in attr and "any" not in attr


class FileInfo:
    def __init__(self, path):
        self.path = path
        self.mod_decls = []  # (inline module path below the file, name, cfg_test)
        self.inline_mods = []  # inline module paths below the file
        self.refs = []  # (inline module path, segments, kind, line, in_test); kind "path" or "use"
        self.fns = []  # (name, start line, end line, in_test)
        self.test_only = False


def parse_use_tree(toks, i, prefix, out):
    """Parses a use tree from toks[i]; appends each full path to out; returns
    the index after it."""
    path = list(prefix)
    while i < len(toks):
        t = toks[i]
        if t == "{":
            i += 1
            while i < len(toks) and toks[i] != "}":
                i = parse_use_tree(toks, i, path, out)
                if i < len(toks) and toks[i] == ",":
                    i += 1
            return i + 1
        if t == "*":
            out.append(path)
            return i + 1
        if t == "::":
            if not path:
                path.append("::")  # a global path (::std): never ours
            i += 1
            continue
        if re.match(r"[A-Za-z_]", t):
            path.append(t)
            i += 1
            if i < len(toks) and toks[i] == "as":
                i += 2
                out.append(path)
                return i
            if i < len(toks) and toks[i] == "::":
                continue
            out.append(path)
            return i
        return i + 1
    out.append(path)
    return i


def parse(path):
    info = FileInfo(path)
    text = strip(path.read_text(encoding="utf-8"))
    toks = list(tokens(text))
    words = [t for t, _ in toks]
    # The brace stack: each frame is (kind, name, start line, in_test).
    stack = []
    mods = []  # the inline module path at this point
    pending_test = False
    pending_fn = None  # (name, line) between `fn name` and its body or `;`
    pending_mod = None
    nest = 0  # ( and [ depth, for the `;` of a signature
    i = 0

    def in_test():
        return info.test_only or any(f[3] for f in stack)

    while i < len(toks):
        t, line = toks[i]
        if t == "#" and i + 1 < len(toks) and words[i + 1] in ("[", "!"):
            inner = words[i + 1] == "!"
            j = i + (3 if inner else 2)
            depth, start = 1, j
            while j < len(toks) and depth:
                depth += {"[": 1, "]": -1}.get(words[j], 0)
                j += 1
            if is_cfg_test(words[start:j - 1]):
                if inner and not stack:
                    info.test_only = True
                elif not inner:
                    pending_test = True
            i = j
            continue
        if t == "mod" and i + 2 < len(toks) and re.match(r"[A-Za-z_]", words[i + 1]):
            if words[i + 2] == ";":
                info.mod_decls.append((tuple(mods), words[i + 1], pending_test or in_test()))
                pending_test = False
                i += 3
                continue
            if words[i + 2] == "{":
                pending_mod = words[i + 1]
                i += 2
                continue
        if t == "fn" and i + 1 < len(toks) and re.match(r"[A-Za-z_]", words[i + 1]):
            pending_fn = (words[i + 1], line, nest)
            i += 2
            continue
        if t == "use" and i + 1 < len(toks) and words[i + 1] != "<" and (i == 0 or words[i - 1] != "::"):
            j = i + 1
            while j < len(toks) and words[j] != ";":
                j += 1
            paths = []
            k = i + 1
            while k < j:
                k = parse_use_tree(words[:j], k, [], paths)
            for p in paths:
                if len(p) > 1 and p[-1] == "self":
                    p = p[:-1]  # `use a::{self}` names a itself
                if p and p[0] != "::":
                    info.refs.append((tuple(mods), p, "use", line, pending_test or in_test()))
            pending_test = False
            i = j + 1
            continue
        if t in ("crate", "super", "self") and i + 1 < len(toks) and words[i + 1] == "::" and (i == 0 or words[i - 1] != "::"):
            segs = [t]
            j = i + 2
            while j < len(toks) and re.match(r"[A-Za-z_]", words[j]):
                segs.append(words[j])
                if j + 1 < len(toks) and words[j + 1] == "::":
                    j += 2
                else:
                    j += 1
                    break
            info.refs.append((tuple(mods), segs, "path", line, in_test()))
            i = j
            continue
        if t == "{":
            if pending_mod is not None:
                test = pending_test or in_test()
                stack.append(("mod", pending_mod, line, test))
                mods.append(pending_mod)
                info.inline_mods.append(tuple(mods))
                pending_mod = None
            elif pending_fn is not None:
                stack.append(("fn", pending_fn[0], pending_fn[1], pending_test or in_test()))
                pending_fn = None
            else:
                stack.append(("block", None, line, pending_test))
            pending_test = False
        elif t == "}":
            if not stack:
                raise ParseError(f"{path}:{line}: unbalanced closing brace")
            kind, name, start, test = stack.pop()
            if kind == "mod":
                mods.pop()
            elif kind == "fn":
                info.fns.append((name, start, line, test or info.test_only or any(f[3] for f in stack)))
        elif t in ("(", "["):
            nest += 1
        elif t in (")", "]"):
            nest -= 1
        elif t == ";":
            # `fn f();` in a trait ends a fn without a body; a `;` inside
            # its signature (`-> [u8; 4]`) does not.
            if pending_fn is not None and pending_fn[2] == nest:
                pending_fn = None
            pending_test = False
        i += 1
    if stack:
        raise ParseError(f"{path}: {len(stack)} unclosed braces")
    return info


class Crate:
    def __init__(self, name, dir):
        self.name = name
        self.dir = dir
        self.files = {}  # Path -> FileInfo
        self.modules = {}  # (root, module path) -> Path
        self.file_mod = {}  # Path -> (root, module path)
        self.test_files = set()


def child_file(parent_file, parent_is_dir_owner, inline, name):
    """The file of module `name` declared in parent_file, inside its inline
    modules `inline`."""
    base = parent_file.parent if parent_is_dir_owner else parent_file.with_suffix("")
    base = base.joinpath(*inline)
    for cand in (base / f"{name}.rs", base / name / "mod.rs"):
        if cand.is_file():
            return cand
    return None


def load_crate(root, member):
    d = (root / member).resolve()
    crate = Crate(member, d)
    src = d / "src"
    roots = [p for p in (src / "lib.rs", src / "main.rs") if p.is_file()]
    if (src / "bin").is_dir():
        roots += sorted((src / "bin").glob("*.rs"))
    for r in roots:
        queue = [(r, (), True, False)]
        while queue:
            f, modpath, owner, test = queue.pop()
            if f in crate.files and crate.file_mod[f][0] == r:
                continue
            info = crate.files.get(f) or parse(f)
            crate.files[f] = info
            crate.file_mod.setdefault(f, (r, modpath))
            crate.modules[(r, modpath)] = f
            if test or info.test_only:
                crate.test_files.add(f)
            for inline in info.inline_mods:
                crate.modules.setdefault((r, modpath + inline), f)
            for inline, name, decl_test in info.mod_decls:
                cf = child_file(f, owner, inline, name)
                if cf is None:
                    continue  # a module cargo would not find either: the compiler says so
                queue.append((cf, modpath + inline + (name,), cf.name == "mod.rs", test or decl_test))
    return crate


def resolve(crate, f, inline, segs, kind):
    root, modpath = crate.file_mod[f]
    cur = modpath + inline
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("self", "super"):
        base, rest = cur, segs
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                if not base:
                    return None
                base = base[:-1]
            rest = rest[1:]
    elif kind == "use" and (root, cur + (segs[0],)) in crate.modules:
        base, rest = cur, segs  # a use of one of this module's children
    else:
        return None
    for k in range(len(rest), -1, -1):
        target = crate.modules.get((root, base + tuple(rest[:k])))
        if target is not None:
            return target
    return None


def sccs(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def members(root):
    text = (root / "Cargo.toml").read_text(encoding="utf-8")
    m = re.search(r"^\[workspace\][^\[]*?^members\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if not m:
        raise ParseError(f"{root}/Cargo.toml: no [workspace] members")
    return re.findall(r'"([^"]+)"', m.group(1))


def violations(root, include_tests=False):
    """(key, detail) per violation, in a stable order."""
    out = []
    for member in members(root):
        crate = load_crate(root, member)
        rel = lambda p: os.path.relpath(p, root)
        edges = {}
        for f, info in crate.files.items():
            if f in crate.test_files:
                continue
            for inline, segs, kind, _line, test in info.refs:
                if test and not include_tests:
                    continue
                t = resolve(crate, f, inline, segs, kind)
                if t is not None and t != f and t not in crate.test_files:
                    edges.setdefault(f, set()).add(t)
        label = "." if member == "." else member
        for comp in sccs(sorted(crate.files), edges):
            if len(comp) > 1:
                files = " ".join(sorted(rel(p) for p in comp))
                out.append((f"import-circle {label}: {files}", ""))
        out.extend(unmapped(crate, label))
        for f in sorted(crate.files):
            if f in crate.test_files:
                continue
            for name, start, end, test in crate.files[f].fns:
                length = end - start + 1
                if not test and length > MAX_FN_LINES:
                    out.append((f"long-fn {rel(f)}::{name}", f"{length} lines from line {start}"))
    return out


def unmapped(crate, label):
    """Modules the crate root declares that its `//!` map does not name."""
    src = crate.dir / "src"
    root = next((p for p in (src / "lib.rs", src / "main.rs") if p.is_file()), None)
    if root is None or root not in crate.files:
        return []
    doc = "\n".join(
        line.strip()[3:] for line in root.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("//!"))
    out = []
    for inline, name, decl_test in crate.files[root].mod_decls:
        if inline or decl_test:
            continue
        if not re.search(r"`\[?" + re.escape(name) + r"(\]|`|::)", doc):
            out.append((f"unmapped-module {label}: {name}", f"not named in {root.relative_to(crate.dir)}'s //! map"))
    return out


def read_allow(path):
    allow = {}
    if not path.is_file():
        return allow
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, reason = line.partition("#")
        if not sep or not reason.strip():
            raise ParseError(f"{path}:{n}: an entry needs a reason after '#'")
        allow[key.strip()] = reason.strip()
    return allow


def check(root, allow_path, include_tests=False, out=sys.stdout):
    found = violations(root, include_tests)
    allow = read_allow(allow_path)
    failed = False
    keys = set()
    for key, detail in found:
        keys.add(key)
        suffix = f" ({detail})" if detail else ""
        if key in allow:
            print(f"warning: {key}{suffix}  [allowed: {allow[key]}]", file=out)
        else:
            print(f"error: {key}{suffix}", file=out)
            failed = True
    for key in allow:
        if key not in keys:
            print(f"error: {key}: allowed in {allow_path.name} but no longer occurs: remove it", file=out)
            failed = True
    return 1 if failed else 0


SELF_TEST_FILES = {
    "Cargo.toml": '[workspace]\nmembers = ["a", "b"]\n',
    # a: a circle x -> y -> z -> x (a use, a path in code, a pub use), a
    # long function, a long test function and a test-only file that imports
    # everything (neither counts).
    "a/src/lib.rs": "pub mod x;\npub mod y;\npub mod z;\npub mod p;\n#[cfg(test)]\nmod tests;\n",
    "a/src/x.rs": "use crate::y::Y;\npub struct X(Y);\n",
    "a/src/y.rs": "pub struct Y;\npub fn f() -> u8 { crate::z::g() }\n",
    "a/src/z.rs": "pub use super::x::X;\npub fn g() -> u8 { 1 }\n"
    + "pub fn long() {\n" + "    let _s = \"}\";\n" * 150 + "}\n"
    + "#[cfg(test)]\nmod tests {\n    use crate::p::c::C;\n    fn long_test() {\n" + "        let _ = 1;\n" * 160 + "    }\n}\n",
    "a/src/tests.rs": "use crate::x::X;\nuse crate::z::*;\nfn t() {\n" + "    let _ = 1;\n" * 160 + "}\n",
    # p declares its child c and calls it; c uses super: not a circle.
    "a/src/p.rs": "pub mod c;\npub const Q: u8 = 1;\npub fn p() -> u8 { c::C }\n",
    "a/src/p/c.rs": "pub const C: u8 = super::Q;\n// use crate::x::X; is a comment\n",
    # b: clean, with a 150-line function (the limit itself passes).
    "b/src/lib.rs": "//! The map names `m` only.\nmod m;\nmod lost;\npub fn ok() {\n" + "    let _ = '{';\n" * 148 + "}\n",
    "b/src/lost.rs": "",
    "b/src/m.rs": "use crate::ok;\n",
}


def self_test():
    failures = []

    def expect(what, cond):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, text in SELF_TEST_FILES.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        found = violations(root)
        keys = [k for k, _ in found]
        circle = "import-circle a: a/src/x.rs a/src/y.rs a/src/z.rs"
        expect("planted circle x -> y -> z -> x found", circle in keys)
        expect("long function found", "long-fn a/src/z.rs::long" in keys)
        expect("test code (cfg(test) module, tests.rs) not counted", not any("test" in k for k in keys))
        expect("mod declaration and parent -> child call are not edges", not any("p.rs" in k for k in keys))
        expect("a 150-line function passes; nothing else in b", not any(" b/" in k for k in keys))
        expect("a module the crate map does not name is found", "unmapped-module b: lost" in keys)
        expect("a module the map names passes", "unmapped-module b: m" not in keys)
        expect("crate a has no map: its modules are unmapped", "unmapped-module a: x" in keys)
        found = [f for f in found if not f[0].startswith("unmapped-module")]
        expect("exactly two other violations", len(found) == 2)
        # The rest of the self-test is about circles and long functions.
        for rel in ("a/src/lib.rs", "b/src/lib.rs"):
            text = (root / rel).read_text(encoding="utf-8")
            (root / rel).write_text("//! `x` `y` `z` `p` `m` `lost`\n" + text, encoding="utf-8")

        allow = root / "allow.txt"
        run = lambda: subprocess.run(
            [sys.executable, __file__, "--root", str(root), "--allow", str(allow)],
            capture_output=True, text=True)
        r = run()
        expect("exits 1 on the planted circle, not allowed", r.returncode == 1 and "error: " + circle in r.stdout)
        allow.write_text(f"{circle}  # planted\nlong-fn a/src/z.rs::long  # planted\n")
        r = run()
        expect("exits 0 when both are allowed, with warnings", r.returncode == 0 and r.stdout.count("warning:") == 2)
        (root / "a/src/z.rs").write_text("pub fn g() -> u8 { 1 }\npub fn long() {}\n")
        r = run()
        expect("exits 1 when allowed entries no longer occur", r.returncode == 1 and r.stdout.count("no longer occurs") == 2)
        allow.write_text(f"{circle}\n")
        r = run()
        expect("exits 2 on an entry without a reason", r.returncode == 2)
    print(f"self-test: {len(failures)} failure(s)")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--root", type=Path, default=here.parent, help="workspace root")
    ap.add_argument("--allow", type=Path, default=None, help="allowlist (default hack/structure-allow.txt)")
    ap.add_argument("--include-tests", action="store_true", help="keep cfg(test) code in the import graph")
    ap.add_argument("--self-test", action="store_true", help="check the checker on planted violations")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    allow = args.allow or args.root / "hack" / "structure-allow.txt"
    try:
        return check(args.root.resolve(), allow, args.include_tests)
    except (ParseError, OSError, UnicodeDecodeError) as e:
        print(f"check-structure: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
