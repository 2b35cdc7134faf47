/* processors._summary: the extractive summariser's choice of sentences, in C.

   pick(pieces, max_chars, params, importance) gives what reference_pick gives
   (processors/summary.py): the sentences of an episode ranked and chosen, joined, as
   (summary, True), or (best sentence, False) when none fits and the best is to be
   cut. pieces is a non-empty list of (text, terms, opens_wide, closes_wide), terms a
   frozenset of str that is a function of the text; max_chars > 0; params the
   ScoringParams whose summary_* weights and redundancy are read; importance(text,
   params) -> float the importance of a text.

   The reference builds dicts of terms, their logs and a score a distinct text, a
   named sentence object a piece, and measures a near repeat by intersecting sets.
   Here the terms of a call are counted in one table of their own (equal strings, one
   slot), each distinct text holds the slots of its terms, and a near repeat is
   counted over slots. Callgrind, 10 000 events of the processors bench's rich
   workload: see BENCHMARKS.md, "Stop 45" under Processors.

   The arithmetic is the reference's, operation for operation (no contraction into
   fused multiply-adds: setup.py compiles with -ffp-contract=off):
   - a text's tf is math.fsum of ln(frequency) over its terms (called through
     Python, where more than one of them is not 0), over sqrt(number of terms); the
     logs are math.log's own, read once at import;
   - its topical part tf_weight * tf / top, its weighty part
     importance_weight * (importance - 1) / 9;
   - a sentence's score topical + position_weight * (1 - position / count) + weighty;
   - a near repeat: shared / (size + other - shared) >= redundancy.
   The ranking sorts by score, best first, then by position (positions are unique,
   so any sort gives the reference's order). Scores are never NaN for the weights
   ScoringParams accepts.

   tests/unit/test_summary_native.py holds pick to reference_pick on drawn pieces. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define LOGS 1024 /* ln(k) of the frequencies below this, read from math.log */

static double log_of_small[LOGS];
static PyObject *float_log_of_small[LOGS]; /* the same, as floats for math.fsum */
static PyObject *math_log;
static PyObject *math_fsum;
static PyObject *space;
static PyObject *empty;
static PyObject *weight_names[4]; /* the weights' and the redundancy's, interned */

typedef struct {
    PyObject *key; /* borrowed: held by the pieces tuple */
    Py_hash_t hash;
    Py_ssize_t id; /* -1: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t mask;
    Py_ssize_t used;
} Table;

static int
table_init(Table *table, Py_ssize_t keys)
{
    Py_ssize_t size = 8;
    while (size < 2 * keys + 1)
        size <<= 1;
    table->slots = PyMem_Malloc((size_t)size * sizeof(Slot));
    if (table->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++)
        table->slots[i].id = -1;
    table->mask = size - 1;
    table->used = 0;
    return 0;
}

static Py_ssize_t
table_id_hashed(Table *table, PyObject *key, Py_hash_t hash)
{
    /* the id of the str key of hash ``hash`` (ids count from 0 in the order keys are
       first seen); -1 with an exception set on failure. The table never fills: it is
       sized for every key of the call. */
    for (Py_ssize_t i = (Py_ssize_t)((size_t)hash & (size_t)table->mask);;
         i = (i + 1) & table->mask) {
        Slot *slot = &table->slots[i];
        if (slot->id < 0) {
            slot->key = key;
            slot->hash = hash;
            slot->id = table->used++;
            return slot->id;
        }
        if (slot->key == key)
            return slot->id;
        if (slot->hash == hash && PyUnicode_Compare(slot->key, key) == 0)
            return slot->id;
        if (PyErr_Occurred())
            return -1;
    }
}

static Py_ssize_t
table_id(Table *table, PyObject *key)
{
    /* table_id_hashed of key's hash */
    Py_hash_t hash = PyObject_Hash(key);
    return hash == -1 ? -1 : table_id_hashed(table, key, hash);
}

typedef struct {
    PyObject *text; /* borrowed from the pieces tuple */
    PyObject *terms;
    Py_ssize_t length; /* in code points */
    int opens_wide;
    int closes_wide;
    Py_ssize_t distinct; /* the id of its text */
} Piece;

typedef struct {
    Py_ssize_t first;   /* the position of its first counted saying */
    Py_ssize_t start;   /* its term ids: terms[start:start + count] */
    Py_ssize_t count;
    double topical;
    double weighty;
    int chosen;
} Distinct;

typedef struct {
    double score;
    Py_ssize_t position;
} Ranked;

typedef struct {
    Piece *pieces;
    Distinct *distinct;
    Py_ssize_t *terms; /* the term ids of each distinct text, in turn */
    Py_ssize_t *stamps; /* a stamp a term id, for counting shared terms */
    Py_ssize_t stamp;
    Py_ssize_t *chosen; /* positions, in order */
    Py_ssize_t n_chosen;
    Py_ssize_t max_chars;
    double redundancy;
} Call;

static int
read_piece(PyObject *item, Piece *piece)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
        PyErr_SetString(PyExc_TypeError, "pick: a piece is a tuple "
                                         "(text, terms, opens_wide, closes_wide)");
        return -1;
    }
    piece->text = PyTuple_GET_ITEM(item, 0);
    piece->terms = PyTuple_GET_ITEM(item, 1);
    if (!PyUnicode_Check(piece->text) || !PyFrozenSet_Check(piece->terms)) {
        PyErr_SetString(PyExc_TypeError,
                        "pick: a piece's text is a str, its terms a frozenset");
        return -1;
    }
    piece->length = PyUnicode_GET_LENGTH(piece->text);
    if (piece->length == 0) {
        PyErr_SetString(PyExc_ValueError, "pick: a piece's text is not empty");
        return -1;
    }
    piece->opens_wide = PyTuple_GET_ITEM(item, 2) == Py_True;
    piece->closes_wide = PyTuple_GET_ITEM(item, 3) == Py_True;
    return 0;
}

static double
weight(PyObject *params, PyObject *name)
{
    /* params.<name> as a double; -1.0 with an exception set on failure */
    PyObject *value = PyObject_GetAttr(params, name);
    if (value == NULL)
        return -1.0;
    double read = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return read;
}

static int
log_of(Py_ssize_t frequency, double *out, PyObject **as_float)
{
    /* ln(frequency) and a new reference to it as a float */
    if (frequency < LOGS) {
        *out = log_of_small[frequency];
        *as_float = Py_NewRef(float_log_of_small[frequency]);
        return 0;
    }
    *as_float = PyObject_CallFunction(math_log, "n", frequency);
    if (*as_float == NULL)
        return -1;
    *out = PyFloat_AsDouble(*as_float);
    return 0;
}

static int
tf_of(const Py_ssize_t *ids, Py_ssize_t count, const Py_ssize_t *frequency, double *tf)
{
    /* math.fsum(ln(frequency) of each term) / sqrt(count); 0 without terms. Terms of
       frequency 1 add 0: the sum is called in Python only when two terms or more
       add something. */
    Py_ssize_t nonzero = 0;
    Py_ssize_t last = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (frequency[ids[i]] > 1) {
            nonzero++;
            last = frequency[ids[i]];
        }
    }
    double sum = 0.0;
    if (nonzero == 1) {
        PyObject *as_float;
        if (log_of(last, &sum, &as_float) < 0)
            return -1;
        Py_DECREF(as_float);
    }
    else if (nonzero > 1) {
        PyObject *addends = PyTuple_New(nonzero);
        if (addends == NULL)
            return -1;
        for (Py_ssize_t i = 0, at = 0; i < count; i++) {
            Py_ssize_t k = frequency[ids[i]];
            if (k == 1)
                continue;
            PyObject *as_float;
            if (log_of(k, &sum, &as_float) < 0) {
                Py_DECREF(addends);
                return -1;
            }
            PyTuple_SET_ITEM(addends, at++, as_float);
        }
        PyObject *total = PyObject_CallOneArg(math_fsum, addends);
        Py_DECREF(addends);
        if (total == NULL)
            return -1;
        sum = PyFloat_AsDouble(total);
        Py_DECREF(total);
    }
    *tf = count ? sum / sqrt((double)count) : 0.0;
    return 0;
}

static int
by_rank(const void *a, const void *b)
{
    /* best score first, then the earlier position */
    const Ranked *x = a;
    const Ranked *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

static void
rank(const Call *call, Ranked *ranked, Py_ssize_t n, Py_ssize_t count, double placed)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t position = ranked[i].position;
        const Distinct *d = &call->distinct[call->pieces[position].distinct];
        ranked[i].score =
            d->topical + placed * (1.0 - (double)position / (double)count) + d->weighty;
    }
    qsort(ranked, (size_t)n, sizeof(Ranked), by_rank);
}

static int
repeats(Call *call, const Distinct *d)
{
    /* whether d's terms overlap those of a chosen sentence by Jaccard >= redundancy
       (never when either has none) */
    if (d->count == 0)
        return 0;
    Py_ssize_t stamp = ++call->stamp;
    for (Py_ssize_t i = 0; i < d->count; i++)
        call->stamps[call->terms[d->start + i]] = stamp;
    for (Py_ssize_t c = 0; c < call->n_chosen; c++) {
        const Distinct *other = &call->distinct[call->pieces[call->chosen[c]].distinct];
        if (other->count == 0)
            continue;
        Py_ssize_t shared = 0;
        for (Py_ssize_t i = 0; i < other->count; i++)
            shared += call->stamps[call->terms[other->start + i]] == stamp;
        double jaccard = (double)shared / (double)(d->count + other->count - shared);
        if (jaccard >= call->redundancy)
            return 1;
    }
    return 0;
}

static Py_ssize_t
gap(const Piece *left, const Piece *right)
{
    /* 1 for the space between two sentences, 0 between two CJK sides */
    return left->closes_wide && right->opens_wide ? 0 : 1;
}

static Py_ssize_t
gaps(const Call *call, Py_ssize_t at, const Piece *piece)
{
    /* the characters that joining adds when piece goes to chosen[at] */
    const Piece *left = at ? &call->pieces[call->chosen[at - 1]] : NULL;
    const Piece *right = at < call->n_chosen ? &call->pieces[call->chosen[at]] : NULL;
    Py_ssize_t added = 0;
    if (left != NULL)
        added += gap(left, piece);
    if (right != NULL) {
        added += gap(piece, right);
        if (left != NULL)
            added -= gap(left, right);
    }
    return added;
}

#define NEAR_MISS (-1)

static Py_ssize_t
choose(Call *call, const Ranked *ranked, Py_ssize_t n, int near_fits)
{
    /* reference_pick's _select: greedy by rank, what fits and is not a near repeat,
       kept in order of position. The number chosen, or NEAR_MISS when near_fits and
       a candidate that fits with the narrowest join is left out by its gaps. */
    call->n_chosen = 0;
    Py_ssize_t used = -1;
    Py_ssize_t shortest = PY_SSIZE_T_MAX;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length = call->pieces[ranked[i].position].length;
        shortest = length < shortest ? length : shortest;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t position = ranked[i].position;
        const Piece *piece = &call->pieces[position];
        Distinct *d = &call->distinct[piece->distinct];
        if (shortest + used + 1 > call->max_chars)
            break; /* no candidate fits even with the narrowest join */
        if (piece->length + used + 1 > call->max_chars || d->chosen || repeats(call, d))
            continue;
        Py_ssize_t at = call->n_chosen; /* after the chosen ones before it */
        while (at > 0 && call->chosen[at - 1] > position)
            at--;
        Py_ssize_t length = (used > 0 ? used : 0) + piece->length;
        length += gaps(call, at, piece);
        if (length <= call->max_chars) {
            memmove(&call->chosen[at + 1], &call->chosen[at],
                    (size_t)(call->n_chosen - at) * sizeof(Py_ssize_t));
            call->chosen[at] = position;
            call->n_chosen++;
            d->chosen = 1;
            used = length;
        }
        else if (near_fits) {
            return NEAR_MISS;
        }
    }
    return call->n_chosen;
}

static PyObject *
join(const Call *call)
{
    /* the chosen sentences joined by a space, or by nothing between two CJK sides */
    PyObject *parts = PyList_New(0);
    if (parts == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < call->n_chosen; c++) {
        const Piece *piece = &call->pieces[call->chosen[c]];
        if (c && gap(&call->pieces[call->chosen[c - 1]], piece) &&
            PyList_Append(parts, space) < 0)
            goto failed;
        if (PyList_Append(parts, piece->text) < 0)
            goto failed;
    }
    PyObject *joined = PyUnicode_Join(empty, parts);
    Py_DECREF(parts);
    return joined;
failed:
    Py_DECREF(parts);
    return NULL;
}

#if PY_VERSION_HEX < 0x030D0000
/* CPython before 3.13 exports the walk of a set's table, with each key's hash */
#define WALK_SET_TABLE 1
#endif

static int
read_terms(Call *call, Table *terms, Distinct *d, PyObject *set, Py_ssize_t *at)
{
    /* the ids of the terms of set, stored from terms[*at] */
    d->start = *at;
    d->count = PySet_GET_SIZE(set);
#ifdef WALK_SET_TABLE
    Py_ssize_t pos = 0;
    PyObject *term;
    Py_hash_t hash;
    while (_PySet_NextEntry(set, &pos, &term, &hash)) { /* term: borrowed */
        if (!PyUnicode_Check(term)) {
            PyErr_SetString(PyExc_TypeError, "pick: a piece's terms are str");
            return -1;
        }
        Py_ssize_t id = table_id_hashed(terms, term, hash);
        if (id < 0)
            return -1;
        call->terms[(*at)++] = id;
    }
    return 0;
#else
    PyObject *iterator = PyObject_GetIter(set);
    if (iterator == NULL)
        return -1;
    PyObject *term;
    while ((term = PyIter_Next(iterator)) != NULL) {
        Py_ssize_t id = -1;
        if (!PyUnicode_Check(term))
            PyErr_SetString(PyExc_TypeError, "pick: a piece's terms are str");
        else
            id = table_id(terms, term);
        Py_DECREF(term); /* still held by the set */
        if (id < 0) {
            Py_DECREF(iterator);
            return -1;
        }
        call->terms[(*at)++] = id;
    }
    Py_DECREF(iterator);
    return PyErr_Occurred() ? -1 : 0;
#endif
}

static int
score_texts(Call *call, Py_ssize_t n_distinct, Py_ssize_t n_terms, PyObject *params,
            PyObject *importance, const double *weights)
{
    /* each distinct text's topical and weighty parts (see the top of this file) */
    Py_ssize_t *frequency = PyMem_Calloc((size_t)n_terms + 1, sizeof(Py_ssize_t));
    double *tf = PyMem_Malloc(((size_t)n_distinct + 1) * sizeof(double));
    int failed = frequency == NULL || tf == NULL;
    if (failed)
        PyErr_NoMemory();
    for (Py_ssize_t d = 0; !failed && d < n_distinct; d++)
        for (Py_ssize_t i = 0; i < call->distinct[d].count; i++)
            frequency[call->terms[call->distinct[d].start + i]]++;
    double top = 0.0;
    for (Py_ssize_t d = 0; !failed && d < n_distinct; d++) {
        const Distinct *each = &call->distinct[d];
        failed = tf_of(&call->terms[each->start], each->count, frequency, &tf[d]) < 0;
        top = !failed && tf[d] > top ? tf[d] : top;
    }
    top = top == 0.0 ? 1.0 : top;
    for (Py_ssize_t d = 0; !failed && d < n_distinct; d++) {
        Distinct *each = &call->distinct[d];
        PyObject *argv[2] = {call->pieces[each->first].text, params};
        PyObject *value = PyObject_Vectorcall(importance, argv, 2, NULL);
        double read = value == NULL ? -1.0 : PyFloat_AsDouble(value);
        Py_XDECREF(value);
        failed = value == NULL || (read == -1.0 && PyErr_Occurred());
        each->topical = weights[0] * tf[d] / top;
        each->weighty = weights[2] * (read - 1.0) / 9.0;
    }
    PyMem_Free(frequency);
    PyMem_Free(tf);
    return failed ? -1 : 0;
}

typedef struct {
    Py_ssize_t n;
    Py_ssize_t *counted; /* the positions of the sentences that count */
    Py_ssize_t n_counted;
    Py_ssize_t n_distinct;
    Py_ssize_t n_terms;
    Ranked *ranked;
    Table texts;
    Table terms;
} Work;

static int
read_call(Call *call, Work *work, PyObject *pieces)
{
    /* the pieces, which of them count, their distinct texts and their terms */
    Py_ssize_t n = work->n;
    Py_ssize_t bound = 0; /* every term of every counted piece */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_piece(PyTuple_GET_ITEM(pieces, i), &call->pieces[i]) < 0)
            return -1;
        call->pieces[i].distinct = -1;
        if (PySet_GET_SIZE(call->pieces[i].terms)) {
            work->counted[work->n_counted++] = i;
            bound += PySet_GET_SIZE(call->pieces[i].terms);
        }
    }
    if (work->n_counted == 0) { /* none has content: every one counts */
        for (Py_ssize_t i = 0; i < n; i++)
            work->counted[i] = i;
        work->n_counted = n;
    }
    call->terms = PyMem_Malloc(((size_t)bound + 1) * sizeof(Py_ssize_t));
    call->stamps = PyMem_Calloc((size_t)bound + 1, sizeof(Py_ssize_t));
    if (call->terms == NULL || call->stamps == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (table_init(&work->texts, work->n_counted) < 0 ||
        table_init(&work->terms, bound) < 0)
        return -1;
    Py_ssize_t at = 0;
    for (Py_ssize_t c = 0; c < work->n_counted; c++) {
        Piece *piece = &call->pieces[work->counted[c]];
        piece->distinct = table_id(&work->texts, piece->text);
        if (piece->distinct < 0)
            return -1;
        if (piece->distinct < work->n_distinct)
            continue; /* said before */
        Distinct *d = &call->distinct[work->n_distinct++];
        d->first = work->counted[c];
        d->chosen = 0;
        if (read_terms(call, &work->terms, d, piece->terms, &at) < 0)
            return -1;
    }
    work->n_terms = work->terms.used;
    return 0;
}

static PyObject *
result(const Call *call, const Ranked *ranked)
{
    /* (summary, True), or (the best sentence, False) when none was chosen */
    if (call->n_chosen == 0)
        return Py_BuildValue("(OO)", call->pieces[ranked[0].position].text, Py_False);
    PyObject *joined = join(call);
    if (joined == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("(OO)", joined, Py_True);
    Py_DECREF(joined);
    return out;
}

static PyObject *
choose_and_join(Call *call, Work *work, double placed)
{
    /* rank the first sayings and choose; on a near miss, rank and choose every
       saying (see reference_pick) */
    Py_ssize_t count = work->counted[work->n_counted - 1] + 1;
    Ranked *ranked = work->ranked;
    for (Py_ssize_t d = 0; d < work->n_distinct; d++)
        ranked[d].position = call->distinct[d].first;
    rank(call, ranked, work->n_distinct, count, placed);
    int near_fits = work->n_distinct < work->n_counted;
    if (choose(call, ranked, work->n_distinct, near_fits) == NEAR_MISS) {
        for (Py_ssize_t d = 0; d < work->n_distinct; d++)
            call->distinct[d].chosen = 0;
        for (Py_ssize_t c = 0; c < work->n_counted; c++)
            ranked[c].position = work->counted[c];
        rank(call, ranked, work->n_counted, count, placed);
        choose(call, ranked, work->n_counted, 0);
    }
    return result(call, ranked);
}

static int
read_weights(PyObject *params, double *weights, double *redundancy)
{
    /* tf, position and importance weights, and the redundancy, of params */
    for (int i = 0; i < 3; i++) {
        weights[i] = weight(params, weight_names[i]);
        if (weights[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    *redundancy = weight(params, weight_names[3]);
    return *redundancy == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static Py_ssize_t
read_max_chars(PyObject *value)
{
    /* max_chars, > 0: beyond a Py_ssize_t it is as good as no limit; -1 on failure */
    int overflow = 0;
    long long read = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (read == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0 || read > PY_SSIZE_T_MAX / 4)
        return PY_SSIZE_T_MAX / 4;
    if (overflow < 0 || read <= 0) {
        PyErr_SetString(PyExc_ValueError, "pick: max_chars is above 0");
        return -1;
    }
    return (Py_ssize_t)read;
}

static PyObject *
pick(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pick(pieces, max_chars, params, importance)");
        return NULL;
    }
    Call call = {0};
    Work work = {0};
    double weights[3];
    PyObject *out = NULL;
    call.max_chars = read_max_chars(args[1]);
    if (call.max_chars < 0 || read_weights(args[2], weights, &call.redundancy) < 0)
        return NULL;
    PyObject *pieces = PySequence_Tuple(args[0]); /* held: the call borrows from it */
    if (pieces == NULL)
        return NULL;
    work.n = PyTuple_GET_SIZE(pieces);
    if (work.n == 0) {
        PyErr_SetString(PyExc_ValueError, "pick: no pieces");
        goto done;
    }
    size_t n = (size_t)work.n;
    call.pieces = PyMem_Malloc(n * sizeof(Piece));
    call.distinct = PyMem_Malloc(n * sizeof(Distinct));
    call.chosen = PyMem_Malloc(n * sizeof(Py_ssize_t));
    work.counted = PyMem_Malloc(n * sizeof(Py_ssize_t));
    work.ranked = PyMem_Malloc(n * sizeof(Ranked));
    if (!call.pieces || !call.distinct || !call.chosen || !work.counted ||
        !work.ranked) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_call(&call, &work, pieces) < 0 ||
        score_texts(&call, work.n_distinct, work.n_terms, args[2], args[3],
                    weights) < 0)
        goto done;
    out = choose_and_join(&call, &work, weights[1]);
done:
    PyMem_Free(call.pieces);
    PyMem_Free(call.distinct);
    PyMem_Free(call.chosen);
    PyMem_Free(call.terms);
    PyMem_Free(call.stamps);
    PyMem_Free(work.counted);
    PyMem_Free(work.ranked);
    PyMem_Free(work.texts.slots);
    PyMem_Free(work.terms.slots);
    Py_DECREF(pieces);
    return out;
}

static PyMethodDef methods[] = {
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL,
     "pick(pieces, max_chars, params, importance) -> (text, whole): the summary of the "
     "pieces (whole), or the best sentence, to be cut (not whole)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "processors._summary",
    "The extractive summariser's choice of sentences, in C (processors/summary.py).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int
read_logs(void)
{
    /* math.log(k) for 1 <= k < LOGS, as doubles and as floats */
    for (Py_ssize_t k = 1; k < LOGS; k++) {
        float_log_of_small[k] = PyObject_CallFunction(math_log, "n", k);
        if (float_log_of_small[k] == NULL)
            return -1;
        log_of_small[k] = PyFloat_AsDouble(float_log_of_small[k]);
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__summary(void)
{
    PyObject *math = PyImport_ImportModule("math");
    if (math == NULL)
        return NULL;
    math_log = PyObject_GetAttrString(math, "log");
    math_fsum = PyObject_GetAttrString(math, "fsum");
    Py_DECREF(math);
    space = PyUnicode_InternFromString(" ");
    empty = PyUnicode_New(0, 0);
    static const char *names[4] = {"summary_tf_weight", "summary_position_weight",
                                   "summary_importance_weight", "summary_redundancy"};
    for (int i = 0; i < 4; i++)
        if ((weight_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    if (math_log == NULL || math_fsum == NULL || space == NULL || empty == NULL ||
        read_logs() < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
