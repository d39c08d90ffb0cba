"""Import contracts (what import-linter would check, written out): the numpy references in
vkdflash.ref depend on the core and never the reverse; the import graph has no cycles, counting
imports inside functions too (a local import must not be a way around a cycle); the built-in
plugins use only the public API, `vkdflash` and `vkdflash.api`. Each contract is also shown to
fail on a violating import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC, PLUGINS = ROOT / "src", ROOT / "plugins"
# the checkers may use the references: conformance compares with them, bench makes random blocks
MAY_IMPORT_REF = ("vkdflash.ref", "vkdflash.conformance", "vkdflash.bench")
PUBLIC = ("vkdflash", "vkdflash.api")


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(base: Path) -> dict[str, Path]:
    return {module_name(p, base): p for p in base.rglob("*.py")}


def imports(name: str, path: Path, known: set, source: str | None = None) -> set[str]:
    """Modules `name` imports (module level and inside functions), resolved against `known`."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    return {m for m in out if m in known}


def graph(extra: dict | None = None) -> dict[str, set]:
    """module -> imported modules, for src and plugins; `extra` adds source lines to a module."""
    found = {**modules(SRC), **modules(PLUGINS)}
    known = set(found)
    out = {}
    for name, path in found.items():
        source = path.read_text(encoding="utf-8") + (extra or {}).get(name, "")
        out[name] = imports(name, path, known, source)
    return out


def ref_violations(g) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in g.items() for b in deps
                  if b.startswith("vkdflash.ref") and not a.startswith(MAY_IMPORT_REF))


def plugin_violations(g) -> list[str]:
    plugin_pkgs = {m.split(".")[0] for m in modules(PLUGINS)}
    return sorted(f"{a} -> {b}" for a, deps in g.items() if a.split(".")[0] in plugin_pkgs
                  for b in deps if (b == "vkdflash" or b.startswith("vkdflash.")) and b not in PUBLIC)


def cycles(g) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_core_does_not_import_the_references():
    assert ref_violations(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_builtin_plugins_import_only_the_public_api():
    assert plugin_violations(graph()) == []


def test_the_contracts_fail_on_violating_imports():
    g = graph(extra={"vkdflash.kv_cache": "\nfrom .ref import kv\n",
                     "vkdflash.kernels.types": "\ndef f():\n    from ..kv_cache import KVCache\n",
                     "vkdflash_ngram": "\nfrom vkdflash.kernels import matmul\n"})
    assert "vkdflash.kv_cache -> vkdflash.ref.kv" in ref_violations(g)
    assert any("vkdflash.kernels.types" in c and "vkdflash.kv_cache" in c for c in cycles(g))
    assert "vkdflash_ngram -> vkdflash.kernels.matmul" in plugin_violations(g)


def test_every_public_name_resolves_from_vkdflash_and_vkdflash_api():
    import vkdflash
    from vkdflash import api
    assert api.__all__ and len(set(api.__all__)) == len(api.__all__)
    for name in api.__all__:
        assert getattr(vkdflash, name) is getattr(api, name), name
    assert set(api.__all__) <= set(dir(vkdflash))
