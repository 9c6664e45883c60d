/* test_utf8.c — li_utf8_valid, the check on request text (HTTP bodies,
 * prompts, messages, stop strings): the boundaries of each sequence length,
 * overlong forms, surrogates, code points past U+10FFFF, truncated
 * sequences, NUL (valid), and a length that cuts a sequence short. */
#define _GNU_SOURCE /* libuv's headers need POSIX types */
#include "server/server.h"
#include "test_util.h"

#include <string.h>

int main(void) {
    static const struct {
        const char *s;
        size_t n;
        bool ok;
        const char *what;
    } cases[] = {
        {"", 0, true, "empty"},
        {"hello", 5, true, "ASCII"},
        {"a\0b", 3, true, "NUL is valid UTF-8"},
        {"\xc2\x80", 2, true, "U+0080"},
        {"\xdf\xbf", 2, true, "U+07FF"},
        {"\xe0\xa0\x80", 3, true, "U+0800"},
        {"\xed\x9f\xbf", 3, true, "U+D7FF"},
        {"\xee\x80\x80", 3, true, "U+E000"},
        {"\xef\xbf\xbf", 3, true, "U+FFFF"},
        {"\xf0\x90\x80\x80", 4, true, "U+10000"},
        {"\xf4\x8f\xbf\xbf", 4, true, "U+10FFFF"},
        {"ok \xf0\x9f\x98\x80 \xc3\xa9", 10, true, "mixed"},
        {"\xc0\x80", 2, false, "overlong NUL"},
        {"\xc1\xbf", 2, false, "overlong 2-byte"},
        {"\xe0\x9f\xbf", 3, false, "overlong 3-byte"},
        {"\xf0\x8f\xbf\xbf", 4, false, "overlong 4-byte"},
        {"\xed\xa0\x80", 3, false, "surrogate U+D800"},
        {"\xed\xbf\xbf", 3, false, "surrogate U+DFFF"},
        {"\xf4\x90\x80\x80", 4, false, "U+110000"},
        {"\xf5\x80\x80\x80", 4, false, "lead byte F5"},
        {"\xff", 1, false, "FF"},
        {"\x80", 1, false, "a lone continuation byte"},
        {"\xc3", 1, false, "truncated 2-byte"},
        {"\xe2\x82", 2, false, "truncated 3-byte"},
        {"\xf0\x9f\x98", 3, false, "truncated 4-byte"},
        {"\xe2\x28\xa1", 3, false, "a bad continuation byte"},
        {"\xf0\x9f\x98\x80", 3, false, "n cuts the sequence short"},
        {"x\xc3\xa9", 2, false, "n cuts the last sequence short"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++)
        CHECK(li_utf8_valid(cases[i].s, cases[i].n) == cases[i].ok, "%s: want %s", cases[i].what,
              cases[i].ok ? "valid" : "invalid");
    /* li_utf8_valid_len: where the first bad sequence starts (a prefix
     * before it, every case above after it), n when all is valid */
    for (size_t i = 0; i < LI_ARRAY_LEN(cases); i++) {
        char buf[32];
        const size_t pre = 5 + i % 4; /* "caf\xc3\xa9" and ASCII: 5 to 8 bytes */
        memcpy(buf, "caf\xc3\xa9xyz", pre);
        memcpy(buf + pre, cases[i].s, cases[i].n);
        const size_t got = li_utf8_valid_len(buf, pre + cases[i].n);
        if (cases[i].ok) CHECK(got == pre + cases[i].n, "%s after %zu bytes: all %zu valid, got %zu", cases[i].what,
                               pre, pre + cases[i].n, got);
        else CHECK(got >= pre && got < pre + cases[i].n && !li_utf8_valid(buf + got, pre + cases[i].n - got),
                   "%s after %zu bytes: the valid prefix ends inside it (got %zu)", cases[i].what, pre, got);
    }
    CHECK(li_utf8_valid_len("ab\xff" "cd", 5) == 2 && li_utf8_valid_len("\xe2\x82", 2) == 0,
          "the valid prefix stops at the first bad byte");
    return t_summary("test_utf8");
}
