/* raftline.raftlog._speedups: C versions of the per-record loops of raftlog/records.py and
 * of the segment log's per-batch append steps.
 *
 * Owns encode_records (the records section of a Kafka RecordBatch v2 from Record or bytes
 * items), decode_records (the strict walk over a records section that decode_batch,
 * iter_batches and check_batch share), and append_fields / buffer_batch (the header check and
 * the stamped copy into the write buffer that every appended batch goes through in log.py and
 * segment.py), and unfilled_bytes (a bytes object a request body is received straight into,
 * for api/body_intake.py). Those modules use these when raftlog/speedups.py loads this one and keep their
 * pure-Python twins as the fallback; tests/test_records_speedups.py and
 * tests/test_log_speedups.py hold the two to identical output and the same errors. Garbage
 * input must only ever raise CorruptBatchError (or get None from append_fields): every varint
 * and length is bounds-checked before it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#include "_record_reader.h"

#define INT32_LIMIT 2147483647LL

/* Set once by bind(): the classes records.py defines. */
static PyObject *record_type;        /* Record, a slots dataclass */
static PyObject *decoded_record_type; /* DecodedRecord, a tuple subclass */

/* Record's five fields in the order encode reads them. For an instance of exactly Record the
 * fields are read straight from their __slots__ (the offsets Python's own member descriptors
 * use): one load instead of an attribute lookup each, which dominates small records. */
enum { F_VALUE, F_KEY, F_HEADERS, F_TIMESTAMP, F_OFFSET_DELTA, F_COUNT };
static const char *const field_names[F_COUNT] = {"value", "key", "headers", "timestamp",
                                                 "offset_delta"};
static PyObject *field_name_objects[F_COUNT];
static Py_ssize_t slot_offsets[F_COUNT]; /* all 0: read through getattr */

/* ------------------------------------------------------------------------- varints */

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline int varint_size(uint64_t u) {
    int n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *out, uint64_t u) {
    while (u >= 0x80) {
        *out++ = (char)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *out++ = (char)u;
    return out;
}

/* ------------------------------------------------------------------------- encoding */

/* The output: a bytearray (the caller writes the batch header into its reserved front), grown
 * by doubling and cut to size at the end. */
typedef struct {
    PyObject *array;
    Py_ssize_t used;
    Py_ssize_t capacity;
} Out;

static int out_reserve(Out *out, Py_ssize_t more) {
    if (more <= out->capacity - out->used)
        return 0;
    if (more > PY_SSIZE_T_MAX / 2 - out->used) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t wanted = out->used + more;
    if (wanted < out->capacity * 2)
        wanted = out->capacity * 2;
    if (PyByteArray_Resize(out->array, wanted) < 0)
        return -1;
    out->capacity = wanted;
    return 0;
}

static inline char *out_end(Out *out) { return PyByteArray_AS_STRING(out->array) + out->used; }

/* Record framing beyond key and value bytes that a guess of the output size allows for. */
#define FRAMING_GUESS 16
#define GUESS_LIMIT (64 << 20)

/* A guess of the section size from the items' bytes keys and values, so that a typical batch
 * is written without regrowing its buffer (each regrowth copies it). */
static Py_ssize_t guess_size(PyObject *const *items, Py_ssize_t count) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count && total < GUESS_LIMIT; i++) {
        PyObject *item = items[i];
        total += FRAMING_GUESS;
        if (PyBytes_Check(item)) {
            total += PyBytes_GET_SIZE(item);
        } else if ((PyObject *)Py_TYPE(item) == record_type && slot_offsets[0] != 0) {
            PyObject *value = *(PyObject **)((char *)item + slot_offsets[F_VALUE]);
            PyObject *key = *(PyObject **)((char *)item + slot_offsets[F_KEY]);
            if (value != NULL && PyBytes_Check(value))
                total += PyBytes_GET_SIZE(value);
            if (key != NULL && PyBytes_Check(key))
                total += PyBytes_GET_SIZE(key);
        }
    }
    return total < GUESS_LIMIT ? total : GUESS_LIMIT;
}

/* A nullable bytes-like field: its data pointer and size (-1: null). The object (bytes) or
 * its buffer (anything else) is held until field_release, so no code that runs meanwhile can
 * free the data under us. */
typedef struct {
    const char *data;
    Py_ssize_t size;
    PyObject *bytes;
    Py_buffer view;
    int held;
} Field;

static void field_release(Field *f) {
    if (f->held)
        PyBuffer_Release(&f->view);
    f->held = 0;
    Py_CLEAR(f->bytes);
}

static int field_open(PyObject *obj, Field *f) {
    f->held = 0;
    f->bytes = NULL;
    if (obj == Py_None) {
        f->data = NULL;
        f->size = -1;
        return 0;
    }
    if (PyBytes_Check(obj)) {
        Py_INCREF(obj);
        f->bytes = obj;
        f->data = PyBytes_AS_STRING(obj);
        f->size = PyBytes_GET_SIZE(obj);
    } else {
        if (PyObject_GetBuffer(obj, &f->view, PyBUF_SIMPLE) < 0)
            return -1;
        f->held = 1;
        f->data = f->view.buf;
        f->size = f->view.len;
    }
    if (f->size > INT32_LIMIT) {
        PyErr_Format(PyExc_ValueError, "field of %zd bytes exceeds the int32 length limit",
                     f->size);
        field_release(f);
        return -1;
    }
    return 0;
}

static inline Py_ssize_t field_encoded_size(const Field *f) {
    return f->size < 0 ? 1 : varint_size(zigzag(f->size)) + f->size;
}

static inline char *put_field(char *p, const Field *f) {
    if (f->size < 0)
        return put_varint(p, 1); /* zigzag(-1) */
    p = put_varint(p, zigzag(f->size));
    memcpy(p, f->data, (size_t)f->size);
    return p + f->size;
}

/* An int that must fit int64: ValueError (as the Python encoder gives) when it does not. */
static int as_int64(PyObject *obj, const char *what, int64_t *out) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s %R exceeds int64", what, obj);
        return -1;
    }
    *out = v;
    return 0;
}

/* One header's key (UTF-8 of a str) and value, from a (key, value) pair. */
typedef struct {
    PyObject *key_str; /* held, like a Field's object */
    const char *key;
    Py_ssize_t key_size;
    Field value;
} HeaderFields;

static void header_release(HeaderFields *h) {
    Py_CLEAR(h->key_str);
    field_release(&h->value);
}

/* On failure nothing stays held. */
static int header_open(PyObject *pair, HeaderFields *h) {
    PyObject *key, *value;
    if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
        key = PyTuple_GET_ITEM(pair, 0);
        value = PyTuple_GET_ITEM(pair, 1);
    } else if (PyList_Check(pair) && PyList_GET_SIZE(pair) == 2) {
        key = PyList_GET_ITEM(pair, 0);
        value = PyList_GET_ITEM(pair, 1);
    } else {
        PyErr_SetString(PyExc_ValueError, "a header must be a (key, value) pair");
        return -1;
    }
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "header key must be str, not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    h->key = PyUnicode_AsUTF8AndSize(key, &h->key_size); /* cached in the str */
    if (h->key == NULL)
        return -1;
    if (h->key_size > INT32_LIMIT) {
        PyErr_Format(PyExc_ValueError, "field of %zd bytes exceeds the int32 length limit",
                     h->key_size);
        return -1;
    }
    Py_INCREF(key);
    h->key_str = key;
    if (field_open(value, &h->value) < 0) {
        Py_CLEAR(h->key_str);
        return -1;
    }
    return 0;
}

/* The fields of one item: a Record (or anything with its attributes) or plain bytes. */
typedef struct {
    PyObject *obj[F_COUNT]; /* new references; NULL where unset */
} ItemFields;

static void item_clear(ItemFields *it) {
    for (int i = 0; i < F_COUNT; i++)
        Py_CLEAR(it->obj[i]);
}

static int item_open(PyObject *item, ItemFields *it) {
    memset(it, 0, sizeof(*it));
    if (PyBytes_Check(item)) {
        Py_INCREF(item);
        it->obj[F_VALUE] = item;
        return 0;
    }
    int direct = (PyObject *)Py_TYPE(item) == record_type && slot_offsets[0] != 0;
    for (int i = 0; i < F_COUNT; i++) {
        if (direct) {
            PyObject *v = *(PyObject **)((char *)item + slot_offsets[i]);
            if (v == NULL) {
                PyErr_Format(PyExc_AttributeError, "Record has no %s", field_names[i]);
                goto fail;
            }
            Py_INCREF(v);
            it->obj[i] = v;
        } else {
            it->obj[i] = PyObject_GetAttr(item, field_name_objects[i]);
            if (it->obj[i] == NULL)
                goto fail;
        }
    }
    return 0;
fail:
    item_clear(it);
    return -1;
}

/* Encoder state across records. */
typedef struct {
    Out out;
    int64_t default_timestamp;
    int default_ok; /* 0: the default timestamp overflows int64 (an error only if used) */
    PyObject *default_obj;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int64_t previous_delta;
} Encoder;

static int record_timestamp(Encoder *e, PyObject *ts, int64_t *out) {
    if (ts == NULL || ts == Py_None) {
        if (!e->default_ok)
            return as_int64(e->default_obj, "timestamp", out); /* raises */
        *out = e->default_timestamp;
        return 0;
    }
    return as_int64(ts, "timestamp", out);
}

#define MAX_STACK_HEADERS 16

static int encode_one(Encoder *e, PyObject *item, Py_ssize_t position) {
    ItemFields it;
    Field key = {0}, value = {0};
    HeaderFields stack_headers[MAX_STACK_HEADERS];
    HeaderFields *headers = stack_headers;
    Py_ssize_t header_count = 0, opened = 0;
    PyObject *header_seq = NULL;
    int rc = -1;
    key.size = value.size = -1;

    if (item_open(item, &it) < 0)
        return -1;

    /* Offset delta: the position unless set; strictly increasing within int32. */
    int64_t offset_delta = position;
    PyObject *od = it.obj[F_OFFSET_DELTA];
    if (od != NULL && od != Py_None) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(od, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (overflow) {
            PyErr_Format(PyExc_ValueError, "offset deltas must increase within int32: %R", od);
            goto done;
        }
        offset_delta = v;
    }
    if (!(e->previous_delta < offset_delta && offset_delta <= INT32_LIMIT)) {
        PyErr_Format(PyExc_ValueError, "offset deltas must increase within int32: %lld",
                     (long long)offset_delta);
        goto done;
    }
    e->previous_delta = offset_delta;

    int64_t timestamp, timestamp_delta;
    if (record_timestamp(e, it.obj[F_TIMESTAMP], &timestamp) < 0)
        goto done;
    if (timestamp > e->max_timestamp)
        e->max_timestamp = timestamp;
    if (__builtin_sub_overflow(timestamp, e->base_timestamp, &timestamp_delta)) {
        PyErr_Format(PyExc_ValueError, "timestamp delta %lld - %lld exceeds int64",
                     (long long)timestamp, (long long)e->base_timestamp);
        goto done;
    }

    if (field_open(it.obj[F_KEY] ? it.obj[F_KEY] : Py_None, &key) < 0 ||
        field_open(it.obj[F_VALUE], &value) < 0)
        goto done;

    /* Headers: a sequence of (str, bytes | None) pairs. */
    PyObject *hobj = it.obj[F_HEADERS];
    if (hobj != NULL && !(PyTuple_Check(hobj) && PyTuple_GET_SIZE(hobj) == 0)) {
        /* A sized collection, as Python's encoder takes len() of it (no generators). */
        if (!PyList_Check(hobj) && !PyTuple_Check(hobj) && PyObject_Length(hobj) < 0)
            goto done;
        /* A tuple (a list is copied): its items stay put whatever code a buffer runs. */
        header_seq = PySequence_Tuple(hobj);
        if (header_seq == NULL)
            goto done;
        header_count = PyTuple_GET_SIZE(header_seq);
        if (header_count > MAX_STACK_HEADERS) {
            headers = PyMem_Malloc(sizeof(HeaderFields) * (size_t)header_count);
            if (headers == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        }
        for (; opened < header_count; opened++)
            if (header_open(PyTuple_GET_ITEM(header_seq, opened), &headers[opened]) < 0)
                goto done;
    }

    /* The body size comes first on the wire, so add it up before writing. Every term is at
     * most about 2**31 and the running sum is checked, so it cannot overflow. */
    int64_t body = 1 + varint_size(zigzag(timestamp_delta)) + varint_size(zigzag(offset_delta)) +
                   field_encoded_size(&key) + field_encoded_size(&value) +
                   varint_size(zigzag(header_count));
    for (Py_ssize_t i = 0; i < header_count; i++) {
        body += varint_size(zigzag(headers[i].key_size)) + headers[i].key_size +
                field_encoded_size(&headers[i].value);
        if (body > INT32_LIMIT)
            break;
    }
    if (body > INT32_LIMIT) {
        /* Its length would not read back as the int32 varint every decoder expects. */
        PyErr_Format(PyExc_ValueError, "record of %lld bytes exceeds the int32 length limit",
                     (long long)body);
        goto done;
    }
    if (out_reserve(&e->out, varint_size(zigzag(body)) + (Py_ssize_t)body) < 0)
        goto done;
    char *p = out_end(&e->out);
    p = put_varint(p, zigzag(body));
    *p++ = 0; /* record attributes: none defined */
    p = put_varint(p, zigzag(timestamp_delta));
    p = put_varint(p, zigzag(offset_delta));
    p = put_field(p, &key);
    p = put_field(p, &value);
    p = put_varint(p, zigzag(header_count));
    for (Py_ssize_t i = 0; i < header_count; i++) {
        p = put_varint(p, zigzag(headers[i].key_size));
        memcpy(p, headers[i].key, (size_t)headers[i].key_size);
        p += headers[i].key_size;
        p = put_field(p, &headers[i].value);
    }
    e->out.used = p - PyByteArray_AS_STRING(e->out.array);
    rc = 0;
done:
    for (Py_ssize_t i = 0; i < opened; i++)
        header_release(&headers[i]);
    if (headers != stack_headers)
        PyMem_Free(headers);
    Py_XDECREF(header_seq);
    field_release(&key);
    field_release(&value);
    item_clear(&it);
    return rc;
}

PyDoc_STRVAR(encode_records_doc,
             "encode_records(records, default_timestamp, reserve) -> (out, last_offset_delta, "
             "base_timestamp, max_timestamp)\n\n"
             "The records section of a non-empty batch of Record or bytes items, in a bytearray "
             "after `reserve` zero bytes (room for the batch header).");

static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *records, *default_obj, *seq = NULL, *result = NULL;
    Py_ssize_t reserve;
    if (!PyArg_ParseTuple(args, "OOn:encode_records", &records, &default_obj, &reserve))
        return NULL;
    if (reserve < 0 || reserve > GUESS_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "reserve out of range");
        return NULL;
    }
    /* A tuple (a list is copied): attribute lookups on odd items may run Python code. */
    seq = PySequence_Tuple(records);
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    if (count == 0) {
        PyErr_SetString(PyExc_ValueError, "a batch needs at least one record");
        goto fail;
    }

    Encoder e;
    e.default_obj = default_obj;
    e.default_ok = as_int64(default_obj, "timestamp", &e.default_timestamp) == 0;
    if (!e.default_ok) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            goto fail; /* not an int at all */
        PyErr_Clear();
    }
    e.max_timestamp = INT64_MIN;
    e.previous_delta = -1;
    e.out.capacity = reserve + guess_size(items, count);
    e.out.array = PyByteArray_FromStringAndSize(NULL, e.out.capacity);
    if (e.out.array == NULL)
        goto fail;
    memset(PyByteArray_AS_STRING(e.out.array), 0, (size_t)reserve);
    e.out.used = reserve;

    /* The base timestamp is the first record's own, else the default. */
    PyObject *first = items[0], *first_ts = NULL;
    if (!PyBytes_Check(first)) {
        first_ts = PyObject_GetAttr(first, field_name_objects[F_TIMESTAMP]);
        if (first_ts == NULL)
            goto fail_out;
    }
    int bad = record_timestamp(&e, first_ts, &e.base_timestamp);
    Py_XDECREF(first_ts);
    if (bad < 0)
        goto fail_out;

    for (Py_ssize_t i = 0; i < count; i++)
        if (encode_one(&e, items[i], i) < 0)
            goto fail_out;
    if (PyByteArray_Resize(e.out.array, e.out.used) < 0)
        goto fail_out;
    result = Py_BuildValue("(NLLL)", e.out.array, (long long)e.previous_delta,
                           (long long)e.base_timestamp, (long long)e.max_timestamp);
    Py_DECREF(seq);
    return result;
fail_out:
    Py_DECREF(e.out.array);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* ------------------------------------------------------------------------- decoding */

static PyObject *field_object(const Reader *r, Py_ssize_t start, int64_t size) {
    if (size < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)r->data + start, (Py_ssize_t)size);
}

/* base + delta as a Python int; exact even past int64 (as Python's arithmetic is). */
static PyObject *sum_object(int64_t base, int64_t delta) {
    int64_t sum;
    if (!__builtin_add_overflow(base, delta, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *a = PyLong_FromLongLong(base), *b = PyLong_FromLongLong(delta), *s = NULL;
    if (a != NULL && b != NULL)
        s = PyNumber_Add(a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return s;
}

/* An int attribute of the batch header as int64. */
static int header_int(PyObject *header, const char *name, int64_t *out) {
    PyObject *v = PyObject_GetAttrString(header, name);
    if (v == NULL)
        return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* Read one record's header list (keep: build it; else only check it). */
static int read_headers(Reader *r, Py_ssize_t record_end, int keep, PyObject **headers_out) {
    int64_t count;
    PyObject *headers = NULL;
    if (read_header_count(r, record_end, &count) < 0)
        return -1;
    if (keep && (headers = PyList_New(0)) == NULL)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        Py_ssize_t key_start, value_start;
        int64_t key_size, value_size;
        if (read_header_fields(r, record_end, &key_start, &key_size, &value_start,
                               &value_size) < 0)
            goto fail;
        /* Python's str decode is the UTF-8 check in both modes. */
        PyObject *key = PyUnicode_DecodeUTF8((const char *)r->data + key_start,
                                             (Py_ssize_t)key_size, "strict");
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            corrupt("header key is not UTF-8");
            goto fail;
        }
        if (!keep) {
            Py_DECREF(key);
            continue;
        }
        PyObject *value = field_object(r, value_start, value_size);
        PyObject *pair = value ? PyTuple_Pack(2, key, value) : NULL;
        Py_DECREF(key);
        Py_XDECREF(value);
        if (pair == NULL)
            goto fail;
        int appended = PyList_Append(headers, pair);
        Py_DECREF(pair);
        if (appended < 0)
            goto fail;
    }
    *headers_out = headers;
    return 0;
fail:
    Py_XDECREF(headers);
    return -1;
}

PyDoc_STRVAR(decode_records_doc,
             "decode_records(data, header, keep=1) -> (records, largest)\n\n"
             "Every record of a records section, checked field by field, and the largest "
             "record's encoded size. keep 1: DecodedRecords; 2: only each record's value; "
             "0: only the checks run (records is []).");

static PyObject *decode_records(PyObject *self, PyObject *args) {
    PyObject *data_obj, *header, *records = NULL, *append_time = NULL, *result = NULL;
    int keep = 1; /* 0: check only, 1: DecodedRecords, 2: values */
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "OO|i:decode_records", &data_obj, &header, &keep))
        return NULL;
    if (decoded_record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.bind() was not called");
        return NULL;
    }
    int64_t count, base_offset, base_timestamp, last_offset_delta;
    if (header_int(header, "records_count", &count) < 0 ||
        header_int(header, "base_offset", &base_offset) < 0 ||
        header_int(header, "base_timestamp", &base_timestamp) < 0 ||
        header_int(header, "last_offset_delta", &last_offset_delta) < 0)
        return NULL;
    PyObject *is_append_time = PyObject_GetAttrString(header, "log_append_time");
    if (is_append_time == NULL)
        return NULL;
    int truth = PyObject_IsTrue(is_append_time);
    Py_DECREF(is_append_time);
    if (truth < 0)
        return NULL;
    if (truth && (append_time = PyObject_GetAttrString(header, "max_timestamp")) == NULL)
        return NULL;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0) {
        Py_XDECREF(append_time);
        return NULL;
    }
    if ((records = PyList_New(0)) == NULL)
        goto done;

    Reader r = {view.buf, view.len, 0};
    int64_t previous_delta = -1, largest = 0;
    for (int64_t n = 0; n < count; n++) {
        RecordHead h;
        if (read_record_head(&r, last_offset_delta, &previous_delta, &h) < 0)
            goto fail;
        if (h.length > largest)
            largest = h.length;
        PyObject *headers = NULL;
        if (read_headers(&r, h.end, keep == 1, &headers) < 0)
            goto fail;
        if (r.pos != h.end) {
            Py_XDECREF(headers);
            corrupt("record declares %lld bytes but holds a different size", (long long)h.length);
            goto fail;
        }
        if (keep == 2) {
            PyObject *value = field_object(&r, h.value_start, h.value_size);
            int appended = value == NULL ? -1 : PyList_Append(records, value);
            Py_XDECREF(value);
            if (appended < 0)
                goto fail;
            continue;
        }
        if (!keep)
            continue;
        /* DecodedRecord is a tuple subclass: allocate it and fill its five items. */
        PyObject *record = ((PyTypeObject *)decoded_record_type)
                               ->tp_alloc((PyTypeObject *)decoded_record_type, 5);
        if (record == NULL) {
            Py_DECREF(headers);
            goto fail;
        }
        PyTuple_SET_ITEM(record, 4, headers);
        PyObject *offset = sum_object(base_offset, h.offset_delta);
        PyObject *timestamp;
        if (append_time != NULL) {
            Py_INCREF(append_time);
            timestamp = append_time;
        } else {
            timestamp = sum_object(base_timestamp, h.timestamp_delta);
        }
        PyObject *key = field_object(&r, h.key_start, h.key_size);
        PyObject *value = field_object(&r, h.value_start, h.value_size);
        /* A NULL item is harmless to the tuple's dealloc; fail after filling every slot. */
        PyTuple_SET_ITEM(record, 0, offset);
        PyTuple_SET_ITEM(record, 1, timestamp);
        PyTuple_SET_ITEM(record, 2, key);
        PyTuple_SET_ITEM(record, 3, value);
        if (offset == NULL || timestamp == NULL || key == NULL || value == NULL) {
            Py_DECREF(record);
            goto fail;
        }
        int appended = PyList_Append(records, record);
        Py_DECREF(record);
        if (appended < 0)
            goto fail;
    }
    if (r.pos != r.end) {
        corrupt("%zd bytes left after %lld records", r.end - r.pos, (long long)count);
        goto fail;
    }
    result = Py_BuildValue("(OL)", records, (long long)largest);
fail: /* and success: result holds its own reference to records */
    Py_XDECREF(records);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(append_time);
    return result;
}

/* ------------------------------------------------------------------------- segment log */

/* The header fields the segment log's append reads, at their offsets in a Kafka v2 batch. */
#define BATCH_LENGTH_AT 8
#define MAGIC_AT 16
#define LAST_OFFSET_DELTA_AT 23
#define MAX_TIMESTAMP_AT 35
#define RECORDS_COUNT_AT 57
#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12 /* baseOffset + batchLength */
#define MAX_BATCH_SIZE (16 * 1024 * 1024)
#define STAMPED_PREFIX_SIZE 16 /* baseOffset, batchLength, partitionLeaderEpoch */

static inline uint64_t get_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static inline void put_be(unsigned char *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (unsigned char)v;
        v >>= 8;
    }
}

PyDoc_STRVAR(append_fields_doc,
             "append_fields(batch) -> (batchLength, lastOffsetDelta, maxTimestamp) | None\n\n"
             "The header fields an append needs if the batch is sane (magic 2, a length within "
             "bounds that matches the buffer, non-negative last offset delta and record "
             "count); None otherwise, and the caller words the error.");

static PyObject *append_fields(PyObject *self, PyObject *batch) {
    Py_buffer view;
    if (PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (view.len >= BATCH_HEADER_SIZE) {
        const unsigned char *p = view.buf;
        int32_t length = (int32_t)get_be(p + BATCH_LENGTH_AT, 4);
        int32_t last_delta = (int32_t)get_be(p + LAST_OFFSET_DELTA_AT, 4);
        int64_t max_timestamp = (int64_t)get_be(p + MAX_TIMESTAMP_AT, 8);
        int32_t count = (int32_t)get_be(p + RECORDS_COUNT_AT, 4);
        if (p[MAGIC_AT] == 2 && length >= BATCH_HEADER_SIZE - LOG_OVERHEAD &&
            length <= MAX_BATCH_SIZE - LOG_OVERHEAD && last_delta >= 0 && count >= 0 &&
            view.len == (Py_ssize_t)length + LOG_OVERHEAD)
            result = Py_BuildValue("(iiL)", length, last_delta, (long long)max_timestamp);
    }
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

PyDoc_STRVAR(buffer_batch_doc,
             "buffer_batch(pending, batch, base_offset, batch_length, term)\n\n"
             "Append a checked batch to the bytearray write buffer and stamp its base offset, "
             "length and term (the partition leader epoch) there; the CRC does not cover them.");

static PyObject *buffer_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "buffer_batch() takes 5 arguments");
        return NULL;
    }
    PyObject *pending = args[0];
    if (!PyByteArray_Check(pending)) {
        PyErr_SetString(PyExc_TypeError, "buffer_batch() needs a bytearray buffer");
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[2]);
    long length = PyLong_AsLong(args[3]);
    long term = PyLong_AsLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (length < INT32_MIN || length > INT32_MAX || term < INT32_MIN || term > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "batch length and term must fit in int32");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len < STAMPED_PREFIX_SIZE) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "a batch is longer than its stamped prefix");
        return NULL;
    }
    Py_ssize_t at = PyByteArray_GET_SIZE(pending);
    if (PyByteArray_Resize(pending, at + view.len) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(pending) + at;
    memcpy(out, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    put_be(out, (uint64_t)base_offset, 8);
    put_be(out + 8, (uint64_t)(uint32_t)length, 4);
    put_be(out + 12, (uint64_t)(uint32_t)term, 4);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------- module */

PyDoc_STRVAR(bind_doc, "bind(Record, DecodedRecord, CorruptBatchError)\n\n"
                       "Hand over the classes records.py defines; called once on import.");

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *rec, *decoded, *error;
    if (!PyArg_ParseTuple(args, "O!O!O!:bind", &PyType_Type, &rec, &PyType_Type, &decoded,
                          &PyType_Type, &error))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)decoded, &PyTuple_Type) ||
        !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "DecodedRecord must be a tuple subclass and "
                                         "CorruptBatchError an exception class");
        return NULL;
    }
    /* The direct slot reads need each field to be a plain object member of Record itself. */
    Py_ssize_t offsets[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)rec)->tp_dict,
                                                  field_name_objects[i]); /* borrowed */
        if (descr == NULL && PyErr_Occurred())
            return NULL;
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            memset(offsets, 0, sizeof(offsets)); /* not slots: read through getattr */
            break;
        }
        offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_INCREF(rec);
    Py_INCREF(decoded);
    Py_INCREF(error);
    Py_XSETREF(record_type, rec);
    Py_XSETREF(decoded_record_type, decoded);
    Py_XSETREF(corrupt_batch_error, error);
    memcpy(slot_offsets, offsets, sizeof(offsets));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------- bodies */

PyDoc_STRVAR(unfilled_bytes_doc,
             "unfilled_bytes(size) -> (bytes, memoryview)\n\n"
             "A new bytes object of size bytes, not yet filled (nor zeroed), and a writable view "
             "of them, for a socket to read a body into. The view does not keep the bytes alive: "
             "hold both, release the view before handing the bytes out, and let nothing read or "
             "hash the bytes before they are filled.");

static PyObject *unfilled_bytes(PyObject *self, PyObject *arg) {
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "unfilled_bytes() needs a size >= 0");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes == NULL)
        return NULL;
    PyObject *view = PyMemoryView_FromMemory(PyBytes_AS_STRING(bytes), size, PyBUF_WRITE);
    if (view == NULL) {
        Py_DECREF(bytes);
        return NULL;
    }
    return Py_BuildValue("(NN)", bytes, view);
}

static PyMethodDef methods[] = {
    {"encode_records", encode_records, METH_VARARGS, encode_records_doc},
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {"bind", bind, METH_VARARGS, bind_doc},
    {"append_fields", append_fields, METH_O, append_fields_doc},
    {"buffer_batch", (PyCFunction)(void (*)(void))buffer_batch, METH_FASTCALL, buffer_batch_doc},
    {"unfilled_bytes", unfilled_bytes, METH_O, unfilled_bytes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "raftline.raftlog._speedups",
    "C versions of the per-record and per-batch loops of raftline.raftlog.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (int i = 0; i < F_COUNT; i++) {
        field_name_objects[i] = PyUnicode_InternFromString(field_names[i]);
        if (field_name_objects[i] == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
