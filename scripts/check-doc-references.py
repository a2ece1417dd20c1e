#!/usr/bin/env python3
"""Fails on any reference to a file that is not in the repository.

Scans README.md, docs/**/*.md and the comments of the code (C++ // and /* */ comments; shell,
CMake and Python # comments) under lib/, launcher/, apps/, examples/, tests/, scripts/ and
cmake/. A reference is
  - a markdown link or image to a relative path, [text](docs/launcher.md#anchor): the anchor is
    dropped and the path is resolved against the directory of the file holding the link, as a
    markdown viewer does; http(s)://, mailto: and pure #anchor links are not checked;
  - a path-like token in prose or a comment: made of path characters and either holding a '/'
    (whose first part names a directory of the repository, so that "and/or" or "gloo/nccl" are
    prose) or ending in .md .h .cpp .sh .py .cmake .txt. It is resolved against the referencing
    file's directory, the repository root, lib/src, lib/include, lib/include/lightning/fabric,
    lib/private, lib/private/lightning/fabric,
    launcher/src, launcher/include and tests, as written and with .h .cpp .md .sh .py .cmake
    appended ("internal/gradient_reducer" names lib/src/internal/gradient_reducer.cpp). A bare
    file name (no '/') also resolves when some file of the repository has that name.
Fenced ```diff blocks in markdown are skipped: they show files a change would add.

In README.md and docs/, every name qualified with lf:: or lightning::fabric:: inside code (an
inline `code span` or a fenced block), such as `lf::ddp_strategy` or
`lightning::fabric::DDPOptions::process_group`, must be declared in an installed header
(lib/include): each part of the name must occur there as a word. A documented function a user
cannot include is as broken as a missing file. Such a problem prints as
"file:line: 'name' is not declared in an installed header (lib/include)". A member named through
its type in code, such as `DDPOptions::process_group` or `lf::Fabric::launch`, must be declared in
that struct's or class's body when the type is one of the installed headers' (a renamed field is
as broken as a removed function): "file:line: 'Type::member' is not a member of Type".

The files, both those scanned and those a reference may name, come from git (tracked, plus
untracked files that .gitignore does not ignore), so build outputs are never scanned.

Prints every broken reference as "file:line: 'token' names no file in the repository" and exits
1 if there is any, 0 otherwise (77, skipped, outside a git checkout; 2 when git fails). With file arguments, scans those files (any path) instead of the
repository's, still resolving against the repository (a file outside it counts as one at its
root): scripts/check-doc-references.py /tmp/x.md
"""

import io
import os
import re
import subprocess
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXTENSIONS = (".md", ".h", ".cpp", ".sh", ".py", ".cmake", ".txt")
TRY_SUFFIXES = ("", ".h", ".cpp", ".md", ".sh", ".py", ".cmake")
SEARCH_BASES = ("", "lib/src", "lib/include", "lib/include/lightning/fabric", "lib/private",
                "lib/private/lightning/fabric", "launcher/src",
                "launcher/include", "tests")
COMMENT_DIRS = ("lib/", "launcher/", "apps/", "examples/", "tests/", "scripts/", "cmake/")

# Leading parts that name places outside the repository's files: build trees, the virtual
# environment and the vendored headers are ignored by git; the others are absolute or home paths.
SKIP_PREFIXES = ("/", "~", "build/", "build-", ".venv/", ".cache/", "third_party/")

# Generic tokens that look like paths but name no repository file, each with its reason.
ALLOWLIST = {
    "./train": "the user's own program in launch examples (lightning-run model ./train)",
    "train.py": "the user's own Python script in launch examples",
    "report.txt": "the hang report lightning-run writes into the attempt folder at run time",
    "results.md": "the summary scripts/device-check.sh writes under $OUT at run time",
    "nccl.h": "NCCL's header, from the CUDA toolkit",
    "ATen/functorch/Interpreter.h": "a LibTorch header",
}

PATH_TOKEN = re.compile(r"^[A-Za-z0-9_.+\-/@]+$")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://\S*|\bmailto:\S*")
# Splits prose into candidate tokens; < > { } $ * stay inside a token so that it can be skipped.
DELIMITERS = re.compile(r"[\s`'\"()\[\],;|:=#!?]+")
MD_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
API_NAME = re.compile(r"\b(?:lf|lightning::fabric)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
CODE_SPAN = re.compile(r"`([^`]+)`")
MEMBER_NAME = re.compile(r"\b([A-Z][A-Za-z0-9_]*)::([a-z_][A-Za-z0-9_]*)\b")
TYPE_HEAD = re.compile(r"\b(?:struct|class)\s+(?:LF_API\s+)?([A-Z][A-Za-z0-9_]*)\b[^;{()]*\{")


def type_bodies(text):
    """{type name: (the words of its body, the words naming its bases)} for the structs and
    classes a header defines."""
    bodies = {}
    for match in TYPE_HEAD.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text[match.end():i]))
        head = text[match.start(1) + len(match.group(1)):match.end() - 1]
        bases = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", head.split(":", 1)[1])) if ":" in head else set()
        entry = bodies.setdefault(match.group(1), (set(), set()))
        entry[0].update(words)
        entry[1].update(bases)
    return bodies


def with_inherited(types):
    """{type: its own words and those of every base it names, transitively}."""
    resolved = {}

    def words_of(name, seen):
        if name in resolved:
            return resolved[name]
        own, bases = types[name]
        words = set(own)
        for base in bases:
            if base in types and base not in seen:
                words |= words_of(base, seen | {base})
        resolved[name] = words
        return words

    return {name: words_of(name, {name}) for name in types}
MD_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?([^\s<>{}\"]+?)>?(?:\s+\"[^\"]*\")?\s*$")


def git_files():
    if not os.path.exists(os.path.join(ROOT, ".git")):
        print(f"skipped: {ROOT} is not a git checkout, so its files are unknown")
        sys.exit(77)
    run = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if run.returncode != 0:
        print("FAIL: git ls-files: " + run.stderr.decode().strip())
        sys.exit(2)
    out = run.stdout.decode()
    return sorted(f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f)))


class Repository:
    def __init__(self, files):
        self.files = set(files)
        self.installed_words = set()
        self.installed_types = {}
        for f in files:
            if f.startswith("lib/include/") and f.endswith((".h", ".in")):
                with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as header:
                    text = header.read()
                self.installed_words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
                for name, (words, bases) in type_bodies(text).items():
                    entry = self.installed_types.setdefault(name, (set(), set()))
                    entry[0].update(words)
                    entry[1].update(bases)
        self.installed_types = with_inherited(self.installed_types)
        self.dirs = set()
        for f in files:
            d = os.path.dirname(f)
            while d:
                self.dirs.add(d)
                d = os.path.dirname(d)
        self.base_names = {os.path.basename(f) for f in files}

    def exists(self, path):
        path = os.path.normpath(path)
        if path.startswith(".."):
            return False
        return path in self.files or path in self.dirs or path == "."

    def resolves(self, rel_dir, token, suffixes=TRY_SUFFIXES):
        for base in bases_for(rel_dir):
            for suffix in suffixes:
                if self.exists(os.path.join(base, token.rstrip("/") + suffix)):
                    return True
        return False


def bases_for(rel_dir):
    """The referencing file's directory and its parents up to the root (so that src/x.cpp in
    launcher/include/... names launcher/src/x.cpp), then SEARCH_BASES."""
    bases, d = [], rel_dir
    while d:
        bases.append(d)
        d = os.path.dirname(d)
    return bases + [b for b in SEARCH_BASES if b not in bases]


def comment_lines_cpp(text):
    """Yields (line number, comment text) for the // and /* */ comments of C++ source."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                yield line + k, part
            line += text.count("\n", i, end)
            i = end + 2
        elif c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"delim( ... )delim"
            open_paren = text.find("(", i)
            close = text.find(")" + text[i + 1:open_paren] + '"', open_paren)
            close = n if close < 0 else close
            line += text.count("\n", i, close)
            i = close + 1
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isdigit())):  # not 1'000
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1 if j < n and text[j] == c else j
        else:
            i += 1


def comment_lines_hash(text):
    """Yields (line number, comment text) for # comments of shell and CMake: a # outside quotes,
    at the start of a line or after a blank ($#, ${#x} and a#b are not comments)."""
    for number, raw in enumerate(text.split("\n"), 1):
        quote = None
        for k, c in enumerate(raw):
            if quote:
                if c == "\\" and quote == '"':
                    continue
                if c == quote and not (k > 0 and raw[k - 1] == "\\" and quote == '"'):
                    quote = None
            elif c in "'\"":
                quote = c
            elif c == "#" and (k == 0 or raw[k - 1] in " \t"):
                yield number, raw[k + 1:]
                break


def comment_lines_python(text):
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string[1:]
    except (tokenize.TokenError, SyntaxError):
        yield from comment_lines_hash(text)


def candidate_tokens(text):
    """The path-like tokens of a line of prose or of a comment."""
    for raw in DELIMITERS.split(URL.sub(" ", text)):
        token = raw
        # Markdown emphasis around a token: **name**, _name_.
        for mark in ("**", "*", "__", "_"):
            if len(token) > 2 * len(mark) and token.startswith(mark) and token.endswith(mark):
                token = token[len(mark):-len(mark)]
        token = token.rstrip(".")
        if not token or token in (".", ".."):
            continue
        if any(c in token for c in "<>{}$*%\\"):
            continue  # a template such as <name>, a glob or a shell variable: no single path
        if not PATH_TOKEN.match(token):
            continue
        yield token


def is_reference(repo, rel_dir, token):
    """Whether a token claims to name a file: it ends in a known extension, or it holds a '/'
    and starts with ./, ../ or a directory the resolution reaches ("and/or" does not)."""
    if token.startswith(SKIP_PREFIXES):
        return False
    if token.endswith(EXTENSIONS):
        return len(token.rsplit("/", 1)[-1]) > len(os.path.splitext(token)[1])
    if "/" in token:
        first = token.split("/")[0]
        return first in (".", "..") or repo.resolves(rel_dir, first + "/", ("",))
    return False


def check_token(repo, rel_dir, token):
    """True when the token names a file (or directory) of the repository."""
    if token in ALLOWLIST:
        return True
    if repo.resolves(rel_dir, token):
        return True
    return "/" not in token and token in repo.base_names


def undeclared_api_names(repo, code):
    """The lf::/lightning::fabric:: names in code that no installed header declares, and the
    Type::member names whose member the installed Type does not declare."""
    for match in API_NAME.finditer(code):
        parts = [p for p in match.group(1).split("::") if p]
        if parts and not all(p in repo.installed_words for p in parts):
            yield match.group(0), "is not declared in an installed header (lib/include)"
    for match in MEMBER_NAME.finditer(code):
        members = repo.installed_types.get(match.group(1))
        if members is not None and match.group(2) not in members:
            yield match.group(0), "is not a member of " + match.group(1)


# A command the docs show running one of the scripts directly: optional VAR=value words, then the
# script's path. Group 1: the words, 2: the path, 3: what follows.
DIRECT_SCRIPT = re.compile(r"^((?:(?:sudo\s+)?[A-Za-z_][A-Za-z0-9_]*=(?:\"[^\"]*\"|'[^']*'|\S*)\s+)*(?:sudo\s+)?)"
                           r"(?:\./)?(scripts/[\w.-]+)(.*)$")


def not_executable(repo, code_texts, whole_lines):
    """The scripts that the given commands run directly (not through bash or python3) and that are
    not executable: such a command fails as written with "Permission denied". A code span of the
    path alone names the file; with words before or after it, or on a line of a code block, it is
    a command."""
    for code in code_texts:
        match = DIRECT_SCRIPT.match(code.strip())
        if not match or not (whole_lines or match.group(1) or match.group(3).strip()):
            continue
        if repo.exists(match.group(2)) and not os.access(os.path.join(ROOT, match.group(2)), os.X_OK):
            yield match.group(2)


def scan_text(repo, rel_path, lines, problems, markdown, api_problems=None):
    rel_dir = os.path.dirname(rel_path)
    in_code = False
    for number, text in lines:
        if markdown and api_problems is not None:
            if text.strip().startswith("```"):
                in_code = not in_code
                continue
            code = text if in_code else " ".join(CODE_SPAN.findall(text))
            for name, why in undeclared_api_names(repo, code):
                api_problems.append((rel_path, number, name, why))
            for script in not_executable(repo, [text] if in_code else CODE_SPAN.findall(text), in_code):
                api_problems.append((rel_path, number, script, "is run directly there but is not executable "
                                     "(git update-index --chmod=+x, or show it run by bash)"))
        if markdown:
            targets = [m.group(1) for m in MD_LINK.finditer(text)]
            ref = MD_REF_DEF.match(text)
            if ref:
                targets.append(ref.group(1))
            for target in targets:
                if not target or target.startswith("#") or URL.match(target) \
                        or target.startswith(("http:", "https:", "mailto:")):
                    continue
                path = target.split("#")[0].split("?")[0]
                if path.startswith("/") or not repo.exists(os.path.join(rel_dir, path)):
                    problems.append((rel_path, number, target))
            # The link targets are checked; the prose check below sees only the link texts.
            text = MD_LINK.sub(lambda m: m.group(0)[:m.group(0).rfind("](") + 1], text)
            if ref:
                text = ""
        for token in candidate_tokens(text):
            if is_reference(repo, rel_dir, token) and not check_token(repo, rel_dir, token):
                problems.append((rel_path, number, token))


def markdown_lines(text):
    """Numbered lines of a markdown file, leaving out ```diff blocks: a diff shows files a change
    would add, which need not exist. Other fence lines are kept (the API check reads them)."""
    in_diff = False
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```") and (in_diff or stripped[3:].strip() == "diff"):
            in_diff = not in_diff
            continue
        if not in_diff:
            yield number, line


def scan_file(repo, rel_path, full_path, problems, api_problems):
    with open(full_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    name = os.path.basename(rel_path)
    if name.endswith(".md"):
        scan_text(repo, rel_path, markdown_lines(text), problems, markdown=True, api_problems=api_problems)
        return
    if name.endswith((".h", ".hpp", ".cpp", ".cc", ".cu")):
        lines = comment_lines_cpp(text)
    elif name.endswith(".py"):
        lines = comment_lines_python(text)
    elif (name.endswith((".sh", ".cmake", ".in", ".sbatch", ".txt")) or name == "CMakeLists.txt"
          or text.startswith("#!")):
        lines = comment_lines_hash(text)
    else:
        return
    scan_text(repo, rel_path, lines, problems, markdown=False)


def scanned(files):
    for f in files:
        if f == "README.md" or (f.startswith("docs/") and f.endswith(".md")):
            yield f
        elif f.startswith(COMMENT_DIRS) or f in ("CMakeLists.txt", ".ci/run"):
            yield f


def main(argv):
    files = git_files()
    repo = Repository(files)
    problems, api_problems = [], []
    if argv:
        for path in argv:
            full = os.path.abspath(path)
            rel = os.path.relpath(full, ROOT)
            scan_file(repo, rel if not rel.startswith("..") else os.path.basename(full), full,
                      problems, api_problems)
    else:
        for f in scanned(files):
            scan_file(repo, f, os.path.join(ROOT, f), problems, api_problems)
    for path, number, token in problems:
        print(f"{path}:{number}: '{token}' names no file in the repository")
    for path, number, name, why in api_problems:
        print(f"{path}:{number}: '{name}' {why}")
    return 1 if problems or api_problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
