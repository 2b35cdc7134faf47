/* schemas._bare: an instance built from its slots, in one C call.

   bare(cls, d1, v1, d2, v2, ...) does what this Python does:

       made = object.__new__(cls)
       d1.__set__(made, v1)
       d2.__set__(made, v2)
       ...
       return made

   where each d is a data descriptor of cls or of one of its bases (a slot's
   member_descriptor, the __dict__ getset_descriptor): the same checks, the same
   setters, the same errors, without a bound method-wrapper, an argument tuple and
   its unpacking for every value (about 600 instructions a value on CPython 3.11).
   schemas/reader.py builds each pydantic model it trusts with it (its __dict__ and
   three slots), schemas/uuids.py each UUID (three slots). schemas/bare.py holds the
   Python above as its reference, which runs where this extension is not built
   (ENGRAM_PURE_PYTHON=1); tests/unit/test_bare.py holds the two to each other.

   Contract: cls is a type whose instances object.__new__ makes (its __new__ is
   object's, inherited: others are refused); each d is an object whose type sets
   (tp_descr_set); on any error the half-built instance is released and the error
   raised. The setters are the descriptors' own, so a read-only slot, a descriptor of
   an unrelated class or a __dict__ that is not a dict are refused exactly as
   d.__set__ refuses them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *no_args;

static PyObject *
bare(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs % 2 == 0) {
        PyErr_SetString(PyExc_TypeError,
                        "bare(cls, descriptor, value, ...) takes a class and pairs "
                        "of a data descriptor and its value");
        return NULL;
    }
    PyObject *cls = args[0];
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "bare(): cls must be a type, not %.200s",
                     Py_TYPE(cls)->tp_name);
        return NULL;
    }
    /* only a class that object.__new__ makes the instances of (it has no __new__ of
       its own, nor a base that has: not one built on int, say, nor a compiled class) */
    if (((PyTypeObject *)cls)->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_Format(PyExc_TypeError,
                     "bare(): %.200s does not make its instances with object.__new__",
                     ((PyTypeObject *)cls)->tp_name);
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i += 2) {
        if (Py_TYPE(args[i])->tp_descr_set == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "bare(): argument %zd is a %.200s, not a data descriptor", i,
                         Py_TYPE(args[i])->tp_name);
            return NULL;
        }
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *made;
    if (PyType_HasFeature(type, Py_TPFLAGS_IS_ABSTRACT)) {
        made = PyBaseObject_Type.tp_new(type, no_args, NULL); /* its error, as in Python */
    }
    else {
        /* object.__new__(cls) is its tp_alloc, then (CPython 3.11, 3.12) the laying out
           of the values of a __dict__ that CPython manages: made into a dict and thrown
           away when a __dict__ is set, about a third of a model's bare (no __dict__
           set, the instance makes its own when first asked, as any other does) */
        made = type->tp_alloc(type, 0);
    }
    if (made == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i += 2) {
        PyObject *descriptor = args[i];
        if (Py_TYPE(descriptor)->tp_descr_set(descriptor, made, args[i + 1]) < 0) {
            Py_DECREF(made);
            return NULL;
        }
    }
    return made;
}

static PyMethodDef methods[] = {
    {"bare", (PyCFunction)(void (*)(void))bare, METH_FASTCALL,
     "bare(cls, descriptor, value, ...)\n--\n\n"
     "object.__new__(cls), then descriptor.__set__(made, value) for each pair, in "
     "order; the instance."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "schemas._bare",
    "Instances built from their slots in one C call (see bare).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__bare(void)
{
    no_args = PyTuple_New(0);
    if (no_args == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
