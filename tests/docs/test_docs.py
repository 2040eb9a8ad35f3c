"""The manual's own checks (Debian's python3 + pytest):

- every relative link and #anchor in README.md and docs/*.md resolves: the file exists, and
  the anchor is the GitHub slug of one of its headings (or of the same file's);
- every code block of the guides (docs/guide-*.md) is a verbatim excerpt of an example under
  examples/ (which tests/docs/CMakeLists.txt builds and runs), so no guide code goes untested;
- every file and folder that docs/architecture.md names (`store/src/gpu.cpp`, `gpu.cpp`,
  `base/thread_pool.hpp`, `tests/common/`, `*_cmd.cpp`) is in the repository;
- scripts/plot_bench.py turns the fixtures (tests/docs/fixtures/*.json) into PNG files,
  says which charts it skipped, and names the file and field of malformed input.
"""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "docs", "fixtures")
PLOT = os.path.join(ROOT, "scripts", "plot_bench.py")
CHARTS = ["io_sweep", "adam_threads", "step_breakdown", "emulated_scaling", "planner_accuracy"]


def markdown_files():
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))


FENCE = re.compile(r"^(\s*)(```|~~~)")


def split_fences(text):
    """(prose lines, code blocks): code blocks as (info string, body) in order."""
    prose, blocks, body, info, fence = [], [], None, "", None
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if body is None:
            if m:
                fence, info, body = m.group(2), line.strip()[3:].strip(), []
                prose.append("\n")
            else:
                prose.append(line)
        elif m and m.group(2) == fence and line.strip() == fence:
            blocks.append((info, "".join(body)))
            body = None
            prose.append("\n")
        else:
            body.append(line)
            prose.append("\n")
    return prose, blocks


def github_slug(heading):
    """GitHub's anchor of a heading: the rendered text lower-cased, punctuation other than
    '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(^|\s)_+|_+($|\s)", r"\1\2", text)           # _emphasis_
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    prose, _ = split_fences(open(path, encoding="utf-8").read())
    seen, out = {}, set()
    for line in prose:
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)")


def links(path):
    """(line number, target) of every link outside code blocks and inline code."""
    prose, _ = split_fences(open(path, encoding="utf-8").read())
    for n, line in enumerate(prose, 1):
        line = re.sub(r"(`+).*?\1", "", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)
        m = REF_DEF.match(line)
        if m:
            yield n, m.group(1)


def dead_links(path):
    dead = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else os.path.normpath(
            os.path.join(os.path.dirname(path), file_part))
        where = f"{os.path.relpath(path, ROOT)}:{n}: ({target})"
        if not os.path.exists(dest):
            dead.append(f"{where}: {os.path.relpath(dest, ROOT)} does not exist")
        elif anchor:
            if not dest.endswith(".md"):
                dead.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                dead.append(f"{where}: no heading with anchor #{anchor} in "
                            f"{os.path.relpath(dest, ROOT)}")
    return dead


def test_github_slugs():
    assert github_slug("The data path of a put (NVMe tier)") == "the-data-path-of-a-put-nvme-tier"
    assert github_slug("Naming: `x_async()` returns a future, `x()` blocks") == \
        "naming-x_async-returns-a-future-x-blocks"
    assert github_slug("Parameter offload (`strata.torch.offload_parameters`, `offload_init`)") == \
        "parameter-offload-stratatorchoffload_parameters-offload_init"
    assert github_slug("One store worker thread") == "one-store-worker-thread"


def test_the_link_checker_finds_dead_links(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading\n\n## Twice\n\n## Twice\n")
    (tmp_path / "a.md").write_text(
        "# Top\n[ok](b.md) [ok](b.md#real-heading) [ok](b.md#twice-1) [ok](#top)\n"
        "[gone](missing.md) [bad anchor](b.md#nope) [self](#nowhere)\n"
        "`[not a link](x.md)`\n```\n[in code](y.md)\n```\n[web](https://example.com/x)\n")
    found = dead_links(str(tmp_path / "a.md"))
    assert len(found) == 3, found
    assert "missing.md does not exist" in found[0]
    assert "no heading with anchor #nope" in found[1]
    assert "#nowhere" in found[2]


def test_no_dead_links_in_readme_and_docs():
    dead = [d for f in markdown_files() for d in dead_links(f)]
    assert not dead, "dead links:\n" + "\n".join(dead)


# A token of a doc names a file when it ends in one of these, a folder when it ends in "/".
FILE_EXTENSIONS = (".cpp", ".hpp", ".h", ".c", ".cc", ".cu", ".py", ".md", ".txt", ".cmake",
                   ".sh", ".json", ".toml", ".cfg")
PATH_TOKEN = re.compile(r"[\w.*<>\-]+(?:/[\w.*<>\-]+)*/?")


def named_paths(text):
    """The file and folder names in `text`, in order, each once: tokens ending in one of
    FILE_EXTENSIONS (after any trailing '.', as at the end of a sentence) or in '/'.
    Placeholders (`tests/<component>/`) are not names."""
    out = []
    for m in PATH_TOKEN.finditer(text):
        tok = m.group(0)
        if tok.endswith("/"):
            is_dir = len(tok) > 1
        else:
            tok = tok.rstrip(".")
            is_dir = False
        if "<" in tok or ">" in tok or not (is_dir or tok.endswith(FILE_EXTENSIONS)):
            continue
        if tok.strip("./*") and tok not in out:
            out.append(tok)
    return out


def repo_paths(root):
    """(files, folders) of the source tree below `root`, as '/'-separated paths relative to
    it; build trees (a CMakeCache.txt), hidden and __pycache__ folders left out."""
    files, dirs = [], []
    for here, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "__pycache__"
                            and not os.path.exists(os.path.join(here, d, "CMakeCache.txt")))
        rel = os.path.relpath(here, root).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        dirs += [prefix + d for d in subdirs]
        files += [prefix + n for n in names]
    return files, dirs


def missing_paths(names, files, dirs):
    """The names (from named_paths) that no file or folder matches. A name matches a path
    equal to it or ending in "/" + it (`gpu.cpp`, `base/thread_pool.hpp` for
    base/include/strata/base/thread_pool.hpp); '*' matches within one path component."""
    missing = []
    for name in names:
        is_dir = name.endswith("/")
        pattern = name.rstrip("/")
        candidates = dirs if is_dir else files
        if not any(fnmatch.fnmatchcase(c, pattern) or fnmatch.fnmatchcase(c, "*/" + pattern)
                   for c in candidates
                   if c.count("/") >= pattern.count("/")
                   and fnmatch.fnmatchcase(c.rsplit("/", 1)[-1], pattern.rsplit("/", 1)[-1])):
            missing.append(name)
    return missing


def test_the_path_checker_finds_missing_names(tmp_path):
    for f in ["store/src/gpu.cpp", "base/include/strata/base/thread_pool.hpp", "cli/tune_cmd.cpp",
              "tests/common/temp_dir.hpp", "build/store/src/gone.cpp"]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    (tmp_path / "build" / "CMakeCache.txt").write_text("")
    text = ("store/src/gpu.cpp holds it (gpu.cpp, base/thread_pool.hpp); *_cmd.cpp, tests/common/,\n"
            "tests/<component>/, Status/Result, put/get. Gone: store/src/old.cpp, gone.cpp, src/gpu.cpp\n"
            "thread_pool.hpp. bench_*.cpp, tests/gone/, strata.h.")
    names = named_paths(text)
    assert names == ["store/src/gpu.cpp", "gpu.cpp", "base/thread_pool.hpp", "*_cmd.cpp",
                     "tests/common/", "store/src/old.cpp", "gone.cpp", "src/gpu.cpp",
                     "thread_pool.hpp", "bench_*.cpp", "tests/gone/", "strata.h"], names
    files, dirs = repo_paths(str(tmp_path))
    assert missing_paths(names, files, dirs) == ["store/src/old.cpp", "gone.cpp", "bench_*.cpp",
                                                 "tests/gone/", "strata.h"]


def test_architecture_names_only_files_that_exist():
    doc = os.path.join(ROOT, "docs", "architecture.md")
    names = named_paths(open(doc, encoding="utf-8").read())
    assert len(names) > 50, names  # the components' boxes name files
    files, dirs = repo_paths(ROOT)
    missing = missing_paths(names, files, dirs)
    assert not missing, ("docs/architecture.md names files or folders that are not in the "
                         "repository: " + ", ".join(missing))


GUIDE_LANGS = {"cpp": ".cpp", "c": ".c", "python": ".py"}


def test_every_guide_code_block_is_an_example_that_runs():
    guides = sorted(f for f in markdown_files() if os.path.basename(f).startswith("guide-"))
    assert {os.path.basename(g) for g in guides} >= {"guide-cpp.md", "guide-c.md", "guide-python.md"}
    examples = {}
    for f in os.listdir(os.path.join(ROOT, "examples")):
        if f.startswith("guide_"):
            examples[f] = open(os.path.join(ROOT, "examples", f), encoding="utf-8").read()
    cmake = open(os.path.join(ROOT, "tests", "docs", "CMakeLists.txt"), encoding="utf-8").read()
    for name in examples:  # each example is built and run by ctest
        assert f"examples/{name}" in cmake, f"examples/{name} is not run by tests/docs/CMakeLists.txt"
    checked = 0
    for g in guides:
        _, blocks = split_fences(open(g, encoding="utf-8").read())
        for info, body in blocks:
            lang = info.split()[0] if info else ""
            if lang in ("sh", "text", "console"):
                continue  # commands and output, not programs
            assert lang in GUIDE_LANGS, f"{g}: a code block of language {lang!r} (expected " \
                f"cpp, c, python, sh or text)"
            ext = GUIDE_LANGS[lang]
            hosts = [n for n, src in examples.items() if n.endswith(ext) and body in src]
            assert hosts, (f"{os.path.relpath(g, ROOT)}: this {lang} block is not a verbatim "
                           f"excerpt of any examples/guide_*{ext}:\n{body}")
            checked += 1
    assert checked >= 9


def run_plot(*args):
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True)


@pytest.fixture
def matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed (apt-get install python3-matplotlib)")


def test_plot_bench_writes_every_chart(matplotlib, tmp_path):
    out = tmp_path / "img"
    p = run_plot("--data", FIXTURES, "--out", str(out))
    assert p.returncode == 0, p.stderr
    for name in CHARTS:
        png = out / f"{name}.png"
        assert f"wrote {png}" in p.stdout
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert len(data) > 20_000, (name, len(data))


def test_plot_bench_skips_missing_files(matplotlib, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(FIXTURES, "adam_threads.json"), data)
    p = run_plot("--data", str(data), "--out", str(tmp_path / "img"))
    assert p.returncode == 0, p.stderr
    for name in CHARTS:
        if name == "adam_threads":
            assert (tmp_path / "img" / "adam_threads.png").exists()
        else:
            assert f"skipped {name}: {data / (name + '.json')} not found" in p.stdout
            assert not (tmp_path / "img" / f"{name}.png").exists()


def test_plot_bench_names_the_file_of_malformed_json(matplotlib, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "io_sweep.json").write_text('{"results": [{"op": "read",\n "gbps": 1.0,,}]}')
    shutil.copy(os.path.join(FIXTURES, "adam_threads.json"), data)
    p = run_plot("--data", str(data), "--out", str(tmp_path / "img"))
    assert p.returncode == 1
    assert f"{data / 'io_sweep.json'}: invalid JSON: Expecting property name enclosed in " \
           "double quotes at line 2 column 14" in p.stderr
    assert (tmp_path / "img" / "adam_threads.png").exists()  # the others are still made
    assert not (tmp_path / "img" / "io_sweep.png").exists()


@pytest.mark.parametrize("doc,message", [
    ({"results": [{"op": "read", "block_size": 4096, "queue_depth": 1}]},
     'results[0] has no "gbps"'),
    ({"results": [{"op": "read", "block_size": "4KiB", "queue_depth": 1, "gbps": 1}]},
     "results[0].block_size is not a number: '4KiB'"),
    ({"results": [{"op": "trim", "block_size": 4096, "queue_depth": 1, "gbps": 1}]},
     "results[0].op is 'trim', expected read or write"),
    ({"rows": []}, 'expected an object with a "results" list'),
    ({"results": []}, '"results" is empty'),
])
def test_plot_bench_names_the_field_at_fault(matplotlib, tmp_path, doc, message):
    (tmp_path / "io_sweep.json").write_text(json.dumps(doc))
    p = run_plot("--data", str(tmp_path), "--out", str(tmp_path / "img"), "io_sweep")
    assert p.returncode == 1
    assert p.stderr.strip() == f"plot_bench.py: {tmp_path / 'io_sweep.json'}: {message}"


def test_plot_bench_rejects_an_unknown_chart_name():
    p = run_plot("io_sweeps")
    assert p.returncode == 2
    assert "unknown chart 'io_sweeps'" in p.stderr


def test_c_api_version_and_functions_in_bindings_md_are_the_headers():
    """docs/bindings.md states strata.h's STRATA_C_API_VERSION, and every function strata.h
    declares is named in docs/bindings.md or docs/guide-c.md (the exported set is compared
    with the declared one by bindings.c_api_consumer, with nm -D)."""
    header = open(os.path.join(ROOT, "bindings", "c", "include", "strata", "strata.h"),
                  encoding="utf-8").read()
    version = re.search(r"#define STRATA_C_API_VERSION (\d+)", header).group(1)
    doc = open(os.path.join(ROOT, "docs", "bindings.md"), encoding="utf-8").read()
    said = re.search(r"`STRATA_C_API_VERSION` is (\d+)", doc)
    assert said and said.group(1) == version, (said and said.group(1), version)
    declared = set(re.findall(r"STRATA_C_API[^;(]*?[ *](strata_\w+)\(", header))
    assert len(declared) >= 70, len(declared)
    guide = open(os.path.join(ROOT, "docs", "guide-c.md"), encoding="utf-8").read()
    # named in full, or without its "strata_<object>_" prefix in a list of one family
    # ("`strata_store_read_range` / `write_range`"); an `_async` form with its blocking one
    names = set(re.findall(r"\w+", doc + guide))

    def named(f):
        return f in names or f.split("_", 2)[-1] in names

    undocumented = sorted(f for f in declared
                          if not named(f) and not (f.endswith("_async") and named(f[:-6])))
    assert not undocumented, "strata.h functions docs/bindings.md never names: " + \
        ", ".join(undocumented)
