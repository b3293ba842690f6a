/* raftlog/_record_reader.h: the bounds-checked reading of a Kafka v2 records section that the C
 * decoders share (raftlog/_speedups.c: records as Python objects; raftlog/_columns.c: records
 * as Arrow column buffers).
 *
 * Owns the Reader cursor, zigzag varints with Java's bit limits and nullable length-prefixed
 * fields. Every error is a CorruptBatchError with records.py's wording; each extension sets
 * corrupt_batch_error in its bind() before decoding anything.
 */
#ifndef RAFTLINE_RECORD_READER_H
#define RAFTLINE_RECORD_READER_H

#include <Python.h>
#include <stdarg.h>
#include <stdint.h>

static PyObject *corrupt_batch_error; /* CorruptBatchError, set by bind() */

/* The records section being read and the position in it. */
typedef struct {
    const unsigned char *data;
    Py_ssize_t end;
    Py_ssize_t pos;
} Reader;

static void *corrupt(const char *format, ...) {
    va_list vargs;
    va_start(vargs, format);
    PyObject *message = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (message != NULL) {
        PyErr_SetObject(corrupt_batch_error, message);
        Py_DECREF(message);
    }
    return NULL;
}

static int past_end(void) {
    corrupt("record runs past the end of the records section");
    return -1;
}

/* A zigzag varint of at most `bits` bits (32: Java's readVarint, 64: readVarlong), with the
 * Python reader's errors: at most ceil(bits / 7) bytes, and no value bits past `bits`. */
static int read_zigzag(Reader *r, int bits, int64_t *out) {
    if (r->pos >= r->end)
        return past_end();
    unsigned b = r->data[r->pos];
    if (b < 0x80) { /* one byte: the common case for deltas, counts and short lengths */
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        r->pos++;
        return 0;
    }
    uint64_t u = b & 0x7F;
    int shift = 7;
    int overflow = 0; /* value bits at or past bit 64 (only the 10th byte of a varlong) */
    for (;;) {
        r->pos++;
        if (r->pos >= r->end)
            return past_end();
        b = r->data[r->pos];
        uint64_t part = b & 0x7F;
        if (shift == 63 && part > 1)
            overflow = 1;
        u |= part << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift >= bits) {
            corrupt("varint longer than %d bits at %zd", bits, r->pos);
            return -1;
        }
    }
    if (overflow || (bits < 64 && (u >> bits) != 0)) {
        corrupt("varint exceeds %d bits at %zd", bits, r->pos);
        return -1;
    }
    *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    r->pos++;
    return 0;
}

/* A nullable length-prefixed field ending at or before `limit`: its start in `*start` and
 * size in `*size` (-1: null). */
static int read_field(Reader *r, Py_ssize_t limit, Py_ssize_t *start, int64_t *size) {
    if (read_zigzag(r, 32, size) < 0)
        return -1;
    if (*size < 0) {
        if (*size != -1) {
            corrupt("negative length %lld", (long long)*size);
            return -1;
        }
        return 0;
    }
    if (r->pos + *size > limit) {
        corrupt("field of %lld bytes runs past its record", (long long)*size);
        return -1;
    }
    *start = r->pos;
    r->pos += (Py_ssize_t)*size;
    return 0;
}

#endif
