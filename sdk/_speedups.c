/* sdk._speedups: decode_records in C, the same as sdk/_transport/codec.py's Python one.
 *
 * Decoding runs for every message a consumer receives and was half of a consumer's CPU in
 * Python (about 0.9 us a message). This does the same walk over the records: the same
 * checks in the same order, the same errors, the same MessageExt objects. The Python
 * function stays the reference (and what runs where this did not compile); the tests
 * compare the two on generated and corrupted records.
 *
 * configure() is given what the decode needs from Python once: MessageExt, MessageQueue,
 * RecordFormatError, the CRC-32 function and decode_properties. MessageExt's fields are
 * slots; their offsets are read from its member descriptors, so each field is stored
 * without an attribute lookup. configure() refuses a MessageExt whose slots are not
 * exactly the fields below (codec.py then uses the Python decode).
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

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *mtype, *qtype, *err, *crc, *props;
    if (!PyArg_ParseTuple(args, "O!OOOO:configure", &PyType_Type, &mtype, &qtype, &err, &crc,
                          &props))
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
    Py_ssize_t found[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *descr = PyDict_GetItemString(((PyTypeObject *)mtype)->tp_dict, field_names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "MessageExt.%s is not a slot", field_names[i]);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "MessageExt.%s is not an object slot", field_names[i]);
            return NULL;
        }
        found[i] = member->offset;
    }
    memcpy(offsets, found, sizeof(offsets));
    Py_INCREF(mtype); Py_XSETREF(message_type, (PyTypeObject *)mtype);
    Py_INCREF(qtype); Py_XSETREF(queue_type, qtype);
    Py_INCREF(err); Py_XSETREF(format_error, err);
    Py_INCREF(crc); Py_XSETREF(crc32_func, crc);
    Py_INCREF(props); Py_XSETREF(decode_properties_func, props);
    Py_RETURN_NONE;
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
crc_matches(const unsigned char *base, Py_ssize_t from, Py_ssize_t stop,
            uint32_t expected)
{
    PyObject *view = PyMemoryView_FromMemory((char *)base + from, stop - from, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *got = PyObject_CallOneArg(crc32_func, view);
    Py_DECREF(view);
    if (got == NULL)
        return -1;
    unsigned long value = PyLong_AsUnsignedLong(got);
    Py_DECREF(got);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    return value == expected;
}

/* One record's message, from its fields at p (after the topic) to stop; NULL on error. */
static PyObject *
message_at(const unsigned char *base, Py_ssize_t pos, Py_ssize_t p, Py_ssize_t stop,
           PyObject *topic, PyObject *queue, int64_t queue_offset, int64_t store_ts,
           int32_t reconsume)
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
    if (!PyArg_ParseTuple(args, "SU:decode_records", &records, &broker_name))
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
                                 i64(h + 16), i64(h + 24), i32(h + 32));
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

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(MessageExt, MessageQueue, RecordFormatError, crc32, decode_properties)"},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(records, broker_name) -> list[MessageExt]: as codec.decode_records"},
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
