/* processors._ids: name-based (version 5) UUIDs in C, for the fold's derived ids.

   uuid5_int(namespace, name) is uuid.uuid5(UUID(bytes=namespace), name).int and
   uuid5_text(namespace, name) its str(): SHA-1 (FIPS 180-4) of the namespace's 16 bytes
   followed by the name in UTF-8, the digest's first 16 bytes with the version (5) and
   the RFC 4122 variant set. A name that UTF-8 cannot encode (a lone surrogate) raises
   UnicodeEncodeError, as name.encode() does.

   The Python (processors/ids.py: reference_uuid5_int) makes a hash object, the bytes of
   namespace and name joined, the digest, then an int of it, shifted and masked: about
   7 000 instructions an id, where hashing ~60 bytes is one 64-byte block. Here it is
   the block, then an int or a str. The block is hashed with the CPU's SHA extensions
   where it has them (x86-64: sha1rnds4 and its kin, checked at import), else in
   portable C (some 2 700 instructions: SHA-1's 80 steps); a call from Python took
   ~180-340 ns against ~500-650 ns portable (timeit, 2 cores, AMD EPYC, loaded), and
   uuid.uuid5 ~6 900 ns. portable(on) chooses the portable C (for the tests).

   text_of(value) is str(UUID(int=value)), the text of the fold's source ids, where the
   Python (schemas/uuids.py: canonical) formats the int's bytes in hexadecimal and
   slices it: about 3 700 instructions an id, 400 here.

   tests/unit/test_ids_native.py holds the first two to uuid.uuid5 on drawn names, at
   every length around the blocks' boundaries, both ways where the CPU has the
   extensions, and text_of to str(UUID(int=...)). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 64
#define SMALL 256 /* messages up to this long are padded on the stack */

static uint32_t
rotl(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
           (uint32_t)p[3];
}

static void
sha1_block(uint32_t h[5], const unsigned char *block)
{
    uint32_t w[80];
    for (int t = 0; t < 16; t++)
        w[t] = be32(block + 4 * t);
    for (int t = 16; t < 80; t++)
        w[t] = rotl(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    /* the four rounds of 20 steps, each with its function and constant (a loop
       apiece: no branch inside a step) */
#define STEP(f, k)                                                                     \
    do {                                                                               \
        uint32_t next = rotl(a, 5) + (f) + e + (k) + w[t];                             \
        e = d;                                                                         \
        d = c;                                                                         \
        c = rotl(b, 30);                                                               \
        b = a;                                                                         \
        a = next;                                                                      \
    } while (0)
    int t = 0;
    for (; t < 20; t++)
        STEP((b & c) | (~b & d), 0x5A827999u);
    for (; t < 40; t++)
        STEP(b ^ c ^ d, 0x6ED9EBA1u);
    for (; t < 60; t++)
        STEP((b & c) | (b & d) | (c & d), 0x8F1BBCDCu);
    for (; t < 80; t++)
        STEP(b ^ c ^ d, 0xCA62C1D6u);
#undef STEP
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI 1

/* Four steps a group of four message words, with the x86 SHA extensions: the CPU's
   own rounds (sha1rnds4: four steps of the function of group / 5, its constant
   added), its own schedule (W[g] from W[g - 4 .. g - 1]: sha1msg1, a xor, sha1msg2)
   and its own rotation of A into the next E (sha1nexte). The words sit big end
   first, W[t] of a group in its highest lane, as the instructions take them. */
#define NI_GROUP(g, f)                                                                 \
    do {                                                                               \
        e = _mm_sha1nexte_epu32(previous, w[g]);                                       \
        previous = abcd;                                                               \
        abcd = _mm_sha1rnds4_epu32(abcd, e, f);                                        \
    } while (0)

__attribute__((target("sha,ssse3,sse4.1"))) static void
sha1_block_ni(uint32_t h[5], const unsigned char *block)
{
    const __m128i reverse = _mm_set_epi64x(0x0001020304050607LL, 0x08090a0b0c0d0e0fLL);
    __m128i w[20];
    for (int g = 0; g < 4; g++)
        w[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16 * g)),
                                reverse);
    for (int g = 4; g < 20; g++)
        w[g] = _mm_sha1msg2_epu32(
            _mm_xor_si128(_mm_sha1msg1_epu32(w[g - 4], w[g - 3]), w[g - 2]), w[g - 1]);
    __m128i start = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0x1B);
    __m128i start_e = _mm_set_epi32((int)h[4], 0, 0, 0);
    __m128i abcd = start;
    __m128i e = _mm_add_epi32(start_e, w[0]);
    __m128i previous = abcd;
    abcd = _mm_sha1rnds4_epu32(abcd, e, 0);
    NI_GROUP(1, 0);
    NI_GROUP(2, 0);
    NI_GROUP(3, 0);
    NI_GROUP(4, 0);
    NI_GROUP(5, 1);
    NI_GROUP(6, 1);
    NI_GROUP(7, 1);
    NI_GROUP(8, 1);
    NI_GROUP(9, 1);
    NI_GROUP(10, 2);
    NI_GROUP(11, 2);
    NI_GROUP(12, 2);
    NI_GROUP(13, 2);
    NI_GROUP(14, 2);
    NI_GROUP(15, 3);
    NI_GROUP(16, 3);
    NI_GROUP(17, 3);
    NI_GROUP(18, 3);
    NI_GROUP(19, 3);
    e = _mm_sha1nexte_epu32(previous, start_e);
    abcd = _mm_add_epi32(abcd, start);
    _mm_storeu_si128((__m128i *)h, _mm_shuffle_epi32(abcd, 0x1B));
    h[4] = (uint32_t)_mm_extract_epi32(e, 3);
}
#undef NI_GROUP

static int
cpu_has_sha_ni(void)
{
    /* the SHA extensions (leaf 7: EBX bit 29), SSSE3 and SSE4.1 (leaf 1: ECX bits 9
       and 19) */
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19)))
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b & (1u << 29)) != 0;
}
#else
#define HAVE_SHA_NI 0
#endif

static int use_sha_ni; /* set at import where the CPU has them; see portable() */

static void
sha1(uint32_t h[5], const unsigned char *block)
{
#if HAVE_SHA_NI
    if (use_sha_ni) {
        sha1_block_ni(h, block);
        return;
    }
#endif
    sha1_block(h, block);
}

static int
uuid5_bytes(PyObject *const *args, Py_ssize_t nargs, unsigned char out[16])
{
    /* the 16 bytes of the UUID of args (namespace: bytes of 16, name: str) */
    if (nargs != 2 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 16 ||
        !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "uuid5(namespace, name): 16 bytes of a namespace, a str name");
        return -1;
    }
    Py_ssize_t size;
    const char *name = PyUnicode_AsUTF8AndSize(args[1], &size);
    if (name == NULL)
        return -1;
    if ((size_t)size > ((size_t)PY_SSIZE_T_MAX >> 4)) {
        PyErr_SetString(PyExc_OverflowError, "uuid5: the name is too long");
        return -1;
    }
    size_t length = 16 + (size_t)size;
    /* the message, 0x80, zeros and its length in bits in 8 bytes, in whole blocks */
    size_t padded = (length + 8) / BLOCK * BLOCK + BLOCK;
    unsigned char small[SMALL];
    unsigned char *message = padded <= SMALL ? small : PyMem_Malloc(padded);
    if (message == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(message, PyBytes_AS_STRING(args[0]), 16);
    memcpy(message + 16, name, (size_t)size);
    message[length] = 0x80;
    memset(message + length + 1, 0, padded - length - 1);
    uint64_t bits = (uint64_t)length * 8;
    for (int i = 0; i < 8; i++)
        message[padded - 1 - i] = (unsigned char)(bits >> (8 * i));
    uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    for (size_t at = 0; at < padded; at += BLOCK)
        sha1(h, message + at);
    if (message != small)
        PyMem_Free(message);
    for (int i = 0; i < 16; i++)
        out[i] = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
    out[6] = (unsigned char)((out[6] & 0x0F) | 0x50); /* version 5 */
    out[8] = (unsigned char)((out[8] & 0x3F) | 0x80); /* RFC 4122 variant */
    return 0;
}

static PyObject *sixty_four; /* the shift between an int's high and low 64 bits */

static uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static PyObject *
uuid5_int(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    unsigned char bytes[16];
    if (uuid5_bytes(args, nargs, bytes) < 0)
        return NULL;
    PyObject *high = PyLong_FromUnsignedLongLong(be64(bytes));
    PyObject *low = PyLong_FromUnsignedLongLong(be64(bytes + 8));
    PyObject *shifted = NULL;
    PyObject *value = NULL;
    if (high != NULL && low != NULL)
        shifted = PyNumber_Lshift(high, sixty_four);
    if (shifted != NULL)
        value = PyNumber_Or(shifted, low);
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shifted);
    return value;
}

static PyObject *
text_of_bytes(const unsigned char bytes[16])
{
    /* str(UUID(bytes=bytes)): lower-case hexadecimal, hyphens at 8, 13, 18, 23 */
    static const char digits[] = "0123456789abcdef";
    PyObject *text = PyUnicode_New(36, 127);
    if (text == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    for (int i = 0, at = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[at++] = '-';
        out[at++] = (Py_UCS1)digits[bytes[i] >> 4];
        out[at++] = (Py_UCS1)digits[bytes[i] & 0x0F];
    }
    return text;
}

static PyObject *
uuid5_text(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    unsigned char bytes[16];
    if (uuid5_bytes(args, nargs, bytes) < 0)
        return NULL;
    return text_of_bytes(bytes);
}

static void
put_be64(unsigned char *p, uint64_t value)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(value >> (56 - 8 * i));
}

static PyObject *
text_of(PyObject *module, PyObject *value)
{
    /* str(UUID(int=value)); OverflowError, as value.to_bytes(16) raises it, for a
       negative value or one of more than 128 bits */
    (void)module;
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "text_of(value): value is an int");
        return NULL;
    }
    unsigned long long low = PyLong_AsUnsignedLongLongMask(value);
    if (low == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *shifted = PyNumber_Rshift(value, sixty_four);
    if (shifted == NULL)
        return NULL;
    unsigned long long high = PyLong_AsUnsignedLongLong(shifted);
    Py_DECREF(shifted);
    if (high == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned char bytes[16];
    put_be64(bytes, high);
    put_be64(bytes + 8, low);
    return text_of_bytes(bytes);
}

static PyObject *
portable(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* portable([on]) -> bool: whether SHA-1 runs in portable C, not with the CPU's SHA
       extensions; with on, sets it first (on where the CPU has no extensions is
       all it can be). For tests, which hold both ways to uuid.uuid5. */
    (void)module;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "portable([on])");
        return NULL;
    }
    if (nargs == 1) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0)
            return NULL;
#if HAVE_SHA_NI
        use_sha_ni = !on && cpu_has_sha_ni();
#endif
    }
    return PyBool_FromLong(!use_sha_ni);
}

static PyMethodDef methods[] = {
    {"portable", (PyCFunction)(void (*)(void))portable, METH_FASTCALL,
     "portable([on]) -> bool: SHA-1 in portable C rather than with the CPU's SHA "
     "extensions (set with on)."},
    {"uuid5_int", (PyCFunction)(void (*)(void))uuid5_int, METH_FASTCALL,
     "uuid5_int(namespace, name) -> int: uuid.uuid5's int (namespace: its 16 bytes)."},
    {"uuid5_text", (PyCFunction)(void (*)(void))uuid5_text, METH_FASTCALL,
     "uuid5_text(namespace, name) -> str: uuid.uuid5's text (namespace: its bytes)."},
    {"text_of", text_of, METH_O, "text_of(value) -> str: str(UUID(int=value))."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "processors._ids",
    "Name-based (version 5) UUIDs in C (processors/ids.py).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__ids(void)
{
#if HAVE_SHA_NI
    use_sha_ni = cpu_has_sha_ni();
#endif
    sixty_four = PyLong_FromLong(64);
    if (sixty_four == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
