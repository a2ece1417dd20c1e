#!/usr/bin/env python3
"""The C++ examples of README.md and docs/*.md that CI compiles (tests/docs/CMakeLists.txt).

A ```cpp block is compiled when the line just before its fence is a marker:
    <!-- example: program NAME -->   a whole program (with main): built as doc_example_NAME
    <!-- example: body -->           statements: compiled inside a function
    <!-- example: unit -->           declarations: compiled at namespace scope
(bodies and units after <lightning/fabric.h>, <torch/torch.h> and `namespace lf`). Every other
```cpp block is a fragment of a program, which README.md and docs/testing.md say.

    doc-examples.py OUTDIR    writes OUTDIR/NAME.cpp per program and OUTDIR/fragments.cpp (the
                              bodies and units), each block behind a #line naming its markdown
                              file and line, and prints the program names, one per line, for CMake
Standard library only: CMake runs it at configure time.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- example: (program ([A-Za-z0-9_]+)|body|unit) -->\s*$")


def blocks():
    """Yields (kind, name, markdown path, first code line number, code) for every marked block."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            match = MARKER.match(line)
            if not match:
                continue
            relative = path.relative_to(ROOT)
            if index + 1 >= len(lines) or lines[index + 1].strip() != "```cpp":
                sys.exit(f"doc-examples.py: {relative}:{index + 1}: the marker must be followed by a ```cpp fence")
            end = next((k for k in range(index + 2, len(lines)) if lines[k].startswith("```")), None)
            if end is None:
                sys.exit(f"doc-examples.py: {relative}:{index + 2}: the ```cpp block never closes")
            kind = "program" if match.group(2) else match.group(1)
            yield kind, match.group(2), relative, index + 3, "\n".join(lines[index + 2:end])


def write_if_changed(path, text):
    """Leaves an unchanged file alone, so a reconfigure recompiles nothing."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: doc-examples.py OUTDIR")
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    programs, fragments = [], []
    for kind, name, path, first, code in blocks():
        located = f'#line {first} "{path}"\n{code}\n'
        if kind == "program":
            if name in programs:
                sys.exit(f"doc-examples.py: two programs are named {name}")
            programs.append(name)
            write_if_changed(out / f"{name}.cpp", located)
        elif kind == "body":
            fragments.append(f"[[maybe_unused]] static void doc_example_{len(fragments)}() {{\n{located}}}\n")
        else:
            fragments.append(located)
    header = "#include <lightning/fabric.h>\n#include <torch/torch.h>\nnamespace lf = lightning::fabric;\n\n"
    write_if_changed(out / "fragments.cpp", header + "\n".join(fragments))
    print("\n".join(programs))


if __name__ == "__main__":
    main()
