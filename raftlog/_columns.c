/* raftline.raftlog._columns: a segment's record batches decoded straight into Arrow column
 * buffers (what a read_committed Kafka consumer would see), with no Python object per record.
 *
 * Owns decode_columns: the walk over a concatenation of v2 batches (a segment file or a part
 * of one) that checks each batch's CRC and every record field as strictly as records.py does,
 * drops control batches and the batches of aborted transactions (Kafka's consumer algorithm
 * over the aborted list a fetch or a transaction index gives), keeps records in an offset
 * range, and writes offsets, timestamps, keys, values and headers into buffers that
 * raftlog/columns.py wraps as a pyarrow RecordBatch without copying. Decompression and CRC-32C
 * are Python callables, called once per batch: the per-record work is all here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_record_reader.h"

#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define MAX_BATCH_SIZE (16 * 1024 * 1024)
#define CRC_AT 17
#define CRC_START 21
#define MAX_ARROW_OFFSET 2147483647LL

#define ATTR_CODEC 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_TRANSACTIONAL 0x10
#define ATTR_CONTROL 0x20

static inline uint64_t get_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------------- growable buffers */

/* A bytearray grown by doubling; cut to size when handed to Python. */
typedef struct {
    PyObject *array;
    Py_ssize_t used;
} Buf;

static int buf_init(Buf *b, Py_ssize_t capacity) {
    b->used = 0;
    b->array = PyByteArray_FromStringAndSize(NULL, capacity > 0 ? capacity : 64);
    return b->array == NULL ? -1 : 0;
}

static int buf_reserve(Buf *b, Py_ssize_t more) {
    Py_ssize_t capacity = PyByteArray_GET_SIZE(b->array);
    if (more <= capacity - b->used)
        return 0;
    if (more > PY_SSIZE_T_MAX / 2 - b->used) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t wanted = b->used + more;
    if (wanted < capacity * 2)
        wanted = capacity * 2;
    return PyByteArray_Resize(b->array, wanted);
}

static inline char *buf_at(Buf *b) { return PyByteArray_AS_STRING(b->array) + b->used; }

static inline int buf_put(Buf *b, const void *data, Py_ssize_t size) {
    if (buf_reserve(b, size) < 0)
        return -1;
    memcpy(buf_at(b), data, (size_t)size);
    b->used += size;
    return 0;
}

static inline int buf_put_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }
static inline int buf_put_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }

static PyObject *buf_finish(Buf *b) {
    if (PyByteArray_Resize(b->array, b->used) < 0)
        return NULL;
    PyObject *out = b->array;
    b->array = NULL;
    return out;
}

/* A nullable binary/string column: Arrow's int32 offsets, data and validity bitmap. */
typedef struct {
    Buf offsets, data, validity;
    int64_t length, nulls;
} BinaryColumn;

static int column_init(BinaryColumn *c, Py_ssize_t data_guess, Py_ssize_t rows_guess) {
    c->length = c->nulls = 0;
    c->offsets.array = c->data.array = c->validity.array = NULL;
    if (buf_init(&c->offsets, 4 * (rows_guess + 1)) < 0 || buf_init(&c->data, data_guess) < 0 ||
        buf_init(&c->validity, rows_guess / 8 + 1) < 0)
        return -1;
    return buf_put_i32(&c->offsets, 0);
}

static void column_clear(BinaryColumn *c) {
    Py_CLEAR(c->offsets.array);
    Py_CLEAR(c->data.array);
    Py_CLEAR(c->validity.array);
}

/* Append one value (size -1: null). */
static int column_append(BinaryColumn *c, const unsigned char *data, int64_t size) {
    if (c->length % 8 == 0) {
        if (buf_reserve(&c->validity, 1) < 0)
            return -1;
        *buf_at(&c->validity) = 0;
        c->validity.used++;
    }
    if (size >= 0) {
        if (c->data.used + size > MAX_ARROW_OFFSET) {
            PyErr_SetString(PyExc_OverflowError, "column data past 2 GiB: ask for fewer records");
            return -1;
        }
        if (buf_put(&c->data, data, (Py_ssize_t)size) < 0)
            return -1;
        PyByteArray_AS_STRING(c->validity.array)[c->length / 8] |= (char)(1 << (c->length % 8));
    } else {
        c->nulls++;
    }
    c->length++;
    return buf_put_i32(&c->offsets, (int32_t)c->data.used);
}

/* (offsets, data, validity or None, null count) */
static PyObject *column_finish(BinaryColumn *c) {
    PyObject *offsets = buf_finish(&c->offsets), *data = buf_finish(&c->data), *validity;
    if (c->nulls) {
        validity = buf_finish(&c->validity);
    } else {
        Py_INCREF(Py_None);
        validity = Py_None;
    }
    if (offsets == NULL || data == NULL || validity == NULL) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(validity);
        return NULL;
    }
    return Py_BuildValue("(NNNL)", offsets, data, validity, (long long)c->nulls);
}

/* ------------------------------------------------------------------------- the walk */

typedef struct {
    /* arguments */
    PyObject *decompress, *crc;
    int64_t start_offset, end_offset;
    int headers;
    PyObject *aborted; /* producer id -> list of (first offset, last offset) */
    /* output */
    Buf offsets, timestamps, timestamp_types, header_offsets;
    BinaryColumn keys, values, header_keys, header_values;
    int64_t rows, header_count;
} Walk;

static int utf8_check(const unsigned char *p, int64_t size) {
    for (int64_t i = 0; i < size; i++) {
        if (p[i] >= 0x80) { /* rare: let Python's decoder judge the whole key */
            PyObject *s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)size, "strict");
            if (s != NULL) {
                Py_DECREF(s);
                return 0;
            }
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                corrupt("header key is not UTF-8");
            }
            return -1;
        }
    }
    return 0;
}

/* One record's headers: checked always, appended when `keep`. */
static int walk_headers(Walk *w, Reader *r, Py_ssize_t record_end, int keep) {
    int64_t count;
    if (read_header_count(r, record_end, &count) < 0)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        Py_ssize_t key_start, value_start;
        int64_t key_size, value_size;
        if (read_header_fields(r, record_end, &key_start, &key_size, &value_start, &value_size) <
            0)
            return -1;
        if (utf8_check(r->data + key_start, key_size) < 0)
            return -1;
        if (keep) {
            if (column_append(&w->header_keys, r->data + key_start, key_size) < 0 ||
                column_append(&w->header_values, r->data + value_start, value_size) < 0)
                return -1;
            w->header_count++;
        }
    }
    return 0;
}

/* Walk a data batch's records section, checking every record; the records in
 * [start_offset, end_offset) become rows. */
static int walk_records(Walk *w, const unsigned char *section, Py_ssize_t size,
                        const unsigned char *header) {
    int64_t count = (int32_t)get_be(header + 57, 4);
    int64_t base_offset = (int64_t)get_be(header, 8);
    int64_t last_offset_delta = (int32_t)get_be(header + 23, 4);
    int64_t base_timestamp = (int64_t)get_be(header + 27, 8);
    int64_t max_timestamp = (int64_t)get_be(header + 35, 8);
    int attributes = (int)get_be(header + 21, 2);
    int append_time = (attributes & ATTR_LOG_APPEND_TIME) != 0;
    if (count * (MIN_RECORD_BODY + 1) > size) {
        corrupt("%lld records cannot fit in %zd bytes", (long long)count, size);
        return -1;
    }
    Reader r = {section, size, 0};
    int64_t previous_delta = -1;
    for (int64_t n = 0; n < count; n++) {
        RecordHead h;
        if (read_record_head(&r, last_offset_delta, &previous_delta, &h) < 0)
            return -1;
        int64_t offset = base_offset + h.offset_delta;
        int keep = offset >= w->start_offset && offset < w->end_offset;
        if (walk_headers(w, &r, h.end, keep && w->headers) < 0)
            return -1;
        if (r.pos != h.end) {
            corrupt("record declares %lld bytes but holds a different size", (long long)h.length);
            return -1;
        }
        if (!keep)
            continue;
        int64_t timestamp, micros;
        if (append_time) {
            timestamp = max_timestamp;
        } else if (__builtin_add_overflow(base_timestamp, h.timestamp_delta, &timestamp)) {
            corrupt("timestamp delta %lld overflows", (long long)h.timestamp_delta);
            return -1;
        }
        if (__builtin_mul_overflow(timestamp, 1000, &micros)) { /* Arrow wants microseconds */
            corrupt("timestamp %lld out of range", (long long)timestamp);
            return -1;
        }
        if (buf_put_i64(&w->offsets, offset) < 0 || buf_put_i64(&w->timestamps, micros) < 0 ||
            buf_put_i32(&w->timestamp_types, append_time) < 0 ||
            column_append(&w->keys, section + h.key_start, h.key_size) < 0 ||
            column_append(&w->values, section + h.value_start, h.value_size) < 0)
            return -1;
        if (w->headers && buf_put_i32(&w->header_offsets, (int32_t)w->header_count) < 0)
            return -1;
        w->rows++;
    }
    if (r.pos != r.end) {
        corrupt("%zd bytes left after %lld records", r.end - r.pos, (long long)count);
        return -1;
    }
    return 0;
}

/* Whether a transactional batch lies in an aborted transaction of its producer: its base
 * offset within [first offset, abort marker offset] of one of the producer's entries (the
 * transaction index rule, tiered/FORMAT.md section 6). Returns 1 drop, 0 keep, -1 error. */
static int aborted_batch(Walk *w, int64_t base_offset, int64_t producer_id) {
    if (PyDict_GET_SIZE(w->aborted) == 0)
        return 0;
    PyObject *pid = PyLong_FromLongLong(producer_id);
    if (pid == NULL)
        return -1;
    PyObject *spans = PyDict_GetItemWithError(w->aborted, pid); /* borrowed */
    Py_DECREF(pid);
    if (spans == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t count = PyList_GET_SIZE(spans);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *span = PyList_GET_ITEM(spans, i);
        long long first = PyLong_AsLongLong(PyTuple_GET_ITEM(span, 0));
        long long last = PyLong_AsLongLong(PyTuple_GET_ITEM(span, 1));
        if ((first == -1 || last == -1) && PyErr_Occurred())
            return -1;
        if (first <= base_offset && base_offset <= last)
            return 1;
    }
    return 0;
}

static int check_crc(Walk *w, const unsigned char *batch, Py_ssize_t size) {
    if (w->crc == Py_None)
        return 0;
    PyObject *view =
        PyMemoryView_FromMemory((char *)batch + CRC_START, size - CRC_START, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *value = PyObject_CallOneArg(w->crc, view);
    Py_DECREF(view);
    if (value == NULL)
        return -1;
    unsigned long long actual = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (actual == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    uint32_t stored = (uint32_t)get_be(batch + CRC_AT, 4);
    if ((uint32_t)actual != stored) {
        corrupt("CRC mismatch: stored %#010x, computed %#010x", stored, (uint32_t)actual);
        return -1;
    }
    return 0;
}

/* One whole batch at `batch`. */
static int walk_batch(Walk *w, const unsigned char *batch, Py_ssize_t size) {
    if (check_crc(w, batch, size) < 0)
        return -1;
    int attributes = (int)get_be(batch + 21, 2);
    int64_t base_offset = (int64_t)get_be(batch, 8);
    int64_t last_offset = base_offset + (int32_t)get_be(batch + 23, 4);
    int64_t producer_id = (int64_t)get_be(batch + 43, 8);
    int control = (attributes & ATTR_CONTROL) != 0;
    int transactional = (attributes & ATTR_TRANSACTIONAL) != 0;
    int dropped = transactional && !control ? aborted_batch(w, base_offset, producer_id) : 0;
    if (dropped < 0)
        return -1;
    /* Control batches and batches wholly outside the range are checked only through their
     * CRC: no record of theirs is a row. */
    if (control || dropped || last_offset < w->start_offset || base_offset >= w->end_offset)
        return 0;
    int codec = attributes & ATTR_CODEC;
    const unsigned char *section = batch + BATCH_HEADER_SIZE;
    Py_ssize_t section_size = size - BATCH_HEADER_SIZE;
    PyObject *inflated = NULL;
    if (codec != 0) {
        PyObject *view = PyMemoryView_FromMemory((char *)section, section_size, PyBUF_READ);
        if (view == NULL)
            return -1;
        inflated = PyObject_CallFunction(w->decompress, "iO", codec, view);
        Py_DECREF(view);
        if (inflated == NULL)
            return -1;
        if (!PyBytes_Check(inflated)) {
            Py_DECREF(inflated);
            PyErr_SetString(PyExc_TypeError, "decompress must return bytes");
            return -1;
        }
        section = (const unsigned char *)PyBytes_AS_STRING(inflated);
        section_size = PyBytes_GET_SIZE(inflated);
    }
    int result = walk_records(w, section, section_size, batch);
    Py_XDECREF(inflated);
    return result;
}

PyDoc_STRVAR(
    decode_columns_doc,
    "decode_columns(data, pos, start_offset, end_offset, max_rows, aborted, headers, "
    "decompress, crc) -> tuple\n\n"
    "Walk the batches of `data` from byte `pos`, stopping after the batch that brings the rows "
    "to `max_rows`, at the first batch at or past `end_offset`, or at the end. Records in "
    "[start_offset, end_offset) of data batches that are not part of an aborted transaction "
    "become rows. `aborted` maps a producer id to a list of (first offset, abort marker offset) "
    "tuples. decompress(codec, memoryview) -> bytes; crc(memoryview) -> int, or None to skip "
    "CRC checks.\n\n"
    "Returns (rows, next_pos, next_offset, offsets, timestamps_us, timestamp_types, keys, "
    "values, header_offsets, header_keys, header_values): each column buffer a bytearray, each "
    "binary column (offsets, data, validity or None, null count); the header buffers are None "
    "unless `headers`. next_offset is one past the last batch walked (-1: none).");

static PyObject *decode_columns(PyObject *self, PyObject *args) {
    PyObject *data_obj;
    Py_ssize_t pos, max_rows;
    long long start_offset, end_offset;
    Walk w;
    memset(&w, 0, sizeof(w));
    if (!PyArg_ParseTuple(args, "OnLLnO!pOO:decode_columns", &data_obj, &pos, &start_offset,
                          &end_offset, &max_rows, &PyDict_Type, &w.aborted, &w.headers,
                          &w.decompress, &w.crc))
        return NULL;
    if (corrupt_batch_error == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_columns.bind() was not called");
        return NULL;
    }
    Py_ssize_t at = 0;
    PyObject *pid, *spans;
    while (PyDict_Next(w.aborted, &at, &pid, &spans)) {
        int ok = PyList_Check(spans);
        for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(spans); i++) {
            PyObject *span = PyList_GET_ITEM(spans, i);
            ok = PyTuple_Check(span) && PyTuple_GET_SIZE(span) == 2;
        }
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "aborted maps producer ids to lists of "
                                             "(first offset, last offset) tuples");
            return NULL;
        }
    }
    w.start_offset = start_offset;
    w.end_offset = end_offset;
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    const unsigned char *data = view.buf;
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "pos outside the data");
        goto release;
    }
    Py_ssize_t rows_guess = max_rows < 65536 ? max_rows : 65536;
    Py_ssize_t data_guess = view.len - pos < (64 << 20) ? view.len - pos : (64 << 20);
    if (buf_init(&w.offsets, 8 * rows_guess) < 0 || buf_init(&w.timestamps, 8 * rows_guess) < 0 ||
        buf_init(&w.timestamp_types, 4 * rows_guess) < 0 ||
        column_init(&w.keys, 64, rows_guess) < 0 ||
        column_init(&w.values, data_guess, rows_guess) < 0)
        goto fail;
    if (w.headers &&
        (buf_init(&w.header_offsets, 4 * (rows_guess + 1)) < 0 ||
         buf_put_i32(&w.header_offsets, 0) < 0 || column_init(&w.header_keys, 64, 64) < 0 ||
         column_init(&w.header_values, 64, 64) < 0))
        goto fail;
    int64_t next_offset = -1;
    while (pos < view.len && w.rows < max_rows) {
        if (view.len - pos < BATCH_HEADER_SIZE) {
            corrupt("truncated batch header at %zd: %zd bytes", pos, view.len - pos);
            goto fail;
        }
        const unsigned char *batch = data + pos;
        int64_t base_offset = (int64_t)get_be(batch, 8);
        int64_t length = (int32_t)get_be(batch + 8, 4);
        if (batch[16] != 2) {
            corrupt("unsupported magic %d at %zd", batch[16], pos);
            goto fail;
        }
        if (length < BATCH_HEADER_SIZE - LOG_OVERHEAD || length + LOG_OVERHEAD > MAX_BATCH_SIZE) {
            corrupt("implausible batch length %lld at %zd", (long long)length, pos);
            goto fail;
        }
        if ((int32_t)get_be(batch + 23, 4) < 0 || (int32_t)get_be(batch + 57, 4) < 0) {
            corrupt("negative offset delta or record count at %zd", pos);
            goto fail;
        }
        Py_ssize_t size = (Py_ssize_t)length + LOG_OVERHEAD;
        if (size > view.len - pos) {
            corrupt("batch at %zd runs past the end of the buffer", pos);
            goto fail;
        }
        if (base_offset >= end_offset)
            break;
        if (walk_batch(&w, batch, size) < 0)
            goto fail;
        next_offset = base_offset + (int32_t)get_be(batch + 23, 4) + 1;
        pos += size;
    }
    PyObject *offsets = buf_finish(&w.offsets), *timestamps = buf_finish(&w.timestamps),
             *types = buf_finish(&w.timestamp_types), *keys = column_finish(&w.keys),
             *values = column_finish(&w.values);
    PyObject *header_offsets = Py_None, *header_keys = Py_None, *header_values = Py_None;
    if (w.headers) {
        header_offsets = buf_finish(&w.header_offsets);
        header_keys = column_finish(&w.header_keys);
        header_values = column_finish(&w.header_values);
    } else {
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
    }
    if (offsets && timestamps && types && keys && values && header_offsets && header_keys &&
        header_values) {
        result = Py_BuildValue("(LnLNNNNNNNN)", (long long)w.rows, pos,
                               (long long)next_offset, offsets, timestamps, types, keys, values,
                               header_offsets, header_keys, header_values);
    } else {
        Py_XDECREF(offsets);
        Py_XDECREF(timestamps);
        Py_XDECREF(types);
        Py_XDECREF(keys);
        Py_XDECREF(values);
        Py_XDECREF(header_offsets);
        Py_XDECREF(header_keys);
        Py_XDECREF(header_values);
    }
fail:
    Py_XDECREF(w.offsets.array);
    Py_XDECREF(w.timestamps.array);
    Py_XDECREF(w.timestamp_types.array);
    Py_XDECREF(w.header_offsets.array);
    column_clear(&w.keys);
    column_clear(&w.values);
    column_clear(&w.header_keys);
    column_clear(&w.header_values);
release:
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(bind_doc, "bind(CorruptBatchError)\n\nThe error class for malformed input.");

static PyObject *bind(PyObject *self, PyObject *error) {
    if (!PyType_Check(error) ||
        !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "bind() needs an exception class");
        return NULL;
    }
    Py_INCREF(error);
    Py_XSETREF(corrupt_batch_error, error);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_columns", decode_columns, METH_VARARGS, decode_columns_doc},
    {"bind", bind, METH_O, bind_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "raftline.raftlog._columns",
    "Record batches decoded into Arrow column buffers.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
