/* svc_ingest.id_index's table of event ids, compiled.
 *
 * The same table as id_index.PythonIdIndex, field for field: an id is held
 * as its 64-bit hash (Python's own hash of the bytes, 0 taken as 1) in an
 * open-addressing table with linear probing, its first-seen milliseconds
 * beside it; the table doubles past half full and never shrinks; removing
 * an id shifts the rest of its run back. tests/unit/test_ingest_id_index.py
 * runs every test against both. Claiming an id took 0.55 µs in Python, a
 * turn of the interpreter per probe, on the worker's path for every event.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define EMPTY 0
#define MIN_SLOTS (1 << 16)
/* Past this share of slots taken (tenths) the table doubles. */
#define MAX_LOAD_TENTHS 5

typedef struct {
    PyObject_HEAD
    uint64_t *keys;
    int64_t *times;
    uint64_t mask;
    Py_ssize_t count;
    Py_ssize_t limit;
} IdTable;

static int allocate(IdTable *self, uint64_t slots) {
    uint64_t *keys = PyMem_RawCalloc(slots, sizeof *keys);
    int64_t *times = PyMem_RawCalloc(slots, sizeof *times);
    if (!keys || !times) {
        PyMem_RawFree(keys);
        PyMem_RawFree(times);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_RawFree(self->keys);
    PyMem_RawFree(self->times);
    self->keys = keys;
    self->times = times;
    self->mask = slots - 1;
    self->limit = (Py_ssize_t)(slots * MAX_LOAD_TENTHS / 10);
    return 0;
}

/* Where key is held, or else the empty slot that ends its probe. */
static inline uint64_t slot_of(const IdTable *self, uint64_t key) {
    uint64_t slot = key & self->mask;
    uint64_t held;
    while ((held = self->keys[slot]) != key && held != EMPTY)
        slot = (slot + 1) & self->mask;
    return slot;
}

static int grow(IdTable *self) {
    uint64_t slots = self->mask + 1;
    uint64_t *keys = self->keys;
    int64_t *times = self->times;
    self->keys = NULL;
    self->times = NULL;
    if (allocate(self, slots * 2) < 0) {
        self->keys = keys;
        self->times = times;
        return -1;
    }
    for (uint64_t at = 0; at < slots; at++) {
        if (keys[at] != EMPTY) {
            uint64_t slot = slot_of(self, keys[at]);
            self->keys[slot] = keys[at];
            self->times[slot] = times[at];
        }
    }
    PyMem_RawFree(keys);
    PyMem_RawFree(times);
    return 0;
}

/* Holds key at ms in the empty slot its probe ended at; doubles past the limit. */
static int insert_at(IdTable *self, uint64_t slot, uint64_t key, int64_t ms) {
    self->keys[slot] = key;
    self->times[slot] = ms;
    self->count++;
    if (self->count > self->limit)
        return grow(self);
    return 0;
}

static int key_of(PyObject *event_id, uint64_t *key) {
    if (!PyBytes_CheckExact(event_id)) {
        PyErr_Format(PyExc_TypeError, "an event id is bytes, got %.100s",
                     Py_TYPE(event_id)->tp_name);
        return -1;
    }
    Py_hash_t hash = PyObject_Hash(event_id);
    if (hash == -1 && PyErr_Occurred())
        return -1;
    *key = (uint64_t)hash ? (uint64_t)hash : 1;
    return 0;
}

static int IdTable_init(IdTable *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"slots", NULL};
    Py_ssize_t slots = MIN_SLOTS;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|n", names, &slots))
        return -1;
    if (slots < 1 || (slots & (slots - 1))) {
        PyErr_Format(PyExc_ValueError, "slots must be a power of two, got %zd", slots);
        return -1;
    }
    self->count = 0;
    return allocate(self, (uint64_t)slots);
}

static void IdTable_dealloc(IdTable *self) {
    PyMem_RawFree(self->keys);
    PyMem_RawFree(self->times);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *IdTable_claim(IdTable *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "claim(event_id, ms, within_ms)");
        return NULL;
    }
    uint64_t key;
    if (key_of(args[0], &key) < 0)
        return NULL;
    int64_t ms = PyLong_AsLongLong(args[1]);
    if (ms == -1 && PyErr_Occurred())
        return NULL;
    int64_t within = PyLong_AsLongLong(args[2]);
    if (within == -1 && PyErr_Occurred())
        return NULL;
    uint64_t slot = slot_of(self, key);
    if (self->keys[slot] == key) {
        if (ms - self->times[slot] <= within)
            return PyLong_FromLong(0);
        self->times[slot] = ms;
    } else if (insert_at(self, slot, key, ms) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(key);
}

static PyObject *IdTable_get(IdTable *self, PyObject *event_id) {
    uint64_t key;
    if (key_of(event_id, &key) < 0)
        return NULL;
    uint64_t slot = slot_of(self, key);
    if (self->keys[slot] != key)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(self->times[slot]);
}

static PyObject *IdTable_remove_if_seen_at(IdTable *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "remove_if_seen_at(key, ms)");
        return NULL;
    }
    uint64_t key = PyLong_AsUnsignedLongLong(args[0]);
    if (key == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    int64_t ms = PyLong_AsLongLong(args[1]);
    if (ms == -1 && PyErr_Occurred())
        return NULL;
    uint64_t mask = self->mask;
    uint64_t hole = slot_of(self, key);
    if (self->keys[hole] != key || self->times[hole] != ms)
        Py_RETURN_FALSE;
    /* Backward-shift deletion: each later key of the run that may sit in the
     * hole (its home slot is not between the hole and where it is) moves
     * into it, so every probe still finds its key before an empty slot. */
    for (uint64_t at = (hole + 1) & mask; self->keys[at] != EMPTY; at = (at + 1) & mask) {
        uint64_t held = self->keys[at];
        if (((at - (held & mask)) & mask) >= ((at - hole) & mask)) {
            self->keys[hole] = held;
            self->times[hole] = self->times[at];
            hole = at;
        }
    }
    self->keys[hole] = EMPTY;
    self->times[hole] = 0;
    self->count--;
    Py_RETURN_TRUE;
}

static PyObject *IdTable_of(PyTypeObject *type, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "of(keys, times)");
        return NULL;
    }
    Py_buffer keys, times;
    if (PyObject_GetBuffer(args[0], &keys, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &times, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&keys);
        return NULL;
    }
    IdTable *self = NULL;
    if (keys.itemsize != 8 || times.itemsize != 8 || keys.len != times.len) {
        PyErr_SetString(PyExc_ValueError, "of: keys (uint64) and times (int64) of one length");
        goto done;
    }
    self = (IdTable *)PyObject_CallNoArgs((PyObject *)type);
    if (!self)
        goto done;
    const uint64_t *k = keys.buf;
    const int64_t *t = times.buf;
    for (Py_ssize_t i = 0; i < keys.len / 8; i++) {
        uint64_t key = k[i] ? k[i] : 1;
        uint64_t slot = slot_of(self, key);
        if (self->keys[slot] == key) {
            if (t[i] > self->times[slot]) /* an id in several groups: its latest */
                self->times[slot] = t[i];
        } else if (insert_at(self, slot, key, t[i]) < 0) {
            Py_CLEAR(self);
            goto done;
        }
    }
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&times);
    return (PyObject *)self;
}

static Py_ssize_t IdTable_len(IdTable *self) { return self->count; }

static PyObject *IdTable_slots(IdTable *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->mask + 1);
}

static PyMethodDef IdTable_methods[] = {
    {"claim", (PyCFunction)(void (*)(void))IdTable_claim, METH_FASTCALL,
     "claim(event_id, ms, within_ms) -> its key if claimed, else 0"},
    {"get", (PyCFunction)IdTable_get, METH_O, "get(event_id) -> first-seen ms or None"},
    {"remove_if_seen_at", (PyCFunction)(void (*)(void))IdTable_remove_if_seen_at,
     METH_FASTCALL, "remove_if_seen_at(key, ms) -> whether it was removed"},
    {"of", (PyCFunction)(void (*)(void))IdTable_of, METH_FASTCALL | METH_CLASS,
     "of(keys, times) -> a table of keys (uint64), each at its latest time (int64)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef IdTable_getset[] = {
    {"slots", (getter)IdTable_slots, NULL, "the table's size", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods IdTable_as_sequence = {
    .sq_length = (lenfunc)IdTable_len,
};

static PyTypeObject IdTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svc_ingest._id_table.IdTable",
    .tp_basicsize = sizeof(IdTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Event id -> first-seen milliseconds: svc_ingest.id_index's table, compiled.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)IdTable_init,
    .tp_dealloc = (destructor)IdTable_dealloc,
    .tp_methods = IdTable_methods,
    .tp_getset = IdTable_getset,
    .tp_as_sequence = &IdTable_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_id_table",
    "svc_ingest.id_index's table of event ids, compiled: see svc_ingest.id_index.", -1, NULL,
};

PyMODINIT_FUNC PyInit__id_table(void) {
    if (PyType_Ready(&IdTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "IdTable", (PyObject *)&IdTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
