/* utf8.c — li_utf8_valid and li_utf8_scrub share one character step; li_read_text reads a file as text. */
#include "util/utf8.h"
#include "util/common.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Bytes of the valid UTF-8 character at s (n > 0 bytes left), or 0. NUL
 * (U+0000) counts as valid: utf8proc_iterate returns 1 for it. */
static inline size_t utf8_char_len(const utf8proc_uint8_t *s, size_t n) {
    if (s[0] < 0x80) return 1; /* ASCII, most of any body: no call per byte */
    utf8proc_int32_t cp;
    /* a sequence is at most 4 bytes: passing no more also keeps a huge n
     * from turning negative as utf8proc_ssize_t ("NUL-terminated") */
    utf8proc_ssize_t len = utf8proc_iterate(s, (utf8proc_ssize_t)LI_MIN(n, 4), &cp);
    return len > 0 ? (size_t)len : 0;
}

size_t li_utf8_valid_len(const char *str, size_t n) {
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)str;
    size_t i = 0;
    for (size_t k; i < n; i += k)
        if (!(k = utf8_char_len(s + i, n - i))) break;
    return i;
}

bool li_utf8_valid(const char *str, size_t n) { return li_utf8_valid_len(str, n) == n; }


void li_utf8_scrub(char *str, size_t n) {
    utf8proc_uint8_t *s = (utf8proc_uint8_t *)str;
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_char_len(s + i, n - i);
        if (k) i += k;
        else s[i++] = '?';
    }
}

int li_read_text(const char *path, size_t max_bytes, const char *what, char **out, size_t *len, li_error *err) {
    int rc = li_read_file(path, max_bytes, what, out, len, err);
    if (rc) return rc;
    const char *nul = memchr(*out, 0, *len);
    if (nul) {
        const size_t at = (size_t)(nul - *out);
        free(*out);
        *out = NULL;
        *len = 0;
        return li_error_set(err, LI_EINVAL, "%s '%s' holds a NUL byte at offset %zu: not a text file", what, path,
                            at);
    }
    const size_t ok = li_utf8_valid_len(*out, *len);
    if (ok < *len)
        li_log_warn("%s '%s' is not UTF-8 from byte %zu (0x%02x); its bytes are tokenized as they are", what, path,
                    ok, (unsigned)(unsigned char)(*out)[ok]);
    return 0;
}
