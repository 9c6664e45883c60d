/* utf8.h — strict UTF-8 checks for bytes from outside (request parameters,
 * HTTP bodies, error messages that quote them). */
#ifndef LI_UTF8_H
#define LI_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Strict UTF-8 as utf8proc_iterate decodes it: shortest forms only, no
 * surrogates, nothing above U+10FFFF, no truncated sequence. NUL is valid. */
bool li_utf8_valid(const char *s, size_t n);
/* The length of s's longest valid prefix (n when all of it is valid), as
 * li_utf8_valid reads it. */
size_t li_utf8_valid_len(const char *s, size_t n);
/* Makes s (n bytes) valid UTF-8 in place: each byte of an invalid or cut
 * sequence becomes '?'. Error messages quote client bytes (a parameter
 * name, a logit_bias key) and may be cut by their buffer; a reply must
 * still be a string every client decodes. */
void li_utf8_scrub(char *s, size_t n);

#endif
