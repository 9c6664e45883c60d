/* draft_base.c — a draft file's base model, read and checked (spec/draft_base.h). */
#include "spec/draft_base.h"

#include <stdio.h>
#include <string.h>

int li_draft_base_read(const li_gguf *g, const char *path, const char *kind, const char *what,
                       const li_draft_model_ref *model, char *name, size_t name_cap, uint64_t *hash, char *who,
                       size_t who_cap, li_error *err) {
    char key[64], text[64] = "";
    name[0] = who[0] = '\0';
    snprintf(key, sizeof key, "%s.base.name", kind);
    li_gguf_copy_str(g, key, name, name_cap);
    snprintf(key, sizeof key, "%s.base.vocab_hash", kind);
    li_gguf_copy_str(g, key, text, sizeof text);
    if (!li_gguf_get_hex64(g, key, hash))
        return li_error_set(err, LI_EINVAL, "%s: %s: %s '%s' is not 16 lowercase hex digits", kind, path, key, text);
    if (!model) return 0;
    if (model->name) snprintf(who, who_cap, " '%s'", model->name);
    if (*hash != model->vocab_hash)
        return li_error_set(err, LI_EINVAL, "%s: %s made for '%s' (vocab hash %016llx), the model%s has %016llx", kind,
                            what, name, (unsigned long long)*hash, who, (unsigned long long)model->vocab_hash);
    return 0;
}

void li_draft_base_warn_name(const char *kind, const char *what, const char *name, const li_draft_model_ref *model) {
    if (model && model->name && strcmp(name, model->name))
        li_log_warn("%s: %s made for '%s', the model is '%s' (same vocabulary and shape: used)", kind, what, name,
                    model->name);
}
