/* metrics_tensorboard.c: TensorBoard event files written by hand: the TFRecord framing (length, masked CRC32C of
 * the length, payload, masked CRC32C of the payload) around Event protos with scalar summaries. Only the proto
 * fields TensorBoard's scalar reader needs are written:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; } */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "metrics_internal.h"

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), bitwise over a 256-entry table built once. */
static uint32_t crc32c_table[256];
static int crc32c_table_ready;

static void crc32c_init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[i] = c;
    }
    crc32c_table_ready = 1;
}

uint32_t dsarl_crc32c(const void *data, size_t n)
{
    if (!crc32c_table_ready)
        crc32c_init_table(); /* idempotent: racing threads write identical values */
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = crc32c_table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t dsarl_tfrecord_masked_crc32c(const void *data, size_t n)
{
    uint32_t crc = dsarl_crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* --- protobuf wire format ------------------------------------------------------------------------------------ */

typedef struct proto_buf {
    uint8_t *data;
    size_t len, size;
    int overflow;
} proto_buf;

static void put_byte(proto_buf *b, uint8_t v)
{
    if (b->len < b->size)
        b->data[b->len] = v;
    else
        b->overflow = 1;
    b->len++;
}

static void put_varint(proto_buf *b, uint64_t v)
{
    while (v >= 0x80) {
        put_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    put_byte(b, (uint8_t)v);
}

static void put_le(proto_buf *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        put_byte(b, (uint8_t)(v >> (8 * i)));
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Event header fields: wall_time (field 1, fixed64) and step (field 2, varint; omitted at 0 as proto3 does). */
static void put_event_head(proto_buf *b, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    put_byte(b, 0x09);
    put_le(b, bits, 8);
    if (step != 0) {
        put_byte(b, 0x10);
        put_varint(b, (uint64_t)step);
    }
}

size_t dsarl_tb_scalar_event(uint8_t *buf, size_t size, double wall_time, int64_t step, const char *tag, float value)
{
    proto_buf b = {buf, 0, size, 0};
    size_t tag_len = strlen(tag);
    size_t value_len = 1 + varint_size(tag_len) + tag_len + 1 + 4; /* Value { tag; simple_value } */
    size_t summary_len = 1 + varint_size(value_len) + value_len;    /* Summary { value } */
    put_event_head(&b, wall_time, step);
    put_byte(&b, 0x2a); /* Event.summary, length-delimited */
    put_varint(&b, summary_len);
    put_byte(&b, 0x0a); /* Summary.value */
    put_varint(&b, value_len);
    put_byte(&b, 0x0a); /* Value.tag */
    put_varint(&b, tag_len);
    for (size_t i = 0; i < tag_len; i++)
        put_byte(&b, (uint8_t)tag[i]);
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    put_byte(&b, 0x15); /* Value.simple_value, fixed32 */
    put_le(&b, bits, 4);
    return b.overflow ? 0 : b.len;
}

static size_t file_version_event(uint8_t *buf, size_t size, double wall_time)
{
    static const char version[] = "brain.Event:2";
    proto_buf b = {buf, 0, size, 0};
    put_event_head(&b, wall_time, 0);
    put_byte(&b, 0x1a); /* Event.file_version */
    put_varint(&b, sizeof version - 1);
    for (size_t i = 0; i < sizeof version - 1; i++)
        put_byte(&b, (uint8_t)version[i]);
    return b.overflow ? 0 : b.len;
}

/* --- the event file ------------------------------------------------------------------------------------------ */

static int write_record(metrics_tb_writer *w, const uint8_t *data, size_t n, dsarl_error *err)
{
    uint8_t head[12];
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t len_crc = dsarl_tfrecord_masked_crc32c(head, 8);
    uint32_t data_crc = dsarl_tfrecord_masked_crc32c(data, n);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(len_crc >> (8 * i));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (uint8_t)(data_crc >> (8 * i));
    if (fwrite(head, 1, 12, w->file) != 12 || fwrite(data, 1, n, w->file) != n || fwrite(tail, 1, 4, w->file) != 4)
        return DSARL_FAIL(err, DSARL_E_IO, "cannot write TensorBoard event file %s: %s", w->path, strerror(errno));
    return DSARL_OK;
}

static double now_seconds(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

int metrics_tb_open(metrics_tb_writer *w, const char *dir, dsarl_error *err)
{
    memset(w, 0, sizeof *w);
    DSARL_TRY(dsarl_mkdir_p(dir, err));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    double t = now_seconds();
    /* pid in the name keeps two sessions in one second apart */
    char name[400];
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%d", (long long)t, host, (int)getpid());
    w->path = dsarl_path_join(dir, name);
    if (!w->path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory naming the TensorBoard event file in %s", dir);
    w->file = fopen(w->path, "wb");
    if (!w->file) {
        int rc = DSARL_FAIL(err, DSARL_E_IO, "cannot create TensorBoard event file %s: %s", w->path, strerror(errno));
        free(w->path);
        w->path = NULL;
        return rc;
    }
    uint8_t buf[64];
    size_t n = file_version_event(buf, sizeof buf, t);
    int rc = write_record(w, buf, n, err);
    if (rc == DSARL_OK)
        rc = metrics_tb_flush(w, err);
    if (rc < 0)
        metrics_tb_close(w);
    return rc;
}

int metrics_tb_scalar(metrics_tb_writer *w, double wall_time, int64_t step, const char *tag, float value,
                      dsarl_error *err)
{
    uint8_t small[512];
    size_t need = dsarl_tb_scalar_event(small, sizeof small, wall_time, step, tag, value);
    if (need)
        return write_record(w, small, need, err);
    size_t size = strlen(tag) + 64;
    uint8_t *big = malloc(size);
    if (!big)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory encoding TensorBoard scalar '%s'", tag);
    size_t n = dsarl_tb_scalar_event(big, size, wall_time, step, tag, value);
    int rc = write_record(w, big, n, err);
    free(big);
    return rc;
}

int metrics_tb_flush(metrics_tb_writer *w, dsarl_error *err)
{
    if (w->file && fflush(w->file) != 0)
        return DSARL_FAIL(err, DSARL_E_IO, "cannot flush TensorBoard event file %s: %s", w->path, strerror(errno));
    return DSARL_OK;
}

void metrics_tb_close(metrics_tb_writer *w)
{
    if (w->file)
        fclose(w->file);
    free(w->path);
    memset(w, 0, sizeof *w);
}
