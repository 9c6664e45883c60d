/* utf8.h — strict UTF-8 checks for bytes from outside (request parameters,
 * HTTP bodies, error messages that quote them). */
#ifndef LI_UTF8_H
#define LI_UTF8_H

#include "util/common.h"

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

/* li_read_file for text read as text (calibration, training, evaluation):
 * a NUL byte is refused (LI_EINVAL, naming its offset: a binary file, a
 * GGUF or an archive given by mistake), and bytes that are not UTF-8 get a
 * warning naming the first one (the tokenizer takes them as they are: a
 * Latin-1 text still reads). */
int li_read_text(const char *path, size_t max_bytes, const char *what, char **out, size_t *len, li_error *err);

#endif
