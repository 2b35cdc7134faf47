/* schemas._avro: an event's Avro single-object bytes written in C, in one buffer.

   Writer(spec).encode(value, header) is header followed by
   the Avro binary body of value, the bytes that schemas.wire's RecordWriter tree of
   the same spec writes (schemas/avro.py: compile_writer, the Python reference), and
   so the bytes fastavro writes for value.model_dump(). The spec is the tree's shape
   (schemas.wire.writer_spec): a leaf's kind (wire.KIND_STRING .. KIND_STRINGS,
   KIND_DOUBLES), or a tuple ("optional", spec), ("array", spec), ("map", spec),
   ("record", names, specs); and SPEC_BYTES (50) for Avro bytes.
   Writer(spec).encode_fields(header, *fields) writes a record's fields given in order
   (a sealed event's envelope: schemas/sealed.py).

   Why: the tree appends a bytes object a value (a string's length, its UTF-8, a
   varint, a double) to a list and joins them: ~7 us for a working.updated of ~550
   bytes and ~8 us for a memory.created of ~1 100 (timeit, 2 cores, AMD EPYC); the
   worker writes ~1.5 derived events an ingested event. Here each value is written
   where it goes in one buffer: ~2-3.5 and ~2 us, most of it reading the values.

   What the reference refuses, this refuses, with the same kind of exception where it
   can (TypeError for a value of another type, OverflowError for a long outside 64
   bits, UnicodeEncodeError for a lone surrogate, KeyError for a missing field,
   AttributeError for a record without a __dict__; a value that is not a double:
   TypeError, where struct raises struct.error): AvroType.encode then takes fastavro's
   road, which writes or refuses the value as before. A timestamp in UTC is counted
   here; in another zone, epoch_millis (schemas.wire) counts it. A plain UUID's text is
   formatted from its int here, a TextUUID's is the text it keeps; any other UUID's is
   its str().

   tests/unit/test_compiled_writer.py holds the bytes to fastavro's and to the
   reference's for every event type (hypothesis), and the refusals. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

enum {
    K_STRING = 0, /* the kinds of schemas.wire, KIND_STRING .. KIND_STRINGS */
    K_UUID = 1,
    K_LONG = 2,
    K_TIMESTAMP = 3,
    K_DOUBLE = 4,
    K_BOOLEAN = 5,
    K_DOUBLES = 6,
    K_STRINGS = 7,
    K_BYTES = 50,     /* Avro bytes: schemas.wire.SPEC_BYTES, not a kind of the tree */
    K_OPTIONAL = 100, /* this file's own: the spec names them */
    K_ARRAY = 101,
    K_MAP = 102,
    K_RECORD = 103,
};

#define MAX_DEPTH 64 /* a spec nested deeper is refused (a loop, or not an event) */

typedef struct Node {
    int kind;
    struct Node *inner;  /* optional, array, map */
    Py_ssize_t count;    /* record: its fields */
    PyObject **names;    /* record: interned field names (owned) */
    struct Node **fields;
} Node;

static void
node_free(Node *node)
{
    if (node == NULL)
        return;
    node_free(node->inner);
    for (Py_ssize_t i = 0; i < node->count; i++) {
        if (node->names != NULL)
            Py_XDECREF(node->names[i]);
        if (node->fields != NULL)
            node_free(node->fields[i]);
    }
    PyMem_Free(node->names);
    PyMem_Free(node->fields);
    PyMem_Free(node);
}

static Node *
node_new(int kind)
{
    Node *node = PyMem_Calloc(1, sizeof(Node));
    if (node == NULL)
        PyErr_NoMemory();
    else
        node->kind = kind;
    return node;
}

static Node *node_of(PyObject *spec, int depth);

static Node *
record_of(PyObject *spec, int depth)
{
    PyObject *names = PyTuple_GET_ITEM(spec, 1);
    PyObject *specs = PyTuple_GET_ITEM(spec, 2);
    if (!PyTuple_Check(names) || !PyTuple_Check(specs) ||
        PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(specs)) {
        PyErr_SetString(PyExc_ValueError, "a record's spec: names and specs, as tuples");
        return NULL;
    }
    Node *node = node_new(K_RECORD);
    if (node == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    node->names = PyMem_Calloc((size_t)count + 1, sizeof(PyObject *));
    node->fields = PyMem_Calloc((size_t)count + 1, sizeof(Node *));
    node->count = count;
    if (node->names == NULL || node->fields == NULL) {
        node_free(node);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            node_free(node);
            PyErr_SetString(PyExc_ValueError, "a record's field name is not a str");
            return NULL;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        node->names[i] = name;
        node->fields[i] = node_of(PyTuple_GET_ITEM(specs, i), depth + 1);
        if (node->fields[i] == NULL) {
            node_free(node);
            return NULL;
        }
    }
    return node;
}

static Node *
node_of(PyObject *spec, int depth)
{
    /* the tree of ``spec`` (see the header), or NULL with ValueError */
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "the spec is nested too deep");
        return NULL;
    }
    if (PyLong_CheckExact(spec)) {
        long kind = PyLong_AsLong(spec);
        if ((kind < K_STRING || kind > K_STRINGS) && kind != K_BYTES) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "no leaf of kind %ld", kind);
            return NULL;
        }
        return node_new((int)kind);
    }
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_ValueError, "a spec is a leaf's kind or a tagged tuple");
        return NULL;
    }
    PyObject *tag = PyTuple_GET_ITEM(spec, 0);
    if (PyTuple_GET_SIZE(spec) == 3 && PyUnicode_CompareWithASCIIString(tag, "record") == 0)
        return record_of(spec, depth);
    int kind;
    if (PyUnicode_CompareWithASCIIString(tag, "optional") == 0)
        kind = K_OPTIONAL;
    else if (PyUnicode_CompareWithASCIIString(tag, "array") == 0)
        kind = K_ARRAY;
    else if (PyUnicode_CompareWithASCIIString(tag, "map") == 0)
        kind = K_MAP;
    else {
        PyErr_Format(PyExc_ValueError, "no spec tagged %R", tag);
        return NULL;
    }
    if (PyTuple_GET_SIZE(spec) != 2) {
        PyErr_Format(PyExc_ValueError, "a spec tagged %R holds one spec", tag);
        return NULL;
    }
    Node *node = node_new(kind);
    if (node == NULL)
        return NULL;
    node->inner = node_of(PyTuple_GET_ITEM(spec, 1), depth + 1);
    if (node->inner == NULL) {
        node_free(node);
        return NULL;
    }
    return node;
}

/* -- the buffer ------------------------------------------------------------------ */

#define ROOM 1024

typedef struct {
    char *data;
    size_t size;
    size_t capacity;
    char room[ROOM];
} Buffer;

static int
grow(Buffer *out, size_t more)
{
    size_t needed = out->size + more;
    if (needed <= out->capacity)
        return 0;
    if (needed > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    size_t capacity = out->capacity * 2;
    if (capacity < needed)
        capacity = needed;
    char *data;
    if (out->data == out->room) {
        data = PyMem_Malloc(capacity);
        if (data != NULL)
            memcpy(data, out->room, out->size);
    }
    else {
        data = PyMem_Realloc(out->data, capacity);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = data;
    out->capacity = capacity;
    return 0;
}

static int
put(Buffer *out, const void *bytes, size_t size)
{
    if (grow(out, size) < 0)
        return -1;
    memcpy(out->data + out->size, bytes, size);
    out->size += size;
    return 0;
}

static int
put_byte(Buffer *out, unsigned char byte)
{
    if (out->size == out->capacity && grow(out, 1) < 0)
        return -1;
    out->data[out->size++] = (char)byte;
    return 0;
}

static int
put_long(Buffer *out, int64_t n)
{
    /* Avro's zigzag varint: seven bits a byte, low first, the top bit on all but the last */
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    unsigned char bytes[10];
    int size = 0;
    while (z > 0x7F) {
        bytes[size++] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    bytes[size++] = (unsigned char)z;
    return put(out, bytes, (size_t)size);
}

/* -- the leaves ------------------------------------------------------------------ */

static PyObject *epoch_millis;   /* schemas.wire.epoch_millis, for a zone other than UTC */
static PyObject *uuid_type;      /* uuid.UUID */
static PyObject *text_uuid_type; /* schemas.uuids.TextUUID */
static PyObject *int_name;       /* "int" */
static PyObject *text_name;      /* "_text" */

static int
put_text(Buffer *out, PyObject *value)
{
    /* UTF-8, strict (a lone surrogate: UnicodeEncodeError, as str.encode) */
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "not a str: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    if (PyUnicode_IS_ASCII(value)) { /* its own bytes are its UTF-8 */
        Py_ssize_t size = PyUnicode_GET_LENGTH(value);
        if (put_long(out, size) < 0)
            return -1;
        return put(out, PyUnicode_1BYTE_DATA(value), (size_t)size);
    }
    /* not PyUnicode_AsUTF8AndSize: that keeps the UTF-8 in the str for its life */
    PyObject *data = PyUnicode_AsUTF8String(value);
    if (data == NULL)
        return -1;
    int failed = put_long(out, PyBytes_GET_SIZE(data)) < 0 ||
                 put(out, PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data)) < 0;
    Py_DECREF(data);
    return failed ? -1 : 0;
}

static int
put_canonical(Buffer *out, PyObject *value)
{
    /* str(UUID) of a plain UUID, from its int: 32 lower-case hexadecimal digits,
       hyphens at 8, 13, 18, 23 (the int of a UUID is below 2**128) */
    static const char digits[] = "0123456789abcdef";
    PyObject *number = PyObject_GetAttr(value, int_name);
    if (number == NULL)
        return -1;
    unsigned char bytes[16];
    int failed = !PyLong_CheckExact(number) ||
                 _PyLong_AsByteArray((PyLongObject *)number, bytes, 16, 0, 0) < 0;
    Py_DECREF(number);
    if (failed) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a UUID whose int is not an int");
        return -1;
    }
    unsigned char text[37];
    text[0] = 72; /* its length, 36, as an Avro long (zigzag: 2 * 36) */
    for (int i = 0, at = 1; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            text[at++] = '-';
        text[at++] = (unsigned char)digits[bytes[i] >> 4];
        text[at++] = (unsigned char)digits[bytes[i] & 0x0F];
    }
    return put(out, text, sizeof text);
}

static int
put_uuid(Buffer *out, PyObject *value)
{
    /* a UUID as its text (str), a str as it is */
    if (PyUnicode_Check(value))
        return put_text(out, value);
    if (Py_IS_TYPE(value, (PyTypeObject *)uuid_type))
        return put_canonical(out, value);
    if (Py_IS_TYPE(value, (PyTypeObject *)text_uuid_type)) {
        /* the text it keeps, when made (schemas/uuids.py): its str() */
        PyObject *kept = PyObject_GetAttr(value, text_name);
        if (kept == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
        }
        else {
            int usable = PyUnicode_CheckExact(kept) && PyUnicode_GET_LENGTH(kept) == 36;
            int failed = usable ? put_text(out, kept) : 0;
            Py_DECREF(kept);
            if (usable)
                return failed;
        }
    }
    int is_uuid = PyObject_IsInstance(value, uuid_type);
    if (is_uuid < 0)
        return -1;
    if (!is_uuid) {
        PyErr_Format(PyExc_TypeError, "not a UUID: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *text = PyObject_Str(value);
    if (text == NULL)
        return -1;
    int failed = put_text(out, text);
    Py_DECREF(text);
    return failed;
}

static int
put_long_value(Buffer *out, PyObject *value)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "not an int: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "the int is outside an Avro long");
        return -1;
    }
    if (n == -1 && PyErr_Occurred())
        return -1;
    return put_long(out, (int64_t)n);
}

static int64_t
days_from_civil(int64_t y, int64_t m, int64_t d)
{
    /* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm) */
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int
put_timestamp(Buffer *out, PyObject *value)
{
    /* fastavro's timestamp-millis: whole seconds since the epoch, then the
       milliseconds truncated; an aware datetime only */
    if (!PyDateTime_Check(value)) {
        PyErr_Format(PyExc_TypeError, "not a datetime: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *zone = PyDateTime_DATE_GET_TZINFO(value);
    if (zone == Py_None) {
        PyErr_SetString(PyExc_TypeError, "not an aware datetime");
        return -1;
    }
    if (zone != PyDateTime_TimeZone_UTC) {
        PyObject *millis = PyObject_CallOneArg(epoch_millis, value);
        if (millis == NULL)
            return -1;
        int failed = put_long_value(out, millis);
        Py_DECREF(millis);
        return failed;
    }
    int64_t days = days_from_civil(PyDateTime_GET_YEAR(value), PyDateTime_GET_MONTH(value),
                                   PyDateTime_GET_DAY(value));
    int64_t seconds = days * 86400 + PyDateTime_DATE_GET_HOUR(value) * 3600 +
                      PyDateTime_DATE_GET_MINUTE(value) * 60 +
                      PyDateTime_DATE_GET_SECOND(value);
    return put_long(out, seconds * 1000 + PyDateTime_DATE_GET_MICROSECOND(value) / 1000);
}

static int
put_double(Buffer *out, PyObject *value)
{
    /* as struct.pack("<d", value): what PyFloat_AsDouble takes (floats, and what has
       __float__ or __index__) */
    double x = PyFloat_AsDouble(value);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    unsigned char bytes[8];
    if (PyFloat_Pack8(x, bytes, 1) < 0)
        return -1;
    return put(out, bytes, 8);
}

static int
put_boolean(Buffer *out, PyObject *value)
{
    if (value == Py_True)
        return put_byte(out, 1);
    if (value == Py_False)
        return put_byte(out, 0);
    PyErr_Format(PyExc_TypeError, "not a bool: %.100s", Py_TYPE(value)->tp_name);
    return -1;
}

static int
put_bytes(Buffer *out, PyObject *value)
{
    /* Avro bytes: the length as a long, then the bytes (a bytes object only) */
    if (!PyBytes_Check(value)) {
        PyErr_Format(PyExc_TypeError, "not bytes: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    if (put_long(out, PyBytes_GET_SIZE(value)) < 0)
        return -1;
    return put(out, PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
}

static int put_value(Buffer *out, const Node *node, PyObject *value);

static int
put_items(Buffer *out, const Node *item, PyObject *value, int doubles)
{
    /* an array: one block (its count, then the items) and the count 0 */
    PyObject *items = PySequence_Fast(value, "not a sequence");
    if (items == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    int failed = 0;
    if (count)
        failed = put_long(out, count) < 0;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(items, i);
        Py_INCREF(x);
        if (doubles)
            failed = put_double(out, x) < 0;
        else if (item == NULL)
            failed = put_text(out, x) < 0;
        else
            failed = put_value(out, item, x) < 0;
        Py_DECREF(x);
    }
    Py_DECREF(items);
    if (failed)
        return -1;
    return put_byte(out, 0);
}

static int
put_map(Buffer *out, const Node *node, PyObject *value)
{
    /* as an array, each item a string key then its value */
    if (!PyDict_Check(value)) {
        PyErr_Format(PyExc_TypeError, "not a dict: %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t count = PyDict_GET_SIZE(value);
    if (count && put_long(out, count) < 0)
        return -1;
    Py_ssize_t at = 0, seen = 0;
    PyObject *key, *x;
    while (PyDict_Next(value, &at, &key, &x)) {
        Py_INCREF(key);
        Py_INCREF(x);
        int failed = put_text(out, key) < 0 || put_value(out, node->inner, x) < 0;
        Py_DECREF(key);
        Py_DECREF(x);
        if (failed)
            return -1;
        seen++;
    }
    if (seen != count) {
        PyErr_SetString(PyExc_RuntimeError, "the dict changed size while written");
        return -1;
    }
    return put_byte(out, 0);
}

static int
put_record(Buffer *out, const Node *node, PyObject *value)
{
    /* each field in turn, read from the model's __dict__ */
    PyObject *fields = NULL;
    PyObject **slot = _PyObject_GetDictPtr(value);
    if (slot != NULL && *slot != NULL && PyDict_CheckExact(*slot)) {
        fields = *slot;
        Py_INCREF(fields);
    }
    else {
        fields = PyObject_GetAttrString(value, "__dict__");
        if (fields == NULL)
            return -1;
        if (!PyDict_Check(fields)) {
            Py_DECREF(fields);
            PyErr_SetString(PyExc_TypeError, "a record's __dict__ is not a dict");
            return -1;
        }
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < node->count && !failed; i++) {
        PyObject *x = PyDict_GetItemWithError(fields, node->names[i]);
        if (x == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, node->names[i]);
            failed = 1;
            break;
        }
        Py_INCREF(x);
        failed = put_value(out, node->fields[i], x) < 0;
        Py_DECREF(x);
    }
    Py_DECREF(fields);
    return failed ? -1 : 0;
}

static int
put_value(Buffer *out, const Node *node, PyObject *value)
{
    switch (node->kind) {
    case K_STRING:
        return put_text(out, value);
    case K_UUID:
        return put_uuid(out, value);
    case K_LONG:
        return put_long_value(out, value);
    case K_TIMESTAMP:
        return put_timestamp(out, value);
    case K_DOUBLE:
        return put_double(out, value);
    case K_BOOLEAN:
        return put_boolean(out, value);
    case K_DOUBLES:
        return put_items(out, NULL, value, 1);
    case K_STRINGS:
        return put_items(out, NULL, value, 0);
    case K_BYTES:
        return put_bytes(out, value);
    case K_OPTIONAL:
        if (value == Py_None)
            return put_byte(out, 0);
        if (put_byte(out, 2) < 0)
            return -1;
        return put_value(out, node->inner, value);
    case K_ARRAY:
        return put_items(out, node->inner, value, 0);
    case K_MAP:
        return put_map(out, node, value);
    case K_RECORD:
        if (Py_EnterRecursiveCall(" while writing Avro"))
            return -1;
        int failed = put_record(out, node, value);
        Py_LeaveRecursiveCall();
        return failed;
    }
    PyErr_SetString(PyExc_SystemError, "a writer node of no known kind");
    return -1;
}

/* -- the Writer type --------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Node *root;
} Writer;

static int
writer_init(Writer *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"spec", NULL};
    PyObject *spec;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Writer", keywords, &spec))
        return -1;
    Node *root = node_of(spec, 0);
    if (root == NULL)
        return -1;
    node_free(self->root);
    self->root = root;
    return 0;
}

static void
writer_dealloc(Writer *self)
{
    node_free(self->root);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
writer_encode(Writer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode(value, header): a value and bytes");
        return NULL;
    }
    if (self->root == NULL) {
        PyErr_SetString(PyExc_ValueError, "the Writer was not initialised");
        return NULL;
    }
    Buffer out = {.data = NULL, .size = 0, .capacity = ROOM};
    out.data = out.room;
    PyObject *result = NULL;
    if (put(&out, PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1])) == 0 &&
        put_value(&out, self->root, args[0]) == 0)
        result = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.size);
    if (out.data != out.room)
        PyMem_Free(out.data);
    return result;
}

static PyObject *
writer_encode_fields(Writer *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* header, then a record's fields given in order (a record spec's only) */
    if (self->root == NULL || self->root->kind != K_RECORD) {
        PyErr_SetString(PyExc_TypeError, "encode_fields: the Writer's spec is no record");
        return NULL;
    }
    if (nargs != 1 + self->root->count || !PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "encode_fields(header, *fields): bytes, then %zd fields",
                     self->root->count);
        return NULL;
    }
    Buffer out = {.data = NULL, .size = 0, .capacity = ROOM};
    out.data = out.room;
    PyObject *result = NULL;
    int failed = put(&out, PyBytes_AS_STRING(args[0]), (size_t)PyBytes_GET_SIZE(args[0]));
    for (Py_ssize_t i = 0; i < self->root->count && !failed; i++)
        failed = put_value(&out, self->root->fields[i], args[1 + i]) < 0;
    if (!failed)
        result = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.size);
    if (out.data != out.room)
        PyMem_Free(out.data);
    return result;
}

static PyMethodDef writer_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))writer_encode, METH_FASTCALL,
     "encode(value, header): header, then the Avro binary body of value."},
    {"encode_fields", (PyCFunction)(void (*)(void))writer_encode_fields, METH_FASTCALL,
     "encode_fields(header, *fields): header, then a record's fields given in order."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "schemas._avro.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(spec): writes values of the spec's shape as Avro (schemas/avro.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "schemas._avro",
    "An event's Avro single-object bytes written in C (schemas/avro.py).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

static PyObject *
imported(const char *module_name, const char *name)
{
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL)
        return NULL;
    PyObject *value = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return value;
}

PyMODINIT_FUNC
PyInit__avro(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    uuid_type = imported("uuid", "UUID");
    if (uuid_type == NULL)
        return NULL;
    text_uuid_type = imported("schemas.uuids", "TextUUID");
    if (text_uuid_type == NULL)
        return NULL;
    epoch_millis = imported("schemas.wire", "epoch_millis");
    if (epoch_millis == NULL)
        return NULL;
    int_name = PyUnicode_InternFromString("int");
    text_name = PyUnicode_InternFromString("_text");
    if (int_name == NULL || text_name == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(module, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
