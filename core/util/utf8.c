/* utf8.c — li_utf8_valid and li_utf8_scrub share one character step. */
#include "util/utf8.h"
#include "util/common.h"

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
