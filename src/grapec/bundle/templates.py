"""Many JSON documents that differ mostly in their numbers, stored as templates plus deltas (Grape's
metadata compression).

The plans of a range's sizes (and their kernels) are the same documents but for sizes, offsets and
grids. Each document is split into a template (the document with every number taken out) and its
numbers. Documents of one template keep their numbers in a matrix, one row per document; the stored
rows are differences from the row before, which for neighbouring sizes are small and repeat, so the
zlib of the section shrinks them to little. Floats are kept as they are (a difference of floats
would not give the same float back).

    encode(docs) -> {"templates": [template JSON..], "docs": [template index per doc],
                     "ints": [[first row, differences..] per template], "floats": [[row..] per template]}
    decode(that) -> docs, equal to the ones encoded
    JoinText(template JSON)(ints, floats) -> one document
"""
from __future__ import annotations

import json
import math
import re

import numpy as np

_INT, _FLOAT = "\0i", "\0f"   # stand-ins for numbers in a template; no string of a plan starts with NUL
# a float of a whole value, kept with the ints: a mean's divisor (1599.0, Wav2Vec2's frames) follows the
# sizes as they do, so a range's formulas fit it (compiler/formulas.py); joined back as a float
_WHOLE = "\0n"
WHOLE_LIMIT = 2 ** 53   # whole floats beyond this are not all exact as floats: kept as floats
INT_PLACES = (_INT, _WHOLE)   # what an int's place holds in a template (compiler/families.py numbers the places)


def split(doc) -> tuple:
    """-> (template, ints, floats)."""
    ints: list = []
    floats: list = []

    def walk(x):
        if isinstance(x, bool) or x is None:
            return x
        if isinstance(x, int):
            ints.append(x)
            return _INT
        if isinstance(x, float):
            if _whole(x):
                ints.append(int(x))
                return _WHOLE
            floats.append(x)
            return _FLOAT
        if isinstance(x, str):
            if "\0" in x:   # NUL marks the numbers' places (JoinText finds them in the template's JSON)
                raise ValueError(f"string {x!r} cannot be stored in a template")
            return x
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        raise TypeError(f"cannot store a {type(x).__name__} in a template")
    return walk(doc), ints, floats


def _whole(x: float) -> bool:
    """A float that is exactly an int and back (not -0.0, whose sign an int loses)."""
    return x.is_integer() and abs(x) < WHOLE_LIMIT and (x != 0 or math.copysign(1.0, x) > 0)


class JoinText:
    """A template's documents back from their numbers, over the template's JSON text: each row is
    formatted into the text in C (`%`) and parsed by the json module (a range's thousands of derived
    plans and kernels each joined without a walk in Python)."""

    def __init__(self, template_json: str):
        pieces = re.split(_TOKENS, template_json)   # text, stand-in, text, stand-in, ..., text
        self.kinds = [p != _FLOAT_JSON for p in pieces[1::2]]   # True: an int's place (or a whole float's)
        self.wholes = [p == _WHOLE_JSON for p in pieces[1::2] if p != _FLOAT_JSON]   # per int place
        self.n_ints = sum(self.kinds)
        self.format = "%s".join(p.replace("%", "%%") for p in pieces[0::2])

    def __call__(self, ints, floats):
        if len(ints) != self.n_ints or len(floats) != len(self.kinds) - self.n_ints:
            raise ValueError(f"a template of {self.n_ints} ints and {len(self.kinds) - self.n_ints} floats "
                             f"has a row of {len(ints)} and {len(floats)}")
        ints = map(int, ints)
        if any(self.wholes):
            ints = [f"{i}.0" if w else i for i, w in zip(ints, self.wholes)]
        if floats:
            it, ft = iter(ints), iter([repr(float(f)) if math.isfinite(f) else json.dumps(float(f)) for f in floats])
            values = tuple(next(it) if k else next(ft) for k in self.kinds)
        else:
            values = tuple(ints)
        return json.loads(self.format % values)


_INT_JSON, _FLOAT_JSON, _WHOLE_JSON = json.dumps(_INT), json.dumps(_FLOAT), json.dumps(_WHOLE)
_TOKENS = "(" + "|".join(re.escape(t) for t in (_INT_JSON, _FLOAT_JSON, _WHOLE_JSON)) + ")"


def encode(docs: list) -> dict:
    templates: dict = {}
    which, ints, floats = [], [], []
    for doc in docs:
        t, i, f = split(doc)
        key = json.dumps(t, separators=(",", ":"))
        k = templates.setdefault(key, len(templates))
        if k == len(ints):
            ints.append([])
            floats.append([])
        which.append(k)
        ints[k].append(i)
        floats[k].append(f)
    rows = []
    for mat in ints:
        try:
            a = np.array(mat, dtype=np.int64).reshape(len(mat), -1)
        except OverflowError:   # a number beyond int64 (a uint64 constant): rows kept as they are
            rows.append({"raw": mat})
            continue
        # differences that wrap around int64 add back exactly (two's complement), so no check is needed
        rows.append(np.concatenate([a[:1], np.diff(a, axis=0)]).tolist())
    return {"templates": list(templates), "docs": which, "ints": rows, "floats": floats}


class TemplatedDocs:
    """The documents of an encoding, each joined when it is asked for (a range's hundreds of plans are
    not all held as Python objects at once). Raises KeyError/TypeError/ValueError on a malformed
    encoding, here or when a document is joined."""

    def __init__(self, enc: dict):
        self.packed = None   # the section's bytes as read, where a bundle's reader keeps them
        self.templates = [json.loads(t) for t in enc["templates"]]
        self._joins = [None] * len(self.templates)   # JoinText per template, made when first used
        self._texts = enc["templates"]
        self.ints = [r["raw"] if isinstance(r, dict) else
                     np.cumsum(np.array(r, dtype=np.int64).reshape(len(r), -1), axis=0) for r in enc["ints"]]
        self.floats = enc["floats"]
        if not (len(self.ints) == len(self.floats) == len(self.templates)):
            raise ValueError("templates, ints and floats differ in number")
        self.where = []   # per document: (template, row)
        seen = [0] * len(self.templates)
        for k in enc["docs"]:
            if not isinstance(k, int) or not 0 <= k < len(self.templates):
                raise ValueError(f"template index {k!r} out of range")
            self.where.append((k, seen[k]))
            seen[k] += 1
        if any(n != len(r) or n != len(f) for n, r, f in zip(seen, self.ints, self.floats)):
            raise ValueError("a template's rows do not match its documents")

    def __len__(self) -> int:
        return len(self.where)

    def template_of(self, i: int) -> int:
        """Document i's template (an index)."""
        return self.where[i][0]

    def __getitem__(self, i: int):
        k, j = self.where[i]
        row = self.ints[k][j]
        if self._joins[k] is None:
            self._joins[k] = JoinText(self._texts[k])
        return self._joins[k](row.tolist() if hasattr(row, "tolist") else row, self.floats[k][j])


def decode(enc: dict) -> list:
    docs = TemplatedDocs(enc)
    return [docs[i] for i in range(len(docs))]


class LazyDocuments:
    """decode(enc) as a list whose documents are joined when first read: a range bundle's 200k kernels
    took 60 s to join at read, where a run reads the few its sizes use. Documents appended after (a
    range's joined sizes' kernels, bundle/families.py) are kept as given. `packed`: the encoding's bytes
    as read, which writing reuses while the first `len(enc's documents)` are the ones read."""

    def __init__(self, enc: dict, packed: bytes | None = None):
        self._docs = TemplatedDocs(enc)
        self._joined: dict = {}
        self._added: list = []
        self.packed = packed
        self.stored = len(self._docs)

    def __len__(self) -> int:
        return self.stored + len(self._added)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} of {len(self)}")
        if i >= self.stored:
            return self._added[i - self.stored]
        doc = self._joined.get(i)
        if doc is None:
            doc = self._joined[i] = self._docs[i]
        return doc

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def joined(self) -> int:
        """How many of the documents read have been joined so far."""
        return len(self._joined)

    def append(self, doc):
        self._added.append(doc)

    def extend(self, docs):
        self._added.extend(docs)
