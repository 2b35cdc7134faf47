/* processors._text: what the fold reads in every text, in one pass each, in C.

   1. A text's sentences and the gaps between them (processors/sentences.py).

   sentences_and_gaps(text) gives what reference_sentences_and_gaps gives
   (processors/sentences.py): (sentences, gaps), where the sentences are the stripped,
   non-empty pieces of text cut after each sentence end, and gaps[i] is the text between
   sentence i - 1 (or the start) and sentence i, whitespace only. split_sentences(text)
   gives the sentences alone. The reference does it with a regex split and a list
   operation a piece; here it is one predicate a character and one substring a sentence
   and a gap. Callgrind, 10 000 events of the processors bench's rich workload: the two
   functions took 380 M instructions compiled by mypyc, 78 M in C.

   A sentence ends (the character is the last of its piece) at:
   - one of 。！？；!?… not followed by another of those or by a closing quote or
     bracket (」』”’"')）]), or followed by nothing;
   - a full stop followed by whitespace (Py_UNICODE_ISSPACE: what the regex's \s and
     str.strip see);
   - a line break.

   2. A text's estimated tokens (processors/working.py, estimate_tokens): one per
   character of working.CJK, one per started 4 others. The reference counts the
   others with a regex: 135 M instructions over the same events, 32 M in C one
   character at a time (stop 44), 6 M in vector lanes (stop 46, see estimate_tokens).

   tests/unit/test_text_native.py holds each function to its Python reference: the
   sentences on drawn texts of every character class that matters and on any text,
   the tokens on every code point. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int
is_mark(Py_UCS4 c)
{
    switch (c) {
    case 0x3002: /* 。 */
    case 0xFF01: /* ！ */
    case 0xFF1F: /* ？ */
    case 0xFF1B: /* ； */
    case '!':
    case '?':
    case 0x2026: /* … */
        return 1;
    default:
        return 0;
    }
}

static int
holds_the_end(Py_UCS4 c)
{
    /* a mark followed by one of these does not end its sentence there */
    if (is_mark(c))
        return 1;
    switch (c) {
    case 0x300D: /* 」 */
    case 0x300F: /* 』 */
    case 0x201D: /* ” */
    case 0x2019: /* ’ */
    case '"':
    case '\'':
    case ')':
    case 0xFF09: /* ） */
    case ']':
        return 1;
    default:
        return 0;
    }
}

/* Append text[start:end] to list; 0 on success, -1 with an exception set. */
static int
append_slice(PyObject *list, PyObject *text, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *piece = PyUnicode_Substring(text, start, end);
    if (piece == NULL)
        return -1;
    int failed = PyList_Append(list, piece);
    Py_DECREF(piece);
    return failed;
}

/* The piece text[start:end]: its stripped sentence into sentences and the gap before
   it (text[*previous:] up to the sentence) into gaps, when gaps is not NULL, and
   *previous moved to the sentence's end; nothing for a blank piece. 0 on success, -1
   with an exception set. */
static int
take_piece(PyObject *text, int kind, const void *data, Py_ssize_t start, Py_ssize_t end,
           Py_ssize_t *previous, PyObject *sentences, PyObject *gaps)
{
    while (start < end && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, start)))
        start++;
    while (end > start && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, end - 1)))
        end--;
    if (start == end)
        return 0;
    if (gaps != NULL && append_slice(gaps, text, *previous, start) < 0)
        return -1;
    if (append_slice(sentences, text, start, end) < 0)
        return -1;
    *previous = end;
    return 0;
}

/* The sentences of text into sentences, and (when gaps is not NULL) the gaps before
   them into gaps. 0 on success, -1 with an exception set. */
static int
split(PyObject *text, PyObject *sentences, PyObject *gaps)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0)
        return -1;
#endif
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t start = 0;     /* where the current piece begins */
    Py_ssize_t previous = 0;  /* where the last sentence ended (its gap's start) */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        int ends;
        if (c == '\n')
            ends = 1;
        else if (c == '.')
            ends = i + 1 < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i + 1));
        else if (is_mark(c))
            ends = i + 1 == n || !holds_the_end(PyUnicode_READ(kind, data, i + 1));
        else
            continue;
        if (!ends)
            continue;
        if (take_piece(text, kind, data, start, i + 1, &previous, sentences, gaps) < 0)
            return -1;
        start = i + 1;
    }
    return take_piece(text, kind, data, start, n, &previous, sentences, gaps);
}

/* Whether text is a str; else a TypeError naming the function. */
static int
is_text(PyObject *text, const char *function)
{
    if (PyUnicode_Check(text))
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes a str, not %.200s", function,
                 Py_TYPE(text)->tp_name);
    return 0;
}

static PyObject *
split_sentences(PyObject *module, PyObject *text)
{
    (void)module;
    if (!is_text(text, "split_sentences"))
        return NULL;
    PyObject *sentences = PyList_New(0);
    if (sentences == NULL)
        return NULL;
    if (split(text, sentences, NULL) < 0) {
        Py_DECREF(sentences);
        return NULL;
    }
    return sentences;
}

static PyObject *
sentences_and_gaps(PyObject *module, PyObject *text)
{
    (void)module;
    if (!is_text(text, "sentences_and_gaps"))
        return NULL;
    PyObject *sentences = PyList_New(0);
    PyObject *gaps = PyList_New(0);
    if (sentences == NULL || gaps == NULL || split(text, sentences, gaps) < 0) {
        Py_XDECREF(sentences);
        Py_XDECREF(gaps);
        return NULL;
    }
    return Py_BuildValue("(NN)", sentences, gaps);
}

/* Whether c is in working.CJK's class (the ranges below, in its order). Each range is
   one unsigned comparison and the ranges are or-ed without branches, so that the loops
   below are vectorised (see the pragma): with SSE2, a two-byte text's characters are
   counted eight at a time, a four-byte text's four. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize") /* clang vectorises at -O2 already */
#endif

#define WITHIN(c, lo, hi) ((uint32_t)((uint32_t)(c) - (lo)) <= (uint32_t)((hi) - (lo)))
#define WITHIN16(c, lo, hi) ((uint16_t)((c) - (lo)) <= (uint16_t)((hi) - (lo)))

#define IS_WIDE_BMP(c, within)                                                        \
    (within(c, 0x1100, 0x11FF)     /* Hangul jamo */                                \
     | within(c, 0x2E80, 0x2FDF)   /* CJK radicals, Kangxi radicals */              \
     | within(c, 0x3000, 0x9FFF)   /* CJK punctuation, kana, ideographs */          \
     | within(c, 0xAC00, 0xD7AF)   /* Hangul syllables */                           \
     | within(c, 0xF900, 0xFAFF)   /* CJK compatibility ideographs */               \
     | within(c, 0xFF00, 0xFFEF))  /* full-width and half-width forms */

static Py_ssize_t
wide_ucs2(const Py_UCS2 *data, Py_ssize_t n)
{
    /* counted in 16-bit lanes: a 16-bit count a chunk of at most 32 768 characters */
    Py_ssize_t wide = 0;
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t end = n - i > 32768 ? i + 32768 : n;
        uint16_t chunk = 0;
        for (; i < end; i++)
            chunk += (uint16_t)IS_WIDE_BMP(data[i], WITHIN16);
        wide += chunk;
    }
    return wide;
}

static Py_ssize_t
wide_ucs4(const Py_UCS4 *data, Py_ssize_t n)
{
    Py_ssize_t wide = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        /* the BMP's ranges, and CJK extensions B-H */
        wide += IS_WIDE_BMP(data[i], WITHIN) | WITHIN(data[i], 0x20000, 0x3134F);
    return wide;
}

static PyObject *
estimate_tokens(PyObject *module, PyObject *text)
{
    (void)module;
    if (!is_text(text, "estimate_tokens"))
        return NULL;
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0)
        return NULL;
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t wide = 0;
    /* every character of working.CJK is above 0xFF: none in a one-byte string */
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_2BYTE_KIND:
        wide = wide_ucs2(PyUnicode_2BYTE_DATA(text), n);
        break;
    case PyUnicode_4BYTE_KIND:
        wide = wide_ucs4(PyUnicode_4BYTE_DATA(text), n);
        break;
    default:
        break;
    }
    Py_ssize_t other = n - wide;
    return PyLong_FromSsize_t(wide + (other + 3) / 4);
}

static PyMethodDef methods[] = {
    {"split_sentences", split_sentences, METH_O,
     "split_sentences(text) -> list[str]: the stripped, non-empty sentences of text."},
    {"sentences_and_gaps", sentences_and_gaps, METH_O,
     "sentences_and_gaps(text) -> (sentences, gaps): gaps[i] is the whitespace before "
     "sentence i, after the one before it."},
    {"estimate_tokens", estimate_tokens, METH_O,
     "estimate_tokens(text) -> int: one token per CJK character, one per started 4 "
     "others."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "processors._text",
    "What the fold reads in every text, in C: sentences (processors/sentences.py), "
    "estimated tokens (processors/working.py).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__text(void)
{
    return PyModule_Create(&module_def);
}
