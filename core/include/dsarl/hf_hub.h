/* dsarl/hf_hub.h: model names as users write them. A Hugging Face hub id (`zai-org/GLM-5.2`) names a model that
 * the Hugging Face tools downloaded into their cache; dsarl finds it there, offline (it never downloads).
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * The cache is the Hugging Face hub's layout: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub; a model lives in models--<owner>--<name>/snapshots/<commit>/, and
 * refs/<branch or tag> holds the commit a name points to. */
#ifndef DSARL_HF_HUB_H
#define DSARL_HF_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

/* True when name has the shape of a hub id, "owner/name" with letters, digits and - _ . only (no "..", no
 * leading "."), and is not an existing local path. */
DSARL_API bool dsarl_hf_is_hub_id(const char *name);

/* The hub cache directory this process uses (see above), into out (size bytes); *source names the variable it came
 * from ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME" or "HOME"). DSARL_E_NOT_FOUND when none of them is set. */
DSARL_API int dsarl_hf_cache_dir(char *out, size_t size, const char **source, dsarl_error *err);

/* The local directory of a model or tokenizer named as a user writes it, into out (size bytes). An existing local
 * path is returned as it is; a hub id is looked up in the cache at revision (NULL or "" = "main": a branch or tag
 * read from refs/, or a full 40-digit commit). key names the recipe key or argument for messages. A hub id that is
 * not in the cache is DSARL_E_NOT_FOUND with one line saying where it looked and how to download it; anything
 * else that is neither a local path nor a hub id is DSARL_E_NOT_FOUND naming the path. */
DSARL_API int dsarl_hf_resolve(const char *name, const char *revision, const char *key, char *out, size_t size,
                               dsarl_error *err);

/* The directory of name when this machine has it (dsarl_hf_resolve succeeds), else name itself, into out: for
 * commands that only inspect a recipe and fall back to choosing by name when the model is not here. */
DSARL_API void dsarl_hf_find(const char *name, const char *revision, char *out, size_t size);

DSARL_END_DECLS

#endif /* DSARL_HF_HUB_H */
