/* sdk._speedups: the per-message paths of ordermq's wire in C, the same as their Python.
 *
 * - decode_records: codec.decode_records (records -> MessageExt), for every message a
 *   consumer receives; about 0.9 us a message in Python, half of a consumer's CPU.
 * - encode_frames: codec.encode_message (Message -> frame), for every message sent.
 * - scan_frames, scan_parts, lay_out_parts: the broker's check_frames and lay_out_parts
 *   (mockbroker/store/records.py) for the usual batch.
 * - rebase_entries, shifted: a large batch's slices, laid out ahead, moved to where the
 *   broker writes them (records.rebase_entries, IdKeyEntries.take).
 * - shard_groups, send_results: a producer's batch grouped by queue (selector.shard_index
 *   for each message), and its SendResults built (message.build_send_results).
 * - track: messages decoded for a consumer's buffer (kept out of the cycle collector)
 *   given back to it as they are handed out.
 *
 * Each does what its Python version does: the same checks in the same order, the same
 * errors, the same bytes and objects; where a case is unusual it hands it to the Python
 * version (a fallback function, or None for the caller to run it), so every refusal is
 * worded in one place. The Python versions stay the reference, and what runs where this
 * did not compile; the tests compare the two on generated, cut and damaged input.
 *
 * configure() and configure_encode() are given what the code needs from Python once.
 * MessageExt's and Message's fields are slots; their offsets are read from the member
 * descriptors, so each field is read or stored without an attribute lookup. Both refuse
 * a class whose slots are not the ones below (sdk/_accel.py then leaves this module out).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "records are little-endian: this decoder reads them in place on little-endian machines only"
#endif

#define RECORD_MAGIC 0x4F4D5131u
#define RECORD_SIZE 38      /* <IIIiqqiH: size, crc, magic, queue id, offset, store ts, reconsume, topic len */
#define FIELDS_SIZE 47      /* <16sqqBHHHII: id, born, deliver at, level, tl, sl, kl, pl, bl */
#define CRC_FROM 8          /* the CRC covers the record after its size and CRC */

enum {
    F_TOPIC, F_BODY, F_TAGS, F_KEYS, F_PROPERTIES, F_SHARDING_KEY, F_MSG_ID, F_QUEUE,
    F_QUEUE_OFFSET, F_RECONSUME_TIMES, F_BORN_TIMESTAMP, F_STORE_TIMESTAMP, F_DELIVER_AT,
    F_DELIVERY_ATTEMPT, F_RECEIPT, F_COMMIT_LOG_OFFSET, F_COUNT
};

static const char *field_names[F_COUNT] = {
    "topic", "body", "tags", "keys", "properties", "sharding_key", "msg_id", "queue",
    "queue_offset", "reconsume_times", "born_timestamp", "store_timestamp", "deliver_at",
    "delivery_attempt", "receipt", "commit_log_offset",
};

static PyTypeObject *message_type = NULL;
static PyObject *queue_type = NULL;
static PyObject *format_error = NULL;
static PyObject *crc32_func = NULL;
static PyObject *decode_properties_func = NULL;
static Py_ssize_t offsets[F_COUNT];
/* The CRC function's C entry, where the installed library has one (ISA-L's): called
 * directly instead of through Python. configure() checks it against `crc32_func` first. */
typedef uint32_t (*native_crc_fn)(uint32_t, const unsigned char *, uint64_t);
static native_crc_fn native_crc = NULL;
static PyObject *zero = NULL;
static PyObject *minus_one = NULL;
static PyObject *nul = NULL;

static uint16_t u16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int32_t i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static int64_t i64(const unsigned char *p) { int64_t v; memcpy(&v, p, 8); return v; }

static void set_field(PyObject *obj, int field, PyObject *value) /* steals value */
{
    PyObject **slot = (PyObject **)((char *)obj + offsets[field]);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

/* The CRC-32 of n bytes at p, continuing from `init`; -1 with an exception on failure. */
static int
crc_of(const unsigned char *p, Py_ssize_t n, uint32_t init, uint32_t *out)
{
    if (native_crc != NULL) {
        *out = native_crc(init, p, (uint64_t)n);
        return 0;
    }
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *got = init ? PyObject_CallFunction(crc32_func, "Ok", view, (unsigned long)init)
                         : PyObject_CallOneArg(crc32_func, view);
    Py_DECREF(view);
    if (got == NULL)
        return -1;
    unsigned long value = PyLong_AsUnsignedLong(got);
    Py_DECREF(got);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint32_t)value;
    return 0;
}

/* Whether `candidate` gives what crc32_func gives, on inputs of several sizes and starts. */
static int
native_crc_agrees(native_crc_fn candidate)
{
    unsigned char data[300];
    for (int i = 0; i < 300; i++)
        data[i] = (unsigned char)(i * 131 + 7);
    static const Py_ssize_t sizes[] = {0, 1, 7, 16, 63, 190, 300};
    static const uint32_t inits[] = {0, 1, 0xDEADBEEFu};
    native_crc_fn saved = native_crc;
    native_crc = NULL;  /* crc_of through Python */
    int same = 1;
    for (size_t i = 0; same && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (size_t j = 0; same && j < sizeof(inits) / sizeof(inits[0]); j++) {
            uint32_t expected;
            if (crc_of(data, sizes[i], inits[j], &expected) < 0) {
                native_crc = saved;
                return -1;
            }
            same = candidate(inits[j], data, (uint64_t)sizes[i]) == expected;
        }
    }
    native_crc = saved;
    return same;
}

/* Where each of `count` object slots `names` of class `type` lives in its instances, into
 * `out` (untouched on failure: a TypeError naming the field that is not an object slot). */
static int
slot_offsets(PyObject *type, const char *what, const char **names, int count, Py_ssize_t *out)
{
    Py_ssize_t found[32];
    if (count > 32) {
        PyErr_SetString(PyExc_SystemError, "too many slots");
        return -1;
    }
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", what, names[i]);
            return -1;
        }
        found[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    memcpy(out, found, (size_t)count * sizeof(Py_ssize_t));
    return 0;
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *mtype, *qtype, *err, *crc, *props, *address = Py_None;
    if (!PyArg_ParseTuple(args, "O!OOOO|O:configure", &PyType_Type, &mtype, &qtype, &err, &crc,
                          &props, &address))
        return NULL;
    PyObject *slots = PyObject_GetAttrString(mtype, "__slots__");
    if (slots == NULL)
        return NULL;
    PyObject *names = PySequence_Tuple(slots);
    Py_DECREF(slots);
    if (names == NULL)
        return NULL;
    int same = PyTuple_GET_SIZE(names) == F_COUNT;
    for (int i = 0; same && i < F_COUNT; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        same = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, field_names[i]) == 0;
    }
    Py_DECREF(names);
    if (!same) {
        PyErr_SetString(PyExc_TypeError, "MessageExt's slots are not the fields this decoder sets");
        return NULL;
    }
    if (slot_offsets(mtype, "MessageExt", field_names, F_COUNT, offsets) < 0)
        return NULL;
    Py_INCREF(mtype); Py_XSETREF(message_type, (PyTypeObject *)mtype);
    Py_INCREF(qtype); Py_XSETREF(queue_type, qtype);
    Py_INCREF(err); Py_XSETREF(format_error, err);
    Py_INCREF(crc); Py_XSETREF(crc32_func, crc);
    Py_INCREF(props); Py_XSETREF(decode_properties_func, props);
    native_crc = NULL;
    if (address != Py_None) {
        native_crc_fn candidate = (native_crc_fn)PyLong_AsVoidPtr(address);
        if (candidate == NULL)
            return NULL;
        int agrees = native_crc_agrees(candidate);
        if (agrees < 0)
            return NULL;
        if (agrees)
            native_crc = candidate;
    }
    return PyBool_FromLong(native_crc != NULL);
}

static void
fail(Py_ssize_t pos, const char *what)
{
    PyErr_Format(format_error, what, pos);
}

/* A ValueError (a UnicodeDecodeError included) while decoding: the record's error, as the
 * Python decode words it. Other errors pass as they are. */
static void
not_decoded(Py_ssize_t pos)
{
    if (!PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(format_error))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    if (text != NULL)
        PyErr_Format(format_error, "record at byte %zd does not decode: %U", pos, text);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static PyObject *
hex_id(const unsigned char *id)
{
    static const char digits[] = "0123456789ABCDEF";
    PyObject *s = PyUnicode_New(32, 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(s);
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[id[i] >> 4];
        out[2 * i + 1] = digits[id[i] & 15];
    }
    return s;
}

static PyObject *
text_or_none(const unsigned char *p, Py_ssize_t n)
{
    if (n == 0)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
}

static int
crc_matches(const unsigned char *base, Py_ssize_t from, Py_ssize_t stop, uint32_t expected)
{
    uint32_t got;
    if (crc_of(base + from, stop - from, 0, &got) < 0)
        return -1;
    return got == expected;
}

/* One record's message, from its fields at p (after the topic) to stop; NULL on error. */
static PyObject *
message_at(const unsigned char *base, Py_ssize_t pos, Py_ssize_t p, Py_ssize_t stop,
           PyObject *topic, PyObject *queue, int64_t queue_offset, int64_t store_ts,
           int32_t reconsume, int tracked)
{
    const unsigned char *f = base + p;
    const unsigned char *id = f;
    int64_t born = i64(f + 16), deliver_at = i64(f + 24);
    Py_ssize_t tl = u16(f + 33), sl = u16(f + 35), kl = u16(f + 37);
    Py_ssize_t pl = u32(f + 39), bl = u32(f + 43);
    p += FIELDS_SIZE;
    if (p + tl + sl + kl + pl + bl != stop) {
        fail(pos, "record at byte %zd has inconsistent lengths");
        return NULL;
    }
    PyObject *m = message_type->tp_alloc(message_type, 0);
    if (m == NULL)
        return NULL;
    if (!tracked)
        PyObject_GC_UnTrack(m);
    PyObject *value;
#define SET(field, expr) \
    do { value = (expr); if (value == NULL) goto error; set_field(m, field, value); } while (0)
    SET(F_TAGS, text_or_none(base + p, tl));
    p += tl;
    SET(F_SHARDING_KEY, text_or_none(base + p, sl));
    p += sl;
    if (kl) {
        PyObject *joined = PyUnicode_DecodeUTF8((const char *)base + p, kl, NULL);
        if (joined == NULL)
            goto error;
        PyObject *parts = PyUnicode_Split(joined, nul, -1);
        Py_DECREF(joined);
        if (parts == NULL)
            goto error;
        SET(F_KEYS, PyList_AsTuple(parts));
        Py_DECREF(parts);
    } else {
        SET(F_KEYS, PyTuple_New(0));
    }
    p += kl;
    if (pl) {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)base + p, pl);
        if (raw == NULL)
            goto error;
        value = PyObject_CallOneArg(decode_properties_func, raw);
        Py_DECREF(raw);
        if (value == NULL)
            goto error;
        set_field(m, F_PROPERTIES, value);
    } else {
        SET(F_PROPERTIES, PyDict_New());
    }
    p += pl;
    Py_INCREF(topic);
    set_field(m, F_TOPIC, topic);
    SET(F_BODY, PyBytes_FromStringAndSize((const char *)base + p, stop - p));
    SET(F_MSG_ID, hex_id(id));
    Py_INCREF(queue);
    set_field(m, F_QUEUE, queue);
    SET(F_QUEUE_OFFSET, PyLong_FromLongLong(queue_offset));
    SET(F_RECONSUME_TIMES, PyLong_FromLong(reconsume));
    SET(F_BORN_TIMESTAMP, PyLong_FromLongLong(born));
    SET(F_STORE_TIMESTAMP, PyLong_FromLongLong(store_ts));
    SET(F_DELIVER_AT, PyLong_FromLongLong(deliver_at));
    Py_INCREF(zero);
    set_field(m, F_DELIVERY_ATTEMPT, zero);
    Py_INCREF(Py_None);
    set_field(m, F_RECEIPT, Py_None);
    Py_INCREF(minus_one);
    set_field(m, F_COMMIT_LOG_OFFSET, minus_one);
#undef SET
    return m;
error:
    Py_DECREF(m);
    not_decoded(pos);
    return NULL;
}

static PyObject *
decode_records(PyObject *module, PyObject *args)
{
    PyObject *records, *broker_name;
    int tracked = 1;
    if (!PyArg_ParseTuple(args, "SU|p:decode_records", &records, &broker_name, &tracked))
        return NULL;
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sdk._speedups.configure() was not called");
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(records);
    Py_ssize_t end = PyBytes_GET_SIZE(records), pos = 0;
    PyObject *out = PyList_New(0);
    PyObject *topics = PyDict_New();   /* raw topic -> str */
    PyObject *queues = PyDict_New();   /* (topic, queue id) -> MessageQueue */
    PyObject *last_raw = NULL;  /* the last record's raw topic */
    PyObject *topic = NULL, *queue = NULL;  /* borrowed from the dicts */
    int32_t last_queue_id = 0;
    if (out == NULL || topics == NULL || queues == NULL)
        goto error;
    while (pos < end) {
        if (pos + RECORD_SIZE > end) {
            fail(pos, "record header truncated at byte %zd");
            goto error;
        }
        const unsigned char *h = base + pos;
        Py_ssize_t size = u32(h);
        uint32_t crc = u32(h + 4);
        Py_ssize_t topic_len = u16(h + 36);
        Py_ssize_t stop = pos + size;
        if (u32(h + 8) != RECORD_MAGIC || size < RECORD_SIZE + topic_len + FIELDS_SIZE
            || stop > end) {
            fail(pos, "malformed record at byte %zd");
            goto error;
        }
        int ok = crc_matches(base, pos + CRC_FROM, stop, crc);
        if (ok < 0)
            goto error;
        if (!ok) {
            fail(pos, "record at byte %zd fails its CRC check");
            goto error;
        }
        const unsigned char *raw = h + RECORD_SIZE;
        int32_t queue_id = i32(h + 12);
        if (last_raw == NULL || PyBytes_GET_SIZE(last_raw) != topic_len
            || memcmp(PyBytes_AS_STRING(last_raw), raw, topic_len) != 0) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)raw, topic_len);
            if (key == NULL)
                goto error;
            PyObject *known = PyDict_GetItemWithError(topics, key);  /* borrowed */
            if (known == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(key);
                    goto error;
                }
                known = PyUnicode_DecodeUTF8((const char *)raw, topic_len, NULL);
                if (known == NULL) {
                    Py_DECREF(key);
                    not_decoded(pos);
                    goto error;
                }
                int bad = PyDict_SetItem(topics, key, known) < 0;
                Py_DECREF(known);  /* the dict holds it, as long as this call runs */
                if (bad) {
                    Py_DECREF(key);
                    goto error;
                }
            }
            Py_XSETREF(last_raw, key);
            topic = known;
            queue = NULL;
        }
        if (queue == NULL || queue_id != last_queue_id) {
            PyObject *qid = PyLong_FromLong(queue_id);
            if (qid == NULL)
                goto error;
            PyObject *qkey = PyTuple_Pack(2, topic, qid);
            if (qkey == NULL) {
                Py_DECREF(qid);
                goto error;
            }
            PyObject *found = PyDict_GetItemWithError(queues, qkey);
            if (found == NULL) {
                if (PyErr_Occurred()
                    || (found = PyObject_CallFunctionObjArgs(queue_type, topic, broker_name, qid,
                                                             NULL)) == NULL) {
                    Py_DECREF(qkey);
                    Py_DECREF(qid);
                    goto error;
                }
                int bad = PyDict_SetItem(queues, qkey, found) < 0;
                Py_DECREF(found);  /* the dict holds it */
                if (bad) {
                    Py_DECREF(qkey);
                    Py_DECREF(qid);
                    goto error;
                }
            }
            Py_DECREF(qkey);
            Py_DECREF(qid);
            queue = found;
            last_queue_id = queue_id;
        }
        PyObject *m = message_at(base, pos, pos + RECORD_SIZE + topic_len, stop, topic, queue,
                                 i64(h + 16), i64(h + 24), i32(h + 32), tracked);
        if (m == NULL)
            goto error;
        int bad = PyList_Append(out, m) < 0;
        Py_DECREF(m);
        if (bad)
            goto error;
        pos = stop;
    }
    Py_XDECREF(last_raw);
    Py_DECREF(topics);
    Py_DECREF(queues);
    return out;
error:
    Py_XDECREF(last_raw);
    Py_XDECREF(out);
    Py_XDECREF(topics);
    Py_XDECREF(queues);
    return NULL;
}


/* ---------------------------------------------------------------- the broker's send path
 *
 * scan_frames: mockbroker/store/records.py's check_frames for the usual batch, which it
 * answers with CheckedFrames' six ints per frame; None for anything else (a frame that
 * fails a check, has a due time, non-ASCII text or properties that are not plain ASCII, or
 * carries the half-message property), which check_frames then checks in Python, raising
 * the error that names the frame. So every refusal is Python's, word for word.
 *
 * scan_parts: scan_frames of a request's parts, each whole, in one call (a mixed-key
 * batch is a part per queue).
 *
 * lay_out_parts: records.py's lay_out_parts, each part's records in one bytes object.
 */
#define FRAME_PREFIX 4

static int
all_ascii(const unsigned char *p, Py_ssize_t n)
{
    unsigned char seen = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        seen |= p[i];
    return seen < 0x80;
}

/* Properties (u16 key length, key, u16 value length, value, ...) that parse, are ASCII and
 * hold no key equal to `half` (unless `half_allowed`). */
static int
plain_properties(const unsigned char *p, Py_ssize_t n, const char *half, Py_ssize_t half_len,
                 int half_allowed)
{
    Py_ssize_t pos = 0;
    if (!all_ascii(p, n))
        return 0;
    while (pos < n) {
        if (pos + 2 > n)
            return 0;
        Py_ssize_t klen = u16(p + pos);
        pos += 2;
        if (pos + klen + 2 > n)
            return 0;
        if (!half_allowed && klen == half_len && memcmp(p + pos, half, half_len) == 0)
            return 0;
        pos += klen;
        Py_ssize_t vlen = u16(p + pos);
        pos += 2;
        if (pos + vlen > n)
            return 0;
        pos += vlen;
    }
    return 1;
}

/* The usual frames of base[pos:stop_at) (up to frame index `last_index`) appended to `out`,
 * six ints each; *pos and *index are moved past them. 1: every frame seen was usual; 0:
 * one was not (check it in Python); -1: an error is set. */
static int
scan_into(PyObject *out, const unsigned char *base, Py_ssize_t end, Py_ssize_t *pos,
          Py_ssize_t *index, Py_ssize_t last_index, Py_ssize_t stop_at, Py_ssize_t max_body,
          Py_ssize_t max_properties, const char *half, Py_ssize_t half_len, int half_allowed)
{
    if (stop_at > end)
        stop_at = end;
    while (*pos < stop_at && *index < last_index) {
        if (*pos + FRAME_PREFIX + FIELDS_SIZE > end)
            return 0;
        const unsigned char *h = base + *pos;
        Py_ssize_t length = u32(h);
        const unsigned char *f = h + FRAME_PREFIX;
        int64_t deliver_at = i64(f + 24);
        unsigned char level = f[32];
        Py_ssize_t tl = u16(f + 33), sl = u16(f + 35), kl = u16(f + 37);
        Py_ssize_t pl = u32(f + 39), bl = u32(f + 43);
        Py_ssize_t s = *pos + FRAME_PREFIX, stop = s + length;
        if (length != FIELDS_SIZE + tl + sl + kl + pl + bl || stop > end || bl == 0
            || bl > max_body || pl > max_properties || deliver_at != 0 || level != 0)
            return 0;
        Py_ssize_t p = s + FIELDS_SIZE;
        if (!all_ascii(base + p, tl + sl + kl))
            return 0;
        if (pl && !plain_properties(base + p + tl + sl + kl, pl, half, half_len, half_allowed))
            return 0;
        uint32_t tags_hash = 0;
        if (tl && crc_of(base + p, tl, 0, &tags_hash) < 0)
            return -1;
        PyObject *item[6];
        item[0] = PyLong_FromSsize_t(s);
        item[1] = PyLong_FromSsize_t(stop);
        item[2] = PyLong_FromUnsignedLong(tags_hash);
        item[3] = Py_NewRef(zero);
        item[4] = PyLong_FromSsize_t(p + tl + sl);
        item[5] = PyLong_FromSsize_t(kl);
        int bad = 0;
        for (int i = 0; i < 6; i++) {
            if (!bad && (item[i] == NULL || PyList_Append(out, item[i]) < 0))
                bad = 1;
            Py_XDECREF(item[i]);
        }
        if (bad)
            return -1;
        *pos = stop;
        (*index)++;
    }
    return 1;
}

static PyObject *
scan_frames(PyObject *module, PyObject *args)
{
    Py_buffer frames;
    Py_ssize_t start, last_index, first_index, stop_at, max_body, max_properties;
    const char *half;
    Py_ssize_t half_len;
    int half_allowed;
    if (!PyArg_ParseTuple(args, "y*nnnnnns#p:scan_frames", &frames, &start, &first_index,
                          &last_index, &stop_at, &max_body, &max_properties, &half, &half_len,
                          &half_allowed))
        return NULL;
    Py_ssize_t pos = start, index = first_index;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&frames);
        return NULL;
    }
    int usual = 0;
    if (frames.len > 0 && start >= 0)
        usual = scan_into(out, frames.buf, frames.len, &pos, &index, last_index, stop_at,
                          max_body, max_properties, half, half_len, half_allowed);
    PyBuffer_Release(&frames);
    if (usual == 1)
        return out;
    Py_XDECREF(out);
    if (usual < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* scan_frames of every part of a request whole, in one call: each part's ints, or None
 * when any part is not the usual one (empty, a frame to check in Python) or the parts
 * hold over `max_frames` frames or `max_bytes` bytes in all. */
static PyObject *
scan_parts(PyObject *module, PyObject *args)
{
    PyObject *parts;
    Py_ssize_t max_frames, max_bytes, max_body, max_properties;
    const char *half;
    Py_ssize_t half_len;
    int half_allowed;
    if (!PyArg_ParseTuple(args, "O!nnnns#p:scan_parts", &PyList_Type, &parts, &max_frames,
                          &max_bytes, &max_body, &max_properties, &half, &half_len,
                          &half_allowed))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(parts), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        if (!PyBytes_Check(part) || PyBytes_GET_SIZE(part) == 0)
            Py_RETURN_NONE;
        total += PyBytes_GET_SIZE(part);
    }
    if (total > max_bytes)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    Py_ssize_t frames_left = max_frames;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        PyObject *data = PyList_New(0);
        if (data == NULL)
            goto error;
        PyList_SET_ITEM(out, i, data);
        Py_ssize_t end = PyBytes_GET_SIZE(part), pos = 0, index = 0;
        int usual = scan_into(data, (const unsigned char *)PyBytes_AS_STRING(part), end, &pos,
                              &index, frames_left, end, max_body, max_properties, half,
                              half_len, half_allowed);
        if (usual < 0)
            goto error;
        if (usual == 0 || pos != end) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        frames_left -= index;
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

static int
append_stolen(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* One part: (frames, CheckedFrames' ints, queue id, first offset). Its records are added
 * to `into` as one bytes object; returns its consume-queue entries. */
static PyObject *
lay_out_part(PyObject *part, PyObject *into, const char *topic, Py_ssize_t topic_len,
             int64_t store_ts, int32_t reconsume, int64_t *position, PyObject *positions,
             PyObject *ids, PyObject *keyed)
{
    PyObject *frames_obj, *data;
    int queue_id;
    long long offset;
    if (!PyArg_ParseTuple(part, "SO!iL:part", &frames_obj, &PyList_Type, &data, &queue_id,
                          &offset))
        return NULL;
    const unsigned char *frames = (const unsigned char *)PyBytes_AS_STRING(frames_obj);
    Py_ssize_t frames_len = PyBytes_GET_SIZE(frames_obj);
    Py_ssize_t n = PyList_GET_SIZE(data);
    if (n % 6 != 0) {
        PyErr_SetString(PyExc_ValueError, "checked frames are six ints each");
        return NULL;
    }
    Py_ssize_t count = n / 6, total = 0;
    Py_ssize_t overhead = RECORD_SIZE + topic_len;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GET_ITEM(data, 6 * i));
        Py_ssize_t e = PyLong_AsSsize_t(PyList_GET_ITEM(data, 6 * i + 1));
        if (PyErr_Occurred())
            return NULL;
        if (s < 0 || e - s < FIELDS_SIZE || e > frames_len) {
            PyErr_SetString(PyExc_ValueError, "a checked frame lies outside its frames");
            return NULL;
        }
        total += overhead + (e - s);
    }
    PyObject *records = PyBytes_FromStringAndSize(NULL, total);
    PyObject *entries = PyBytes_FromStringAndSize(NULL, count * 20);
    if (records == NULL || entries == NULL)
        goto error;
    unsigned char *r = (unsigned char *)PyBytes_AS_STRING(records);
    unsigned char *en = (unsigned char *)PyBytes_AS_STRING(entries);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject **f = &PyList_GET_ITEM(data, 6 * i);
        Py_ssize_t s = PyLong_AsSsize_t(f[0]), e = PyLong_AsSsize_t(f[1]);
        long long tag_hash = PyLong_AsLongLong(f[2]);
        Py_ssize_t keys_at = PyLong_AsSsize_t(f[4]), keys_len = PyLong_AsSsize_t(f[5]);
        if (PyErr_Occurred())
            goto error;
        if (keys_len && (keys_at < 0 || keys_len < 0 || keys_at + keys_len > frames_len)) {
            PyErr_SetString(PyExc_ValueError, "a checked frame's keys lie outside its frames");
            goto error;
        }
        uint32_t size = (uint32_t)(overhead + (e - s));
        uint32_t magic = RECORD_MAGIC;
        int32_t qid = queue_id;
        int64_t off = offset + i;
        uint16_t tlen = (uint16_t)topic_len;
        memcpy(r, &size, 4);
        memcpy(r + 8, &magic, 4);
        memcpy(r + 12, &qid, 4);
        memcpy(r + 16, &off, 8);
        memcpy(r + 24, &store_ts, 8);
        memcpy(r + 32, &reconsume, 4);
        memcpy(r + 36, &tlen, 2);
        memcpy(r + RECORD_SIZE, topic, topic_len);
        memcpy(r + overhead, frames + s, e - s);
        uint32_t crc;
        if (crc_of(r + CRC_FROM, size - CRC_FROM, 0, &crc) < 0)
            goto error;
        memcpy(r + 4, &crc, 4);
        int64_t at = *position;
        int32_t entry_size = (int32_t)size;
        int64_t hash = tag_hash;
        memcpy(en, &at, 8);
        memcpy(en + 8, &entry_size, 4);
        memcpy(en + 12, &hash, 8);
        if (positions != NULL) {
            if (append_stolen(positions, PyLong_FromLongLong(at)) < 0
                || append_stolen(ids, PyBytes_FromStringAndSize((const char *)frames + s, 16)) < 0)
                goto error;
            if (keys_len) {
                PyObject *keys = PyBytes_FromStringAndSize((const char *)frames + keys_at, keys_len);
                PyObject *pair = keys != NULL ? Py_BuildValue("(LN)", (long long)at, keys) : NULL;
                if (append_stolen(keyed, pair) < 0)
                    goto error;
            }
        }
        r += size;
        en += 20;
        *position += size;
    }
    if (PyList_Append(into, records) < 0)
        goto error;
    Py_DECREF(records);
    return entries;
error:
    Py_XDECREF(records);
    Py_XDECREF(entries);
    return NULL;
}

static PyObject *
lay_out_parts(PyObject *module, PyObject *args)
{
    PyObject *parts, *into, *positions, *ids, *keyed;
    const char *topic;
    Py_ssize_t topic_len;
    long long store_ts, base_position;
    int reconsume;
    if (!PyArg_ParseTuple(args, "O!O!y#LLiOOO:lay_out_parts", &PyList_Type, &parts,
                          &PyList_Type, &into, &topic, &topic_len, &store_ts, &base_position,
                          &reconsume, &positions, &ids, &keyed))
        return NULL;
    if (positions == Py_None) {
        positions = ids = keyed = NULL;
    } else if (!PyList_Check(positions) || !PyList_Check(ids) || !PyList_Check(keyed)) {
        PyErr_SetString(PyExc_TypeError, "the index's positions, ids and keyed are lists");
        return NULL;
    }
    if (topic_len > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "a topic name is at most 65535 bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(parts);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    int64_t position = base_position;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entries = lay_out_part(PyList_GET_ITEM(parts, i), into, topic, topic_len,
                                         store_ts, reconsume, &position, positions, ids, keyed);
        if (entries == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, entries);
    }
    return out;
}


/* ---------------------------------------------------------------- the producer's encode
 *
 * encode_frames: codec.encode_message for each message of a send, the frames in order.
 * A Message due now is laid out here from its slots; any other (delayed, a subclass, a
 * field of an unexpected type) goes to `fallback(message, msg_id, now_s)`, the Python
 * encode, so the frames are always encode_message's.
 */
enum {
    M_PROPERTIES, M_BODY, M_DELAY, M_DELIVER_AT, M_KEYS, M_SHARDING_KEY, M_TAGS, M_TOPIC, M_COUNT
};
static const char *message_fields[M_COUNT] = {
    "_encoded_properties", "body", "delay_seconds", "deliver_at", "keys", "sharding_key", "tags",
    "topic",
};
static PyTypeObject *send_type = NULL;
static Py_ssize_t send_offsets[M_COUNT];

/* `*into` = `type` once its `count` object slots `names` are found (into `offsets`). */
static PyObject *
configure_type(PyObject *type, const char *what, const char **names, int count,
               Py_ssize_t *offsets, PyTypeObject **into)
{
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "takes the %s class", what);
        return NULL;
    }
    if (slot_offsets(type, what, names, count, offsets) < 0)
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(*into, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

static PyObject *
configure_encode(PyObject *module, PyObject *mtype)
{
    return configure_type(mtype, "Message", message_fields, M_COUNT, send_offsets, &send_type);
}

static PyObject *
slot_of(PyObject *m, int field)
{
    return *(PyObject **)((char *)m + send_offsets[field]);  /* borrowed; NULL if unset */
}

/* A str's UTF-8 (cached in the str), or empty for None and ""; 0 when not a str or None. */
static int
utf8_of(PyObject *value, const char **data, Py_ssize_t *size)
{
    if (value == Py_None) {
        *data = "";
        *size = 0;
        return 1;
    }
    if (!PyUnicode_CheckExact(value))
        return 0;
    *data = PyUnicode_AsUTF8AndSize(value, size);
    return *data != NULL ? 1 : -1;
}

/* One message's frame, or Py_None (not a usual message: the caller falls back). */
static PyObject *
frame_of(PyObject *m, PyObject *msg_id, int64_t born_ms)
{
    if (Py_TYPE(m) != send_type || !PyBytes_CheckExact(msg_id) || PyBytes_GET_SIZE(msg_id) != 16)
        Py_RETURN_NONE;
    PyObject *f[M_COUNT];
    for (int i = 0; i < M_COUNT; i++) {
        f[i] = slot_of(m, i);
        if (f[i] == NULL)
            Py_RETURN_NONE;
    }
    if (f[M_DELAY] != Py_None || f[M_DELIVER_AT] != Py_None || !PyBytes_CheckExact(f[M_BODY])
        || !PyBytes_CheckExact(f[M_PROPERTIES]) || !PyTuple_CheckExact(f[M_KEYS]))
        Py_RETURN_NONE;
    const char *tags, *key;
    Py_ssize_t tl, sl, kl = 0;
    int ok = utf8_of(f[M_TAGS], &tags, &tl);
    if (ok > 0)
        ok = utf8_of(f[M_SHARDING_KEY], &key, &sl);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        Py_RETURN_NONE;
    Py_ssize_t nkeys = PyTuple_GET_SIZE(f[M_KEYS]);
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        PyObject *k = PyTuple_GET_ITEM(f[M_KEYS], i);
        if (!PyUnicode_CheckExact(k))
            Py_RETURN_NONE;
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(k, &n) == NULL)
            return NULL;
        kl += n + (i > 0);
    }
    Py_ssize_t pl = PyBytes_GET_SIZE(f[M_PROPERTIES]), bl = PyBytes_GET_SIZE(f[M_BODY]);
    if (tl > 0xFFFF || sl > 0xFFFF || kl > 0xFFFF || pl > 0xFFFFFFFFLL || bl > 0xFFFFFFFFLL)
        Py_RETURN_NONE;  /* struct.pack refuses it there, with its own error */
    Py_ssize_t length = FIELDS_SIZE + tl + sl + kl + pl + bl;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, FRAME_PREFIX + length);
    if (frame == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(frame);
    uint32_t len32 = (uint32_t)length, pl32 = (uint32_t)pl, bl32 = (uint32_t)bl;
    uint16_t tl16 = (uint16_t)tl, sl16 = (uint16_t)sl, kl16 = (uint16_t)kl;
    int64_t deliver = 0;
    memcpy(o, &len32, 4);
    memcpy(o + 4, PyBytes_AS_STRING(msg_id), 16);
    memcpy(o + 20, &born_ms, 8);
    memcpy(o + 28, &deliver, 8);
    o[36] = 0;
    memcpy(o + 37, &tl16, 2);
    memcpy(o + 39, &sl16, 2);
    memcpy(o + 41, &kl16, 2);
    memcpy(o + 43, &pl32, 4);
    memcpy(o + 47, &bl32, 4);
    o += FRAME_PREFIX + FIELDS_SIZE;
    memcpy(o, tags, tl);
    o += tl;
    memcpy(o, key, sl);
    o += sl;
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        Py_ssize_t n;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(f[M_KEYS], i), &n);
        if (i > 0)
            *o++ = 0;
        memcpy(o, k, n);
        o += n;
    }
    memcpy(o, PyBytes_AS_STRING(f[M_PROPERTIES]), pl);
    o += pl;
    memcpy(o, PyBytes_AS_STRING(f[M_BODY]), bl);
    return frame;
}

static PyObject *
encode_frames(PyObject *module, PyObject *args)
{
    PyObject *messages, *ids, *now_s, *fallback;
    long long born_ms;
    if (!PyArg_ParseTuple(args, "OOLOO:encode_frames", &messages, &ids, &born_ms, &now_s,
                          &fallback))
        return NULL;
    if (send_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sdk._speedups.configure_encode() was not called");
        return NULL;
    }
    PyObject *ms = PySequence_Fast(messages, "messages must be a sequence");
    if (ms == NULL)
        return NULL;
    PyObject *is = PySequence_Fast(ids, "ids must be a sequence");
    if (is == NULL) {
        Py_DECREF(ms);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ms);
    PyObject *out = NULL;
    if (PySequence_Fast_GET_SIZE(is) != n) {
        PyErr_SetString(PyExc_ValueError, "one id per message");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(ms, i), *id = PySequence_Fast_GET_ITEM(is, i);
        PyObject *frame = frame_of(m, id, born_ms);
        if (frame == Py_None) {
            Py_DECREF(frame);
            frame = PyObject_CallFunctionObjArgs(fallback, m, id, now_s, NULL);
        }
        if (frame == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, frame);
    }
done:
    Py_DECREF(ms);
    Py_DECREF(is);
    return out;
}

/* ---------------------------------------------------------------- a batch's parts
 *
 * pick(items, indexes): [items[i] for i in indexes]; put_at(into, indexes, values):
 * into[indexes[k]] = values[k] for each k. A mixed-key batch is split into a part per
 * queue and its results put back in input order: a list comprehension and a loop per
 * part in Python. Indexes are within the list (no negative ones): IndexError otherwise.
 */
static int
index_within(PyObject *list, PyObject *index, Py_ssize_t *at)
{
    *at = PyLong_AsSsize_t(index);
    if (*at == -1 && PyErr_Occurred())
        return -1;
    if (*at < 0 || *at >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return -1;
    }
    return 0;
}

static PyObject *
pick(PyObject *module, PyObject *args)
{
    PyObject *items, *indexes;
    if (!PyArg_ParseTuple(args, "O!O!:pick", &PyList_Type, &items, &PyList_Type, &indexes))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indexes);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        Py_ssize_t at;
        if (index_within(items, PyList_GET_ITEM(indexes, k), &at) < 0) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, Py_NewRef(PyList_GET_ITEM(items, at)));
    }
    return out;
}

static PyObject *
put_at(PyObject *module, PyObject *args)
{
    PyObject *into, *indexes, *values;
    if (!PyArg_ParseTuple(args, "O!O!O!:put_at", &PyList_Type, &into, &PyList_Type, &indexes,
                          &PyList_Type, &values))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indexes);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "one value per index");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t at;
        if (index_within(into, PyList_GET_ITEM(indexes, k), &at) < 0)
            return NULL;
        PyObject *old = PyList_GET_ITEM(into, at);
        PyList_SET_ITEM(into, at, Py_NewRef(PyList_GET_ITEM(values, k)));
        Py_DECREF(old);
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- message ids
 *
 * message_ids: MessageIdGenerator.take's ids, prefix + each number as 8 big-endian
 * bytes, without a to_bytes call and a concatenation per id.
 */
static PyObject *
message_ids(PyObject *module, PyObject *args)
{
    Py_buffer prefix;
    PyObject *numbers;
    if (!PyArg_ParseTuple(args, "y*O!:message_ids", &prefix, &PyList_Type, &numbers))
        return NULL;
    PyObject *out = NULL;
    if (prefix.len != 8) {
        PyErr_SetString(PyExc_ValueError, "message ids start with 8 bytes");
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(numbers);
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(numbers, i));
        PyObject *id = v == (unsigned long long)-1 && PyErr_Occurred()
                           ? NULL
                           : PyBytes_FromStringAndSize(NULL, 16);
        if (id == NULL) {
            Py_CLEAR(out);
            break;
        }
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(id);
        memcpy(o, prefix.buf, 8);
        for (int b = 15; b >= 8; b--, v >>= 8)
            o[b] = (unsigned char)(v & 0xFF);
        PyList_SET_ITEM(out, i, id);
    }
done:
    PyBuffer_Release(&prefix);
    return out;
}

/* ---------------------------------------------------------------- the id index
 *
 * pack_id_entries: message_index's id entries for a write, as
 * b"".join(map(struct.Struct("<16sq").pack, ids, positions)), without a bytes object
 * and a call per entry.
 */
static PyObject *
pack_id_entries(PyObject *module, PyObject *args)
{
    PyObject *ids, *positions;
    if (!PyArg_ParseTuple(args, "O!O!:pack_id_entries", &PyList_Type, &ids, &PyList_Type,
                          &positions))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(positions) != n) {
        PyErr_SetString(PyExc_ValueError, "one position per id");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 24);
    if (out == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, o += 24) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (!PyBytes_Check(id) || PyBytes_GET_SIZE(id) != 16) {
            PyErr_SetString(PyExc_ValueError, "message ids are 16 bytes");
            Py_DECREF(out);
            return NULL;
        }
        int64_t position = PyLong_AsLongLong(PyList_GET_ITEM(positions, i));
        if (position == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        memcpy(o, PyBytes_AS_STRING(id), 16);
        memcpy(o + 16, &position, 8);
    }
    return out;
}

/* ---------------------------------------------------------------- laid-out slices
 *
 * A large batch is laid out in slices from position 0 before it is written, then moved to
 * where the commit log puts it (MessageStore.write_parts): per message a repacked entry
 * and a new int in Python, in the write step, which is not sliced (12-14% of the broker's
 * samples under a flood of 1 000-message sends).
 * rebase_entries: records.rebase_entries, consume-queue entries (<qiq: position, size,
 * tag hash) with each position moved `delta` bytes on. shifted: [p + delta for p in
 * positions]. Both give None where a position would not fit in 64 bits: the caller runs
 * the Python version, which says so.
 */
static PyObject *
rebase_entries(PyObject *module, PyObject *args)
{
    Py_buffer entries;
    long long delta;
    if (!PyArg_ParseTuple(args, "y*L:rebase_entries", &entries, &delta))
        return NULL;
    PyObject *out = NULL;
    if (entries.len % 20) {
        PyErr_SetString(PyExc_ValueError, "consume-queue entries are 20 bytes each");
        goto done;
    }
    out = PyBytes_FromStringAndSize(entries.buf, entries.len);
    if (out == NULL)
        goto done;
    char *o = PyBytes_AS_STRING(out);
    for (Py_ssize_t at = 0; at < entries.len; at += 20) {
        int64_t position;
        memcpy(&position, o + at, 8);
        if (__builtin_add_overflow(position, (int64_t)delta, &position)) {
            Py_SETREF(out, Py_NewRef(Py_None));
            goto done;
        }
        memcpy(o + at, &position, 8);
    }
done:
    PyBuffer_Release(&entries);
    return out;
}

static PyObject *
shifted(PyObject *module, PyObject *args)
{
    PyObject *positions;
    long long delta;
    if (!PyArg_ParseTuple(args, "O!L:shifted", &PyList_Type, &positions, &delta))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(positions);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        int overflow;
        long long position = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(positions, i),
                                                          &overflow);
        if (position == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        if (overflow || __builtin_add_overflow(position, delta, &position)) {
            Py_SETREF(out, Py_NewRef(Py_None));
            break;
        }
        PyObject *moved = PyLong_FromLongLong(position);
        if (moved == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, moved);
    }
    return out;
}

/* ---------------------------------------------------------------- the producer's batch
 *
 * shard_groups: ProducerCore._send_prepared's grouping of a batch by queue, for the usual
 * batch: Messages of one topic, due now, each with an ASCII sharding key (selector.
 * shard_index: murmur3's 32-bit hash of the key's UTF-8, seed 0, unsigned, modulo the
 * queue count). Any other batch is None: the caller groups it in Python.
 * send_results: build_send_results for offsets first, first + step, ...
 */
static uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static uint32_t
murmur3_32(const unsigned char *p, Py_ssize_t len)
{
    const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
    uint32_t h = 0, k;
    Py_ssize_t i = 0;
    for (; i + 4 <= len; i += 4) {
        k = rotl32(u32(p + i) * c1, 15) * c2;
        h = rotl32(h ^ k, 13) * 5 + 0xe6546b64u;
    }
    k = 0;
    switch (len & 3) {
    case 3:
        k ^= (uint32_t)p[i + 2] << 16;
        /* fall through */
    case 2:
        k ^= (uint32_t)p[i + 1] << 8;
        /* fall through */
    case 1:
        k ^= p[i];
        h ^= rotl32(k * c1, 15) * c2;
    }
    h ^= (uint32_t)len;
    h = (h ^ (h >> 16)) * 0x85ebca6bu;
    h = (h ^ (h >> 13)) * 0xc2b2ae35u;
    return h ^ (h >> 16);
}

/* The queue index of a usual message of `topic` (see shard_groups), or -1 if unusual. */
static Py_ssize_t
usual_shard(PyObject *m, PyObject *topic, Py_ssize_t count)
{
    if (Py_TYPE(m) != send_type)
        return -1;
    PyObject *t = slot_of(m, M_TOPIC), *key = slot_of(m, M_SHARDING_KEY);
    if (t == NULL || key == NULL || slot_of(m, M_DELAY) != Py_None
        || slot_of(m, M_DELIVER_AT) != Py_None || !PyUnicode_CheckExact(key)
        || !PyUnicode_IS_ASCII(key))
        return -1;
    if (t != topic && (!PyUnicode_CheckExact(t) || PyUnicode_Compare(t, topic) != 0))
        return -1;
    return (Py_ssize_t)(murmur3_32(PyUnicode_1BYTE_DATA(key), PyUnicode_GET_LENGTH(key))
                        % (uint32_t)count);
}

static PyObject *
shard_groups(PyObject *module, PyObject *args)
{
    PyObject *messages, *topic;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OUn:shard_groups", &messages, &topic, &count))
        return NULL;
    if (send_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sdk._speedups.configure_encode() was not called");
        return NULL;
    }
    if (count <= 0 || count > 0xFFFFFFFFLL)
        Py_RETURN_NONE;
    PyObject *ms = PySequence_Fast(messages, "messages must be a sequence");
    if (ms == NULL)
        return NULL;
    PyObject **lists = PyMem_Calloc((size_t)count, sizeof(PyObject *));  /* borrowed */
    PyObject *groups = PyDict_New();
    if (lists == NULL || groups == NULL) {
        if (lists == NULL)
            PyErr_NoMemory();
        goto failed;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ms);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t index = usual_shard(PySequence_Fast_GET_ITEM(ms, i), topic, count);
        if (index < 0) {
            Py_CLEAR(groups);
            groups = Py_NewRef(Py_None);
            break;
        }
        if (lists[index] == NULL) {
            PyObject *key = PyLong_FromSsize_t(index), *list = PyList_New(0);
            int set = key != NULL && list != NULL ? PyDict_SetItem(groups, key, list) : -1;
            Py_XDECREF(key);
            Py_XDECREF(list);
            if (set < 0)
                goto failed;
            lists[index] = list;
        }
        PyObject *at = PyLong_FromSsize_t(i);
        if (at == NULL || PyList_Append(lists[index], at) < 0) {
            Py_XDECREF(at);
            goto failed;
        }
        Py_DECREF(at);
    }
    PyMem_Free(lists);
    Py_DECREF(ms);
    return groups;
failed:
    PyMem_Free(lists);
    Py_XDECREF(groups);
    Py_DECREF(ms);
    return NULL;
}

static PyObject *
shard_hash(PyObject *module, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t h = murmur3_32(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(h);
}

enum { R_STATUS, R_MSG_ID, R_QUEUE, R_QUEUE_OFFSET, R_COUNT };
static const char *result_fields[R_COUNT] = {"status", "msg_id", "queue", "queue_offset"};
static PyTypeObject *result_type = NULL;
static Py_ssize_t result_offsets[R_COUNT];

static PyObject *
configure_results(PyObject *module, PyObject *rtype)
{
    return configure_type(rtype, "SendResult", result_fields, R_COUNT, result_offsets,
                          &result_type);
}

static void
set_result_field(PyObject *obj, int field, PyObject *value) /* steals value; slot is empty */
{
    *(PyObject **)((char *)obj + result_offsets[field]) = value;
}

static PyObject *
send_results(PyObject *module, PyObject *args)
{
    PyObject *status, *ids, *queue;
    long long first, step;
    if (!PyArg_ParseTuple(args, "OOOLL:send_results", &status, &ids, &queue, &first, &step))
        return NULL;
    if (result_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sdk._speedups.configure_results() was not called");
        return NULL;
    }
    PyObject *is = PySequence_Fast(ids, "ids must be a sequence");
    if (is == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(is);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *id = PySequence_Fast_GET_ITEM(is, i);
        if (!PyBytes_CheckExact(id) || PyBytes_GET_SIZE(id) != 16) {
            PyErr_SetString(PyExc_ValueError, "message ids are 16 bytes");
            Py_CLEAR(out);
            break;
        }
        PyObject *r = result_type->tp_alloc(result_type, 0);
        PyObject *text = r != NULL ? hex_id((const unsigned char *)PyBytes_AS_STRING(id)) : NULL;
        PyObject *offset = text != NULL ? PyLong_FromLongLong(first + step * i) : NULL;
        if (offset == NULL) {
            Py_XDECREF(text);
            Py_XDECREF(r);
            Py_CLEAR(out);
            break;
        }
        set_result_field(r, R_STATUS, Py_NewRef(status));
        set_result_field(r, R_MSG_ID, text);
        set_result_field(r, R_QUEUE, Py_NewRef(queue));
        set_result_field(r, R_QUEUE_OFFSET, offset);
        PyList_SET_ITEM(out, i, r);
    }
    Py_DECREF(is);
    return out;
}

/* ---------------------------------------------------------------- buffered messages
 *
 * decode_records(..., tracked=False) makes messages for a consumer's buffer outside the
 * cycle collector's generations; track() gives them back when they are handed out.
 * Received messages cannot be in a reference cycle until a user's code stores into one;
 * sitting in a buffer of thousands while the consumer decodes more, every collection
 * would traverse them (about a tenth of a busy consumer's time). Only MessageExt itself
 * is touched.
 */
static PyObject *
track(PyObject *module, PyObject *messages)
{
    if (!PyList_CheckExact(messages)) {
        PyErr_SetString(PyExc_TypeError, "track takes a list of messages");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(messages, i);
        if (Py_TYPE(m) == message_type && !PyObject_GC_IsTracked(m))
            PyObject_GC_Track(m);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(MessageExt, MessageQueue, RecordFormatError, crc32, decode_properties)"},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(records, broker_name, tracked=True) -> list[MessageExt]: as "
     "codec.decode_records"},
    {"configure_encode", configure_encode, METH_O, "configure_encode(Message)"},
    {"encode_frames", encode_frames, METH_VARARGS,
     "encode_frames(messages, ids, born_ms, now_s, fallback) -> each message's frame: as "
     "codec.encode_message"},
    {"scan_frames", scan_frames, METH_VARARGS,
     "scan_frames(frames, start, first_index, last_index, stop_at, max_body, max_properties, "
     "half_key, half_allowed) -> CheckedFrames' ints, or None: check in Python"},
    {"scan_parts", scan_parts, METH_VARARGS,
     "scan_parts(parts, max_frames, max_bytes, max_body, max_properties, half_key, "
     "half_allowed) -> each part's CheckedFrames' ints, or None: check part by part"},
    {"lay_out_parts", lay_out_parts, METH_VARARGS,
     "lay_out_parts(parts, into, topic, store_ts, base_position, reconsume_times, positions, "
     "ids, keyed) -> each part's entries: as records.lay_out_parts"},
    {"pick", pick, METH_VARARGS, "pick(items, indexes) -> [items[i] for i in indexes]"},
    {"put_at", put_at, METH_VARARGS,
     "put_at(into, indexes, values): into[indexes[k]] = values[k] for each k"},
    {"message_ids", message_ids, METH_VARARGS,
     "message_ids(prefix, numbers) -> a 16-byte id each: prefix + the number, big-endian"},
    {"pack_id_entries", pack_id_entries, METH_VARARGS,
     "pack_id_entries(ids, positions) -> the id index's entries (<16sq each), joined"},
    {"rebase_entries", rebase_entries, METH_VARARGS,
     "rebase_entries(entries, delta) -> entries with positions moved, or None"},
    {"shifted", shifted, METH_VARARGS, "shifted(positions, delta) -> [p + delta ...] or None"},
    {"shard_groups", shard_groups, METH_VARARGS,
     "shard_groups(messages, topic, queue_count) -> {queue index: [message index]}, or None: "
     "group in Python"},
    {"shard_hash", shard_hash, METH_O, "shard_hash(data) -> murmur3's unsigned 32-bit hash, seed 0"},
    {"configure_results", configure_results, METH_O, "configure_results(SendResult)"},
    {"send_results", send_results, METH_VARARGS,
     "send_results(status, ids, queue, first_offset, step) -> list[SendResult]: as "
     "build_send_results"},
    {"track", track, METH_O,
     "track(messages): give MessageExts decoded with tracked=False to the cycle collector"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sdk._speedups",
    "decode_records in C (see sdk/_speedups.c); sdk/_transport/codec.py falls back to Python.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    zero = PyLong_FromLong(0);
    minus_one = PyLong_FromLong(-1);
    nul = PyUnicode_FromStringAndSize("\0", 1);
    if (zero == NULL || minus_one == NULL || nul == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
