"""Count milo_ray's internal imports and how many sit inside functions (the figure the layer work tracks).

    python scripts/count_imports.py [PACKAGE_DIR]   # default: milo_ray
"""
import ast, pathlib, sys
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "milo_ray")
total = inner = 0
for f in root.rglob("*.py"):
    tree = ast.parse(f.read_text())
    def walk(node, depth):
        global total, inner
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in ch.names] if isinstance(ch, ast.Import) else [("." * ch.level) + (ch.module or "")]
                if any(m.startswith("milo_ray") or m.startswith(".") for m in mods):
                    total += 1
                    if depth: inner += 1
            d = depth + isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef))
            walk(ch, d)
    walk(tree, 0)
print(f"internal imports {total}, inside functions {inner}")
