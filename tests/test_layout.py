"""The source layout keeps its arrows one way: C++ rooms include only the rooms below them, and no
ringreduce module imports itself back through another."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
PACKAGE = ROOT / "ringreduce"

# Which rooms of csrc/ each room may include from (its own always). csrc/README.md draws the same.
ALLOWED_INCLUDES = {
    "core": set(),
    "algorithms": {"core"},
    "hierarchy": {"core", "algorithms", "cpu"},
    "engine": {"core", "algorithms", "hierarchy", "cpu"},
    "transports": {"core"},
    "cpu": {"core"},
    "cuda": {"core", "transports"},
    "ps": {"core"},
    "python": {"core", "algorithms", "hierarchy", "engine", "transports", "cpu", "cuda", "ps"},
    "testing": {"core", "algorithms", "hierarchy", "engine", "transports", "cpu", "cuda", "ps", "python"},
}
SOURCE_SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def csrc_files():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in SOURCE_SUFFIXES)


def test_no_source_file_is_loose_at_the_top_of_csrc():
    loose = [p.name for p in CSRC.iterdir() if p.is_file() and p.suffix in SOURCE_SUFFIXES]
    assert not loose, f"files outside the rooms of csrc/: {loose}"
    rooms = {p.name for p in CSRC.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert rooms == set(ALLOWED_INCLUDES), f"csrc/ rooms {sorted(rooms)}; update ALLOWED_INCLUDES and csrc/README.md"


@pytest.mark.parametrize("path", csrc_files(), ids=lambda p: str(p.relative_to(CSRC)))
def test_includes_name_their_room_and_point_down(path):
    room = path.relative_to(CSRC).parts[0]
    for included in QUOTED_INCLUDE.findall(path.read_text()):
        assert ".." not in included.split("/"), f"{path.name} climbs with #include \"{included}\""
        target = included.split("/")[0]
        assert (CSRC / included).exists(), f"{path.name}: #include \"{included}\" is not a path under csrc/"
        assert target == room or target in ALLOWED_INCLUDES[room], (
            f"{room}/{path.name} includes {included}: room {room!r} may include only "
            f"{sorted(ALLOWED_INCLUDES[room] | {room})}"
        )


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path, name):
    """The ringreduce modules `path` imports, at the top or inside functions alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_no_import_circle_among_ringreduce_modules():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: sorted(m for m in imports_of(path, name) if m in modules and m != name)
             for name, path in modules.items()}
    # A package's __init__ is imported by every module inside it; that edge is no circle.
    graph = {name: [m for m in deps if not name.startswith(m + ".")] for name, deps in graph.items()}
    state, stack = {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for dep in graph[name]:
            if state.get(dep) == "open":
                circle = stack[stack.index(dep):] + [dep]
                pytest.fail("import circle: " + " -> ".join(circle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


# Below the device seam (csrc/cuda/device_api.h): the only files of cuda/ that may include the CUDA
# runtime or NCCL, which only a CUDA build compiles. Everything else there runs on the simulated
# device (the half-precision types of cuda_fp16.h and cuda_bf16.h are plain host code too).
BELOW_THE_SEAM = {"real_api.cpp", "reduce_kernels.h"}
TOOLKIT_INCLUDE = re.compile(r'^\s*#\s*include\s+<(cuda\.h|cuda_runtime[^>]*|nccl\.h)>', re.MULTILINE)


@pytest.mark.parametrize("path", sorted((CSRC / "cuda").iterdir()), ids=lambda p: p.name)
def test_only_the_real_side_of_the_device_seam_includes_cuda_or_nccl(path):
    if path.suffix == ".cu" or path.name in BELOW_THE_SEAM:
        return
    included = TOOLKIT_INCLUDE.findall(path.read_text())
    assert not included, f"cuda/{path.name} includes {included}: call CUDA and NCCL through cuda/device_api.h"
