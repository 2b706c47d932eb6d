// Rows of a dataset file (JSON Lines or one JSON array); see row_reader.h.
#include "data/row_reader.h"

#include <errno.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"

enum { READ_CHUNK_BYTES = 1 << 20 };
// A JSON array file is read whole; this only stops a wrong path from exhausting memory.
#define MAX_ARRAY_FILE_BYTES ((size_t)1 << 40)

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// --- byte checks ---------------------------------------------------------------------

// Offset of the first byte that does not start a well-formed UTF-8 sequence, or `length`.
static size_t utf8_first_invalid(const unsigned char *s, size_t length) {
    size_t i = 0;
    while (i < length) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t trailing;
        unsigned low = 0x80, high = 0xbf; // allowed range of the second byte
        if (c >= 0xc2 && c <= 0xdf) trailing = 1;
        else if (c == 0xe0) trailing = 2, low = 0xa0;        // no overlong 3-byte forms
        else if (c == 0xed) trailing = 2, high = 0x9f;       // no surrogates
        else if (c >= 0xe1 && c <= 0xef) trailing = 2;
        else if (c == 0xf0) trailing = 3, low = 0x90;        // no overlong 4-byte forms
        else if (c >= 0xf1 && c <= 0xf3) trailing = 3;
        else if (c == 0xf4) trailing = 3, high = 0x8f;       // nothing above U+10FFFF
        else return i;
        if (length - i - 1 < trailing || s[i + 1] < low || s[i + 1] > high) return i;
        for (size_t k = 2; k <= trailing; k++)
            if ((s[i + k] & 0xc0) != 0x80) return i;
        i += trailing + 1;
    }
    return length;
}

// Where byte `bad` of a row is, in words: in which field's value or name, by a light scan
// of the JSON strings before it (the bytes before `bad` are valid UTF-8). "" outside any
// string.
static void describe_string_position(const char *bytes, size_t length, size_t bad, char *where, size_t size) {
    bool in_string = false;
    size_t string_start = 0, last_start = 0, last_end = 0, key_start = 0, key_end = 0;
    bool have_last = false, have_key = false;
    for (size_t i = 0; i < bad; i++) {
        char c = bytes[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false, last_start = string_start, last_end = i, have_last = true;
        } else if (c == '"') {
            in_string = true;
            string_start = i + 1;
        } else if (c == ':' && have_last) {
            key_start = last_start, key_end = last_end, have_key = true;
        }
    }
    where[0] = '\0';
    if (!in_string) return;
    // Is the string holding the bad byte itself a name? Look past its end for ':'.
    size_t i = bad;
    while (i < length && bytes[i] != '"') i += bytes[i] == '\\' ? 2 : 1;
    for (i++; i < length && is_json_space(bytes[i]); i++) {}
    if (i < length && bytes[i] == ':') {
        snprintf(where, size, " in a field name");
    } else if (have_key) {
        size_t shown = key_end - key_start;
        if (shown > 60) {
            shown = 60;
            while (shown > 0 && ((unsigned char)bytes[key_start + shown] & 0xc0) == 0x80) shown--;
        }
        snprintf(where, size, " in the value of field \"%.*s\"", (int)shown, bytes + key_start);
    } else {
        snprintf(where, size, " in a string");
    }
}

int data_check_row_bytes(const char *bytes, size_t length, const char *path, long first_line, long first_column) {
    const char *nul = memchr(bytes, '\0', length);
    size_t bad = utf8_first_invalid((const unsigned char *)bytes, nul ? (size_t)(nul - bytes) : length);
    if (!nul && bad == length) return 0;
    long line = first_line, column = first_column;
    for (size_t i = 0; i < bad; i++) {
        if (bytes[i] == '\n') line++, column = 1;
        else column++;
    }
    if (nul && (size_t)(nul - bytes) == bad)
        return err_set("row contains a NUL byte (%s:%ld:%ld)", path, line, column);
    char where[128];
    describe_string_position(bytes, length, bad, where, sizeof where);
    return err_set("invalid UTF-8 (byte 0x%02x)%s (%s:%ld:%ld)", (unsigned char)bytes[bad], where, path, line,
                   column);
}

// Parses one checked row into a JSON object.
static int parse_row(const char *bytes, size_t length, const char *path, long line, long column, json_t **row) {
    if (data_check_row_bytes(bytes, length, path, line, column) != 0) return -1;
    json_error_t error;
    json_t *value = json_loadb(bytes, length, JSON_DECODE_ANY, &error);
    if (!value) {
        long at_line = line, at_column = column;
        if (error.line >= 1) {
            at_line = line + error.line - 1;
            at_column = error.line == 1 ? column + error.column - 1 : error.column;
        }
        // jansson refuses "\u0000" unless asked; say so in the user's terms.
        const char *what = strstr(error.text, "JSON_ALLOW_NUL") ? "a \\u0000 escape (NUL) in a string" : error.text;
        return err_set("invalid JSON: %s (%s:%ld:%ld)", what, path, at_line, at_column);
    }
    if (!json_is_object(value)) {
        const char *kind = json_is_array(value)    ? "an array"
                           : json_is_string(value) ? "a string"
                           : json_is_number(value) ? "a number"
                           : json_is_null(value)   ? "null"
                                                   : "a boolean";
        json_decref(value);
        return err_set("row is %s, expected a JSON object (%s:%ld)", kind, path, line);
    }
    *row = value;
    return 0;
}

// --- JSON Lines ----------------------------------------------------------------------

// The next line (without its "\n") in reader->row, NUL-terminated: 1, 0 at the end, -1
// when it is over the byte limit (found without reading the rest of it) or unreadable.
static int read_line(DataRowReader *reader) {
    reader->row_length = 0;
    bool any = false;
    for (;;) {
        if (reader->chunk_position == reader->chunk_length) {
            reader->chunk_length = fread(reader->chunk, 1, READ_CHUNK_BYTES, reader->file);
            reader->chunk_position = 0;
            if (reader->chunk_length == 0) {
                if (ferror(reader->file))
                    return err_set("read error after line %ld (%s)", reader->lines_seen, reader->path);
                if (!any) return 0;
                break;
            }
        }
        any = true;
        const char *start = reader->chunk + reader->chunk_position;
        size_t available = reader->chunk_length - reader->chunk_position;
        const char *newline = memchr(start, '\n', available);
        size_t take = newline ? (size_t)(newline - start) : available;
        if (take > reader->max_row_bytes - reader->row_length)
            return err_set("row is longer than the limit of %zu bytes (%s:%ld)", reader->max_row_bytes, reader->path,
                           reader->lines_seen + 1);
        if (reader->row_length + take + 1 > reader->row_capacity) {
            reader->row_capacity = 2 * (reader->row_length + take + 1);
            reader->row = xrealloc(reader->row, reader->row_capacity);
        }
        memcpy(reader->row + reader->row_length, start, take);
        reader->row_length += take;
        reader->chunk_position += take + (newline ? 1 : 0);
        if (newline) break;
    }
    reader->row[reader->row_length] = '\0';
    reader->end_line = ++reader->lines_seen;
    return 1;
}

static int next_line_row(DataRowReader *reader, json_t **row) {
    for (;;) {
        int got = read_line(reader);
        if (got <= 0) return got;
        const char *bytes = reader->row;
        size_t length = reader->row_length;
        if (reader->lines_seen == 1 && length >= 3 && memcmp(bytes, "\xef\xbb\xbf", 3) == 0) bytes += 3, length -= 3;
        size_t blank = 0;
        while (blank < length && is_json_space(bytes[blank])) blank++;
        if (blank == length) continue;
        reader->line = reader->lines_seen;
        if (parse_row(bytes, length, reader->path, reader->line, 1, row) != 0) return -1;
        return 1;
    }
}

// --- JSON array ------------------------------------------------------------------------

static void advance(DataRowReader *reader) {
    if (reader->text[reader->position] == '\n') reader->position_line++, reader->position_column = 1;
    else reader->position_column++;
    reader->position++;
}

static void skip_space(DataRowReader *reader) {
    while (reader->position < reader->text_size && is_json_space(reader->text[reader->position])) advance(reader);
}

// After the closing "]": only blank space may follow.
static int finish_array(DataRowReader *reader) {
    reader->array_done = true;
    reader->end_line = reader->position_line;
    skip_space(reader);
    if (reader->position < reader->text_size)
        return err_set("data after the end of the JSON array (%s:%ld:%ld)", reader->path, reader->position_line,
                       reader->position_column);
    return 0;
}

static int next_array_row(DataRowReader *reader, json_t **row) {
    if (reader->array_done) return 0;
    skip_space(reader);
    if (reader->position >= reader->text_size)
        return err_set("the JSON array is not closed (%s:%ld)", reader->path, reader->position_line);
    // "]" right after "[" is an empty array (the loader reports it); after a "," it is
    // a trailing comma, found below as an empty element.
    if (reader->line == 0 && reader->text[reader->position] == ']') {
        advance(reader);
        return finish_array(reader) != 0 ? -1 : 0;
    }
    size_t start = reader->position;
    long line = reader->position_line, column = reader->position_column;
    int depth = 0;
    bool in_string = false;
    while (reader->position < reader->text_size) {
        char c = reader->text[reader->position];
        if (in_string) {
            if (c == '\\' && reader->position + 1 < reader->text_size) advance(reader);
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) break;
            depth--;
        } else if (c == ',' && depth == 0) {
            break;
        }
        advance(reader);
        if (reader->position - start > reader->max_row_bytes)
            return err_set("row is longer than the limit of %zu bytes (%s:%ld)", reader->max_row_bytes, reader->path,
                           line);
    }
    if (reader->position >= reader->text_size)
        return err_set("the JSON array is not closed (%s:%ld)", reader->path, line);
    size_t end = reader->position;
    while (end > start && is_json_space(reader->text[end - 1])) end--;
    char terminator = reader->text[reader->position];
    long terminator_line = reader->position_line, terminator_column = reader->position_column;
    if (end == start)
        return err_set("empty element in the JSON array (%s:%ld:%ld)", reader->path, terminator_line,
                       terminator_column);
    if (terminator == '}')
        return err_set("invalid JSON: unmatched '}' (%s:%ld:%ld)", reader->path, terminator_line, terminator_column);
    advance(reader);
    reader->line = line;
    if (parse_row(reader->text + start, end - start, reader->path, line, column, row) != 0) return -1;
    if (terminator == ']' && finish_array(reader) != 0) {
        json_decref(*row);
        return -1;
    }
    return 1;
}

// --- opening -----------------------------------------------------------------------------

int data_rows_open(DataRowReader *reader, const char *path, size_t max_row_bytes) {
    memset(reader, 0, sizeof *reader);
    FILE *file = fopen(path, "rb");
    if (!file) return err_set("cannot open %s: %s", path, strerror(errno));
    if (!fs_is_file(path)) {
        fclose(file);
        return err_set("not a regular file: %s", path);
    }
    // The first non-blank byte (after a byte order mark) tells the layout.
    int c = getc(file);
    if (c == 0xef) {
        int b = getc(file), o = getc(file);
        c = b == 0xbb && o == 0xbf ? getc(file) : '\0';
    }
    while (c != EOF && is_json_space((char)c)) c = getc(file);
    reader->path = xstrdup(path);
    reader->max_row_bytes = max_row_bytes;
    reader->is_array = c == '[';
    if (!reader->is_array) {
        rewind(file);
        reader->file = file;
        reader->chunk = xmalloc(READ_CHUNK_BYTES);
        return 0;
    }
    fclose(file);
    if (fs_read_file(path, MAX_ARRAY_FILE_BYTES, &reader->text, &reader->text_size) != 0) {
        free(reader->path);
        reader->path = NULL;
        return -1;
    }
    reader->position_line = 1, reader->position_column = 1;
    if (reader->text_size >= 3 && memcmp(reader->text, "\xef\xbb\xbf", 3) == 0) reader->position = 3;
    skip_space(reader);
    if (reader->position >= reader->text_size || reader->text[reader->position] != '[') {
        data_rows_close(reader);
        return err_set("the file changed while it was being read: %s", path);
    }
    advance(reader);
    return 0;
}

int data_rows_next(DataRowReader *reader, json_t **row) {
    *row = NULL;
    return reader->is_array ? next_array_row(reader, row) : next_line_row(reader, row);
}

void data_rows_close(DataRowReader *reader) {
    if (reader->file) fclose(reader->file);
    free(reader->path);
    free(reader->chunk);
    free(reader->row);
    free(reader->text);
    memset(reader, 0, sizeof *reader);
}
