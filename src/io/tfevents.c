#include "io/tfevents.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "io/fs.h"

uint32_t crc32c(const void *data, size_t length) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < length; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

uint32_t crc32c_masked(const void *data, size_t length) {
    uint32_t crc = crc32c(data, length);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ---- a tiny protobuf encoder ----
typedef struct {
    uint8_t bytes[1024];
    size_t length;
} Buffer;

static void put_byte(Buffer *b, uint8_t v) {
    CHECK(b->length < sizeof b->bytes, "event too large");
    b->bytes[b->length++] = v;
}
static void put_varint(Buffer *b, uint64_t v) {
    while (v >= 0x80) {
        put_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    put_byte(b, (uint8_t)v);
}
static void put_key(Buffer *b, int field, int wire_type) { put_varint(b, (uint64_t)(field << 3 | wire_type)); }
static void put_fixed(Buffer *b, const void *v, size_t n) {
    for (size_t i = 0; i < n; i++) put_byte(b, ((const uint8_t *)v)[i]);
}
static void put_bytes(Buffer *b, int field, const void *data, size_t n) {
    put_key(b, field, 2);
    put_varint(b, n);
    put_fixed(b, data, n);
}

static int write_record(TfEventsWriter *w, const Buffer *event) {
    uint64_t length = event->length;
    uint32_t length_crc = crc32c_masked(&length, sizeof length);
    uint32_t data_crc = crc32c_masked(event->bytes, event->length);
    if (fwrite(&length, 8, 1, w->file) != 1 || fwrite(&length_crc, 4, 1, w->file) != 1 ||
        fwrite(event->bytes, 1, event->length, w->file) != event->length || fwrite(&data_crc, 4, 1, w->file) != 1 ||
        fflush(w->file) != 0)
        return err_set("cannot write %s: %s", w->path, strerror(errno));
    return 0;
}

int tfevents_open(TfEventsWriter *writer, const char *run_dir) {
    memset(writer, 0, sizeof *writer);
    if (fs_mkdir_p(run_dir) != 0) return -1;
    char name[128];
    snprintf(name, sizeof name, "events.out.tfevents.%ld.marlhf.%d", (long)time(NULL), (int)getpid());
    writer->path = fs_join(run_dir, name);
    writer->file = fopen(writer->path, "wb");
    if (!writer->file) {
        int rc = err_set("cannot create %s: %s", writer->path, strerror(errno));
        free(writer->path);
        writer->path = NULL;
        return rc;
    }
    Buffer event = {.length = 0};
    double now = (double)time(NULL);
    put_key(&event, 1, 1);
    put_fixed(&event, &now, 8);
    put_bytes(&event, 3, "brain.Event:2", 13);
    return write_record(writer, &event);
}

int tfevents_scalar(TfEventsWriter *writer, const char *tag, long step, double wall_time, float value) {
    if (!writer->file) return 0;
    Buffer summary_value = {.length = 0}, summary = {.length = 0}, event = {.length = 0};
    size_t tag_length = strlen(tag);
    if (tag_length > 200) tag_length = 200;
    put_bytes(&summary_value, 1, tag, tag_length);
    put_key(&summary_value, 2, 5);
    put_fixed(&summary_value, &value, 4);
    put_bytes(&summary, 1, summary_value.bytes, summary_value.length);
    put_key(&event, 1, 1);
    put_fixed(&event, &wall_time, 8);
    put_key(&event, 2, 0);
    put_varint(&event, (uint64_t)step);
    put_bytes(&event, 5, summary.bytes, summary.length);
    return write_record(writer, &event);
}

void tfevents_close(TfEventsWriter *writer) {
    if (writer->file) fclose(writer->file);
    free(writer->path);
    memset(writer, 0, sizeof *writer);
}
