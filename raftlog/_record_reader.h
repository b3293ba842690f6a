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

/* Smallest record body after its length: attributes, timestamp delta, offset delta, key
 * length, value length, header count, one byte each (records.py's _MIN_RECORD_SIZE - 1). */
#define MIN_RECORD_BODY 6

/* A record's fields before its headers. */
typedef struct {
    int64_t length;   /* of the body, as the record declares it */
    Py_ssize_t end;   /* where the body ends in the section */
    int64_t timestamp_delta, offset_delta;
    Py_ssize_t key_start, value_start;
    int64_t key_size, value_size; /* -1: null */
} RecordHead;

/* Reads a record up to its headers: the length (within the section), the attributes, the
 * deltas (offset deltas strictly rising from *previous_delta, at most last_offset_delta;
 * *previous_delta becomes this one), the key and the value. */
static inline int read_record_head(Reader *r, int64_t last_offset_delta, int64_t *previous_delta,
                                   RecordHead *h) {
    if (read_zigzag(r, 32, &h->length) < 0)
        return -1;
    /* length is an int32 and pos <= end, so this cannot overflow */
    if (h->length < MIN_RECORD_BODY || r->pos + h->length > r->end) {
        corrupt("record length %lld out of range at %zd", (long long)h->length, r->pos);
        return -1;
    }
    h->end = r->pos + (Py_ssize_t)h->length;
    r->pos++; /* record attributes: no bits are defined */
    if (read_zigzag(r, 64, &h->timestamp_delta) < 0 || read_zigzag(r, 32, &h->offset_delta) < 0)
        return -1;
    if (!(*previous_delta < h->offset_delta && h->offset_delta <= last_offset_delta)) {
        corrupt("offset delta %lld out of order or range", (long long)h->offset_delta);
        return -1;
    }
    *previous_delta = h->offset_delta;
    h->key_start = h->value_start = 0;
    if (read_field(r, h->end, &h->key_start, &h->key_size) < 0 ||
        read_field(r, h->end, &h->value_start, &h->value_size) < 0)
        return -1;
    return 0;
}

/* A record's header count, bounded by its remaining bytes (each header takes two at least). */
static inline int read_header_count(Reader *r, Py_ssize_t record_end, int64_t *count) {
    if (read_zigzag(r, 32, count) < 0)
        return -1;
    if (*count != 0 && (*count < 0 || 2 * *count > (int64_t)(record_end - r->pos))) {
        corrupt("header count %lld out of range", (long long)*count);
        return -1;
    }
    return 0;
}

/* One header's key (never null; its UTF-8 is the caller's check) and value (maybe null). */
static inline int read_header_fields(Reader *r, Py_ssize_t record_end, Py_ssize_t *key_start,
                                     int64_t *key_size, Py_ssize_t *value_start,
                                     int64_t *value_size) {
    *key_start = *value_start = 0;
    if (read_field(r, record_end, key_start, key_size) < 0)
        return -1;
    if (*key_size < 0) {
        corrupt("null header key");
        return -1;
    }
    return read_field(r, record_end, value_start, value_size);
}

#endif
