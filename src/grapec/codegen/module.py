"""A bundle's CUDA module: every kernel rendered once, and kernels of different buckets that differ
only in sizes merged into one function that takes the sizes as arguments.

The same ONNX node compiled for two buckets (seq 8 and seq 128, say) renders to CUDA C that differs
only in numeric literals: the element count, strides, loop bounds, a 1/seq scale. Such kernels share
one function: each literal that differs between them becomes a scalar parameter (`i64` for
integers, `f64` for floating point), and each kernel step passes its own values after the buffer
pointers. Literals that agree stay literals, so NVRTC still folds them (a division by a constant is
a multiply and a shift; by an argument it is a real division). For the same reason kernels used by
one bucket only keep all their literals: merging pays where it saves a function across buckets.

Working on the rendered text rather than on the kernel IR keeps the rule simple and safe: two
kernels merge only if their code is the same token for token apart from numbers, and substituting
each kernel's own numbers back gives exactly its own code.

A tensor-core kernel's structural numbers (its shared arrays, register fragments, block size)
must stay literals. Attention kernels therefore merge only within one structure (attention_structure:
the launch shape and the head dims those numbers derive from), so the numbers that differ are the
sequence lengths, tile counts and strides: a range of 512 lengths compiles one attention function
per structure instead of 512. Small-GEMM kernels merge only where their row count alone differs
(codegen/small_gemm.py one_tile_group: the one-tile form, whose tiling the rows do not change); the
split form never merges, nor do NonZero's and NonMaxSuppression's (codegen/selection.py).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ..ir.attention import AttentionKernel
from ..ir.kinds import kernel_from_json
from ..ir.selection import NmsKernel, NmsMaskKernel, NonZeroKernel, TopKKernel
from ..ir.small_gemm import SmallGemmKernel
from ..plan import kernel_steps
from .attention import ATTENTION_PRELUDE, attention_launch, attention_structure, render_attention
from .cuda import CudaRenderer
from .prelude import PRELUDE
from .launch import plan_launch
from .selection import render_selection, selection_launch
from .small_gemm import one_tile_group, render_small_gemm, small_gemm_launch

TENSOR_CORE_KINDS = (AttentionKernel, SmallGemmKernel)
SELECTION_KINDS = (NonZeroKernel, NmsKernel, NmsMaskKernel, TopKKernel)   # codegen/selection.py: never merged across sizes

_NAME = "__grapec_kernel__"
SIZED = "_sized"   # the suffix of a merged function's twin that reads its sizes from memory (sized_twin)
# A numeric literal that is not part of a name (in0, r3, f16) nor of another number.
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(ULL|LL)?(?![\w.])")


@dataclass
class CudaModule:
    bodies: list = field(default_factory=list)     # function definitions, each once
    names: list = field(default_factory=list)      # per bundle kernel: the function it runs
    scalars: list = field(default_factory=list)    # per bundle kernel: [[type, value]..] after the pointers
    launches: list = field(default_factory=list)   # per bundle kernel: its Launch
    first_user: list = field(default_factory=list)  # per body: the first bundle kernel that runs it
    tensor_cores: bool = False                     # some kernel uses the mma helpers
    body_of: dict = field(default_factory=dict)    # function name -> its definition (one of bodies)
    sized: list = field(default_factory=list)      # merged functions that have a twin NAME_sized (below)

    @property
    def prelude(self) -> str:
        return PRELUDE + (ATTENTION_PRELUDE if self.tensor_cores else "")

    @property
    def source(self) -> str:
        return self.prelude + "\n\n".join(self.bodies) + "\n"


@dataclass
class RenderedKernel:
    """One kernel rendered: what build_module needs of it, worked out where it was rendered."""
    launch: object
    text: str
    scalar: str | None      # its text without rows held in registers or read in vectors, where it has either
    group: object           # what kernels that may merge share: the text with numbers blanked (and more, below)
    plain: str              # the scalar text (or its own) with numbers blanked (_one_way_per_kernel)
    tensor_cores: bool
    style: tuple = (False, False)   # (holds rows in registers, reads rows in vectors)


def render_kernel(k) -> RenderedKernel:
    """A kernel (or its JSON) rendered. One kernel's work, independent of the others': build_module's
    `mapper` may spread it over processes."""
    if isinstance(k, dict):
        k = kernel_from_json(k)
    scalar, style = None, (False, False)
    if isinstance(k, AttentionKernel):
        launch = attention_launch(k)
        text = render_attention(k, launch, _NAME)
        group = (_NUMBER.sub("#", text), attention_structure(k, launch))
    elif isinstance(k, SmallGemmKernel):
        launch = small_gemm_launch(k)
        text = render_small_gemm(k, _NAME)
        rows_blanked = one_tile_group(text)
        group = text if rows_blanked is None else ("small_gemm", rows_blanked)
    elif isinstance(k, SELECTION_KINDS):
        launch = selection_launch(k)
        text = render_selection(k, _NAME)
        group = text
    else:
        launch = plan_launch(k)
        renderer = CudaRenderer(k, launch)
        text = renderer.render(_NAME)[1]
        style = (renderer.resident is not None, renderer.read_vectors)
        if any(style):
            scalar = CudaRenderer(k, launch, hold_rows=False, vectors=False).render(_NAME)[1]
        group = _NUMBER.sub("#", text)
    plain = _NUMBER.sub("#", scalar) if scalar is not None else (group if isinstance(group, str) else _NUMBER.sub("#", text))
    return RenderedKernel(launch, text, scalar, group, plain, isinstance(k, TENSOR_CORE_KINDS), style)


def build_module(kernels: list, users: list | None = None, mapper=map) -> CudaModule:
    """kernels: Kernel objects (or their JSON), in bundle order. users: per kernel, the set of buckets
    whose plans run it; kernels that look alike are merged only when they span two buckets or more.
    mapper(render_kernel, kernels) renders them all, in order (the builtin map, or one over processes:
    a range's bundle holds hundreds of thousands of kernels)."""
    users = users or [{0}] * len(kernels)
    rendered = list(mapper(render_kernel, kernels))
    _one_way_per_kernel(rendered, users)

    groups: dict = {}   # template (numbers blanked) -> kernel indices
    for i, r in enumerate(rendered):
        groups.setdefault(r.group, []).append(i)
    texts = [r.text for r in rendered]
    m = CudaModule(names=[""] * len(kernels), scalars=[[] for _ in kernels], launches=[r.launch for r in rendered],
                   tensor_cores=any(r.tensor_cores for r in rendered))
    del rendered
    body_index: dict = {}   # function name -> index into m.bodies

    def add(name, body, first):
        if name not in body_index:
            body_index[name] = len(m.bodies)
            m.bodies.append(body.replace(_NAME, name))
            m.first_user.append(first)
            m.body_of[name] = m.bodies[-1]

    for members in groups.values():
        distinct = list(dict.fromkeys(texts[i] for i in members))
        spans = set().union(*(users[i] for i in members))
        merged = _merge(distinct) if len(distinct) > 1 and len(spans) > 1 else None
        if merged:
            body, params, values = merged
            name = _function_name(body)
            add(name, body, members[0])
            if name + SIZED not in body_index:
                add(name + SIZED, sized_twin(body, params), members[0])
                m.sized.append(name)
            index_of = {t: j for j, t in enumerate(distinct)}
            for i in members:
                m.names[i] = name
                m.scalars[i] = [[t, v] for t, v in zip(params, values[index_of[texts[i]]])]
        else:
            for i in members:
                name = _function_name(texts[i])
                add(name, texts[i], i)
                m.names[i] = name
    return m


def _one_way_per_kernel(rendered: list, users: list):
    """Kernels that differ only in sizes, used by several buckets, render alike: where some of them
    hold their rows in registers (codegen/resident.py: a softmax row of whole 128-element steps, seq 128
    and 256 but not 68) or read them in 16-byte vectors (rows of a multiple of 4 floats: Wav2Vec2's
    GroupNorm over 516 frames but not 519) and others do not, none does. Else one launch structure of a
    range would run two functions, and its sizes stored as formulas (bundle/families.py) could not name
    theirs. (A range whose structures follow the remainders, fp32 GPT-2's softmax over seq, gives up the
    vectors at its aligned lengths too: its kernels of one text are merged across the structures.)"""
    plain: dict = {}   # the scalar text (no held rows, no vector reads), numbers blanked -> kernel indices
    for i, r in enumerate(rendered):
        plain.setdefault(r.plain, []).append(i)
    for members in plain.values():
        if len({rendered[i].style for i in members}) > 1 and len(set().union(*(users[i] for i in members))) > 1:
            for i in members:
                r = rendered[i]
                if r.scalar is not None:
                    r.text, r.group, r.scalar = r.scalar, r.plain, None


def _merge(texts: list) -> tuple | None:
    """Texts equal but for numbers -> (one body with parameters s0.., [param type..], [values per text]).
    None where a differing number lies before the kernel's own signature (in a device function it
    calls, which the parameters cannot reach)."""
    kernel_at = max(texts[0].find('extern "C"'), 0)
    tokens = [[mt for mt in _NUMBER.finditer(t)] for t in texts]
    columns: dict = {}   # the numbers a position holds across texts -> parameter index
    params, subs = [], []
    for p in range(len(tokens[0])):
        col = tuple(tok[p].group(0) for tok in tokens)
        if len(set(col)) == 1:
            continue
        if tokens[0][p].start() < kernel_at:
            return None
        if col not in columns:
            columns[col] = len(params)
            params.append("f64" if any(_is_float(c) for c in col) else "i64")
        subs.append((tokens[0][p].span(), f"s{columns[col]}"))
    body = texts[0]
    for (a, b), name in reversed(subs):
        body = body[:a] + name + body[b:]
    decl = "".join(f", const {'double' if t == 'f64' else 'i64'} s{j}" for j, t in enumerate(params))
    before, kernel = body[:kernel_at], body[kernel_at:]
    head, rest = kernel.split(") {\n", 1)
    body = f"{before}{head}{decl}) {{\n{_size_divisions(rest)}"
    ordered = sorted(columns, key=columns.get)
    values = [[_value(col[j]) for col in ordered] for j in range(len(texts))]
    return body, params, values


# a division of a named value by a size argument, as the renderer writes one (codegen/cuda.py literal, _INFIX)
_SIZE_DIVISION = re.compile(r"\((\w+) ([/%]) \(\(long long\)(s\d+)\)\)")


def _size_divisions(text: str) -> str:
    """A division by a constant is a multiply and a shift; by the argument that took its place, a 64-bit
    division (Wav2Vec2's positional-convolution gather: 34 us as a range's function, 25 with its constants).
    g_idiv / g_imod (codegen/prelude.py) divide in 32 bits where both sides fit, as the constant did."""
    return _SIZE_DIVISION.sub(lambda m: f"g_i{'div' if m.group(2) == '/' else 'mod'}({m.group(1)}, {m.group(3)})",
                              text)


def sized_twin(body: str, params: list) -> str:
    """A merged function's twin that reads its size arguments from device memory instead of taking
    them by value: `const i64* g_size` holds s0, s1, .. (an f64 as its bits) and then the grid the
    launch needs. A graph node of the twin can be launched with a larger grid (its blocks past
    g_size[n] return at once), so one node serves every size of a launch structure whose numbers
    are written into g_size before the launch (runtime/cuda/shared_exec.py): a switch between sizes
    is a copy of those numbers, not an update of the node."""
    decl = "".join(f", const {'double' if t == 'f64' else 'i64'} s{j}" for j, t in enumerate(params))
    head, rest = body.split(decl + ") {\n", 1)
    loads = "".join(f"  const double s{j} = __longlong_as_double(g_size[{j}]);\n" if t == "f64" else
                    f"  const i64 s{j} = g_size[{j}];\n" for j, t in enumerate(params))
    return (f"{head}, const i64* __restrict__ g_size) {{\n{loads}"
            f"  if ((i64)blockIdx.x >= g_size[{len(params)}]) return;\n{rest}")


def _is_float(tok: str) -> bool:
    return any(c in tok for c in ".eE")


def _value(tok: str):
    return float(tok) if _is_float(tok) else int(tok.rstrip("UL"))


def _function_name(body: str) -> str:
    return "k_" + hashlib.sha1(body.encode()).hexdigest()[:12]


def kernel_users(plans: list, n_kernels: int) -> list:
    """Per bundle kernel, the set of buckets whose plans (bodies of If/Loop included) run it."""
    users = [set() for _ in range(n_kernels)]
    for bucket, st in kernel_steps(plans):
        users[st.kernel].add(bucket)
    return users


def scalar_literal(kind: str, value) -> str:
    """A scalar argument as a C literal (the host emulation passes them this way)."""
    return f"{int(value)}LL" if kind == "i64" else repr(float(value))


__all__ = ["CudaModule", "SIZED", "build_module", "render_kernel", "kernel_users", "scalar_literal", "sized_twin"]
