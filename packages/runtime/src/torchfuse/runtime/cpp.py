"""Building and loading a Program's C++ kernels (``Kernel.language == "cpp"``).

Every C++ kernel of a Program goes into one translation unit (its sources concatenated: the
headers and helpers they start with are include-guarded), compiled once by the system
compiler into one shared object and loaded with ``ctypes``; each kernel is then a plain C
function taking its buffers' addresses and ``int64_t`` sizes::

    lib = build_library(cpp_kernels)        # <cache>/cpp/p_<hash>.so, built once
    fn = lib["cpp_poi_fused_add_0"]         # ctypes function: fn(ptr0, ptr1, ptr2, xnumel)

The compiler is ``$CXX`` or the first of ``g++``, ``clang++``, ``c++`` on the PATH, run with
``-O3 -march=native`` (``-march`` dropped where it is not understood) and ``-fopenmp`` where
it works (else ``-fopenmp-simd``: the kernels run in one thread). The shared object is cached
on disk under the hash of the source, the compiler and the flags, so a second process loads it
without compiling.

C++ cannot be checked the way Triton sources are (`torchfuse.graph.kernel_source`): a
Program with C++ kernels runs native code from its document. `torchfuse.runtime.load` runs
it when the code is this user's own, or with ``trust_code=True``:

* *own code*: kernels the compiler of this process wrote, or read back from this user's
  compile cache, which it vouches for with `vouch` (an in-process set of translation-unit
  hashes; nothing in a document can add to it). The cache directory is inside the user's
  trust boundary anyway: its shared objects are loaded from it without any check, as
  torch.compile loads its own.
* anything else (an archive from someone else, a Program written by hand): ``trust_code=True``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torchfuse.runtime.config as rconfig
from torchfuse.graph import schema as S
from torchfuse.runtime.errors import KernelCompileError

_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()
_vouched: set[str] = set()
"""sha256 of the translation units this process's compiler wrote (see `vouch`)."""

_INSTALL_HINT = (
    "install one (Debian/Ubuntu: `apt-get install g++`; Fedora: `dnf install gcc-c++`; macOS: "
    "`xcode-select --install`), or point the CXX environment variable at one, or compile "
    "with the Triton CPU path instead (inductor option cpu_backend='triton' with TRITON_INTERPRET=1)"
)


class CompilerNotFoundError(KernelCompileError):
    """No C++ compiler to build a Program's C++ kernels with."""


@lru_cache(maxsize=4)
def find_compiler(cxx: str | None = None) -> str:
    """The C++ compiler to use: ``cxx`` (default ``$CXX``), else the first of ``g++``,
    ``clang++``, ``c++`` on the PATH."""
    wanted = cxx if cxx is not None else rconfig.config.cxx
    for name in ([wanted] if wanted else ["g++", "clang++", "c++"]):
        path = shutil.which(name)
        if path:
            return path
    said = f"CXX={wanted!r} was not found" if wanted else "no g++, clang++ or c++ on the PATH"
    raise CompilerNotFoundError(f"C++ kernels need a C++ compiler, and {said}: {_INSTALL_HINT}")


_PROBE = ('extern "C" int probe(int n) { int s = 0;\n#pragma omp parallel for reduction(+:s)\n'
          "for (int i = 0; i < n; ++i) s += i; return s; }\n")

_VECTOR_MATH_PROBE = """#include <cmath>
#include <cstdint>
extern "C" {
#pragma omp declare simd notinbranch
float sinf(float) noexcept;
}
extern "C" void probe(const float* a, float* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = std::sin(a[i]);
}
"""
"""Does the compiler call glibc's vector math (libmvec) from an ``omp simd`` loop, and link it?"""


def _works(cxx: str, flags: Sequence[str], source: str = _PROBE, libs: Sequence[str] = ()) -> bool:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cpp"
        src.write_text(source)
        cmd = [cxx, *flags, "-shared", "-fPIC", str(src), "-o", str(Path(d) / "probe.so"), *libs]
        return subprocess.run(cmd, capture_output=True).returncode == 0


@lru_cache(maxsize=4)
def compiler_flags(cxx: str) -> tuple[str, ...]:
    """``-O3 -march=native -fopenmp`` and the rest, less what ``cxx`` does not accept."""
    # no errno and no FP-exception traps (results are unchanged): what lets floor, sqrt and
    # the exp helper vectorize
    flags = ["-O3", "-std=c++17", "-fno-math-errno", "-fno-trapping-math"]
    if _works(cxx, [*flags, "-march=native"]):
        flags.append("-march=native")
        # g++ prefers 256-bit vectors on Intel cores with AVX-512 (a frequency worry of older
        # ones); with 512-bit ones the softmax kernel ran 1.2 -> 1.0 ms on this machine's
        # Cooper Lake (one thread; 1024 x 1024). Nothing changes without AVX-512.
        if _works(cxx, [*flags, "-mprefer-vector-width=512"]):
            flags.append("-mprefer-vector-width=512")
    flags.append("-fopenmp" if _works(cxx, [*flags, "-fopenmp"]) else "-fopenmp-simd")
    if _works(cxx, flags, _VECTOR_MATH_PROBE, ("-lmvec",)):
        flags.append("-DTORCHFUSE_LIBMVEC")  # the kernels' prelude then declares sinf & co SIMD
    return tuple(flags)


def link_libraries(flags: Sequence[str]) -> tuple[str, ...]:
    """What the link line ends with for ``flags`` (libmvec when the kernels call it)."""
    return ("-lmvec",) if "-DTORCHFUSE_LIBMVEC" in flags else ()


def openmp_enabled() -> bool:
    """Whether C++ kernels run their outer loops on several threads (``-fopenmp`` works)."""
    return "-fopenmp" in compiler_flags(find_compiler())


def translation_unit(kernels: Sequence[S.Kernel]) -> str:
    """The one source file of a Program's C++ kernels."""
    return "\n".join(k.source for k in kernels)


def _unit_hash(kernels: Sequence[S.Kernel]) -> str:
    return hashlib.sha256(translation_unit(kernels).encode()).hexdigest()


def vouch(program: S.Program) -> None:
    """Mark ``program``'s C++ kernels as this user's own code: compiled in this process, or
    read back from the user's own compile cache. `is_vouched` then holds for them, and
    `torchfuse.runtime.load` runs them without ``trust_code=True``. For the compiler's use,
    never for a document that came from elsewhere."""
    kernels = [k for k in program.kernels if k.language == "cpp"]
    if kernels:
        with _lock:
            _vouched.add(_unit_hash(kernels))


def is_vouched(kernels: Sequence[S.Kernel]) -> bool:
    """Whether these C++ kernels are, byte for byte, a translation unit `vouch` was given."""
    with _lock:
        return _unit_hash(kernels) in _vouched


def library_path(source: str, cxx: str, flags: Sequence[str], cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256("\0".join([source, cxx, *flags]).encode()).hexdigest()[:40]
    return (cache_dir or rconfig.config.cache_dir) / "cpp" / f"p_{digest}.so"


def build(source: str, cache_dir: Path | None = None) -> Path:
    """Compile ``source`` into a shared object (or find the one built before)."""
    cxx = find_compiler()
    flags = compiler_flags(cxx)
    path = library_path(source, cxx, flags, cache_dir)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".cpp")
    tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}.so")
    src.write_text(source)
    cmd = [cxx, *flags, "-shared", "-fPIC", str(src), "-o", str(tmp), *link_libraries(flags)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelCompileError(f"C++ kernels failed to compile ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
    os.replace(tmp, path)  # a concurrent process never loads a half-written file
    return path


_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "i32": ctypes.c_int32}


def load_source(source: str, signatures: dict[str, Sequence[str]],
                cache_dir: Path | None = None) -> dict[str, ctypes._CFuncPtr]:
    """Entry name -> its C function, from the shared object of ``source``; ``signatures`` gives
    each entry's parameter kinds (``ptr``, ``i64``, ``i32``)."""
    path = build(source, cache_dir)
    with _lock:
        lib = _libs.get(str(path))
        if lib is None:
            lib = _libs[str(path)] = ctypes.CDLL(str(path))
    out = {}
    for entry, kinds in signatures.items():
        try:
            fn = getattr(lib, entry)
        except AttributeError as e:
            raise KernelCompileError(f"the C++ kernels define no function {entry!r}") from e
        fn.argtypes = [_CTYPES[k] for k in kinds]
        fn.restype = None
        out[entry] = fn
    return out


def signatures(kernels: Sequence[S.Kernel]) -> dict[str, list[str]]:
    return {k.entry or k.name: [p.kind for p in k.signature] for k in kernels}


def load_library(kernels: Sequence[S.Kernel], cache_dir: Path | None = None) -> dict[str, ctypes._CFuncPtr]:
    """Kernel name -> the C function of its entry, from one shared object for ``kernels``."""
    fns = load_source(translation_unit(kernels), signatures(kernels), cache_dir)
    return {k.name: fns[k.entry or k.name] for k in kernels}


__all__ = ["CompilerNotFoundError", "build", "compiler_flags", "find_compiler", "is_vouched",
           "library_path", "link_libraries", "load_library", "load_source", "openmp_enabled",
           "signatures", "translation_unit", "vouch"]
