/* The common JSON sensor reading, raw bytes straight to a CleanEvent's bytes.
 *
 * svc_ingest.sensor_bytes wraps this module; its docstring says what it
 * takes and why. Everything here declines (returns None) rather than
 * rejects: whatever is not plainly the common shape goes to the Python
 * path, which decides. What it accepts is, field for field, the event the
 * Python path builds (tests/unit/test_ingest_sensor_bytes.py holds it to
 * that on hand-written readings and on generated ones).
 *
 * Accepted: a JSON object of ASCII text with no escapes and no arrays, at
 * most three levels deep, no key twice in an object; the keys
 * SensorShapes plans by (svc_ingest.fields): an event id (a string, an
 * integer or null), a time (an epoch number), a device (a string or an
 * integer), "metrics" (an object of numbers or of {"value", "unit"}
 * objects), optional "attributes" (an object of scalars) and any other key
 * with a scalar value (an attribute); no float attributes (their text is
 * Python's repr).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

enum { K_STR, K_INT, K_FLOAT, K_TRUE, K_FALSE, K_NULL, K_OBJ };

#define MAX_MEMBERS 1024
#define MAX_OBJECTS 300
#define MAX_DEPTH 3
#define MAX_NUMBER_TEXT 64
/* Integers of at most 18 digits fit an int64 with room to scale. */
#define MAX_INT_DIGITS 18

typedef struct {
    const char *key;
    Py_ssize_t key_len;
    int kind;
    const char *text; /* a string's contents or a number's token */
    Py_ssize_t text_len;
    int64_t i;
    double d;
    int obj;  /* K_OBJ: its index */
    int next; /* the next member of the same object, -1 at the end */
} Member;

typedef struct {
    int first, last, count;
} Object;

typedef struct {
    const char *s, *end;
    Member m[MAX_MEMBERS];
    int nm;
    Object o[MAX_OBJECTS];
    int no;
} Doc;

/* ---- parsing: 0 declines ---- */

static void skip_blanks(Doc *d) {
    while (d->s < d->end && (*d->s == ' ' || *d->s == '\t' || *d->s == '\n' || *d->s == '\r'))
        d->s++;
}

static int parse_string(Doc *d, const char **text, Py_ssize_t *len) {
    const char *start = ++d->s; /* past the opening quote */
    while (d->s < d->end) {
        unsigned char c = (unsigned char)*d->s;
        if (c == '"') {
            *text = start;
            *len = d->s - start;
            d->s++;
            return 1;
        }
        if (c < 0x20 || c > 0x7e || c == '\\')
            return 0;
        d->s++;
    }
    return 0;
}

static int parse_number(Doc *d, Member *m) {
    const char *start = d->s, *p = d->s;
    int integral = 1, digits = 0;
    if (p < d->end && *p == '-')
        p++;
    if (p >= d->end)
        return 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        while (p < d->end && *p >= '0' && *p <= '9') {
            p++;
            digits++;
        }
    } else {
        return 0;
    }
    if (p < d->end && *p == '.') {
        integral = 0;
        p++;
        if (p >= d->end || *p < '0' || *p > '9')
            return 0;
        while (p < d->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < d->end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < d->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= d->end || *p < '0' || *p > '9')
            return 0;
        while (p < d->end && *p >= '0' && *p <= '9')
            p++;
    }
    m->text = start;
    m->text_len = p - start;
    d->s = p;
    if (integral) {
        /* "-0" is the integer 0, whose text is "0": left to Python. */
        if (digits > MAX_INT_DIGITS || (m->text_len == 2 && start[0] == '-' && start[1] == '0'))
            return 0;
        int64_t value = 0;
        for (const char *q = start[0] == '-' ? start + 1 : start; q < p; q++)
            value = value * 10 + (*q - '0');
        m->kind = K_INT;
        m->i = start[0] == '-' ? -value : value;
        return 1;
    }
    if (m->text_len >= MAX_NUMBER_TEXT)
        return 0;
    char buffer[MAX_NUMBER_TEXT];
    memcpy(buffer, start, (size_t)m->text_len);
    buffer[m->text_len] = 0;
    /* Correctly rounded (glibc), as Python's float() and orjson's. */
    m->d = strtod(buffer, NULL);
    if (!isfinite(m->d))
        return 0;
    m->kind = K_FLOAT;
    return 1;
}

static int parse_literal(Doc *d, const char *word, size_t len) {
    if ((size_t)(d->end - d->s) < len || memcmp(d->s, word, len) != 0)
        return 0;
    d->s += len;
    return 1;
}

static int parse_object(Doc *d, int depth);

static int parse_value(Doc *d, Member *m, int depth) {
    if (d->s >= d->end)
        return 0;
    switch (*d->s) {
    case '"':
        m->kind = K_STR;
        return parse_string(d, &m->text, &m->text_len);
    case '{': {
        int index = parse_object(d, depth + 1);
        if (index < 0)
            return 0;
        m->kind = K_OBJ;
        m->obj = index;
        return 1;
    }
    case 't':
        m->kind = K_TRUE;
        return parse_literal(d, "true", 4);
    case 'f':
        m->kind = K_FALSE;
        return parse_literal(d, "false", 5);
    case 'n':
        m->kind = K_NULL;
        return parse_literal(d, "null", 4);
    default:
        return parse_number(d, m);
    }
}

static int same_key(const Member *a, const char *key, Py_ssize_t len) {
    return a->key_len == len && memcmp(a->key, key, (size_t)len) == 0;
}

/* The object at d->s; its index, or -1 to decline. */
static int parse_object(Doc *d, int depth) {
    if (depth > MAX_DEPTH || d->no >= MAX_OBJECTS)
        return -1;
    int index = d->no++;
    Object *o = &d->o[index];
    o->first = o->last = -1;
    o->count = 0;
    d->s++; /* past '{' */
    skip_blanks(d);
    if (d->s < d->end && *d->s == '}') {
        d->s++;
        return index;
    }
    for (;;) {
        if (d->s >= d->end || *d->s != '"' || d->nm >= MAX_MEMBERS)
            return -1;
        const char *key;
        Py_ssize_t key_len;
        if (!parse_string(d, &key, &key_len))
            return -1;
        /* A key twice: Python's strict parser names it. */
        for (int at = o->first; at >= 0; at = d->m[at].next)
            if (same_key(&d->m[at], key, key_len))
                return -1;
        skip_blanks(d);
        if (d->s >= d->end || *d->s != ':')
            return -1;
        d->s++;
        skip_blanks(d);
        int at = d->nm++;
        Member *m = &d->m[at];
        m->key = key;
        m->key_len = key_len;
        m->next = -1;
        if (!parse_value(d, m, depth))
            return -1;
        o = &d->o[index]; /* parse_value may have added objects, not moved them */
        if (o->last >= 0)
            d->m[o->last].next = at;
        else
            o->first = at;
        o->last = at;
        o->count++;
        skip_blanks(d);
        if (d->s < d->end && *d->s == ',') {
            d->s++;
            skip_blanks(d);
            continue;
        }
        if (d->s < d->end && *d->s == '}') {
            d->s++;
            return index;
        }
        return -1;
    }
}

static Member *find(Doc *d, int obj, const char *key) {
    Py_ssize_t len = (Py_ssize_t)strlen(key);
    for (int at = d->o[obj].first; at >= 0; at = d->m[at].next)
        if (same_key(&d->m[at], key, len))
            return &d->m[at];
    return NULL;
}

/* svc_ingest.fields' preference lists; keep them in step (a test checks). */
static const char *const EVENT_ID[] = {"event_id", "eventId", "id", NULL};
static const char *const TIME[] = {"timestamp", "ts",        "time",         "event_time",
                                   "eventTime", "@timestamp", "time_iso8601", "time_local",
                                   NULL};
static const char *const DEVICE[] = {"device_id", "deviceId", "device", NULL};
static const char *const KIND[] = {"type", "kind", NULL};

static Member *first_of(Doc *d, const char *const *names) {
    for (; *names; names++) {
        Member *m = find(d, 0, *names);
        if (m)
            return m;
    }
    return NULL;
}

static int listed(const Member *m, const char *const *names) {
    for (; *names; names++)
        if (same_key(m, *names, (Py_ssize_t)strlen(*names)))
            return 1;
    return 0;
}

static int sensor_key(const Member *m) {
    return listed(m, EVENT_ID) || listed(m, TIME) || listed(m, DEVICE) || listed(m, KIND) ||
           same_key(m, "metrics", 7) || same_key(m, "attributes", 10);
}

/* ---- the output ---- */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int reserve(Buf *b, size_t more) {
    if (b->n + more <= b->cap)
        return 1;
    size_t cap = b->cap * 2 > b->n + more ? b->cap * 2 : b->n + more;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p)
        return 0;
    b->p = p;
    b->cap = cap;
    return 1;
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Callers reserve first. */
static void put_varint(Buf *b, uint64_t v) {
    while (v >= 0x80) {
        b->p[b->n++] = (char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (char)v;
}

static void put_bytes(Buf *b, const char *p, size_t n) {
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static size_t string_field_size(size_t len) { return len ? 1 + varint_size(len) + len : 0; }

static void put_string_field(Buf *b, int field, const char *p, size_t len) {
    if (!len)
        return;
    put_varint(b, (uint64_t)(field << 3 | 2));
    put_varint(b, len);
    put_bytes(b, p, len);
}

static size_t timestamp_size(int64_t micros) {
    int64_t seconds = micros / 1000000, nanos = micros % 1000000 * 1000;
    return (seconds ? 1 + varint_size((uint64_t)seconds) : 0) +
           (nanos ? 1 + varint_size((uint64_t)nanos) : 0);
}

static void put_timestamp(Buf *b, int field, int64_t micros) {
    int64_t seconds = micros / 1000000, nanos = micros % 1000000 * 1000;
    put_varint(b, (uint64_t)(field << 3 | 2));
    put_varint(b, timestamp_size(micros));
    if (seconds) {
        put_varint(b, 0x08);
        put_varint(b, (uint64_t)seconds);
    }
    if (nanos) {
        put_varint(b, 0x10);
        put_varint(b, (uint64_t)nanos);
    }
}

/* ---- measurement specs, cached by (name, unit) as sent ---- */

typedef struct {
    char *key; /* name, NUL, unit flag, unit */
    size_t key_len;
    char *metric, *unit;
    size_t metric_len, unit_len;
    int convert, bounded;
    double scale, offset, low, high;
} Spec;

#define SPEC_SLOTS 8192
/* Cleared at this many, between records; a record adds at most MAX_READINGS. */
#define SPEC_LIMIT 4096

typedef struct {
    Spec *spec;
    double value;
} Reading;

typedef struct {
    const char *key, *value;
    Py_ssize_t key_len, value_len;
} Attribute;

#define MAX_READINGS 256
#define MAX_ATTRIBUTES 512

typedef struct Scratch {
    Doc doc;
    Reading readings[MAX_READINGS];
    Attribute attributes[MAX_ATTRIBUTES];
} Scratch;

typedef struct {
    PyObject_HEAD
    PyObject *spec_of;
    char *topic;
    size_t topic_len;
    Py_ssize_t max_payload, max_nesting, max_id_length, max_metrics;
    int64_t max_future_skew_us;
    Spec *specs; /* SPEC_SLOTS slots; key NULL when free */
    int spec_count;
    Scratch *scratch; /* one record's parse, kept: it is large */
    /* In clean: spec_of is Python, and may let another thread in, which
     * must not reuse the scratch or the table meanwhile (it declines). */
    int busy;
} Cleaner;

static uint64_t hash_key(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static void clear_specs(Cleaner *self) {
    for (int i = 0; i < SPEC_SLOTS; i++) {
        Spec *s = &self->specs[i];
        if (s->key) {
            PyMem_Free(s->key);
            PyMem_Free(s->metric);
            PyMem_Free(s->unit);
            memset(s, 0, sizeof *s);
        }
    }
    self->spec_count = 0;
}

/* A float, or an int a double holds exactly (as Python compares and scales them); 0 if neither. */
static int exact_double(PyObject *number, double *out) {
    if (PyFloat_Check(number)) {
        *out = PyFloat_AS_DOUBLE(number);
        return 1;
    }
    if (PyLong_Check(number) && !PyBool_Check(number)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
        if (overflow || v > (1LL << 53) || v < -(1LL << 53))
            return 0;
        *out = (double)v;
        return 1;
    }
    return 0;
}

static char *copy_text(PyObject *text, size_t *len) {
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(text, &n);
    if (!p)
        return NULL;
    char *out = PyMem_Malloc((size_t)n + 1);
    if (!out)
        return NULL;
    memcpy(out, p, (size_t)n + 1);
    *len = (size_t)n;
    return out;
}

/* Python's spec for (name, unit); NULL, no error set, to decline. */
static Spec *resolve(Cleaner *self, const Member *name, int unit_flag, const char *unit,
                     Py_ssize_t unit_len) {
    size_t key_len = (size_t)name->key_len + 2 + (size_t)unit_len;
    char stack[256];
    char *key = key_len <= sizeof stack ? stack : PyMem_Malloc(key_len);
    if (!key)
        return NULL;
    memcpy(key, name->key, (size_t)name->key_len);
    key[name->key_len] = 0;
    key[name->key_len + 1] = (char)unit_flag;
    memcpy(key + name->key_len + 2, unit, (size_t)unit_len);
    uint64_t slot = hash_key(key, key_len) % SPEC_SLOTS;
    while (self->specs[slot].key) {
        Spec *s = &self->specs[slot];
        if (s->key_len == key_len && memcmp(s->key, key, key_len) == 0) {
            if (key != stack)
                PyMem_Free(key);
            return s;
        }
        slot = (slot + 1) % SPEC_SLOTS;
    }
    Spec found = {0};
    PyObject *py_name = PyUnicode_DecodeASCII(name->key, name->key_len, NULL);
    PyObject *py_unit = unit_flag == 'n' ? Py_NewRef(Py_None)
                                         : PyUnicode_DecodeASCII(unit, unit_len, NULL);
    PyObject *spec = py_name && py_unit
                         ? PyObject_CallFunctionObjArgs(self->spec_of, py_name, py_unit, NULL)
                         : NULL;
    Py_XDECREF(py_name);
    Py_XDECREF(py_unit);
    int ok = 0;
    if (spec && PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 4) {
        PyObject *metric = PyTuple_GET_ITEM(spec, 0), *unit_found = PyTuple_GET_ITEM(spec, 1);
        PyObject *canonical = PyTuple_GET_ITEM(spec, 2), *bounds = PyTuple_GET_ITEM(spec, 3);
        ok = PyUnicode_Check(metric) && PyUnicode_Check(canonical);
        if (ok && unit_found != Py_None) {
            PyObject *scale = PyObject_GetAttrString(unit_found, "scale");
            PyObject *offset = PyObject_GetAttrString(unit_found, "offset");
            ok = scale && offset && exact_double(scale, &found.scale) &&
                 exact_double(offset, &found.offset);
            found.convert = ok;
            Py_XDECREF(scale);
            Py_XDECREF(offset);
        }
        if (ok && bounds != Py_None) {
            ok = PyTuple_Check(bounds) && PyTuple_GET_SIZE(bounds) == 2 &&
                 exact_double(PyTuple_GET_ITEM(bounds, 0), &found.low) &&
                 exact_double(PyTuple_GET_ITEM(bounds, 1), &found.high);
            found.bounded = ok;
        }
        if (ok) {
            found.metric = copy_text(metric, &found.metric_len);
            found.unit = copy_text(canonical, &found.unit_len);
            found.key = PyMem_Malloc(key_len);
            ok = found.metric && found.unit && found.key;
        }
    }
    Py_XDECREF(spec);
    /* A rejected name or unit, or a spec of other types: Python decides. */
    PyErr_Clear();
    if (!ok) {
        PyMem_Free(found.metric);
        PyMem_Free(found.unit);
        PyMem_Free(found.key);
        if (key != stack)
            PyMem_Free(key);
        return NULL;
    }
    memcpy(found.key, key, key_len);
    found.key_len = key_len;
    if (key != stack)
        PyMem_Free(key);
    self->specs[slot] = found;
    self->spec_count++;
    return &self->specs[slot];
}

/* ---- the fields ---- */

/* fields.identifier of a string or an integer into out (at most max bytes); its length, or 0 to decline. */
static Py_ssize_t identifier(const Member *m, char *out, Py_ssize_t max) {
    const char *p = m->text;
    Py_ssize_t n = m->text_len;
    if (m->kind == K_STR) {
        while (n && *p == ' ') {
            p++;
            n--;
        }
        while (n && p[n - 1] == ' ')
            n--;
    } else if (m->kind != K_INT) {
        return 0;
    }
    if (n == 0 || n > max)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = (p[i] >= 'A' && p[i] <= 'Z') ? (char)(p[i] + 32) : p[i];
    return n;
}

/* fields.attribute_value's text of a scalar; 0 to decline. */
static int attribute_text(const Member *m, const char **text, Py_ssize_t *len) {
    switch (m->kind) {
    case K_STR:
    case K_INT:
        *text = m->text;
        *len = m->text_len;
        return 1;
    case K_TRUE:
        *text = "true";
        *len = 4;
        return 1;
    case K_FALSE:
        *text = "false";
        *len = 5;
        return 1;
    case K_NULL:
        *text = "null";
        *len = 4;
        return 1;
    default:
        return 0;
    }
}

#define MAX_US 7258118400000000LL

/* timestamps._from_epoch, checked; 0 to decline. */
static int epoch_micros(const Member *m, int64_t *micros) {
    if (m->kind == K_INT) {
        int64_t size = m->i < 0 ? -m->i : m->i;
        if (size < 100000000000LL)
            *micros = m->i * 1000000;
        else if (size < 100000000000000LL)
            *micros = m->i * 1000;
        else if (size < 100000000000000000LL)
            *micros = m->i;
        else
            return 0;
    } else if (m->kind == K_FLOAT) {
        double x = m->d, size = fabs(x), r;
        /* Python's round(): half to even, as nearbyint in the default mode. */
        if (size < 1e11)
            r = nearbyint(x * 1e6);
        else if (size < 1e14)
            r = nearbyint(x * 1000.0);
        else if (size < 1e17)
            r = nearbyint(x);
        else if (size < 1e20)
            r = nearbyint(x / 1000.0);
        else
            return 0;
        if (!(r >= 0.0 && r <= (double)MAX_US))
            return 0;
        *micros = (int64_t)r;
    } else {
        return 0;
    }
    return *micros >= 0 && *micros <= MAX_US;
}

/* ---- the type ---- */

static int Cleaner_init(Cleaner *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"spec_of",       "source_topic", "max_payload_bytes",
                            "max_nesting_depth", "max_id_length", "max_metrics",
                            "max_future_skew_us", NULL};
    PyObject *spec_of, *topic;
    long long skew;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUnnnnL", names, &spec_of, &topic,
                                     &self->max_payload, &self->max_nesting,
                                     &self->max_id_length, &self->max_metrics, &skew))
        return -1;
    Py_XSETREF(self->spec_of, Py_NewRef(spec_of));
    size_t len;
    char *copy = copy_text(topic, &len);
    if (!copy)
        return -1;
    PyMem_Free(self->topic);
    self->topic = copy;
    self->topic_len = len;
    self->max_future_skew_us = skew;
    if (!self->scratch) {
        self->scratch = PyMem_Malloc(sizeof(Scratch));
        if (!self->scratch) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (!self->specs) {
        self->specs = PyMem_Calloc(SPEC_SLOTS, sizeof(Spec));
        if (!self->specs) {
            PyErr_NoMemory();
            return -1;
        }
    } else {
        clear_specs(self);
    }
    return 0;
}

static void Cleaner_dealloc(Cleaner *self) {
    if (self->specs) {
        clear_specs(self);
        PyMem_Free(self->specs);
    }
    PyMem_Free(self->scratch);
    PyMem_Free(self->topic);
    Py_XDECREF(self->spec_of);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *encode(Cleaner *self, const char *event_id, Py_ssize_t id_len,
                        const char *device, Py_ssize_t device_len, int64_t event_us,
                        int64_t now_us, long partition, long long offset, Reading *readings,
                        int nreadings, Attribute *attributes, int nattributes) {
    size_t reading_size = string_field_size((size_t)device_len);
    size_t measurement_sizes[MAX_READINGS];
    for (int i = 0; i < nreadings; i++) {
        Spec *s = readings[i].spec;
        uint64_t bits;
        memcpy(&bits, &readings[i].value, sizeof bits);
        size_t size = string_field_size(s->metric_len) + (bits ? 9 : 0) +
                      string_field_size(s->unit_len);
        measurement_sizes[i] = size;
        reading_size += 1 + varint_size(size) + size;
    }
    /* SourcePosition: topic 1, partition 2 (int32: a negative one takes ten bytes), offset 3. */
    uint64_t partition_bits = (uint64_t)(int64_t)partition;
    size_t source_size = string_field_size(self->topic_len) +
                         (partition ? 1 + varint_size(partition_bits) : 0) +
                         (offset ? 1 + varint_size((uint64_t)offset) : 0);
    Buf b = {PyMem_Malloc(512), 0, 512};
    if (!b.p)
        return PyErr_NoMemory();
    size_t need = string_field_size((size_t)id_len) + string_field_size((size_t)device_len) +
                  2 * (2 + 2 * 11) + 1 + varint_size(source_size) + source_size + 1 +
                  varint_size(reading_size) + reading_size;
    for (int i = 0; i < nattributes; i++) {
        size_t entry = string_field_size((size_t)attributes[i].key_len) +
                       string_field_size((size_t)attributes[i].value_len);
        need += 1 + varint_size(entry) + entry;
    }
    if (!reserve(&b, need)) {
        PyMem_Free(b.p);
        return PyErr_NoMemory();
    }
    put_string_field(&b, 1, event_id, (size_t)id_len);
    put_string_field(&b, 2, device, (size_t)device_len);
    put_timestamp(&b, 3, event_us);
    put_timestamp(&b, 4, now_us);
    for (int i = 0; i < nattributes; i++) {
        size_t entry = string_field_size((size_t)attributes[i].key_len) +
                       string_field_size((size_t)attributes[i].value_len);
        put_varint(&b, 5 << 3 | 2);
        put_varint(&b, entry);
        put_string_field(&b, 1, attributes[i].key, (size_t)attributes[i].key_len);
        put_string_field(&b, 2, attributes[i].value, (size_t)attributes[i].value_len);
    }
    put_varint(&b, 6 << 3 | 2);
    put_varint(&b, source_size);
    put_string_field(&b, 1, self->topic, self->topic_len);
    if (partition) {
        put_varint(&b, 0x10);
        put_varint(&b, partition_bits);
    }
    if (offset) {
        put_varint(&b, 0x18);
        put_varint(&b, (uint64_t)offset);
    }
    put_varint(&b, 10 << 3 | 2);
    put_varint(&b, reading_size);
    put_string_field(&b, 1, device, (size_t)device_len);
    for (int i = 0; i < nreadings; i++) {
        Spec *s = readings[i].spec;
        uint64_t bits;
        memcpy(&bits, &readings[i].value, sizeof bits);
        put_varint(&b, 2 << 3 | 2);
        put_varint(&b, measurement_sizes[i]);
        put_string_field(&b, 1, s->metric, s->metric_len);
        if (bits) {
            put_varint(&b, 2 << 3 | 1);
            for (int k = 0; k < 8; k++)
                b.p[b.n++] = (char)(bits >> (8 * k));
        }
        put_string_field(&b, 3, s->unit, s->unit_len);
    }
    PyObject *value = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
    PyMem_Free(b.p);
    if (!value)
        return NULL;
    PyObject *id = PyUnicode_DecodeASCII(event_id, id_len, NULL);
    PyObject *key = PyBytes_FromStringAndSize(device, device_len);
    if (!id || !key) {
        Py_XDECREF(id);
        Py_XDECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(3, id, key, value);
    Py_DECREF(id);
    Py_DECREF(key);
    Py_DECREF(value);
    return result;
}

static PyObject *decline(void) { Py_RETURN_NONE; }

static PyObject *clean_record(Cleaner *self, Scratch *scratch, const char *value,
                              Py_ssize_t size, long long now_us, long partition,
                              long long offset);

static PyObject *Cleaner_clean(Cleaner *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "clean(value: bytes, now_us, partition, offset)");
        return NULL;
    }
    long long now_us = PyLong_AsLongLong(args[1]);
    long partition = PyLong_AsLong(args[2]);
    long long offset = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    const char *value = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (size == 0 || size > self->max_payload || value[0] != '{')
        Py_RETURN_NONE;
    /* payload.decode_json reads a document of more brackets than the depth
     * limit another way: left to it. */
    Py_ssize_t brackets = 0;
    for (const char *p = value; p < value + size; p++)
        brackets += *p == '{' || *p == '[';
    if (brackets > self->max_nesting)
        Py_RETURN_NONE;

    if (self->busy)
        Py_RETURN_NONE;
    /* Specs are cleared between records only: a record's readings point at them. */
    if (self->spec_count >= SPEC_LIMIT)
        clear_specs(self);
    self->busy = 1;
    PyObject *result = clean_record(self, self->scratch, value, size, now_us, partition, offset);
    self->busy = 0;
    return result;
}

static PyObject *clean_record(Cleaner *self, Scratch *scratch, const char *value,
                              Py_ssize_t size, long long now_us, long partition,
                              long long offset) {
    Doc *d = &scratch->doc;
    d->s = value;
    d->end = value + size;
    d->nm = d->no = 0;
    if (parse_object(d, 1) != 0)
        return decline();
    skip_blanks(d);
    if (d->s != d->end)
        return decline();

    /* SensorShapes._plan */
    Member *metrics = find(d, 0, "metrics");
    if (!metrics || first_of(d, KIND) || (find(d, 0, "fields") && find(d, 0, "name")))
        return decline();
    Member *when = first_of(d, TIME), *device = first_of(d, DEVICE);
    Member *given_id = first_of(d, EVENT_ID), *attributes = find(d, 0, "attributes");
    if (!when || !device)
        return decline();

    /* SensorShapes._fill */
    if (metrics->kind != K_OBJ || d->o[metrics->obj].count == 0)
        return decline();
    char id[512], entity[512];
    Py_ssize_t max_id = self->max_id_length < (Py_ssize_t)sizeof id ? self->max_id_length
                                                                     : (Py_ssize_t)sizeof id;
    Py_ssize_t id_len = 0;
    if (given_id && given_id->kind != K_NULL) {
        id_len = identifier(given_id, id, max_id);
        if (!id_len)
            return decline();
    }
    int64_t event_us;
    if (!epoch_micros(when, &event_us) || event_us > now_us + self->max_future_skew_us)
        return decline();
    int nattributes = 0;
    Attribute *out = scratch->attributes;
    if (attributes && attributes->kind != K_NULL) {
        if (attributes->kind != K_OBJ)
            return decline();
        for (int at = d->o[attributes->obj].first; at >= 0; at = d->m[at].next) {
            if (nattributes >= MAX_ATTRIBUTES)
                return decline();
            Attribute *a = &out[nattributes++];
            a->key = d->m[at].key;
            a->key_len = d->m[at].key_len;
            if (!attribute_text(&d->m[at], &a->value, &a->value_len))
                return decline();
        }
    }
    Py_ssize_t entity_len = identifier(device, entity, max_id);
    if (!entity_len)
        return decline();

    /* SensorShapes._add_measurements */
    Object *named = &d->o[metrics->obj];
    if (named->count > self->max_metrics || named->count > MAX_READINGS)
        return decline();
    int nreadings = 0;
    for (int at = named->first; at >= 0; at = d->m[at].next) {
        Member *given = &d->m[at], *raw = given;
        int unit_flag = 's';
        const char *unit = "";
        Py_ssize_t unit_len = 0;
        if (given->kind == K_OBJ) {
            raw = find(d, given->obj, "value");
            if (!raw)
                return decline();
            Member *stated = find(d, given->obj, "unit");
            if (stated && stated->kind == K_STR) {
                unit = stated->text;
                unit_len = stated->text_len;
            } else if (stated && stated->kind == K_NULL) {
                unit_flag = 'n';
            } else if (stated) {
                return decline();
            }
        }
        double reading;
        if (raw->kind == K_FLOAT)
            reading = raw->d;
        else if (raw->kind == K_INT)
            reading = (double)raw->i;
        else
            return decline();
        Spec *spec = resolve(self, given, unit_flag, unit, unit_len);
        if (!spec)
            return decline();
        if (spec->convert)
            reading = reading * spec->scale + spec->offset;
        if (spec->bounded && !(spec->low <= reading && reading <= spec->high))
            return decline();
        for (int i = 0; i < nreadings; i++) {
            Spec *other = scratch->readings[i].spec;
            if (other->metric_len == spec->metric_len &&
                memcmp(other->metric, spec->metric, spec->metric_len) == 0)
                return decline(); /* one metric twice */
        }
        scratch->readings[nreadings].spec = spec;
        scratch->readings[nreadings].value = reading;
        nreadings++;
    }
    for (int at = d->o[0].first; at >= 0; at = d->m[at].next) {
        Member *m = &d->m[at];
        if (sensor_key(m))
            continue;
        if (nattributes >= MAX_ATTRIBUTES)
            return decline();
        Attribute *a = &out[nattributes++];
        a->key = m->key;
        a->key_len = m->key_len;
        if (!attribute_text(m, &a->value, &a->value_len))
            return decline();
    }
    return encode(self, id, id_len, entity, entity_len, event_us, now_us, partition, offset,
                  scratch->readings, nreadings, out, nattributes);
}

/* ---- a fresh W3C traceparent, as header bytes ----
 *
 * shared.bus.envelope.traceparent_header("") made with a generator of this
 * module's own: xoshiro256** (Blackman and Vigna), seeded from the kernel
 * at import and again in a forked child (svc_ingest.sensor_bytes registers
 * the reseed). Trace and span ids need to be unique, not secret, as the
 * envelope's ids: 0.07 against 0.9 µs a record formatting Python's bits. */

static uint64_t rng[4];

static int seed_rng(void) {
    if (getrandom(rng, sizeof rng, 0) != (ssize_t)sizeof rng) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (!(rng[0] | rng[1] | rng[2] | rng[3]))
        rng[0] = 1; /* the one state xoshiro never leaves */
    return 0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_random(void) {
    uint64_t result = rotl(rng[1] * 5, 7) * 9;
    uint64_t t = rng[1] << 17;
    rng[2] ^= rng[0];
    rng[3] ^= rng[1];
    rng[1] ^= rng[2];
    rng[0] ^= rng[3];
    rng[2] ^= t;
    rng[3] = rotl(rng[3], 45);
    return result;
}

static void hex64(char *out, uint64_t x) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, x >>= 4)
        out[i] = digits[x & 15];
}

static PyObject *fresh_traceparent(PyObject *module, PyObject *unused) {
    uint64_t high, low, span;
    do {
        high = next_random();
        low = next_random();
    } while (!(high | low)); /* W3C forbids an all-zero id */
    do
        span = next_random();
    while (!span);
    char out[55];
    memcpy(out, "00-", 3);
    hex64(out + 3, high);
    hex64(out + 19, low);
    out[35] = '-';
    hex64(out + 36, span);
    memcpy(out + 52, "-01", 3);
    return PyBytes_FromStringAndSize(out, sizeof out);
}

static PyObject *reseed(PyObject *module, PyObject *unused) {
    if (seed_rng() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"fresh_traceparent", fresh_traceparent, METH_NOARGS,
     "fresh_traceparent() -> a new trace's traceparent header value (55 bytes)"},
    {"reseed", reseed, METH_NOARGS, "reseed() -> None: the trace generator seeded afresh"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Cleaner_methods[] = {
    {"clean", (PyCFunction)(void (*)(void))Cleaner_clean, METH_FASTCALL,
     "clean(value, now_us, partition, offset) -> (event_id, key, value) or None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CleanerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svc_ingest._sensor_bytes.Cleaner",
    .tp_basicsize = sizeof(Cleaner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The common JSON sensor reading, raw bytes to a CleanEvent's bytes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cleaner_init,
    .tp_dealloc = (destructor)Cleaner_dealloc,
    .tp_methods = Cleaner_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sensor_bytes",
    "The common JSON sensor reading, compiled: see svc_ingest.sensor_bytes.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__sensor_bytes(void) {
    if (seed_rng() < 0)
        return NULL;
    if (PyType_Ready(&CleanerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Cleaner", (PyObject *)&CleanerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
